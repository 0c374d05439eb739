"""The record envelope: one checkpoint as checksummed bytes.

Backends persist a checkpoint as one opaque ``bytes`` value made by
:meth:`StoredRecord.to_bytes`, plus whatever index columns they need (stream,
sequence, id, tags, expiry). Reading goes through :meth:`StoredRecord.from_bytes`,
which verifies the length and checksum, so a torn or truncated record is a
:class:`~statekeeper.errors.CheckpointDecodeError`, never valid data.

Layout (format 1)::

    SK1 <header_len> <state_len> <crc32 hex>\\n
    <header JSON, header_len bytes>
    <state bytes, state_len bytes>

``crc32`` covers the header and the state. The header JSON holds the format
version, store id, id, stream, sequence, timestamps, etag, parent id, tags,
metadata, expiry, the TTL that slides on update, and the codec name. The state
bytes are the codec's output and are decoded only when asked for.

A *positional* record (``to_bytes(..., positional=True)``) has ``"seq": null``: its
sequence is where it is stored (a row's key), assigned after the bytes were built.
It is read only with ``expect_sequence``, which then supplies the sequence. A
backend whose sequence comes from the database in the inserting statement uses
it, so no lock is held while the envelope is built.

This module is public for backend authors: a third-party backend should store
these bytes rather than invent its own envelope.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

import msgspec

from .errors import CheckpointDecodeError
from .models import Checkpoint, CheckpointHeader, trusted_checkpoint, trusted_header

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "NewRecord",
    "RecordEdits",
    "StoredRecord",
    "read_record",
]

MAGIC = b"SK1 "
FORMAT_VERSION = 1
_MAX_PREFIX = 64
# one encoder for every record: json.dumps with options builds a new one per call
_HEADER_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# strict: decimal lengths without signs or spaces, lowercase hex, so no two spellings
# of a prefix mean the same thing and every flipped byte is caught
_PREFIX = re.compile(rb"SK1 (0|[1-9][0-9]{0,11}) (0|[1-9][0-9]{0,11}) ([0-9a-f]{8})\n")


class _Head(msgspec.Struct, gc=False):
    """The header JSON, fields in the order :meth:`StoredRecord.to_bytes` writes them.

    Only the fast parse uses it: msgspec checks each field's JSON type (no coercion:
    ``true`` is not an int, ``"7"`` is not an int), and the parse counts only if
    re-encoding gives back the exact header bytes. Anything else is left to the
    reference parse (``json`` plus :func:`_checked_header`), which words the errors.
    ``gc=False``: it lives for one parse and holds no cycle, so the collector
    need not track it (one tracked allocation less per record read).
    """

    v: int
    store: str
    id: str
    stream: str
    seq: int | None
    created: str
    updated: str
    etag: str
    parent: str | None
    tags: dict[str, str]
    meta: dict[str, Any]
    expires: str | None
    ttl: int | float | None
    codec: str


_NO_FLOAT: frozenset[type] = frozenset({str, int, bool, type(None)})
# built once: msgspec.json.decode(..., type=_Head) and encode look their type or
# encoder up on every call
_decode_head = msgspec.json.Decoder(_Head).decode
_encode_json = msgspec.json.Encoder().encode
_fromiso = datetime.fromisoformat


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A checkpoint that is about to be inserted; the backend supplies the sequence.

    Backends call :meth:`seal` inside the critical section that assigns the sequence.
    """

    id: str
    stream: str
    state: bytes
    codec: str
    created_at: datetime
    updated_at: datetime
    etag: str
    parent_id: str | None
    tags: dict[str, str]
    metadata: dict[str, Any]
    ttl: float | None
    expires_at: datetime | None
    #: The store's clock when the write began. Backends judge whether an existing
    #: record with the same id is still live by this, never by ``created_at`` (which
    #: ``import_checkpoint`` copies from another store).
    written_at: datetime | None = None

    @property
    def now(self) -> datetime:
        """When the write began, by the store's clock."""
        return self.written_at if self.written_at is not None else self.updated_at

    def seal(self, sequence: int) -> StoredRecord:
        """The stored form of this record at ``sequence``."""
        # the fields were validated when the record was made; model_construct would
        # cost several times more for the same unvalidated model
        header = trusted_header(
            {
                "id": self.id,
                "stream": self.stream,
                "sequence": sequence,
                "created_at": self.created_at,
                "updated_at": self.updated_at,
                "etag": self.etag,
                "parent_id": self.parent_id,
                "tags": self.tags,
                "metadata": self.metadata,
                "expires_at": self.expires_at,
            }
        )
        return StoredRecord(header=header, state=self.state, codec=self.codec, ttl=self.ttl)


# NewRecord's slot setters, in field order: trusted_new_record sets each slot once,
# as the generated __init__ does, without its object.__setattr__ call per field
(
    _set_id,
    _set_stream,
    _set_state,
    _set_codec,
    _set_created_at,
    _set_updated_at,
    _set_etag,
    _set_parent_id,
    _set_tags,
    _set_metadata,
    _set_ttl,
    _set_expires_at,
    _set_written_at,
) = (NewRecord.__dict__[f.name].__set__ for f in fields(NewRecord))


def trusted_new_record(
    *,
    id: str,
    stream: str,
    state: bytes,
    codec: str,
    created_at: datetime,
    updated_at: datetime,
    etag: str,
    parent_id: str | None,
    tags: dict[str, str],
    metadata: dict[str, Any],
    ttl: float | None,
    expires_at: datetime | None,
    written_at: datetime | None,
) -> NewRecord:
    """``NewRecord(...)`` with the same fields, for the save path (less than half
    the cost of the frozen dataclass's ``__init__``; there is nothing to validate)."""
    record: NewRecord = object.__new__(NewRecord)
    _set_id(record, id)
    _set_stream(record, stream)
    _set_state(record, state)
    _set_codec(record, codec)
    _set_created_at(record, created_at)
    _set_updated_at(record, updated_at)
    _set_etag(record, etag)
    _set_parent_id(record, parent_id)
    _set_tags(record, tags)
    _set_metadata(record, metadata)
    _set_ttl(record, ttl)
    _set_expires_at(record, expires_at)
    _set_written_at(record, written_at)
    return record


@dataclass(frozen=True, slots=True)
class RecordEdits:
    """What an ``update`` replaces besides the state; ``None`` keeps the field."""

    tags: dict[str, str] | None = None
    metadata: dict[str, Any] | None = None
    parent_id: str | None = None

    @property
    def tags_changed(self) -> bool:
        return self.tags is not None


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A checkpoint as stored: its header, its encoded state and its TTL."""

    header: CheckpointHeader
    state: bytes
    codec: str
    ttl: float | None = None

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def sequence(self) -> int:
        return self.header.sequence

    @property
    def stream(self) -> str:
        return self.header.stream

    def is_expired(self, now: datetime) -> bool:
        """Whether this record has expired at ``now`` (it then behaves as deleted)."""
        expires = self.header.expires_at
        return expires is not None and expires <= now

    def updated(
        self,
        state: bytes,
        *,
        now: datetime,
        etag: str,
        edits: RecordEdits | None = None,
        codec: str | None = None,
    ) -> StoredRecord:
        """This record with a new state: same id, sequence and created_at; TTL slides.

        ``edits`` replaces tags, metadata and the parent link where it says so;
        ``codec`` names the codec of the new state (default: unchanged).
        """
        expires_at = now + timedelta(seconds=self.ttl) if self.ttl is not None else None
        update: dict[str, Any] = {"updated_at": now, "etag": etag, "expires_at": expires_at}
        if edits is not None:
            if edits.tags is not None:
                update["tags"] = edits.tags
            if edits.metadata is not None:
                update["metadata"] = edits.metadata
            if edits.parent_id is not None:
                update["parent_id"] = edits.parent_id
        header = self.header.model_copy(update=update)
        return replace(self, header=header, state=state, codec=codec or self.codec)

    def to_bytes(self, store_id: str, *, positional: bool = False) -> bytes:
        """The envelope bytes, with length and checksum.

        ``positional`` leaves the sequence out (``"seq": null``): the backend stores
        it beside the bytes and passes it back as ``expect_sequence`` when reading.
        """
        h = self.header
        fields = {
            "v": FORMAT_VERSION,
            "store": store_id,
            "id": h.id,
            "stream": h.stream,
            "seq": None if positional else h.sequence,
            "created": h.created_at.isoformat(),
            "updated": h.updated_at.isoformat(),
            "etag": h.etag,
            "parent": h.parent_id,
            "tags": h.tags,
            "meta": h.metadata,
            "expires": h.expires_at.isoformat() if h.expires_at else None,
            "ttl": self.ttl,
            "codec": self.codec,
        }
        head = _fast_head(fields)
        if head is None:
            head = _HEADER_ENCODER.encode(fields).encode("utf-8")
        crc = zlib.crc32(self.state, zlib.crc32(head))
        prefix = b"%s%d %d %08x\n" % (MAGIC, len(head), len(self.state), crc)
        return prefix + head + self.state

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        location: str,
        expect_store_id: str | None = None,
        expect_id: str | None = None,
        expect_sequence: int | None = None,
    ) -> StoredRecord:
        """Parse and verify envelope bytes.

        Raises :class:`CheckpointDecodeError` (with ``location`` and whatever id and
        sequence are known) if the bytes are torn, truncated, fail the checksum,
        carry an unknown format version, or disagree with the expected store id,
        id or sequence (for example a file whose name says sequence 10 but whose
        content says 1). A positional record (``"seq": null``) takes its sequence
        from ``expect_sequence``, and without one it is a decode error.
        """

        def fail(reason: str, rid: str | None = expect_id) -> CheckpointDecodeError:
            return CheckpointDecodeError(
                reason, id=rid, location=location, sequence=expect_sequence
            )

        if type(data) is not bytes:
            if not isinstance(data, bytearray | memoryview):
                raise fail(f"record is {type(data).__name__}, not bytes")
            data = bytes(data)
        prefix = _PREFIX.match(data, 0, _MAX_PREFIX)
        if prefix is None:
            if not data.startswith(MAGIC):
                raise fail("not a statekeeper record (bad magic)")
            raise fail("malformed record prefix")
        hlen, slen, crc = int(prefix[1]), int(prefix[2]), int(prefix[3], 16)
        start = prefix.end()
        if len(data) - start != hlen + slen:
            raise fail(
                f"record is {len(data) - start} bytes long but its prefix says {hlen + slen} "
                "(torn or truncated write)"
            )
        head, state = data[start : start + hlen], data[start + hlen :]
        if zlib.crc32(state, zlib.crc32(head)) != crc:
            raise fail("checksum mismatch (the record is corrupt)")
        fast = _fast_header(head, expect_sequence)
        if fast is not None:
            header, store_id, codec, ttl, stored_seq = fast
        else:
            header, store_id, codec, ttl, stored_seq = _parse_header(head, expect_sequence, fail)
        if expect_store_id is not None and store_id != expect_store_id:
            raise fail(f"record belongs to another store ({store_id!r})", header.id)
        if expect_id is not None and header.id != expect_id:
            raise fail(f"record says its id is {header.id!r}", expect_id)
        if (
            expect_sequence is not None
            and stored_seq is not None
            and header.sequence != expect_sequence
        ):
            raise fail(
                f"record says its sequence is {header.sequence}, "
                f"but it is stored at sequence {expect_sequence}",
                header.id,
            )
        return cls(header=header, state=state, codec=codec, ttl=ttl)


_stored_header, _stored_state, _stored_codec, _stored_ttl = (
    StoredRecord.__dict__[f.name].__set__ for f in fields(StoredRecord)
)


def trusted_stored_record(
    header: CheckpointHeader, state: bytes, codec: str, ttl: float | None
) -> StoredRecord:
    """``StoredRecord(header=header, state=state, codec=codec, ttl=ttl)`` through its
    slot setters, for read paths whose values are already checked (about half the
    cost of the frozen dataclass's ``__init__``)."""
    record: StoredRecord = object.__new__(StoredRecord)
    _stored_header(record, header)
    _stored_state(record, state)
    _stored_codec(record, codec)
    _stored_ttl(record, ttl)
    return record


def read_record(
    data: bytes,
    location_of: Callable[[int], str],
    *,
    store_id: str | None,
    id: str,
    sequence: int,
) -> StoredRecord:
    """``StoredRecord.from_bytes(data, location=location_of(sequence),
    expect_store_id=store_id, expect_id=id, expect_sequence=sequence)``, for a
    backend's reads: the same record, or the same error with the same words.

    A well-formed record whose header takes the fast parse and matches every
    expectation is built here without the location string, the error closure or
    the dataclass ``__init__``; anything else (a wrong type, a bad prefix, length or
    checksum, a header the fast parse leaves, a mismatch) goes through
    :meth:`StoredRecord.from_bytes`, which decides and words the error.
    """
    fast = _fast_record(data, store_id, id, sequence)
    if fast is not None:
        values, state, codec, ttl = fast
        return trusted_stored_record(trusted_header(values), state, codec, ttl)
    return StoredRecord.from_bytes(
        data,
        location=location_of(sequence),
        expect_store_id=store_id,
        expect_id=id,
        expect_sequence=sequence,
    )


class StateDecoder(Protocol):
    """What :func:`read_checkpoint` decodes a state with (a store's codecs)."""

    def decode(self, data: bytes) -> Any: ...


def read_checkpoint(
    data: bytes,
    location_of: Callable[[int], str],
    *,
    store_id: str | None,
    id: str,
    sequence: int,
    decoders: Mapping[str, StateDecoder],
) -> Checkpoint | StoredRecord:
    """:func:`read_record`, then its state decoded by ``decoders[codec]``: the
    :class:`~statekeeper.models.Checkpoint` that
    ``BaseCheckpointStore._decode_strict`` gives for that record, built without the
    record and header in between (a listed page's hot path).

    Whatever is not that plain case, the record is returned (or the error raised)
    exactly as :func:`read_record` would, and the caller decodes it the usual way,
    which words any error: a record off the fast parse, an unknown codec, a state
    its codec refuses.
    """
    fast = _fast_record(data, store_id, id, sequence)
    if fast is None:
        return read_record(data, location_of, store_id=store_id, id=id, sequence=sequence)
    values, state, codec, ttl = fast
    decoder = decoders.get(codec)
    if decoder is not None:
        try:
            decoded = decoder.decode(state)
        except CheckpointDecodeError:
            pass  # the caller's decode raises it again, with the record named
        else:
            return trusted_checkpoint(values, decoded)
    return trusted_stored_record(trusted_header(values), state, codec, ttl)


def _fast_record(
    data: bytes, store_id: str | None, id: str, sequence: int
) -> tuple[dict[str, Any], bytes, str, float | None] | None:
    """The header values, state bytes, codec and ttl of a well-formed record whose
    header takes the fast parse and matches every expectation; ``None`` for
    anything else (:meth:`StoredRecord.from_bytes` then decides)."""
    if type(data) is bytes:
        prefix = _PREFIX.match(data, 0, _MAX_PREFIX)
        if prefix is not None:
            start = prefix.end()
            head_len, state_len, crc = prefix.groups()
            hlen = int(head_len)
            if len(data) - start == hlen + int(state_len):
                head, state = data[start : start + hlen], data[start + hlen :]
                if zlib.crc32(state, zlib.crc32(head)) == int(crc, 16):
                    fast = _fast_values(head, sequence)
                    if (
                        fast is not None
                        and (store_id is None or fast[1] == store_id)
                        and fast[0]["id"] == id
                        and (fast[4] is None or fast[0]["sequence"] == sequence)
                    ):
                        return fast[0], state, fast[2], fast[3]
    return None


def _parse_header(
    head: bytes, expect_sequence: int | None, fail: Any
) -> tuple[CheckpointHeader, str, str, float | None, int | None]:
    """The reference parse of the header: ``json`` plus a check of every field."""
    try:
        h = json.loads(head.decode("utf-8"))
        if not isinstance(h, dict):
            raise TypeError("the header is not a JSON object")
        if h["v"] != FORMAT_VERSION:
            raise fail(f"unsupported record format version {h['v']!r}")
        header = _checked_header(h, expect_sequence)
        store_id, codec, ttl = h["store"], h["codec"], h["ttl"]
        if not isinstance(store_id, str) or not isinstance(codec, str):
            raise TypeError("store and codec must be strings")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)):
            raise TypeError("ttl must be a number or null")
    except CheckpointDecodeError:
        raise
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise fail(f"malformed record header: {exc}") from None
    return header, store_id, codec, ttl, h["seq"]


def _fast_header(
    head: bytes, expect_sequence: int | None
) -> tuple[CheckpointHeader, str, str, float | None, int | None] | None:
    """The header parsed by msgspec, or ``None`` to leave it to :func:`_parse_header`
    (see :func:`_fast_values`)."""
    fast = _fast_values(head, expect_sequence)
    if fast is None:
        return None
    values, store, codec, ttl, seq = fast
    return trusted_header(values), store, codec, ttl, seq


def _fast_values(
    head: bytes, expect_sequence: int | None
) -> tuple[dict[str, Any], str, str, float | None, int | None] | None:
    """The header's field values parsed by msgspec, or ``None`` to leave them to
    :func:`_parse_header`.

    Kept only if re-encoding gives back these exact bytes (so ``json`` would read
    the same keys, values and types: no duplicate key, no ``NaN``, no other
    spelling) and every check of :func:`_checked_header` passes; it never raises.
    """
    try:
        h = _decode_head(head)
        if _encode_json(h) != head or h.v != FORMAT_VERSION:
            return None
        seq = h.seq
        if seq is None:
            seq = expect_sequence
            if type(seq) is not int:
                return None
        if seq < 1:
            return None
        # fromisoformat gives a naive datetime or one with a fixed-offset timezone,
        # whose utcoffset() is never None: a tzinfo is exactly what _aware requires
        created = _fromiso(h.created)
        updated = created if h.updated == h.created else _fromiso(h.updated)
        expires = None if h.expires is None else _fromiso(h.expires)
        if (
            created.tzinfo is None
            or updated.tzinfo is None
            or (expires is not None and expires.tzinfo is None)
        ):
            return None
    except Exception:
        return None
    values = {
        "id": h.id,
        "stream": h.stream,
        "sequence": seq,
        "created_at": created,
        "updated_at": updated,
        "etag": h.etag,
        "parent_id": h.parent,
        "tags": h.tags,
        "metadata": h.meta,
        "expires_at": expires,
    }
    return values, h.store, h.codec, h.ttl, h.seq


def _fast_head(fields: dict[str, Any]) -> bytes | None:
    """The header bytes from msgspec, or ``None`` to leave them to ``json``.

    Unlike ``json`` (``allow_nan=False``), msgspec writes a non-finite float as
    ``null``, so metadata or a TTL holding one goes to ``json``, which refuses it as
    before; so does anything msgspec will not encode (a ``str`` subclass, say).
    """
    ttl = fields["ttl"]
    if (ttl is not None and ttl - ttl != 0.0) or not _finite(fields["meta"]):
        return None
    try:
        return msgspec.json.encode(fields)
    except Exception:
        return None


def _finite(obj: Any) -> bool:
    """Whether a plain JSON tree holds no NaN or infinity."""
    t = type(obj)
    if t is dict:
        children: Any = obj.values()
    elif t is list or t is tuple:
        children = obj
    elif t is float:
        return bool(obj - obj == 0.0)
    else:
        return True
    if _NO_FLOAT.issuperset(map(type, children)):
        return True
    return all(_finite(x) for x in children)


def _aware(value: object, name: str) -> datetime:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be an ISO timestamp string")
    parsed = datetime.fromisoformat(value)
    if parsed.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware")
    return parsed


def _text(value: object, name: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string")
    return value


def _checked_header(h: dict[str, Any], expect_sequence: int | None = None) -> CheckpointHeader:
    """The header of a parsed envelope, every field type-checked (no pydantic pass).

    A positional record (``"seq": null``) takes ``expect_sequence``."""
    seq = h["seq"]
    if seq is None:
        if expect_sequence is None:
            raise TypeError("a positional record (seq null) needs the sequence it is stored at")
        seq = expect_sequence
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise TypeError("seq must be a positive integer")
    tags, meta = h["tags"], h["meta"]
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        raise TypeError("tags must map strings to strings")
    if not isinstance(meta, dict):
        raise TypeError("meta must be an object")
    expires = h["expires"]
    return trusted_header(
        {
            "id": _text(h["id"], "id"),
            "stream": _text(h["stream"], "stream"),
            "sequence": seq,
            "created_at": _aware(h["created"], "created"),
            "updated_at": _aware(h["updated"], "updated"),
            "etag": _text(h["etag"], "etag"),
            "parent_id": _text(h["parent"], "parent", optional=True),
            "tags": tags,
            "metadata": meta,
            "expires_at": None if expires is None else _aware(expires, "expires"),
        }
    )
