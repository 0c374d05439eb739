"""The on-disk format of a file store (``docs/file-backend.md`` describes it): the
names, and the bytes of the meta file, ``state``, the index headers and slots; pure
value types and functions, no I/O.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import secrets
import struct
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote_to_bytes

from ...errors import StoreFormatError

FORMAT_NAME = "statekeeper-file-store"
FORMAT_VERSION = 1

META_NAME = "statekeeper.json"
LOCK_NAME = "lock"
STATE_NAME = "state"
IDS_NAME = "ids.idx"
RECORDS_DIR = "records"
STREAMS_DIR = "streams"
DIRTY_NAME = "dirty"
#: Names the store creates in its root; anything else there makes it "not a store".
ROOT_NAMES = frozenset(
    {META_NAME, LOCK_NAME, STATE_NAME, IDS_NAME, DIRTY_NAME, RECORDS_DIR, STREAMS_DIR}
)

BUCKET_SIZE = 1000
_SEQ_DIGITS = 20
_BUCKET_DIGITS = _SEQ_DIGITS - 3
MAX_SEQUENCE = 10**_SEQ_DIGITS - 1

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)

# json.dumps builds a new encoder whenever it gets options; the save path reuses one.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True)

STATE_COPY = 2048
STATE_SIZE = 2 * STATE_COPY


# Values, but not frozen: the save path builds several per save, and a frozen field
# costs an object.__setattr__.
@dataclass(slots=True)
class Journal:
    """The multi-step operation in progress, so a crash can be finished or undone:
    ``op`` (``insert``, ``update``, ``delete`` or one of :data:`BATCH_OPS`), the index
    file name (a delete's joined by :data:`STREAM_SEP`), the record ``seq`` (``lo..hi``
    for deletes and batches), and the record file and temp file (relative to the
    root) that must not outlive it."""

    op: str
    stream: str
    seq: int = 0
    lo: int = 0
    hi: int = 0
    path: str | None = None
    tmp: str | None = None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Journal:
        return cls(
            op=str(doc["op"]),
            stream=str(doc["stream"]),
            seq=int(doc["seq"]),
            lo=int(doc["lo"]),
            hi=int(doc["hi"]),
            path=None if doc["path"] is None else str(doc["path"]),
            tmp=None if doc["tmp"] is None else str(doc["tmp"]),
        )


class _Keep:
    """Marks a field that :meth:`State.next` leaves as it is."""


_KEEP = _Keep()


@dataclass(slots=True)
class State:
    """The ``state`` file: two checksummed copies, the newer valid one wins. ``hwm``:
    the high-water mark; ``synced``: the sequence up to which the indexes were last
    fsynced; ``boot``: the boot that last checked them; ``ids_used``: id-table slots."""

    gen: int = 0
    hwm: int = 0
    synced: int = 0
    boot: str | None = None
    ids_used: int = 0
    journal: Journal | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Read back while the other copy is invalid: this one may be a generation old.
    torn: bool = False

    def next(
        self,
        *,
        hwm: int | None = None,
        synced: int | None = None,
        boot: str | _Keep | None = _KEEP,
        ids_used: int | None = None,
        journal: Journal | _Keep | None = _KEEP,
        extra: dict[str, Any] | None = None,
    ) -> State:
        """The next generation with some fields changed (faster than ``replace``)."""
        return State(
            self.gen + 1,
            self.hwm if hwm is None else hwm,
            self.synced if synced is None else synced,
            self.boot if isinstance(boot, _Keep) else boot,
            self.ids_used if ids_used is None else ids_used,
            self.journal if isinstance(journal, _Keep) else journal,
            self.extra if extra is None else extra,
        )

    @property
    def streams(self) -> int | None:
        """How many stream index files the store has (``None``: not recorded)."""
        value = self.extra.get("streams")
        return value if isinstance(value, int) else None

    @property
    def orphan(self) -> tuple[int, str] | None:
        """The newest damaged record whose stream could not be told, if any."""
        value = self.extra.get("orphan")
        if isinstance(value, list) and len(value) == 2:
            seq, cid = value
            if isinstance(seq, int) and isinstance(cid, str):
                return seq, cid
        return None

    def with_extra(self, **changes: Any) -> dict[str, Any]:
        """A copy of ``extra`` with ``changes`` (``None`` removes a key)."""
        out = dict(self.extra)
        for key, value in changes.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out

    def copy_bytes(self) -> tuple[int, bytes]:
        """``(offset, bytes)`` of the copy this generation overwrites: the generation
        in 20 digits, a space, JSON padded with spaces, a CRC-32 in hex, a newline."""
        extra = "," + _COMPACT.encode(self.extra)[1:-1] if self.extra else ""
        # Formatted by hand, several times faster than json.dumps (twice per save).
        text = (
            f'{{"hwm":{self.hwm},"synced":{self.synced},"boot":{_jstr(self.boot)},'
            f'"ids_used":{self.ids_used},"journal":{_journal_json(self.journal)}{extra}}}'
        )
        body = b"%020d " % self.gen + text.encode("ascii")
        if len(body) > STATE_COPY - 9:
            raise ValueError("state does not fit in its slot")
        body = body.ljust(STATE_COPY - 9, b" ")
        return (self.gen % 2) * STATE_COPY, body + b"%08x\n" % zlib.crc32(body)

    @classmethod
    def from_bytes(cls, data: bytes) -> State | None:
        """The newest valid copy in ``data`` (``None``: neither), ``torn`` when the
        file is short, a copy fails its checksum, or is all zeros from generation 2."""
        best: tuple[int, bytes] | None = None
        invalid = int(len(data) != STATE_SIZE)
        zeros = 0
        for i in range(2):
            copy = data[i * STATE_COPY : (i + 1) * STATE_COPY]
            body = copy[: STATE_COPY - 9]
            try:
                valid = len(copy) == STATE_COPY and int(copy[-9:-1], 16) == zlib.crc32(body)
                gen = int(body[:20])
            except ValueError:
                if any(copy):
                    invalid += 1
                else:
                    zeros += 1  # never written (a new store), or wiped
                continue
            if not valid:
                invalid += 1
            elif best is None or gen > best[0]:
                best = (gen, body)
        if best is None:
            return None
        if zeros and best[0] >= 2:
            invalid += 1
        try:
            doc = json.loads(best[1][21:])
            if not isinstance(doc, dict) or not isinstance(doc.get("boot"), str | None):
                return None  # checksummed, yet no state: as unreadable as a bad CRC
            journal = doc.pop("journal")
            return cls(
                gen=best[0],
                hwm=int(doc.pop("hwm")),
                synced=int(doc.pop("synced")),
                boot=doc.pop("boot"),
                ids_used=int(doc.pop("ids_used")),
                journal=None if journal is None else Journal.from_json(journal),
                extra=doc,  # what is left
                torn=invalid > 0,
            )
        except (ValueError, KeyError, TypeError):
            return None


def _jstr(value: str | None) -> str:
    if value is None:
        return "null"
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return _COMPACT.encode(value)


def _journal_json(j: Journal | None) -> str:
    if j is None:
        return "null"
    return (
        f'{{"op":{_jstr(j.op)},"stream":{_jstr(j.stream)},"seq":{j.seq},"lo":{j.lo},'
        f'"hi":{j.hi},"path":{_jstr(j.path)},"tmp":{_jstr(j.tmp)}}}'
    )


#: Journal ops of a ``save_many`` of ``lo..hi``: ``batch`` while its records are
#: written (recovery rolls back), ``batched`` once all are durable (it rolls forward).
BATCH_PENDING = "batch"
BATCH_COMMITTED = "batched"
BATCH_OPS = frozenset({BATCH_PENDING, BATCH_COMMITTED})
#: Joins the index file names of a delete that spans streams.
STREAM_SEP = "/"


def visible_cap(state: State | None, *, from_records: bool = False) -> int | None:
    """The highest sequence a reader of ``state`` may show (``None``: no limit): not
    what was saved after the read began, nor a ``save_many`` in flight, so batches
    are all-or-nothing to readers. A ``batched`` one is hidden from the indexes
    (which may hold part of it), not from the records (``from_records``). A torn
    state gives no limit rather than one that may lag an acknowledged save."""
    if state is None:
        return None
    journal = state.journal
    if journal is not None and (
        journal.op == BATCH_PENDING or (journal.op == BATCH_COMMITTED and not from_records)
    ):
        return journal.lo - 1
    return None if state.torn else state.hwm


_RECORD_RE = re.compile(r"(\d{20})\.([A-Za-z0-9._:-]{1,200})\.ckpt")
_TEMP_RE = re.compile(r"\.(\d{20})\.[0-9a-f]{1,24}\.tmp")
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_.")
_TEMP_COUNTER = itertools.count()
_MAX_ESCAPED = 160
_KEEP_ESCAPED = 120


def bucket_of(seq: int) -> int:
    return seq // BUCKET_SIZE


def bucket_name(bucket: int) -> str:
    return f"{bucket:0{_BUCKET_DIGITS}d}"


def parse_bucket_name(name: str) -> int | None:
    return int(name) if len(name) == _BUCKET_DIGITS and name.isascii() and name.isdigit() else None


def record_name(seq: int, cid: str) -> str:
    """``<seq, 20 digits>.<id>.ckpt``: one path component for any valid id."""
    return f"{seq:0{_SEQ_DIGITS}d}.{cid}.ckpt"


def parse_record_name(name: str) -> tuple[int, str] | None:
    m = _RECORD_RE.fullmatch(name)
    return (int(m.group(1)), m.group(2)) if m else None


def temp_name(seq: int) -> str:
    """A fresh temp-file name for record ``seq``, unique per process and call."""
    return f".{seq:0{_SEQ_DIGITS}d}.{os.getpid():x}{next(_TEMP_COUNTER) & 0xFFFFFFFF:08x}.tmp"


def parse_temp_name(name: str) -> int | None:
    m = _TEMP_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def temp_in_flight(journal: Journal | None, location: str) -> bool:
    """Whether the temp file at ``location`` (relative to the root) belongs to the
    write ``journal`` names: its temp, or one of its batch's ``lo..hi``."""
    if journal is None:
        return False
    if journal.tmp == location:
        return True
    if journal.op not in BATCH_OPS:
        return False
    seq = parse_temp_name(location.rsplit("/", 1)[-1])
    return seq is not None and journal.lo <= seq <= journal.hi


@functools.lru_cache(maxsize=4096)
def stream_file_name(stream: str) -> str:
    """The index file name of ``stream``: UTF-8 bytes outside ``[a-z0-9._-]`` (and a
    leading ``.``) become ``%XX``, so it is one path component, distinct on
    case-insensitive file systems; past 160 characters, a 120-character prefix, ``~``
    and a 128-bit BLAKE2b (the exact name is in the index header)."""
    raw = stream.encode("utf-8")
    parts = [
        chr(b) if b in _SAFE and not (i == 0 and b == 0x2E) else f"%{b:02X}"
        for i, b in enumerate(raw)
    ]
    escaped = "".join(parts)
    if len(escaped) > _MAX_ESCAPED:
        head = ""
        for part in parts:
            if len(head) + len(part) > _KEEP_ESCAPED:
                break
            head += part
        escaped = head + "~" + hashlib.blake2b(raw, digest_size=16).hexdigest()
    return escaped + ".idx"


def file_name_head(prefix: str) -> str:
    """What the index file name of every stream starting with ``prefix`` starts with
    (escaping is byte by byte; a hashed name keeps at least 118 characters): a
    filter, not a match."""
    escaped = stream_file_name(prefix)[:-4] if prefix else ""
    if "~" in escaped:  # the prefix itself was hashed
        escaped = escaped[: escaped.index("~")]
    return escaped[: _KEEP_ESCAPED - 2]


def stream_from_file_name(name: str) -> str | None:
    """The stream of a short index file name; ``None`` for a hashed or foreign one (the
    round trip through :func:`stream_file_name` must give the name back)."""
    if not name.endswith(".idx") or "~" in name:
        return None
    try:
        stream = unquote_to_bytes(name[:-4]).decode("utf-8")
    except ValueError:
        return None
    return stream if stream and stream_file_name(stream) == name else None


def id_key(cid: str) -> int:
    """The 64-bit hash of an id in the id table (never 0: an empty slot)."""
    key = int.from_bytes(hashlib.blake2b(cid.encode("ascii"), digest_size=8).digest(), "little")
    return key or 1


def to_micros(when: datetime | None) -> int:
    """An aware datetime as microseconds since the Unix epoch; ``None`` as 0."""
    return 0 if when is None else (when - _EPOCH) // _MICRO


@dataclass(frozen=True)
class Meta:
    """``statekeeper.json``: written once when the store is created, then read-only."""

    store_id: str
    cursor_key: bytes
    version: int = FORMAT_VERSION
    created_at: str = ""

    @classmethod
    def new(cls, now: datetime) -> Meta:
        return cls(secrets.token_hex(16), secrets.token_bytes(32), FORMAT_VERSION, now.isoformat())

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT_NAME,
            "version": self.version,
            "store_id": self.store_id,
            "cursor_key": self.cursor_key.hex(),
            "created_at": self.created_at,
            "layout": {"bucket_size": BUCKET_SIZE, "slot_size": SLOT_SIZE},
        }
        return (json.dumps(doc, indent=2) + "\n").encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Meta:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
                raise ValueError("not a statekeeper file store")
            version = doc["version"]
            if not isinstance(version, int) or version < 1:
                raise ValueError(f"bad version {version!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreFormatError(
                f"{where} is not a statekeeper file store meta file: {exc}"
            ) from None
        if version > FORMAT_VERSION:
            raise StoreFormatError(
                f"{where} has format version {version}, newer than this statekeeper "
                f"understands ({FORMAT_VERSION}); upgrade statekeeper to open it"
            )
        try:
            store_id = doc["store_id"]
            key = bytes.fromhex(doc["cursor_key"])
            layout = doc.get("layout", {})
            if not isinstance(store_id, str) or not re.fullmatch(r"[0-9a-f]{32}", store_id):
                raise ValueError("bad store_id")
            if len(key) < 16:
                raise ValueError("cursor_key too short")
            if layout.get("bucket_size", BUCKET_SIZE) != BUCKET_SIZE:
                raise ValueError("unsupported bucket_size")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StoreFormatError(f"{where} is damaged: {exc}") from None
        return cls(store_id, key, version, str(doc.get("created_at", "")))


IDX_MAGIC = b"SKIDX1\n"
IDX_HEADER_SIZE = 4096
SLOT_SIZE = 256
SLOT_LIVE = 1
SLOT_DEAD = 2
_SLOT = struct.Struct("<QqBB200s34x")
_CRC = struct.Struct("<I")


@dataclass(slots=True)
class Slot:
    """One checkpoint in a stream index. ``expires`` (µs since the epoch, 0: none)
    bounds the record's expiry from above: readers skip a slot whose hint has passed
    and still check the record itself."""

    seq: int
    cid: str
    expires: int = 0
    flags: int = SLOT_LIVE

    @property
    def live(self) -> bool:
        return self.flags == SLOT_LIVE

    def expired(self, now_us: int) -> bool:
        return self.expires != 0 and self.expires <= now_us

    def to_bytes(self) -> bytes:
        raw_id = self.cid.encode("ascii")
        body = _SLOT.pack(self.seq, self.expires, self.flags, len(raw_id), raw_id)
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Slot | None:
        """The slot, or ``None`` if it is torn or corrupt."""
        if len(data) != SLOT_SIZE:
            return None
        body = data[: SLOT_SIZE - 4]
        if _CRC.unpack_from(data, SLOT_SIZE - 4)[0] != zlib.crc32(body):
            return None
        seq, expires, flags, idlen, raw_id = _SLOT.unpack_from(data)
        if flags not in (SLOT_LIVE, SLOT_DEAD) or not 1 <= idlen <= 200 or seq < 1:
            return None
        try:
            cid = raw_id[:idlen].decode("ascii")
        except UnicodeDecodeError:
            return None
        return cls(seq, cid, expires, flags)


def index_header(stream: str, store_id: str) -> bytes:
    return _header(IDX_MAGIC, {"store": store_id, "stream": stream})


def parse_index_header(data: bytes, store_id: str) -> str:
    """The stream name in an index header; :class:`ValueError` if it is not ours."""
    stream = _parse_header(data, IDX_MAGIC, "stream index", store_id).get("stream")
    if not isinstance(stream, str) or not stream:
        raise ValueError("stream index has no stream name")
    return stream


IDS_MAGIC = b"SKIDS1\n"
IDS_HEADER_SIZE = IDX_HEADER_SIZE
IDS_SLOT = struct.Struct("<QQ")
IDS_MIN_CAPACITY = 4096
TOMBSTONE = 1 << 63


def ids_header(capacity: int, store_id: str) -> bytes:
    return _header(IDS_MAGIC, {"store": store_id, "capacity": capacity})


def parse_ids_header(data: bytes, store_id: str) -> int:
    """The capacity in an id-table header; :class:`ValueError` if it is not ours."""
    capacity = _parse_header(data, IDS_MAGIC, "id table", store_id).get("capacity")
    if not isinstance(capacity, int) or capacity < 1 or capacity & (capacity - 1):
        raise ValueError(f"bad id table capacity {capacity!r}")
    return capacity


def _header(magic: bytes, doc: dict[str, Any]) -> bytes:
    """``magic``, ``doc`` in JSON and a newline, NUL-padded, then a CRC-32."""
    text = json.dumps({"v": 1, **doc}, ensure_ascii=False)
    body = (magic + text.encode("utf-8") + b"\n").ljust(IDX_HEADER_SIZE - 4, b"\0")
    return body + _CRC.pack(zlib.crc32(body))


def _parse_header(data: bytes, magic: bytes, what: str, store_id: str) -> dict[str, Any]:
    if len(data) != IDX_HEADER_SIZE or not data.startswith(magic):
        raise ValueError(f"not a statekeeper {what}")
    body = data[: IDX_HEADER_SIZE - 4]
    if _CRC.unpack_from(data, IDX_HEADER_SIZE - 4)[0] != zlib.crc32(body):
        raise ValueError(f"{what} header checksum mismatch")
    doc: dict[str, Any] = json.loads(body[len(magic) : body.index(b"\n", len(magic))])
    version = doc.get("v") if isinstance(doc, dict) else None
    if version != 1:
        raise ValueError(f"unsupported {what} version {version!r}")
    if doc.get("store") != store_id:
        raise ValueError(f"{what} belongs to another store")
    return doc
