"""The bytes of the file backend's ``state`` file and its journal; pure, no I/O.

The state file holds the high-water mark, the sync mark and the journal of the
operation in progress, in two checksummed copies (:class:`State`). What a
lock-free reader may show is derived from it (:func:`visible_cap`). The file
names and the other small files are in :mod:`.format`, which re-exports all of
this.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BATCH_COMMITTED",
    "BATCH_OPS",
    "BATCH_PENDING",
    "STATE_COPY",
    "STATE_SIZE",
    "STREAM_SEP",
    "Journal",
    "State",
    "visible_cap",
]

# json.dumps builds a new encoder whenever it gets options; the save path reuses one.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True)

STATE_COPY = 2048
STATE_SIZE = 2 * STATE_COPY


# The save path builds a Journal, two States and a Slot per save; frozen dataclasses
# pay for object.__setattr__ on every field, so these are plain slotted dataclasses
# that the code treats as immutable values.
@dataclass(slots=True)
class Journal:
    """The multi-step operation in progress, so a crash can be finished or undone.

    ``op`` is ``insert``, ``update``, ``delete``, or a batch (:data:`BATCH_OPS`);
    ``stream`` is the index file name (for a delete, one or more joined by ``/``,
    which no index file name contains); ``seq`` the record (``lo``..``hi`` for
    deletes and batches); ``path`` the record file and ``tmp`` a temp file (both
    relative to the root) that must not outlive the operation.
    """

    op: str
    stream: str
    seq: int = 0
    lo: int = 0
    hi: int = 0
    path: str | None = None
    tmp: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "stream": self.stream,
            "seq": self.seq,
            "lo": self.lo,
            "hi": self.hi,
            "path": self.path,
            "tmp": self.tmp,
        }

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
    """The ``state`` file: two checksummed copies, the newer valid one wins.

    ``hwm`` is the sequence high-water mark; ``synced`` is the sequence up to which
    the soft indexes were last fsynced (the sync mark); ``boot`` the boot id of the
    kernel that last checked them; ``ids_used`` the occupied id-table slots.
    """

    gen: int = 0
    hwm: int = 0
    synced: int = 0
    boot: str | None = None
    ids_used: int = 0
    journal: Journal | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Set when read back and the other copy was written but is invalid: a torn write,
    #: so this copy may be one generation old (never stored).
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
        """The next generation with some fields changed (the save path calls this
        twice per save, so it avoids ``dataclasses.replace``)."""
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
        """How many stream index files the store has (``None`` in a store written
        before this was recorded): fewer files than this means one went missing."""
        value = self.extra.get("streams")
        return value if isinstance(value, int) else None

    @property
    def orphan(self) -> tuple[int, str] | None:
        """The newest damaged record whose stream could not be told, if any: the
        ``get_latest`` of a stream whose winner is older than it raises (see
        ``docs/file-backend.md``)."""
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
        # Written twice per save: formatted by hand (every string is checked to need no
        # JSON escaping), which is several times faster than json.dumps.
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
        """The newest valid copy in ``data``, or ``None`` if neither is valid.

        The result is marked ``torn`` when the other copy is damaged: the file is
        short, a copy fails its checksum, or a copy is all zeros although both have
        been written (generation 2 or more), so this copy may lag one write."""
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
                    zeros += 1  # all zeros: never written (a new store), or wiped
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
            journal = doc.pop("journal")
            known = {"hwm", "synced", "boot", "ids_used"}
            return cls(
                gen=best[0],
                hwm=int(doc["hwm"]),
                synced=int(doc["synced"]),
                boot=doc["boot"],
                ids_used=int(doc["ids_used"]),
                journal=None if journal is None else Journal.from_json(journal),
                extra={k: v for k, v in doc.items() if k not in known},
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


#: Journal ops of a ``save_many`` (sequences ``lo``..``hi``): ``batch`` while its
#: record files are being written (recovery removes them: roll back), ``batched``
#: once they are all written and durable (recovery indexes them: roll forward).
#: Readers hide ``lo``..``hi`` while either is in the journal.
BATCH_PENDING = "batch"
BATCH_COMMITTED = "batched"
BATCH_OPS = frozenset({BATCH_PENDING, BATCH_COMMITTED})
#: Joins the index file names of a delete that spans streams.
STREAM_SEP = "/"


def visible_cap(state: State | None, *, from_records: bool = False) -> int | None:
    """The highest sequence a reader that read ``state`` may show (``None``: no
    limit). Anything above was saved after the read began, or belongs to a
    ``save_many`` that is not complete: hiding it keeps a batch all-or-nothing
    for readers, who take no lock. A committed batch (``batched``) is hidden
    from reads through the indexes, which may hold part of it, but not from
    reads of the record files (``from_records``), which hold all of it. A torn
    state (a concurrent write, or damage) gives no limit rather than one that
    may lag an acknowledged save."""
    if state is None:
        return None
    journal = state.journal
    if journal is not None and (
        journal.op == BATCH_PENDING or (journal.op == BATCH_COMMITTED and not from_records)
    ):
        return journal.lo - 1
    return None if state.torn else state.hwm
