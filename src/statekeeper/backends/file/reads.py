"""The read side of the file backend's engine: lock-free, strict where it must be.

Readers take no lock. Writers only ever replace whole files by rename and write
index slots that carry a CRC, so a reader sees every file either before or after a
change. Where a reader's two looks disagree (a slot said live, its record is gone)
it looks again; if the disagreement persists across a few tries it is damage,
reported as such, never papered over with an older checkpoint.

Each read is one function that takes a :class:`~.budget.Budget`: the store runs it
on the event loop's thread first, and again in the worker where it says it would
block (see :mod:`.budget`). Inline, the descriptors come from this thread's kept
ones (:class:`_Kept`, one ``lstat`` per file); in the worker, from fresh opens.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from ..._protocol import ScanQuery, skipped_from
from ...errors import CheckpointDecodeError, CheckpointNotFound, ConcurrentModificationError
from ...models import Skipped
from ...record import StoredRecord
from . import format as fmt
from .budget import (
    INLINE_DELETED,
    INLINE_EXTRA_RECORDS,
    INLINE_EXTRA_SLOTS,
    INLINE_RECORD_BYTES,
    INLINE_TAIL_RECORDS,
    INLINE_TAIL_SLOTS,
    WORKER,
    Budget,
    WouldBlock,
)
from .core import EngineCore, RecordProblem, Txn
from .index import IdTable, IndexDamaged, StreamIndex
from .io import read_exact
from .orphans import OrphanKey, merge_orphans, orphans_key
from .survey import Survey, take_survey
from .view import orphan_error, view_get, view_latest, view_scan

__all__ = ["Entry", "ProbeOf", "ReadsMixin"]

#: How many times a read that a concurrent writer disturbed is retried.
READ_RETRIES = 8
#: The most slots a page scan reads at once at first: a page of up to this many
#: candidates (``list`` asks one more than its limit) reads the slots it needs in one
#: ``pread`` of up to 64 KiB, when nothing is filtered out.
_PAGE_SLOTS = 256

#: What a scan gives: records and skipped entries.
Entry = StoredRecord | Skipped
#: The probe a page scan runs after the page (see :func:`statekeeper._paging.probe_query`).
ProbeOf = Callable[[list[Entry]], ScanQuery]
#: A page and, when asked, its probe's entries.
PageEntries = tuple[list[Entry], list[Entry] | None]

#: Stream indexes and bucket directories a thread's inline reads keep open.
_KEPT_INDEXES = 32
_KEPT_BUCKETS = 4


class _Kept:
    """The descriptors one thread's inline reads keep between calls, so that a
    read costs one ``lstat`` per file instead of an open, an ``fstat`` and a close.
    Each is used only after that ``lstat`` shows the same file (device and inode,
    a regular file with one link, or a directory) under its name: a file replaced
    by rename is opened afresh, exactly as a fresh open would find it."""

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


class ReadsMixin(EngineCore):
    """Strict ``latest``/``get``, tolerant page scans."""

    #: ``(mtime, size)`` of ``streams/`` when it last held every index ``state`` counts.
    _streams_seen: tuple[int, int] | None = None

    def recover_pending(self, budget: Budget = WORKER) -> Txn:
        """Finish a crashed writer's journal (the engine implements it)."""
        raise NotImplementedError

    def heal(self, budget: Budget = WORKER) -> fmt.State | None:
        """If a writer died mid-operation and nobody holds the lock now, finish its
        work before reading, so no reader sees a half-done delete or update for long.
        Returns the state (``None``: unreadable, so the reads go to the records).

        Save entries are left to the next writer: every completed save leaves one
        (see ``_insert_done``), and a save that died before its index entries is one
        nobody was told about, which strict reads do not show anyway. A read-only
        store heals nothing. A torn read of ``state`` is usually a writer's write
        in flight, so it is read again (a few times) before it is believed.

        Inline, it blocks for a thread holding the write lock (its descriptors are
        the writer's cached ones), a torn state, and any journal but a completed
        save's: each is the worker's to decide."""
        if self._holding():
            budget.block()
        state = self.read_state()
        for _ in range(3):
            if state is None or not state.torn:
                break
            budget.block()
            state = self.read_state()
        journal = state.journal if state is not None else None
        if journal is None or journal.op == "insert":
            return state
        budget.block()
        if self.read_only:
            return state
        with self.locked(wait=False) as got:
            if got:
                self.recover_pending()
                return self.read_state()
        return state

    def _index_missing(self, state: fmt.State, budget: Budget) -> bool:
        """Whether a stream index file went missing: fewer index files than ``state``
        counts. Costs one ``fstat`` unless ``streams/`` changed since it last held
        them all (then one listing, which blocks)."""
        seen = self._streams_unchanged(state)
        if seen is True:
            return False
        budget.block()
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
        self,
        page: list[Entry],
        q: ScanQuery,
        state: fmt.State | None,
        cap: int | None,
        budget: Budget,
    ) -> list[Entry]:
        """``page``, a scan of ``q`` from its stream index, with the damaged records
        of unknown stream in its range (see :mod:`.orphans`): those ``get_latest``
        raises for. Nothing to do, and nothing read, while ``state`` marks none."""
        key = orphans_key(state)
        if key is None:
            return page
        budget.block()
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

    def latest(self, stream: str, now: datetime, budget: Budget = WORKER) -> StoredRecord | None:
        """The live record of ``stream`` with the highest sequence, read from the
        tail of the stream index: no other record is decoded, whatever the size of
        the stream or the store. Without a usable index, from the records.

        Inline it reads the state, the tail of the stream index and the newest live
        record file (a few ``pread``, ``open`` and ``fstat`` calls on the page
        cache) and blocks wherever it would do more: a survey of the records, an
        orphan newer than the answer, a record missing, damaged or of another
        stream (the worker re-looks, then raises), or more than a few expired
        checkpoints at the tail."""
        try:
            state = self.heal(budget)
            cap = fmt.visible_cap(state)
            if self._records_only(state):
                budget.block()
                return view_latest(self.survey_upto(state), stream, now)
            assert state is not None
            try:
                got = self._latest_indexed(stream, now, cap, budget)
            except IndexDamaged:
                budget.block()
                return view_latest(self.survey_upto(state), stream, now)
            if got is None and self._index_missing(state, budget):
                return view_latest(self.survey_upto(state), stream, now)
            orphan = state.orphan
            if orphan is not None and orphan[0] > (got.sequence if got is not None else 0):
                budget.block()
                return self._past_orphan(orphan, stream, now, got)
            return got
        except ConcurrentModificationError:
            budget.block()
            raise

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

    def _latest_indexed(
        self, stream: str, now: datetime, cap: int | None, budget: Budget
    ) -> StoredRecord | None:
        sfile = fmt.stream_file_name(stream)
        now_us = fmt.to_micros(now)
        for _ in range(READ_RETRIES):
            idx = self._index_for(sfile, budget)
            if idx is None:
                return None
            dirs: dict[int, int] = {}
            try:
                with idx:
                    return self._latest_walk(idx, stream, now, now_us, dirs, cap, budget)
            except _Retry:
                continue
            finally:
                if dirs:  # (inline, the kept buckets are used, never these)
                    self.close_dirs(dirs)
        raise ConcurrentModificationError(
            f"get_latest({stream!r}) was disturbed by concurrent writers {READ_RETRIES} times "
            f"in a row in the file store at {self.root}; retry"
        )

    def _latest_walk(
        self,
        idx: StreamIndex,
        stream: str,
        now: datetime,
        now_us: int,
        dirs: dict[int, int],
        cap: int | None,
        budget: Budget,
    ) -> StoredRecord | None:
        loaded = 0
        for seen, (pos, slot) in enumerate(idx.walk(idx.count - 1, -1)):
            if seen >= INLINE_TAIL_SLOTS:
                budget.block()
            if not slot.live or slot.expired(now_us) or (cap is not None and slot.seq > cap):
                continue
            loaded += 1
            if loaded > INLINE_TAIL_RECORDS:
                budget.block()
            got = self._load(slot.seq, slot.cid, dirs, budget)
            if got is None:
                budget.block()
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
                budget.block()
                raise self.decode_error(
                    f"the record belongs to stream {record.stream!r}", slot.seq, slot.cid
                )
            if not record.is_expired(now):
                return record
        return None

    def get(self, cid: str, now: datetime, budget: Budget = WORKER) -> StoredRecord | None:
        """The live record ``cid`` via the id table; ``None`` if missing or expired.
        Without a usable id table, from the records.

        Inline it reads the state, probes the id table and reads the record file its
        entry names; it answers "no such id" only when the probe met no other id's
        entry and each deleted entry of this id is confirmed gone by one ``lstat``,
        and blocks for anything else (see :meth:`_get_indexed`)."""
        try:
            state = self.heal(budget)
            cap = fmt.visible_cap(state)
            if self._records_only(state):
                budget.block()
                return view_get(self.survey_upto(state), cid, now)
            try:
                return self._get_indexed(cid, now, cap, budget)
            except IndexDamaged:
                budget.block()
                return view_get(self.survey_upto(state), cid, now)
        except ConcurrentModificationError:
            budget.block()
            raise

    def _get_indexed(
        self, cid: str, now: datetime, cap: int | None, budget: Budget, table: IdTable | None = None
    ) -> StoredRecord | None:
        """Through the id table (``table``, if the caller has it open). Raises
        :class:`IndexDamaged` (so the caller asks the records) when the table says
        something the record files contradict. A record above ``cap`` is not
        shown (see :func:`.format.visible_cap`); an entry above it is still
        checked against the record files, since a damaged entry can say any
        sequence. Inline, an entry above ``cap`` or a record that is not there
        blocks (the worker looks again)."""
        key = fmt.id_key(cid)
        for attempt in range(READ_RETRIES):
            if table is not None and attempt == 0:
                candidates, deleted, others = table.lookup_checked(key)
            else:
                with self._ids_for(budget) as ids:
                    candidates, deleted, others = ids.lookup_checked(key)
            missing: list[int] = []
            hidden = False
            for seq in candidates:
                if cap is not None and seq > cap:
                    budget.block()
                    if self._record_exists(seq, cid):
                        hidden = True  # saved after this read began, or a batch in flight
                    else:
                        missing.append(seq)
                    continue
                got = self._load(seq, cid, None, budget)
                if got is None:
                    budget.block()
                    missing.append(seq)
                    continue
                record = got[0]
                return None if record.is_expired(now) else record
            if not missing:
                if not hidden:
                    self._confirm_absent(cid, deleted, others, budget)
                return None
            with self._ids_for(budget) as ids:
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

    def _confirm_absent(
        self, cid: str, deleted: list[int], others: list[tuple[int, int]], budget: Budget
    ) -> None:
        """Before answering "no such id": the entries on its probe must agree with
        the record files (id-table slots have no checksum). Raises
        :class:`IndexDamaged` if one does not. Costs an ``lstat`` per deleted entry
        and a directory listing per other entry (which blocks), and only on this
        path."""
        if others or len(deleted) > INLINE_DELETED:
            budget.block()
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
        with self.open_ids() as ids:
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
        """:meth:`~.core.EngineCore.open_index` through this thread's kept descriptors: ``None`` if
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
        idx = self.open_index(sfile)
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

    # -- descriptors and records, by budget ----------------------------------------------

    def _index_for(self, sfile: str, budget: Budget) -> StreamIndex | None:
        """The stream index ``sfile`` for a read (``None`` if there is none): inline
        through this thread's kept descriptors, in the worker a fresh open. Raises
        :class:`IndexDamaged`, which sends the read to the records."""
        if budget.inline:
            return self._index_kept(sfile)
        return self.open_index(sfile)

    def _ids_for(self, budget: Budget) -> IdTable:
        """The id table for a read, as :meth:`_index_for` opens an index."""
        if budget.inline:
            return self._ids_kept()
        return self.open_ids()

    def _load(
        self, seq: int, cid: str, dirs: dict[int, int] | None, budget: Budget
    ) -> tuple[StoredRecord, bytes] | None:
        """:meth:`~.core.EngineCore.load_record` for a read. Inline: through this
        thread's kept bucket descriptors (``budget.seen`` holds the one this call
        last checked by ``lstat``, used again without one), at most
        :data:`~.budget.INLINE_RECORD_BYTES`, and a record that cannot be read (an
        OS error, damage, too large) blocks; the worker reads it and reports it as
        it always does. ``None``: the record file (or its bucket) is not there."""
        if not budget.inline:
            return self.load_record(seq, cid, dirs)
        try:
            number = fmt.bucket_of(seq)
            seen = budget.seen
            bucket = seen.get(number)
            if bucket is None:
                bucket = self._bucket_kept(seq)
                if bucket is None:
                    return None
                # keeping another bucket may close a kept one: forget the others
                seen.clear()
                seen[number] = bucket
            # the kept descriptor, handed over as load_record's own: not closed by it
            return self.load_record(seq, cid, {number: bucket}, INLINE_RECORD_BYTES)
        except (OSError, IndexDamaged, CheckpointDecodeError):
            raise WouldBlock from None

    # -- tolerant scans -----------------------------------------------------------------

    def _scan_all(self, q: ScanQuery, cap: int | None) -> list[StoredRecord | Skipped]:
        """Every stream in global sequence order (the listing mixin has it)."""
        raise NotImplementedError

    def scan_page(
        self, query: ScanQuery, probe_of: ProbeOf | None, budget: Budget = WORKER
    ) -> PageEntries:
        """The entries of ``query`` and, with ``probe_of``, those of the probe
        ``probe_of(page)`` that decides the page's other cursor: both read one
        ``state`` (one cap: the probe sees what the page saw), through one open
        stream index and the same bucket descriptors, or from one survey of the
        records. A scan of one stream also reports, as skipped, each damaged record
        of unknown stream in its range (see :mod:`.orphans`).

        Inline, a page of one stream from its index, whose records are there,
        readable and of that stream; it blocks for a global listing, an orphan, a
        damaged or missing index, a record missing, damaged, too large or of
        another stream (which the worker reports as skipped, or sees deleted), and
        more than :data:`~.budget.INLINE_EXTRA_SLOTS` slots or
        :data:`~.budget.INLINE_EXTRA_RECORDS` records passed over. So an inline
        page never holds a :class:`~statekeeper.models.Skipped` entry."""
        if query.stream is None:
            budget.block()
            state = self.heal(budget)
            cap = fmt.visible_cap(state)
            page = list[Entry](self._scan_all(query, cap))
            if probe_of is None:
                return page, None
            return page, list[Entry](self._scan_all(probe_of(page), cap))
        try:
            state = self.heal(budget)
            if self._records_only(state):
                budget.block()
                return _view_page(self.survey_upto(state), query, probe_of)
            assert state is not None
            try:
                return self._indexed_page(query, probe_of, state, budget)
            except IndexDamaged:
                budget.block()
                return _view_page(self.survey_upto(state), query, probe_of)
        except ConcurrentModificationError:
            budget.block()
            raise

    def _indexed_page(
        self, query: ScanQuery, probe_of: ProbeOf | None, state: fmt.State, budget: Budget
    ) -> PageEntries:
        """:meth:`scan_page` from the stream index (``IndexDamaged`` if it is damaged)."""
        assert query.stream is not None
        cap = fmt.visible_cap(state)
        idx = self._index_for(fmt.stream_file_name(query.stream), budget)
        if idx is None:
            if self._index_missing(state, budget):
                return _view_page(self.survey_upto(state), query, probe_of)
            page = self._with_orphans([], query, state, cap, budget)
            if probe_of is None:
                return page, None
            probe = probe_of(page)
            return page, self._with_orphans([], probe, state, cap, budget)
        dirs: dict[int, int] = {}
        try:
            with idx:
                page = self._scan_slots(idx, query, dirs, cap, budget)
                page = self._with_orphans(page, query, state, cap, budget)
                if probe_of is None:
                    return page, None
                probe = probe_of(page)
                found = self._scan_slots(idx, probe, dirs, cap, budget)
                return page, self._with_orphans(found, probe, state, cap, budget)
        finally:
            if dirs:
                self.close_dirs(dirs)

    def _scan_slots(
        self,
        idx: StreamIndex,
        q: ScanQuery,
        dirs: dict[int, int],
        cap: int | None,
        budget: Budget,
    ) -> list[Entry]:
        """The entries of ``q`` from ``idx``'s slots. Inline, what the worker would
        report as skipped or look at again blocks, and so does passing over more
        slots or records than the budget allows."""
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
        slots_left, records_left = INLINE_EXTRA_SLOTS, INLINE_EXTRA_RECORDS
        for pos, slot in idx.walk(start, step, first=min(q.limit, _PAGE_SLOTS)):
            if not slot.live or slot.expired(now_us) or (cap is not None and slot.seq > cap):
                slots_left -= 1
                if slots_left < 0:
                    budget.block()
                continue
            try:
                got = self._load(slot.seq, slot.cid, dirs, budget)
            except CheckpointDecodeError as exc:
                out.append(skipped_from(exc, slot.cid, slot.seq))
            else:
                if got is None:
                    budget.block()
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
                    budget.block()
                    out.append(
                        self._skipped(
                            slot.seq,
                            slot.cid,
                            self.record_path(slot.seq, slot.cid),
                            f"the record belongs to stream {got[0].stream!r}",
                        )
                    )
                elif not wanted(got[0], q):
                    records_left -= 1
                    if records_left < 0:
                        budget.block()
                    continue
                else:
                    out.append(got[0])
            if len(out) >= q.limit:
                break
        return out

    # -- helpers ------------------------------------------------------------------------

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


def _view_page(s: Survey, query: ScanQuery, probe_of: ProbeOf | None) -> PageEntries:
    """A page (and its probe) from one survey of the records."""
    page = list[Entry](view_scan(s, query))
    if probe_of is None:
        return page, None
    return page, list[Entry](view_scan(s, probe_of(page)))


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


def wanted(record: StoredRecord, q: ScanQuery) -> bool:
    """Whether a scan of ``q`` lists ``record``: not expired at ``q.now``, and with
    every tag ``q`` asks for (an unfiltered page's rows skip the tag loop)."""
    header = record.header
    expires = header.expires_at
    if expires is not None and expires <= q.now:
        return False
    if not q.tags:
        return True
    tags = header.tags
    return all(tags.get(k) == v for k, v in q.tags.items())
