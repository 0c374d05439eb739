"""The read side of a file store: the strict reads (``get_latest``, ``load``,
``load_many``) and the healing that comes first, the listings ``list_streams``
and ``info``, and what every read shares.

Readers take no lock. Writers only ever replace whole files by rename and write
index slots that carry a CRC, so a reader sees every file either before or after a
change. Where a reader's two looks disagree (a slot said live, its record is gone)
it looks again; if the disagreement persists across a few tries it is damage,
reported as such, never papered over with an older checkpoint.

Each read is one function that takes a budget
(:class:`statekeeper._runtime.inline.Budget`): the store runs it on the event
loop's thread first, and again in the worker where it says it would block.
Inline, the descriptors come from this thread's kept ones (see :mod:`.fdcache`,
one ``lstat`` per file); in the worker, from fresh opens. What ``heal`` may touch:
the state, and (under the write lock, through the ``recover`` it is given) the
crashed writer's journal, nothing else.

- :class:`Listing`: ``list_streams`` and ``info`` from the stream indexes, and
  what the strict reads and the page scans (:mod:`.pages`) share:
  whether the indexes can be trusted (:meth:`Listing.records_only`,
  :meth:`Listing.index_missing`), the survey a read that cannot trust them
  answers from, and what a reader must not see yet (:meth:`Listing.unseen`, see
  :func:`.layout.visible_cap`);
- :class:`Reader`: the strict reads, the descriptors and records each read goes
  through by budget, and :meth:`Reader.heal`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from ..._core.query import ScanQuery
from ..._runtime.inline import WORKER, Budget, WouldBlock
from ...errors import CheckpointDecodeError, CheckpointNotFound, ConcurrentModificationError
from ...models import Skipped
from ...record import StoredRecord, header_values
from . import layout as fmt
from .fdcache import Descriptors
from .files import Files, RecordProblem, StateFile, WriteLock
from .indexes import IdTable, IndexDamaged, StreamIndex
from .survey import (
    Survey,
    orphan_error,
    take_survey,
    view_get,
    view_info,
    view_latest,
    view_streams,
)

__all__ = [
    "INLINE_DELETED",
    "INLINE_EXTRA_RECORDS",
    "INLINE_EXTRA_SLOTS",
    "INLINE_RECORD_BYTES",
    "INLINE_TAIL_RECORDS",
    "INLINE_TAIL_SLOTS",
    "READ_RETRIES",
    "Listing",
    "Reader",
    "wanted",
]

#: The most index slots and record files ``get_latest`` looks at inline: a tail of
#: expired checkpoints is walked in the worker, not on the loop.
INLINE_TAIL_SLOTS = 16
INLINE_TAIL_RECORDS = 2
#: What a page scan may pass over inline beyond the page itself: index slots that
#: are deleted, expired or past the reader's cap, and records it reads but does not
#: list (expired, or without the tags asked for). A sparse tag filter or a long run
#: of deleted checkpoints is walked in the worker.
INLINE_EXTRA_SLOTS = 64
INLINE_EXTRA_RECORDS = 16
#: Deleted entries of an id that ``load`` checks inline (one ``lstat`` each).
INLINE_DELETED = 4
#: The largest record file read inline: a bigger one is read in the worker, so a
#: cold read of a large file never stalls the loop.
INLINE_RECORD_BYTES = 1 << 20

#: How many times a read that a concurrent writer disturbed is retried.
READ_RETRIES = 8


class _Retry(Exception):
    """A concurrent writer changed what this read was looking at."""


class Listing:
    """``list(None)``, ``list_streams``, ``info``, and the read side's shared looks."""

    def __init__(
        self,
        files: Files,
        fdcache: Descriptors,
        statefile: StateFile,
        degraded: Callable[[], str | None],
    ) -> None:
        self.files = files
        self.fdcache = fdcache
        self.statefile = statefile
        #: Why the indexes cannot be trusted on this read-only open (``None``: they
        #: can), as the open found (see :meth:`.engine.FileEngine.open`).
        self.degraded = degraded
        #: ``(mtime, size)`` of ``streams/`` when it last held every index ``state``
        #: counts (see :meth:`index_missing`).
        self._streams_seen: tuple[int, int] | None = None

    def records_only(self, state: fmt.State | None) -> bool:
        """Whether this read must go to the records (the indexes cannot be trusted)."""
        return state is None or self.degraded() is not None

    def unseen(self, seq: int, damaged: bool, cap: int | None) -> bool:
        """Whether a reader whose cap is ``cap`` leaves record ``seq`` out. A valid
        record above the cap was saved after the read began; a damaged one is
        left out only while a batch in flight holds its sequence (it is being
        written), since damage above the high-water mark must still be reported."""
        if cap is None or seq <= cap:
            return False
        if not damaged:
            return True
        state = self.statefile.read()
        journal = state.journal if state is not None else None
        return journal is not None and journal.op in fmt.BATCH_OPS and journal.lo <= seq

    def survey_upto(self, state: fmt.State | None) -> Survey:
        """:meth:`survey` without the records a reader that read ``state`` must
        not see (see :func:`.layout.visible_cap`)."""
        cap = fmt.visible_cap(state, from_records=True)
        s = self.survey()
        if cap is not None:
            s.entries = [e for e in s.entries if not self.unseen(e.seq, e.record is None, cap)]
        return s

    def survey(self) -> Survey:
        """The whole store, from its records (O(store); see :func:`.survey.view_latest`)."""
        return take_survey(self.files)

    def index_missing(self, state: fmt.State, budget: Budget) -> bool:
        """Whether a stream index file went missing: fewer index files than ``state``
        counts. Costs one ``fstat`` unless ``streams/`` changed since it last held
        them all (then one listing, which blocks)."""
        seen = self.streams_unchanged(state)
        if seen is True:
            return False
        budget.block()
        missing = len(self.fdcache.index_files()) < (state.streams or 0)
        if not missing:
            self._streams_seen = seen
        return missing

    def streams_unchanged(self, state: fmt.State) -> Literal[True] | tuple[int, int]:
        """``True`` if no stream index can be missing, known from ``state`` and one
        ``fstat`` of ``streams/`` (it did not change since it last held every index
        ``state`` counts); else what that ``fstat`` saw, for :meth:`index_missing`,
        which lists the directory."""
        if not state.streams:
            return True
        st = self.files.io.fstat(self.files.fd("streams"))
        seen = (st.st_mtime_ns, st.st_size)
        return True if seen == self._streams_seen else seen

    def skipped(self, seq: int, cid: str | None, location: str, reason: str) -> Skipped:
        return Skipped.model_construct(
            id=cid,
            sequence=seq,
            location=self.files.where(location),
            reason=reason,
            error=CheckpointDecodeError.__name__,
        )

    # -- listings -----------------------------------------------------------------------

    def list_streams(self, now: datetime, prefix: str = "") -> list[str]:
        """The streams with a live checkpoint that start with ``prefix``. The prefix
        is matched on the stream name in each index's header, never on the file
        name (escaping changes prefixes, and long names are hashed), after a cheap
        pass over the file names that skips only those that cannot match."""
        state = self.statefile.read()
        cap = fmt.visible_cap(state)
        if self.records_only(state) or (state is not None and self.index_missing(state, WORKER)):
            return [n for n in view_streams(self.survey_upto(state), now) if n.startswith(prefix)]
        now_us = fmt.to_micros(now)
        names: list[str] = []
        try:
            for idx in self.fdcache.readable_indexes(strict=True, prefix=prefix):
                with idx:
                    if idx.stream.startswith(prefix) and any(
                        s.live and not s.expired(now_us) and (cap is None or s.seq <= cap)
                        for _, s in idx.walk(idx.count - 1, -1)
                    ):
                        names.append(idx.stream)
        except IndexDamaged:
            return [n for n in view_streams(self.survey_upto(state), now) if n.startswith(prefix)]
        return names

    def info(self, now: datetime) -> dict[str, Any]:
        """Counts of the checkpoints live at ``now`` and their streams; the expired
        ones not yet purged apart (``expired``, when there are any)."""
        extra = {"path": self.files.root, "durability": "full" if self.files.durable else "fast"}
        state = self.statefile.read()
        if self.records_only(state):
            degraded = self.degraded() or "state"
            return {**view_info(self.survey(), now), **extra, "degraded": degraded}
        assert state is not None
        if self.index_missing(state, WORKER):
            degraded = "a stream index is missing"
            return {**view_info(self.survey(), now), **extra, "degraded": degraded}
        now_us = fmt.to_micros(now)
        streams = checkpoints = expired = 0
        try:
            for idx in self.fdcache.readable_indexes(strict=True):
                with idx:
                    slots = [s for _, s in idx.walk(0, 1) if s.live]
                gone = sum(1 for s in slots if s.expired(now_us))
                expired += gone
                if len(slots) > gone:
                    streams += 1
                    checkpoints += len(slots) - gone
        except IndexDamaged as exc:
            return {**view_info(self.survey(), now), **extra, "degraded": str(exc)}
        return {
            "checkpoints": checkpoints,
            "streams": streams,
            "high_water_mark": state.hwm,
            **({"expired": expired} if expired else {}),
            **extra,
        }


class Reader:
    """Strict ``latest``/``get``/``get_many``, the descriptors and records each read
    goes through by budget, and :meth:`heal`."""

    def __init__(
        self,
        files: Files,
        fdcache: Descriptors,
        statefile: StateFile,
        lock: WriteLock,
        listing: Listing,
        *,
        recover: Callable[[], object],
        read_only: bool,
    ) -> None:
        self.files = files
        #: The descriptor cache (the inline reads' kept descriptors).
        self.fdcache = fdcache
        self.statefile = statefile
        #: The write lock: a thread holding it reads through the writer's cache,
        #: and :meth:`heal` takes it (without waiting) to finish a journal.
        self.lock = lock
        self.listing = listing
        #: Finish a crashed writer's journal, under the write lock (the recovery's).
        self.recover = recover
        self.read_only = read_only

    def heal(self, budget: Budget = WORKER) -> fmt.State | None:
        """If a writer died mid-operation and nobody holds the lock now, finish its
        work before reading, so no reader sees a half-done delete or update for long.
        Returns the state (``None``: unreadable, so the reads go to the records).

        Save entries are left to the next writer: every completed save leaves one
        (see ``insert_done``), and a save that died before its index entries is one
        nobody was told about, which strict reads do not show anyway. A read-only
        store heals nothing. A torn read of ``state`` is usually a writer's write
        in flight, so it is read again (a few times) before it is believed.

        Inline, it blocks for a thread holding the write lock (its descriptors are
        the writer's cached ones), a torn state, and any journal but a completed
        save's: each is the worker's to decide."""
        if self.lock.holding():
            budget.block()
        state = self.statefile.read()
        for _ in range(3):
            if state is None or not state.torn:
                break
            budget.block()
            state = self.statefile.read()
        journal = state.journal if state is not None else None
        if journal is None or journal.op == "insert":
            return state
        budget.block()
        if self.read_only:
            return state
        with self.lock.held(wait=False) as got:
            if got:
                self.recover()
                return self.statefile.read()
        return state

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
            if self.listing.records_only(state):
                budget.block()
                return view_latest(self.listing.survey_upto(state), stream, now)
            assert state is not None
            try:
                got = self._latest_indexed(stream, now, cap, budget)
            except IndexDamaged:
                budget.block()
                return view_latest(self.listing.survey_upto(state), stream, now)
            if got is None and self.listing.index_missing(state, budget):
                return view_latest(self.listing.survey_upto(state), stream, now)
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
            found = self.files.load_record(*orphan)
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
            idx = self.index_for(sfile, budget)
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
                    self.files.close_dirs(dirs)
        raise ConcurrentModificationError(
            f"get_latest({stream!r}) was disturbed by concurrent writers {READ_RETRIES} times "
            f"in a row in the file store at {self.files.root}; retry"
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
            got = self.load(slot.seq, slot.cid, dirs, budget)
            if got is None:
                budget.block()
                if self.slot_changed(idx, pos, slot):
                    raise _Retry
                raise self.files.decode_error(
                    "the stream index lists it but its record file is missing "
                    "(removed outside statekeeper?)",
                    slot.seq,
                    slot.cid,
                )
            record = got[0]
            if record.stream != stream:
                budget.block()
                raise self.files.decode_error(
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
            if self.listing.records_only(state):
                budget.block()
                return view_get(self.listing.survey_upto(state), cid, now)
            try:
                return self._get_indexed(cid, now, cap, budget)
            except IndexDamaged:
                budget.block()
                return view_get(self.listing.survey_upto(state), cid, now)
        except ConcurrentModificationError:
            budget.block()
            raise

    def _get_indexed(
        self, cid: str, now: datetime, cap: int | None, budget: Budget, table: IdTable | None = None
    ) -> StoredRecord | None:
        """Through the id table (``table``, if the caller has it open). Raises
        :class:`IndexDamaged` (so the caller asks the records) when the table says
        something the record files contradict. A record above ``cap`` is not
        shown (see :func:`.layout.visible_cap`); an entry above it is still
        checked against the record files, since a damaged entry can say any
        sequence. Inline, an entry above ``cap`` or a record that is not there
        blocks (the worker looks again)."""
        key = fmt.id_key(cid)
        for attempt in range(READ_RETRIES):
            if table is not None and attempt == 0:
                candidates, deleted, others = table.lookup_checked(key)
            else:
                with self.ids_for(budget) as ids:
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
                got = self.load(seq, cid, None, budget)
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
            with self.ids_for(budget) as ids:
                again, _, _ = ids.lookup_checked(key)
            if again != candidates:
                continue
            for seq in missing:
                if not self._sequence_exists(seq):
                    # The table names a sequence no file has: ask the records (a
                    # damaged entry); if they have no such id either, the record
                    # was removed outside statekeeper, and that is not "not found".
                    found = view_get(self.listing.survey_upto(self.statefile.read()), cid, now)
                    if found is not None:
                        return found
                    raise self.files.decode_error(
                        "the id table lists it but its record file is missing "
                        "(removed outside statekeeper?)",
                        seq,
                        cid,
                    )
            return None  # the entries were other ids with the same 64-bit hash
        raise ConcurrentModificationError(
            f"load({cid!r}) was disturbed by concurrent writers {READ_RETRIES} times in a row "
            f"in the file store at {self.files.root}; retry"
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
        bucket = self.files.bucket(seq)
        if bucket is None:
            return []
        try:
            parsed = map(fmt.parse_record_name, self.files.io.listdir(bucket))
            return [p[1] for p in parsed if p is not None and p[0] == seq]
        finally:
            self.files.close_bucket(bucket)

    def _record_exists(self, seq: int, cid: str) -> bool:
        bucket = self.files.bucket(seq)
        if bucket is None:
            return False
        try:
            self.files.io.lstat(fmt.record_name(seq, cid), dir_fd=bucket)
        except FileNotFoundError:
            return False
        finally:
            self.files.close_bucket(bucket)
        return True

    def _sequence_exists(self, seq: int) -> bool:
        """Whether any record file has sequence ``seq`` (under any id)."""
        bucket = self.files.bucket(seq)
        if bucket is None:
            return False
        try:
            prefix = f"{seq:020d}."
            return any(name.startswith(prefix) for name in self.files.io.listdir(bucket))
        finally:
            self.files.close_bucket(bucket)

    def read_raw(self, cid: str) -> bytes:
        """The stored bytes of ``cid``, unverified (the conformance kit's backdoor)."""
        with self.fdcache.open_ids() as ids:
            candidates = [seq for _, seq in ids.lookup(fmt.id_key(cid))]
        for seq in candidates:
            bucket = self.files.bucket(seq)
            if bucket is None:
                continue
            try:
                data = self.files.read_file(bucket, fmt.record_name(seq, cid))
            except RecordProblem as exc:
                raise self.files.decode_error(exc.reason, seq, cid) from None
            finally:
                self.files.close_bucket(bucket)
            if data is not None:
                return data
        raise CheckpointNotFound(cid)

    def index_for(self, sfile: str, budget: Budget) -> StreamIndex | None:
        """The stream index ``sfile`` for a read (``None`` if there is none): inline
        through this thread's kept descriptors, in the worker a fresh open. Raises
        :class:`IndexDamaged`, which sends the read to the records."""
        if budget.inline:
            return self.fdcache.kept_index(sfile)
        return self.fdcache.open_index(sfile)

    def ids_for(self, budget: Budget) -> IdTable:
        """The id table for a read, as :meth:`index_for` opens an index."""
        if budget.inline:
            return self.fdcache.kept_ids()
        return self.fdcache.open_ids()

    def load(
        self, seq: int, cid: str, dirs: dict[int, int] | None, budget: Budget
    ) -> tuple[StoredRecord, bytes] | None:
        """:meth:`.files.Files.load_record` for a read. Inline: through this
        thread's kept bucket descriptors (``budget.kept`` holds the one this call
        last checked by ``lstat``, used again without one), at most
        :data:`INLINE_RECORD_BYTES`, and a record that cannot be read (an
        OS error, damage, too large) blocks; the worker reads it and reports it as
        it always does. ``None``: the record file (or its bucket) is not there."""
        if not budget.inline:
            return self.files.load_record(seq, cid, dirs)
        try:
            number = fmt.bucket_of(seq)
            seen = budget.kept
            bucket = seen.get(number)
            if bucket is None:
                bucket = self.fdcache.kept_bucket(seq)
                if bucket is None:
                    return None
                # keeping another bucket may close a kept one: forget the others
                seen.clear()
                seen[number] = bucket
            # the kept descriptor, handed over as load_record's own: not closed by it
            return self.files.load_record(seq, cid, {number: bucket}, INLINE_RECORD_BYTES)
        except (OSError, IndexDamaged, CheckpointDecodeError):
            raise WouldBlock from None

    def slot_changed(self, idx: StreamIndex, pos: int, slot: fmt.Slot) -> bool:
        """Whether the index (looked up afresh by name) no longer says ``slot`` at ``pos``."""
        fresh = self.fdcache.open_index(idx.name)
        if fresh is None:
            return True
        with fresh:
            if fresh.identity != idx.identity or pos >= fresh.count:
                return True
            return fresh.slot(pos) != slot

    def get_many(
        self, cids: list[str], now: datetime, budget: Budget = WORKER
    ) -> dict[str, StoredRecord]:
        """The live records among ``cids``: one ``state`` read, one open of the id
        table for every probe; strict like :meth:`get` (a damaged one raises).
        Inline it blocks where :meth:`get` would."""
        try:
            state = self.heal(budget)
            cap = fmt.visible_cap(state)
            if not self.listing.records_only(state):
                try:
                    with self.ids_for(budget) as table:
                        found = {}
                        for cid in cids:
                            record = self._get_indexed(cid, now, cap, budget, table)
                            if record is not None:
                                found[cid] = record
                        return found
                except IndexDamaged:
                    pass
            budget.block()
            s = self.listing.survey_upto(state)
            return {cid: record for cid in cids if (record := view_get(s, cid, now)) is not None}
        except ConcurrentModificationError:
            budget.block()
            raise


def wanted(record: StoredRecord, q: ScanQuery) -> bool:
    """Whether a scan of ``q`` lists ``record``: not expired at ``q.now``, and with
    every tag ``q`` asks for (an unfiltered page's rows skip the tag loop). Reads the
    verified header values, so a page builds no header model for a row it passes over
    or returns (list builds the one model a returned checkpoint needs)."""
    values = header_values(record)
    expires = values["expires_at"]
    if expires is not None and expires <= q.now:
        return False
    if not q.tags:
        return True
    tags = values["tags"]
    return all(tags.get(k) == v for k, v in q.tags.items())
