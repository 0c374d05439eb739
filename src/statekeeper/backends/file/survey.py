"""A read-only walk of a whole file store (:func:`take_survey`, O(store)): every
record file, and what the old stream indexes, the id table and the state say of
them; and the reads answered from it when the indexes cannot be trusted.

A record file under its final name is an acknowledged checkpoint, readable or
not (its name gives its sequence and id). A damaged one's stream is recovered
from, in order: a CRC-valid slot of an old stream index naming that sequence and
id (even under a damaged header); the journal, when it names that record's save;
the header left in its bytes, when it parses, names this very record and a stream
the store is known to have. One none of these tells is an *orphan*: the
``get_latest`` of any stream whose winner is older raises naming it.

The ``view_*`` reads give the answers the rebuilt indexes would: the newest
record, or a :class:`~statekeeper.errors.CheckpointDecodeError` naming a damaged
one, never ``None``, ``CheckpointNotFound`` or an older checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..._core.query import ScanQuery
from ..._core.validate import skipped_from
from ...errors import CheckpointDecodeError
from ...models import Skipped
from ...record import StoredRecord
from . import layout as fmt
from .files import Files, RecordProblem
from .indexes import RO, IndexDamaged, open_regular
from .io import read_exact

__all__ = [
    "Entry",
    "OldIndex",
    "Survey",
    "orphan_error",
    "orphans_digest",
    "take_survey",
    "view_get",
    "view_info",
    "view_latest",
    "view_scan",
    "view_streams",
]

_PREFIX = re.compile(rb"SK1 (\d{1,9}) (\d{1,10}) [0-9a-f]{8}\n")


@dataclass
class Entry:
    """One record file, intact (``record``) or damaged (``error``); ``stream`` is
    the record's, or the one recovered for a damaged record (``None``: an orphan)."""

    seq: int
    cid: str
    record: StoredRecord | None
    error: CheckpointDecodeError | None
    stream: str | None = None
    #: Not a regular single-link file (a FIFO, a link): also reported as foreign.
    planted: str | None = None
    hint: str | None = None


@dataclass
class OldIndex:
    """What an existing stream index file still says, slot by slot."""

    sfile: str
    stream: str | None
    slots: list[fmt.Slot] = field(default_factory=list)
    damaged: str | None = None


@dataclass
class Survey:
    entries: list[Entry] = field(default_factory=list)
    #: ``(root-relative location, reason)`` of files that are no record of this store.
    foreign: list[tuple[str, str]] = field(default_factory=list)
    #: ``(bucket, name)`` of non-empty temp files no write is using (an empty one, a
    #: writer's spare or one cut before its first byte, is no problem).
    temps: list[tuple[int, str]] = field(default_factory=list)
    indexes: dict[str, OldIndex] = field(default_factory=dict)
    #: Live ``(key, seq)`` entries of the id table; ``None`` if it is unusable.
    ids: list[tuple[int, int]] | None = None
    ids_damaged: str | None = None
    ids_garbage: int = 0
    state: fmt.State | None = None
    state_problem: str | None = None
    #: The highest sequence anything in the store mentions.
    top: int = 0

    @property
    def orphans(self) -> list[Entry]:
        return [e for e in self.entries if e.record is None and e.stream is None]


def take_survey(files: Files) -> Survey:
    """Walk the store; writes nothing."""
    s = Survey()
    for name in sorted(files.io.listdir(files.fd("root"))):
        if name not in fmt.ROOT_NAMES and not (name.startswith(".") and name.endswith(".tmp")):
            s.foreign.append((name, "not a file of a statekeeper file store"))
    _survey_state(files, s)
    _survey_records(files, s)
    _survey_indexes(files, s)
    _survey_ids(files, s)
    _resolve_streams(s)
    seqs = [e.seq for e in s.entries]
    seqs += [seq for _, name in s.temps if (seq := fmt.parse_temp_name(name)) is not None]
    seqs += [slot.seq for idx in s.indexes.values() for slot in idx.slots]
    seqs += [seq for _, seq in s.ids or []]
    if s.state is not None:
        seqs.append(s.state.hwm)
        if s.state.journal is not None:
            seqs += [s.state.journal.seq, s.state.journal.hi]
    s.top = max([s.top, *seqs])
    return s


def _survey_state(files: Files, s: Survey) -> None:
    fd = files.fd_table.get("state")
    if fd is None:
        s.state_problem = "the state file is missing"
        return
    raw = read_exact(files.io, fd, fmt.STATE_SIZE + 1, 0)
    s.state = fmt.State.from_bytes(raw)
    if s.state is None:
        s.state_problem = "both copies of the state file are unreadable"
    elif s.state.torn:
        s.state_problem = "one copy of the state file is damaged (a torn write?)"


def _survey_records(files: Files, s: Survey) -> None:
    journal = s.state.journal if s.state is not None else None

    def damaged(name: str, number: int | None, reason: str) -> None:
        s.foreign.append((f"{fmt.RECORDS_DIR}/{name}", reason))

    for bucket, bfd, names in files.walk(damaged=damaged):
        for name in sorted(names):
            _survey_file(files, s, bfd, bucket, name, journal)


def _survey_file(
    files: Files, s: Survey, bfd: int, bucket: int, name: str, journal: fmt.Journal | None
) -> None:
    where = f"{fmt.RECORDS_DIR}/{fmt.bucket_name(bucket)}/{name}"
    parsed = fmt.parse_record_name(name)
    if parsed is None or fmt.bucket_of(parsed[0]) != bucket:
        if parsed is None and fmt.parse_temp_name(name) is not None:
            if files.stray_temp(bfd, name, where, journal):
                s.temps.append((bucket, name))
            return
        s.foreign.append((where, "not a record of this store (a planted or misplaced file)"))
        return
    seq, cid = parsed
    try:
        data = files.read_file(bfd, name)
    except RecordProblem as exc:
        error = files.decode_error(exc.reason, seq, cid)
        s.entries.append(Entry(seq, cid, None, error, planted=exc.reason))
        return
    if data is None:
        return  # removed since the listing
    try:
        s.entries.append(Entry(seq, cid, files.decode(data, seq, cid), None))
    except CheckpointDecodeError as exc:
        s.entries.append(Entry(seq, cid, None, exc, hint=_stream_hint(data, seq, cid)))


def _stream_hint(data: bytes, seq: int, cid: str) -> str | None:
    """The stream a damaged record's header still names, if it names this record."""
    m = _PREFIX.match(data)
    if m is None:
        return None
    try:
        head = json.loads(data[m.end() : m.end() + int(m[1])])
    except ValueError:
        return None
    if not isinstance(head, dict) or head.get("seq") != seq or head.get("id") != cid:
        return None
    stream = head.get("stream")
    return stream if isinstance(stream, str) and stream else None


def _survey_indexes(files: Files, s: Survey) -> None:
    io = files.io
    streams = files.fd_table.get("streams")
    if streams is None:
        return
    for sfile in sorted(io.listdir(streams)):
        if sfile.startswith(".") and sfile.endswith(".tmp"):
            continue
        if sfile.startswith(".") or not sfile.endswith(".idx"):
            s.foreign.append((f"{fmt.STREAMS_DIR}/{sfile}", "not a stream index"))
            continue
        s.indexes[sfile] = _read_index(files, streams, sfile)


def _read_whole(files: Files, name: str, dir_fd: int) -> bytes | str | None:
    """The bytes of the regular file ``name``, why not (a ``str``), or ``None`` if
    it is missing."""
    try:
        fd, st = open_regular(files.io, name, RO, dir_fd)
    except FileNotFoundError:
        return None
    except IndexDamaged as exc:
        return str(exc)
    try:
        return read_exact(files.io, fd, st.st_size, 0)
    finally:
        files.io.close(fd)


def _read_index(files: Files, streams: int, sfile: str) -> OldIndex:
    old = OldIndex(sfile, fmt.stream_from_file_name(sfile))
    data = _read_whole(files, sfile, streams)
    if not isinstance(data, bytes):
        old.damaged = data or "it vanished while being read"
        return old
    try:
        old.stream = fmt.parse_index_header(data[: fmt.IDX_HEADER_SIZE], files.store_id)
        if fmt.stream_file_name(old.stream) != sfile:
            old.damaged = f"it names stream {old.stream!r}, which lives elsewhere"
            old.stream = fmt.stream_from_file_name(sfile)
    except (ValueError, UnicodeDecodeError) as exc:
        old.damaged = f"its header is damaged ({exc})"
    body = data[fmt.IDX_HEADER_SIZE :]
    bad = 0
    for at in range(0, len(body) - fmt.SLOT_SIZE + 1, fmt.SLOT_SIZE):
        slot = fmt.Slot.from_bytes(body[at : at + fmt.SLOT_SIZE])
        if slot is None:
            bad += 1
        else:
            old.slots.append(slot)
    if old.damaged is None:
        if bad:
            old.damaged = f"{bad} slot(s) are corrupt"
        elif len(body) % fmt.SLOT_SIZE:
            old.damaged = "it ends in a torn slot"
        elif any(a.seq >= b.seq for a, b in zip(old.slots, old.slots[1:], strict=False)):
            old.damaged = "its slots are out of order"
    return old


def _survey_ids(files: Files, s: Survey) -> None:
    data = _read_whole(files, fmt.IDS_NAME, files.fd("root"))
    if not isinstance(data, bytes):
        s.ids_damaged = data or f"{fmt.IDS_NAME} is missing"
        return
    try:
        capacity = fmt.parse_ids_header(data[: fmt.IDS_HEADER_SIZE], files.store_id)
    except (ValueError, UnicodeDecodeError) as exc:
        s.ids_damaged = f"{fmt.IDS_NAME}: {exc}"
        return
    table = data[fmt.IDS_HEADER_SIZE :]
    if len(table) != capacity * fmt.IDS_SLOT.size:
        s.ids_damaged = f"{fmt.IDS_NAME} is {len(data)} bytes, not the size its header says"
        return
    live: list[tuple[int, int]] = []
    for key, seq in fmt.IDS_SLOT.iter_unpack(table):
        if key == 0 and seq == 0:
            continue
        if key == 0 or seq & ~fmt.TOMBSTONE == 0:
            s.ids_garbage += 1
        elif seq & fmt.TOMBSTONE:
            # A deleted sequence is still used: it bounds the high-water mark.
            s.top = max(s.top, seq & ~fmt.TOMBSTONE)
        else:
            live.append((key, seq))
    s.ids = live


def _resolve_streams(s: Survey) -> None:
    """Give each record its stream: its own, or one recovered for a damaged one."""
    by_sfile: dict[str, str] = {}
    for e in s.entries:
        if e.record is not None:
            e.stream = e.record.stream
            by_sfile.setdefault(fmt.stream_file_name(e.record.stream), e.record.stream)
    named: dict[tuple[int, str], str] = {}
    for old in s.indexes.values():
        if old.stream is not None and fmt.stream_file_name(old.stream) == old.sfile:
            by_sfile.setdefault(old.sfile, old.stream)
        for slot in old.slots:
            if slot.live:
                named.setdefault((slot.seq, slot.cid), old.sfile)
    journal = s.state.journal if s.state is not None else None
    saving = None  # (record name, index file) of the save the journal names
    if journal is not None and journal.op == "insert" and journal.path:
        saving = (journal.path.rsplit("/", 1)[-1], journal.stream)
    known = set(by_sfile.values())
    for e in s.entries:
        if e.record is not None:
            continue
        sfile = named.get((e.seq, e.cid))
        if sfile is None and saving is not None and saving[0] == fmt.record_name(e.seq, e.cid):
            sfile = saving[1]
        if sfile is not None and sfile in by_sfile:
            e.stream = by_sfile[sfile]
        elif e.hint is not None and e.hint in known:
            e.stream = e.hint


def orphans_digest(orphans: Iterable[tuple[int, str]]) -> str:
    """The digest a rebuild stores in ``state`` (``extra["orphans"]``) of the
    ``(sequence, id)`` of every orphan it kept."""
    h = hashlib.blake2b(digest_size=8)
    for seq, cid in sorted(orphans):
        h.update(b"%d %s\n" % (seq, cid.encode()))
    return h.hexdigest()


# -- reads answered from the survey ----------------------------------------------------


def orphan_error(
    error: CheckpointDecodeError, stream: str, *, listed: bool = False
) -> CheckpointDecodeError:
    """The error ``get_latest(stream)`` raises for a newer damaged record whose
    stream cannot be told (it may be this stream's newest checkpoint); ``listed``:
    the one ``list(stream)`` reports it with, in ``skipped``, on every page of any
    stream whose range holds its sequence (it may be one of this stream's)."""
    may_be = (
        f"one of the checkpoints of {stream!r}"
        if listed
        else f"the newest checkpoint of {stream!r} and no older one is returned"
    )
    return CheckpointDecodeError(
        f"{error.reason}; its stream cannot be told from what is left of it, so it may be "
        f"{may_be}. Restore the file, or remove it with repair(drop_damaged=True) "
        "(statekeeper repair --drop-damaged)",
        id=error.id,
        location=error.location,
        sequence=error.sequence,
    )


def view_latest(s: Survey, stream: str, now: datetime) -> StoredRecord | None:
    for e in reversed(s.entries):
        if e.record is not None:
            if e.record.stream == stream and not e.record.is_expired(now):
                return e.record
            continue
        assert e.error is not None
        if e.stream == stream:
            raise e.error
        if e.stream is None:
            raise orphan_error(e.error, stream)
    return None


def view_get(s: Survey, cid: str, now: datetime) -> StoredRecord | None:
    for e in reversed(s.entries):
        if e.cid != cid:
            continue
        if e.record is None:
            assert e.error is not None
            raise e.error
        return None if e.record.is_expired(now) else e.record
    return None


def view_scan(s: Survey, q: ScanQuery) -> list[StoredRecord | Skipped]:
    """The entries of ``q``: the records of its stream and, as skipped, its damaged
    records and every damaged record whose stream cannot be told (an orphan, which
    ``get_latest`` also raises for: it may be one of this stream's)."""
    assert q.stream is not None
    entries: list[Entry] = [e for e in s.entries if e.stream in (q.stream, None)]
    if q.order == "desc":
        entries.reverse()
    out: list[StoredRecord | Skipped] = []
    for e in entries:
        if q.bound is not None and (e.seq <= q.bound if q.order == "asc" else e.seq >= q.bound):
            continue
        if e.record is None:
            assert e.error is not None
            error = (
                e.error if e.stream is not None else orphan_error(e.error, q.stream, listed=True)
            )
            out.append(skipped_from(error, e.cid, e.seq))
        elif not e.record.is_expired(q.now) and all(
            e.record.header.tags.get(k) == v for k, v in q.tags.items()
        ):
            out.append(e.record)
        if len(out) >= q.limit:
            break
    return out


def view_streams(s: Survey, now: datetime) -> list[str]:
    names = {
        e.stream
        for e in s.entries
        if e.stream is not None and (e.record is None or not e.record.is_expired(now))
    }
    return sorted(names)


def view_info(s: Survey, now: datetime) -> dict[str, Any]:
    """``info()`` from the records: live checkpoints and streams at ``now``, the
    expired ones apart (an unreadable record counts as live: it is not known to
    have expired)."""
    gone = [e for e in s.entries if e.record is not None and e.record.is_expired(now)]
    live = [e for e in s.entries if not (e.record is not None and e.record.is_expired(now))]
    return {
        "checkpoints": len(live),
        "streams": len({e.stream for e in live if e.stream is not None}),
        "high_water_mark": s.top,
        **({"expired": len(gone)} if gone else {}),
    }
