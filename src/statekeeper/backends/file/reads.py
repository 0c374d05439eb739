"""The read side of the file backend's engine: lock-free, strict where it must be.

Readers take no lock. Writers only ever replace whole files by rename and write
index slots that carry a CRC, so a reader sees every file either before or after a
change. Where a reader's two looks disagree (a slot said live, its record is gone)
it looks again; if the disagreement persists across a few tries it is damage,
reported as such, never papered over with an older checkpoint.
"""

from __future__ import annotations

import contextlib
import enum
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, Literal, overload

from ..._protocol import ScanQuery, skipped_from
from ...errors import CheckpointDecodeError, CheckpointNotFound, ConcurrentModificationError
from ...models import Checkpoint, Skipped
from ...record import StateDecoder, StoredRecord
from . import format as fmt
from .core import EngineCore, RecordProblem, Txn
from .index import IdTable, IndexDamaged, StreamIndex
from .io import read_exact
from .orphans import OrphanKey, merge_orphans, orphans_key
from .survey import Survey, take_survey
from .view import orphan_error, view_get, view_latest, view_scan

__all__ = ["HOP", "Hop", "ReadsMixin"]

#: How many times a read that a concurrent writer disturbed is retried.
READ_RETRIES = 8
#: The most index slots and record files a point read looks at on the event loop's
#: thread (see :meth:`ReadsMixin.latest_nowait`) before it leaves the rest to the
#: worker: a tail of expired checkpoints is walked there, not on the loop.
_NOWAIT_SLOTS = 16
_NOWAIT_RECORDS = 2
#: The most slots a page scan reads at once at first: a page of up to this many
#: candidates (``list`` asks one more than its limit) reads the slots it needs in one
#: ``pread`` of up to 64 KiB, when nothing is filtered out.
_PAGE_SLOTS = 256
#: What a page scan on the event loop's thread (:meth:`ReadsMixin.scan_nowait`) may
#: pass over beyond the page itself before it leaves the page to the worker: index
#: slots that are deleted, expired or past the cap, and records it reads but does
#: not list (expired, or without the tags asked for). A sparse tag filter or a long
#: run of deleted checkpoints is walked in the worker, not on the loop.
_NOWAIT_EXTRA_SLOTS = 64
_NOWAIT_EXTRA_RECORDS = 16
#: Deleted entries of an id :meth:`ReadsMixin.get_nowait` checks (one ``lstat`` each).
_NOWAIT_DELETED = 4
#: The largest record file read on the event loop's thread: a bigger one is read in
#: the worker, so a cold read of a large file never stalls the loop.
NOWAIT_RECORD_BYTES = 1 << 20


#: What a scan gives: records, skipped entries and, on a listed page's scan (with
#: decoders), checkpoints already decoded.
Entry = StoredRecord | Checkpoint | Skipped
#: The probe a page scan runs after the page (see :func:`statekeeper._paging.probe_query`).
ProbeOf = Callable[[list[Entry]], ScanQuery]
#: A store's state codecs by name (what a listed page's records are decoded with).
Decoders = Mapping[str, StateDecoder]


class Hop(enum.Enum):
    """The answer of a ``*_nowait`` read that leaves the call to the worker thread."""

    HOP = "hop"


#: Returned by :meth:`ReadsMixin.latest_nowait` and :meth:`ReadsMixin.get_nowait`:
#: run the normal read (:meth:`ReadsMixin.latest`, :meth:`ReadsMixin.get`) in a worker.
HOP: Final = Hop.HOP


#: Stream indexes and bucket directories a thread's point reads keep open.
_KEPT_INDEXES = 32
_KEPT_BUCKETS = 4


class _Kept:
    """The descriptors one thread's point reads and pages
    (:meth:`ReadsMixin.latest_nowait`, :meth:`ReadsMixin.get_nowait`,
    :meth:`ReadsMixin.scan_nowait`) keep between calls, so that a read costs one
    ``lstat`` per file instead of an open, an ``fstat`` and a close. Each is used
    only after that ``lstat`` shows the same file (device and inode, a regular file
    with one link, or a directory) under its name: a file replaced by rename is
    opened afresh, exactly as a fresh open would find it."""

    __slots__ = ("buckets", "ids", "indexes")

    def __init__(self) -> None:
        self.indexes: OrderedDict[str, StreamIndex] = OrderedDict()
        #: The id table and the bytes of its header when it was verified.
        self.ids: tuple[IdTable, bytes] | None = None
        self.buckets: OrderedDict[int, tuple[int, tuple[int, int]]] = OrderedDict()

    def fds(self) -> list[int]:
        fds = [idx.fd for idx in self.indexes.values()]
        fds += [fd for fd, _ in self.buckets.values()]
        if self.ids is not None:
            fds.append(self.ids[0].fd)
        self.indexes.clear()
        self.buckets.clear()
        self.ids = None
        return fds


class _Retry(Exception):
    """A concurrent writer changed what this read was looking at."""


class _NoWait(Exception):
    """A scan on the event loop's thread met what only the worker decides."""


class ReadsMixin(EngineCore):
    """Strict ``latest``/``get``, tolerant ``scan``, and the listings."""

    #: ``(mtime, size)`` of ``streams/`` when it last held every index ``state`` counts.
    _streams_seen: tuple[int, int] | None = None

    def recover_pending(self) -> Txn:
        """Finish a crashed writer's journal (the engine implements it)."""
        raise NotImplementedError

    def heal(self) -> fmt.State | None:
        """If a writer died mid-operation and nobody holds the lock now, finish its
        work before reading, so no reader sees a half-done delete or update for long.
        Returns the state (``None``: unreadable, so the reads go to the records).

        Save entries are left to the next writer: every completed save leaves one
        (see ``_insert_done``), and a save that died before its index entries is one
        nobody was told about, which strict reads do not show anyway. A read-only
        store heals nothing. A torn read of ``state`` is usually a writer's write
        in flight, so it is read again (a few times) before it is believed."""
        state = self.read_state()
        for _ in range(3):
            if state is None or not state.torn:
                break
            state = self.read_state()
        if self.read_only or state is None or state.journal is None or state.journal.op == "insert":
            return state
        with self.locked(wait=False) as got:
            if got:
                self.recover_pending()
                return self.read_state()
        return state

    def _index_missing(self, state: fmt.State) -> bool:
        """Whether a stream index file went missing: fewer index files than ``state``
        counts. Costs one ``fstat`` unless ``streams/`` changed since it last held
        them all (then one listing)."""
        seen = self._streams_unchanged(state)
        if seen is True:
            return False
        missing = len(self.index_files()) < (state.streams or 0)
        if not missing:
            self._streams_seen = seen
        return missing

    def _streams_unchanged(self, state: fmt.State) -> Literal[True] | tuple[int, int]:
        """``True`` if no stream index can be missing, known from ``state`` and one
        ``fstat`` of ``streams/`` (it did not change since it last held every index
        ``state`` counts); else what that ``fstat`` saw, for :meth:`_index_missing`,
        which lists the directory."""
        if not state.streams:
            return True
        st = self.io.fstat(self.fd("streams"))
        seen = (st.st_mtime_ns, st.st_size)
        return True if seen == self._streams_seen else seen

    def _records_only(self, state: fmt.State | None) -> bool:
        """Whether this read must go to the records (the indexes cannot be trusted)."""
        return state is None or self.degraded is not None

    def _with_orphans(
        self, page: list[Entry], q: ScanQuery, state: fmt.State | None, cap: int | None
    ) -> list[Entry]:
        """``page``, a scan of ``q`` from its stream index, with the damaged records
        of unknown stream in its range (see :mod:`.orphans`): those ``get_latest``
        raises for. Nothing to do, and nothing read, while ``state`` marks none."""
        key = orphans_key(state)
        if key is None:
            return page
        assert q.stream is not None
        stream = q.stream

        def look(seq: int, cid: str) -> StoredRecord | Skipped | None:
            if self._unseen(seq, True, cap):
                return None
            try:
                got = self.load_record(seq, cid)
            except CheckpointDecodeError as exc:
                return skipped_from(orphan_error(exc, stream, listed=True), cid, seq)
            if got is None or got[0].stream != stream or not wanted(got[0], q):
                return None  # deleted since, or readable again (and another stream's)
            return got[0]

        return merge_orphans(page, q, self._orphans(key), look)

    def _orphans(self, key: OrphanKey) -> list[tuple[int, str]]:
        """The ``(sequence, id)`` of the damaged records of unknown stream, ascending:
        from a survey of the records, kept while ``state`` says ``key``."""
        kept: tuple[OrphanKey, list[tuple[int, str]]] | None = self.__dict__.get("_orphans_kept")
        if kept is not None and kept[0] == key:
            return kept[1]
        found = sorted((e.seq, e.cid) for e in self.survey().orphans)
        self.__dict__["_orphans_kept"] = (key, found)
        return found

    def survey(self) -> Survey:
        """The whole store, from its records (O(store); see :mod:`.view`)."""
        return take_survey(self)

    def survey_upto(self, state: fmt.State | None) -> Survey:
        """:meth:`survey` without the records a reader that read ``state`` must
        not see (see :func:`.format.visible_cap`)."""
        cap = fmt.visible_cap(state, from_records=True)
        s = self.survey()
        if cap is not None:
            s.entries = [e for e in s.entries if not self._unseen(e.seq, e.record is None, cap)]
        return s

    def _unseen(self, seq: int, damaged: bool, cap: int | None) -> bool:
        """Whether a reader whose cap is ``cap`` leaves record ``seq`` out. A valid
        record above the cap was saved after the read began; a damaged one is
        left out only while a batch in flight holds its sequence (it is being
        written), since damage above the high-water mark must still be reported."""
        if cap is None or seq <= cap:
            return False
        if not damaged:
            return True
        state = self.read_state()
        journal = state.journal if state is not None else None
        return journal is not None and journal.op in fmt.BATCH_OPS and journal.lo <= seq

    # -- strict reads -------------------------------------------------------------------

    def latest(self, stream: str, now: datetime) -> StoredRecord | None:
        """The live record of ``stream`` with the highest sequence, read from the
        tail of the stream index: no other record is decoded, whatever the size of
        the stream or the store. Without a usable index, from the records."""
        state = self.heal()
        cap = fmt.visible_cap(state)
        if self._records_only(state):
            return view_latest(self.survey_upto(state), stream, now)
        assert state is not None
        try:
            got = self._latest_indexed(stream, now, cap)
        except IndexDamaged:
            return view_latest(self.survey_upto(state), stream, now)
        if got is None and self._index_missing(state):
            return view_latest(self.survey_upto(state), stream, now)
        orphan = state.orphan
        if orphan is not None and orphan[0] > (got.sequence if got is not None else 0):
            return self._past_orphan(orphan, stream, now, got)
        return got

    def _past_orphan(
        self, orphan: tuple[int, str], stream: str, now: datetime, got: StoredRecord | None
    ) -> StoredRecord | None:
        """A damaged record of unknown stream is newer than ``stream``'s winner: it
        may be that stream's newest, so raise naming it (unless it is gone, or
        readable again and of another stream)."""
        try:
            found = self.load_record(*orphan)
        except CheckpointDecodeError as exc:
            raise orphan_error(exc, stream) from None
        if found is not None and found[0].stream == stream and not found[0].is_expired(now):
            return found[0]
        return got

    def _latest_indexed(self, stream: str, now: datetime, cap: int | None) -> StoredRecord | None:
        sfile = fmt.stream_file_name(stream)
        now_us = fmt.to_micros(now)
        for _ in range(READ_RETRIES):
            idx = self._index_for_read(sfile)
            if idx is None:
                return None
            try:
                with idx:
                    return self._latest_in(idx, stream, now, now_us, cap)
            except _Retry:
                continue
        raise ConcurrentModificationError(
            f"get_latest({stream!r}) was disturbed by concurrent writers {READ_RETRIES} times "
            f"in a row in the file store at {self.root}; retry"
        )

    def _latest_in(
        self, idx: StreamIndex, stream: str, now: datetime, now_us: int, cap: int | None
    ) -> StoredRecord | None:
        dirs: dict[int, int] = {}
        try:
            return self._latest_walk(idx, stream, now, now_us, dirs, cap)
        finally:
            self.close_dirs(dirs)

    def _latest_walk(
        self,
        idx: StreamIndex,
        stream: str,
        now: datetime,
        now_us: int,
        dirs: dict[int, int],
        cap: int | None,
    ) -> StoredRecord | None:
        for pos, slot in idx.walk(idx.count - 1, -1):
            if not slot.live or slot.expired(now_us) or (cap is not None and slot.seq > cap):
                continue
            got = self.load_record(slot.seq, slot.cid, dirs)
            if got is None:
                if self._slot_changed(idx, pos, slot):
                    raise _Retry
                raise self.decode_error(
                    "the stream index lists it but its record file is missing "
                    "(removed outside statekeeper?)",
                    slot.seq,
                    slot.cid,
                )
            record = got[0]
            if record.stream != stream:
                raise self.decode_error(
                    f"the record belongs to stream {record.stream!r}", slot.seq, slot.cid
                )
            if not record.is_expired(now):
                return record
        return None

    def get(self, cid: str, now: datetime) -> StoredRecord | None:
        """The live record ``cid`` via the id table; ``None`` if missing or expired.
        Without a usable id table, from the records."""
        state = self.heal()
        cap = fmt.visible_cap(state)
        if self._records_only(state):
            return view_get(self.survey_upto(state), cid, now)
        try:
            return self._get_indexed(cid, now, cap)
        except IndexDamaged:
            return view_get(self.survey_upto(state), cid, now)

    def _get_indexed(
        self, cid: str, now: datetime, cap: int | None, table: IdTable | None = None
    ) -> StoredRecord | None:
        """Through the id table (``table``, if the caller has it open). Raises
        :class:`IndexDamaged` (so the caller asks the records) when the table says
        something the record files contradict. A record above ``cap`` is not
        shown (see :func:`.format.visible_cap`); an entry above it is still
        checked against the record files, since a damaged entry can say any
        sequence."""
        key = fmt.id_key(cid)
        for attempt in range(READ_RETRIES):
            if table is not None and attempt == 0:
                candidates, deleted, others = table.lookup_checked(key)
            else:
                with self._ids_for_read() as ids:
                    candidates, deleted, others = ids.lookup_checked(key)
            missing: list[int] = []
            hidden = False
            for seq in candidates:
                if cap is not None and seq > cap:
                    if self._record_exists(seq, cid):
                        hidden = True  # saved after this read began, or a batch in flight
                    else:
                        missing.append(seq)
                    continue
                got = self.load_record(seq, cid)
                if got is None:
                    missing.append(seq)
                    continue
                record = got[0]
                return None if record.is_expired(now) else record
            if not missing:
                if not hidden:
                    self._confirm_absent(cid, deleted, others)
                return None
            with self._ids_for_read() as ids:
                again, _, _ = ids.lookup_checked(key)
            if again != candidates:
                continue
            for seq in missing:
                if not self._sequence_exists(seq):
                    # The table names a sequence no file has: ask the records (a
                    # damaged entry); if they have no such id either, the record
                    # was removed outside statekeeper, and that is not "not found".
                    found = view_get(self.survey_upto(self.read_state()), cid, now)
                    if found is not None:
                        return found
                    raise self.decode_error(
                        "the id table lists it but its record file is missing "
                        "(removed outside statekeeper?)",
                        seq,
                        cid,
                    )
            return None  # the entries were other ids with the same 64-bit hash
        raise ConcurrentModificationError(
            f"load({cid!r}) was disturbed by concurrent writers {READ_RETRIES} times in a row "
            f"in the file store at {self.root}; retry"
        )

    def _confirm_absent(self, cid: str, deleted: list[int], others: list[tuple[int, int]]) -> None:
        """Before answering "no such id": the entries on its probe must agree with
        the record files (id-table slots have no checksum). Raises
        :class:`IndexDamaged` if one does not. Costs a directory listing per other
        entry, and only on this path."""
        if any(self._record_exists(seq, cid) for seq in deleted):
            raise IndexDamaged(f"{fmt.IDS_NAME} marks {cid!r} deleted; its record exists")
        for key, seq in others:
            names = self._names_with_seq(seq)
            if names and not any(fmt.id_key(other) == key for other in names):
                raise IndexDamaged(f"{fmt.IDS_NAME}: the entry for sequence {seq} is damaged")

    def _names_with_seq(self, seq: int) -> list[str]:
        """The ids of the record files with sequence ``seq``."""
        bucket = self.bucket(seq)
        if bucket is None:
            return []
        try:
            parsed = map(fmt.parse_record_name, self.io.listdir(bucket))
            return [p[1] for p in parsed if p is not None and p[0] == seq]
        finally:
            self.close_bucket(bucket)

    def _record_exists(self, seq: int, cid: str) -> bool:
        bucket = self.bucket(seq)
        if bucket is None:
            return False
        try:
            self.io.lstat(fmt.record_name(seq, cid), dir_fd=bucket)
        except FileNotFoundError:
            return False
        finally:
            self.close_bucket(bucket)
        return True

    def read_raw(self, cid: str) -> bytes:
        """The stored bytes of ``cid``, unverified (the conformance kit's backdoor)."""
        with self._ids_for_read() as ids:
            candidates = [seq for _, seq in ids.lookup(fmt.id_key(cid))]
        for seq in candidates:
            bucket = self.bucket(seq)
            if bucket is None:
                continue
            try:
                data = self.read_file(bucket, fmt.record_name(seq, cid))
            except RecordProblem as exc:
                raise self.decode_error(exc.reason, seq, cid) from None
            finally:
                self.close_bucket(bucket)
            if data is not None:
                return data
        raise CheckpointNotFound(cid)

    # -- descriptors the point reads keep -----------------------------------------------

    def _kept(self) -> _Kept:
        """This thread's kept descriptors (see :class:`_Kept`)."""
        table: dict[int, _Kept] = self.__dict__.setdefault("_kept_by_thread", {})
        me = threading.get_ident()
        kept = table.get(me)
        if kept is None:
            kept = table[me] = _Kept()
        return kept

    def close_fds(self) -> None:
        """Close the store's descriptors, and those the point reads keep (no call is
        in flight once the store's own are closed, so none of these is in use)."""
        super().close_fds()
        self.__dict__.pop("_orphans_kept", None)  # a reopen surveys afresh
        table: dict[int, _Kept] = self.__dict__.pop("_kept_by_thread", {})
        for kept in table.values():
            for fd in kept.fds():
                with contextlib.suppress(OSError):
                    self.io.close(fd)

    def _lstat_or_none(self, name: str, dir_fd: int) -> os.stat_result | None:
        try:
            return self.io.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return None

    def _index_kept(self, sfile: str) -> StreamIndex | None:
        """:meth:`_index_for_read` through this thread's kept descriptors: ``None`` if
        there is no such index; raises :class:`IndexDamaged` as the open does."""
        kept = self._kept()
        streams = self.fd("streams")
        st = self._lstat_or_none(sfile, streams)
        idx = kept.indexes.get(sfile)
        if idx is not None:
            if st is not None and _same_regular(st, idx.identity):
                idx.refresh(st.st_size)
                kept.indexes.move_to_end(sfile)
                return idx
            del kept.indexes[sfile]
            self.io.close(idx.fd)
        if st is None:
            return None
        idx = self._index_for_read(sfile)
        if idx is None:
            return None
        idx.keep = True
        kept.indexes[sfile] = idx
        while len(kept.indexes) > _KEPT_INDEXES:
            _, old = kept.indexes.popitem(last=False)
            self.io.close(old.fd)
        return idx

    def _ids_kept(self) -> IdTable:
        """The id table through this thread's kept descriptor: its header is read
        again at every use and must be the bytes verified when it was opened (so
        damage to it is seen as by a fresh open), and its size must still hold its
        slots. Raises :class:`IndexDamaged` as :meth:`IdTable.open` does."""
        kept = self._kept()
        root = self.fd("root")
        st = self._lstat_or_none(fmt.IDS_NAME, root)
        if kept.ids is not None:
            ids, header = kept.ids
            if (
                st is not None
                and _same_regular(st, ids.identity)
                and st.st_size >= fmt.IDS_HEADER_SIZE + ids.capacity * fmt.IDS_SLOT.size
                and read_exact(self.io, ids.fd, fmt.IDS_HEADER_SIZE, 0) == header
            ):
                return ids
            kept.ids = None
            self.io.close(ids.fd)
        ids = IdTable.open(self.io, root, self.store_id)
        try:
            header = read_exact(self.io, ids.fd, fmt.IDS_HEADER_SIZE, 0)
        except BaseException:
            ids.close()
            raise
        ids.keep = True
        kept.ids = (ids, header)
        return ids

    def _bucket_kept(self, seq: int) -> int | None:
        """``seq``'s bucket directory through this thread's kept descriptors (not to
        be closed by the caller); ``None`` if missing."""
        kept = self._kept()
        number = fmt.bucket_of(seq)
        records = self.fd("records")
        name = fmt.bucket_name(number)
        st = self._lstat_or_none(name, records)
        held = kept.buckets.get(number)
        if held is not None:
            if st is not None and stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == held[1]:
                return held[0]
            del kept.buckets[number]
            self.io.close(held[0])
        if st is None:
            return None
        fd = self.open_dir(records, name, create=False)
        if fd is None:
            return None
        try:
            got = self.io.fstat(fd)
        except BaseException:
            self.io.close(fd)
            raise
        kept.buckets[number] = (fd, (got.st_dev, got.st_ino))
        while len(kept.buckets) > _KEPT_BUCKETS:
            _, (old, _) = kept.buckets.popitem(last=False)
            self.io.close(old)
        return fd

    # -- point reads that never wait (for the event loop's thread) ---------------------

    def _state_nowait(self) -> fmt.State | None:
        """The state, if a point read may go ahead without the worker: readable, not
        torn (:meth:`heal` would read it again), no journal that :meth:`heal` could
        finish under the lock or that hides a batch (only a completed save's entry,
        which every save leaves), and indexes this open trusts. ``None``: take the hop.
        Also ``None`` for a thread that holds the write lock (its descriptors are the
        writer's cached ones; the loop's thread never holds it between calls)."""
        if self._holding():
            return None
        state = self.read_state()
        if state is None or state.torn or self.degraded is not None:
            return None
        journal = state.journal
        if journal is not None and journal.op != "insert":
            return None
        return state

    def latest_nowait(self, stream: str, now: datetime) -> StoredRecord | Hop | None:
        """:meth:`latest`, when it is the cheap indexed read, else :data:`HOP` at once.

        It runs on the caller's thread (the event loop's) and reads the state, the
        tail of the stream index and the newest live record file: a few ``pread``,
        ``open`` and ``fstat`` calls on the page cache, with no lock, no sleep and no
        retry. Wherever :meth:`latest` would do more, it answers :data:`HOP` and the
        caller runs :meth:`latest` in a worker, which decides: a torn or unreadable
        state, a journal :meth:`heal` may finish, a degraded open, a damaged or
        missing index (a survey of the records), an orphan newer than the answer, a
        record that is missing, damaged or of another stream (the worker re-looks,
        then raises the same error it always raises), a concurrent writer in the way,
        or more than a few expired checkpoints at the tail. So its answers are
        exactly :meth:`latest`'s, and it never raises
        :class:`~statekeeper.errors.CheckpointDecodeError` itself; OS errors
        propagate as they would from :meth:`latest`."""
        state = self._state_nowait()
        if state is None:
            return HOP
        cap = fmt.visible_cap(state)
        try:
            idx = self._index_kept(fmt.stream_file_name(stream))
            if idx is None:
                got: StoredRecord | Hop | None = None
            else:
                got = self._latest_nowait_in(idx, stream, now, cap)
        except (IndexDamaged, ConcurrentModificationError):
            return HOP
        if got is HOP:
            return HOP
        if got is None and self._streams_unchanged(state) is not True:
            return HOP  # a missing index: the worker lists streams/ (and surveys)
        orphan = state.orphan
        if orphan is not None and orphan[0] > (got.sequence if got is not None else 0):
            return HOP
        return got

    def _latest_nowait_in(
        self, idx: StreamIndex, stream: str, now: datetime, cap: int | None
    ) -> StoredRecord | Hop | None:
        """:meth:`_latest_walk` that stops with :data:`HOP` wherever that one would
        re-look, raise, or keep walking for long."""
        now_us = fmt.to_micros(now)
        loaded = 0
        for seen, (_, slot) in enumerate(idx.walk(idx.count - 1, -1)):
            if seen >= _NOWAIT_SLOTS:
                return HOP
            if not slot.live or slot.expired(now_us) or (cap is not None and slot.seq > cap):
                continue
            loaded += 1
            if loaded > _NOWAIT_RECORDS:
                return HOP
            got = self._load_nowait(slot.seq, slot.cid)
            if got is None or got[0].stream != stream:
                return HOP
            if not got[0].is_expired(now):
                return got[0]
        return None

    @overload
    def _load_nowait(
        self, seq: int, cid: str, seen: dict[int, int] | None = None, decoders: None = None
    ) -> tuple[StoredRecord, bytes] | None: ...
    @overload
    def _load_nowait(
        self, seq: int, cid: str, seen: dict[int, int] | None, decoders: Decoders
    ) -> tuple[StoredRecord | Checkpoint, bytes] | None: ...
    def _load_nowait(
        self,
        seq: int,
        cid: str,
        seen: dict[int, int] | None = None,
        decoders: Decoders | None = None,
    ) -> tuple[StoredRecord | Checkpoint, bytes] | None:
        """:meth:`load_record` of a record file that is there, readable and at most
        :data:`NOWAIT_RECORD_BYTES` long (its ``fstat`` tells, before any read);
        ``None`` for anything else (missing, damaged, large, not a plain file), which
        the worker reads instead and reports as it always does. With ``decoders``,
        :meth:`load_entry` instead (the state decoded where it decodes).

        ``seen`` (one page scan's, which visits buckets in order) holds the kept
        bucket this scan last checked by ``lstat``, used again without one. Keeping
        another bucket may close a kept one, so ``seen`` then forgets the rest."""
        try:
            number = fmt.bucket_of(seq)
            bucket = seen.get(number) if seen is not None else None
            if bucket is None:
                bucket = self._bucket_kept(seq)
                if bucket is None:
                    return None
                if seen is not None:
                    seen.clear()
                    seen[number] = bucket
            # the kept descriptor, handed over as load_record's own: not closed by it
            dirs = {number: bucket}
            if decoders is not None:
                return self.load_entry(seq, cid, dirs, NOWAIT_RECORD_BYTES, decoders)
            return self.load_record(seq, cid, dirs, NOWAIT_RECORD_BYTES)
        except (OSError, IndexDamaged, CheckpointDecodeError):
            return None

    def get_nowait(self, cid: str, now: datetime) -> StoredRecord | Hop | None:
        """:meth:`get`, when it is the cheap indexed read, else :data:`HOP` at once.

        Like :meth:`latest_nowait`: it reads the state, probes the id table and
        reads the record file its entry names, and answers "no such id" only when
        the probe met no other id's entry and each deleted entry of this id is
        confirmed gone by one ``lstat``. Anything else (an entry above the reader's
        cap, a record missing, damaged or unreadable, other entries to check against
        their record files, a damaged or missing id table, and every case
        :meth:`_state_nowait` refuses) is :data:`HOP`, and :meth:`get` in a worker
        decides, as it always has."""
        state = self._state_nowait()
        if state is None:
            return HOP
        cap = fmt.visible_cap(state)
        try:
            candidates, deleted, others = self._ids_kept().lookup_checked(fmt.id_key(cid))
            for seq in candidates:
                if cap is not None and seq > cap:
                    return HOP
                got = self._load_nowait(seq, cid)
                if got is None:
                    return HOP
                return None if got[0].is_expired(now) else got[0]
            if others or len(deleted) > _NOWAIT_DELETED:
                return HOP
            if any(self._record_exists(seq, cid) for seq in deleted):
                return HOP  # the id table is damaged: the worker asks the records
        except (IndexDamaged, ConcurrentModificationError):
            return HOP
        return None

    def scan_nowait(
        self,
        query: ScanQuery,
        probe_of: ProbeOf | None,
        decoders: Decoders | None = None,
    ) -> tuple[list[Entry], ScanQuery | None, list[Entry]] | Hop:
        """:meth:`scan_and_probe` (or, with no ``probe_of``, :meth:`scan`) of one
        stream, when it is the cheap indexed read, else :data:`HOP` at once.

        Like :meth:`latest_nowait`, it runs on the caller's thread (the event
        loop's) with no lock, no sleep and no retry: the state, the stream index
        through this thread's kept descriptor, the page's slots, and each record
        file (``open``, ``fstat``, ``pread``, ``close``; each bucket directory of
        the page checked by one ``lstat``) on the page cache. Wherever the worker's
        scan would do more or answer otherwise, it answers :data:`HOP` and the
        worker scans, exactly as without it: a global or metadata-filtered listing,
        every case :meth:`_state_nowait` refuses, an orphan, a damaged or missing
        index, a writer in the way, more than :data:`_NOWAIT_EXTRA_SLOTS` slots or
        :data:`_NOWAIT_EXTRA_RECORDS` records passed over (deleted or expired
        checkpoints, a sparse tag filter), and a record that is missing, damaged,
        unreadable, larger than :data:`NOWAIT_RECORD_BYTES` or of another stream
        (the worker reports it as skipped, or sees it was deleted meanwhile). So a
        page it returns never holds a :class:`~statekeeper.models.Skipped` entry.
        OS errors propagate as they would from the worker's scan. ``decoders``: the
        page's records whose states decode come back decoded (never the probe's)."""
        if query.stream is None or query.metadata:
            return HOP
        state = self._state_nowait()
        if state is None or state.orphan is not None:
            return HOP  # (a state _state_nowait gives is one the indexes are trusted for)
        cap = fmt.visible_cap(state)
        try:
            idx = self._index_kept(fmt.stream_file_name(query.stream))
            if idx is None:
                return HOP  # a missing index: the worker lists streams/ (and surveys)
            page = self._scan_slots(idx, query, {}, cap, nowait=True, decoders=decoders)
            if probe_of is None:
                return page, None, []
            probe = probe_of(page)
            return page, probe, self._scan_slots(idx, probe, {}, cap, nowait=True)
        except (IndexDamaged, ConcurrentModificationError, _NoWait):
            return HOP

    # -- tolerant scans -----------------------------------------------------------------

    def _scan_all(self, q: ScanQuery, cap: int | None) -> list[StoredRecord | Skipped]:
        """Every stream in global sequence order (the listing mixin has it)."""
        raise NotImplementedError

    def scan(self, query: ScanQuery, decoders: Decoders | None = None) -> list[Entry]:
        """The entries of ``query`` (``decoders``: see :meth:`_scan_slots`). A scan of
        one stream also reports, as skipped, each damaged record of unknown stream
        in its range (see :mod:`.orphans`), from the index or from the records."""
        state = self.heal()
        cap = fmt.visible_cap(state)
        # the paths off the stream index give records (list_page decodes them)
        if query.stream is None:
            # from the bucket directories: no index needed
            return list[Entry](self._scan_all(query, cap))
        if self._records_only(state):
            return list[Entry](view_scan(self.survey_upto(state), query))
        assert state is not None
        try:
            idx = self._index_for_read(fmt.stream_file_name(query.stream))
            if idx is None:
                if self._index_missing(state):
                    return list[Entry](view_scan(self.survey_upto(state), query))
                return self._with_orphans([], query, state, cap)
            with idx:
                page = self._scan_index(idx, query, cap, decoders)
            return self._with_orphans(page, query, state, cap)
        except IndexDamaged:
            return list[Entry](view_scan(self.survey_upto(state), query))

    def scan_and_probe(
        self, query: ScanQuery, probe_of: ProbeOf, decoders: Decoders | None = None
    ) -> tuple[list[Entry], ScanQuery, list[Entry]]:
        """:meth:`scan` of ``query``, then of ``probe_of(page)``: a page and the probe
        that decides its other cursor. On the indexed path both read one ``state``
        (one cap: the probe sees what the page saw) through one open stream index
        and the same bucket descriptors; from the records (one survey for both)
        where :meth:`scan` would go there; anywhere else, two :meth:`scan` calls."""
        if query.stream is not None:
            state = self.heal()
            if self._records_only(state):
                s = self.survey_upto(state)
                page = list[Entry](view_scan(s, query))
                probe = probe_of(page)
                return page, probe, list[Entry](view_scan(s, probe))
            cap = fmt.visible_cap(state)
            try:
                idx = self._index_for_read(fmt.stream_file_name(query.stream))
                if idx is not None:
                    dirs: dict[int, int] = {}
                    try:
                        with idx:
                            page = self._scan_slots(idx, query, dirs, cap, decoders=decoders)
                            page = self._with_orphans(page, query, state, cap)
                            probe = probe_of(page)
                            probed = self._scan_slots(idx, probe, dirs, cap)
                            return page, probe, self._with_orphans(probed, probe, state, cap)
                    finally:
                        self.close_dirs(dirs)
            except IndexDamaged:
                pass  # the records answer, below
        page = self.scan(query, decoders)
        probe = probe_of(page)
        return page, probe, self.scan(probe)

    def _scan_index(
        self, idx: StreamIndex, q: ScanQuery, cap: int | None, decoders: Decoders | None = None
    ) -> list[Entry]:
        dirs: dict[int, int] = {}
        try:
            return self._scan_slots(idx, q, dirs, cap, decoders=decoders)
        finally:
            self.close_dirs(dirs)

    def _scan_slots(
        self,
        idx: StreamIndex,
        q: ScanQuery,
        dirs: dict[int, int],
        cap: int | None,
        *,
        nowait: bool = False,
        decoders: Decoders | None = None,
    ) -> list[Entry]:
        """The entries of ``q`` from ``idx``'s slots. ``nowait`` (the event loop's
        thread, :meth:`scan_nowait`): each record through :meth:`_load_nowait`, and
        :class:`_NoWait` wherever the worker's scan would report a skipped entry or
        look again (a record missing, damaged, unreadable or of another stream).
        ``decoders`` (a listed page's scan): a record whose state decodes is its
        checkpoint (:meth:`load_entry`); the caller decodes any other as usual."""
        if q.order == "asc":
            start, step = (0 if q.bound is None else idx.locate(q.bound, right=True)), 1
            if start >= idx.count > 0:
                _check_edge(idx, idx.count - 1, q.bound, beyond=False)
        else:
            top = idx.count if q.bound is None else idx.locate(q.bound, right=False)
            start, step = top - 1, -1
            if top == 0 < idx.count:
                _check_edge(idx, 0, q.bound, beyond=True)
        now_us = fmt.to_micros(q.now)
        out: list[Entry] = []
        seen: dict[int, int] = {}
        # nowait: how many slots and records may be passed over (see the constants)
        slots_left, records_left = _NOWAIT_EXTRA_SLOTS, _NOWAIT_EXTRA_RECORDS
        for pos, slot in idx.walk(start, step, first=min(q.limit, _PAGE_SLOTS)):
            if not slot.live or slot.expired(now_us) or (cap is not None and slot.seq > cap):
                if nowait:
                    slots_left -= 1
                    if slots_left < 0:
                        raise _NoWait
                continue
            if nowait:
                got = self._load_nowait(slot.seq, slot.cid, seen, decoders)
                if got is None or got[0].stream != q.stream:
                    raise _NoWait
                if wanted(got[0], q):
                    out.append(got[0])
                    if len(out) >= q.limit:
                        break
                else:
                    records_left -= 1
                    if records_left < 0:
                        raise _NoWait
                continue
            try:
                if decoders is not None:
                    got = self.load_entry(slot.seq, slot.cid, dirs, None, decoders)
                else:
                    got = self.load_record(slot.seq, slot.cid, dirs)
            except CheckpointDecodeError as exc:
                out.append(skipped_from(exc, slot.cid, slot.seq))
            else:
                if got is None:
                    if self._slot_changed(idx, pos, slot):
                        continue  # deleted since we read the slot
                    out.append(
                        self._skipped(
                            slot.seq,
                            slot.cid,
                            self.record_path(slot.seq, slot.cid),
                            "the stream index lists it but its record file is missing",
                        )
                    )
                elif got[0].stream != q.stream:
                    out.append(
                        self._skipped(
                            slot.seq,
                            slot.cid,
                            self.record_path(slot.seq, slot.cid),
                            f"the record belongs to stream {got[0].stream!r}",
                        )
                    )
                elif not wanted(got[0], q):
                    continue
                else:
                    out.append(got[0])
            if len(out) >= q.limit:
                break
        return out

    # -- helpers ------------------------------------------------------------------------

    def _index_for_read(self, sfile: str) -> StreamIndex | None:
        """Raises :class:`IndexDamaged`, which sends the read to the records."""
        return self.open_index(sfile)

    def _ids_for_read(self) -> Any:
        return self.open_ids()

    def _slot_changed(self, idx: StreamIndex, pos: int, slot: fmt.Slot) -> bool:
        """Whether the index (looked up afresh by name) no longer says ``slot`` at ``pos``."""
        fresh = self.open_index(idx.name)
        if fresh is None:
            return True
        with fresh:
            if fresh.identity != idx.identity or pos >= fresh.count:
                return True
            return fresh.slot(pos) != slot

    def _sequence_exists(self, seq: int) -> bool:
        """Whether any record file has sequence ``seq`` (under any id)."""
        bucket = self.bucket(seq)
        if bucket is None:
            return False
        try:
            prefix = f"{seq:020d}."
            return any(name.startswith(prefix) for name in self.io.listdir(bucket))
        finally:
            self.close_bucket(bucket)

    def _skipped(self, seq: int, cid: str | None, location: str, reason: str) -> Skipped:
        return Skipped.model_construct(
            id=cid,
            sequence=seq,
            location=self.where(location),
            reason=reason,
            error=CheckpointDecodeError.__name__,
        )


def _same_regular(st: Any, identity: tuple[int, int]) -> bool:
    """Whether ``st`` (an ``lstat``) is the regular, singly linked file ``identity``."""
    return (st.st_dev, st.st_ino) == identity and stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _check_edge(idx: StreamIndex, pos: int, bound: int | None, *, beyond: bool) -> None:
    """A search that put a page past the end of the index (so the walk reads no
    slot) decided on sequences read unchecked: check the slot at the edge it passed,
    whose sequence must be at or below the bound (``beyond``: at or above it).
    Raises :class:`IndexDamaged` (the scan then asks the records) if it is corrupt
    or says otherwise: an index overwritten in place, not an empty page."""
    seq = idx.slot(pos).seq
    if bound is not None and (seq < bound if beyond else seq > bound):
        raise IndexDamaged(f"streams/{idx.name}: slot {pos} is out of order")


def wanted(record: StoredRecord | Checkpoint, q: ScanQuery) -> bool:
    """Whether a scan of ``q`` lists ``record`` (or the checkpoint it decoded to):
    not expired at ``q.now``, and with every tag ``q`` asks for (an unfiltered
    page's rows skip the tag loop)."""
    header = record.header if isinstance(record, StoredRecord) else record
    expires = header.expires_at
    if expires is not None and expires <= q.now:
        return False
    if not q.tags:
        return True
    tags = header.tags
    return all(tags.get(k) == v for k, v in q.tags.items())
