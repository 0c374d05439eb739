"""The read side: :class:`Listing` (``list_streams``, ``info``, and what every read
shares: whether the indexes can be trusted, the survey a read falls back on, what a
reader must not see yet) and :class:`Reader` (the strict reads and ``heal``).

Readers take no lock. Writers replace whole files by rename and write index slots
with a CRC, so a reader sees each file before or after a change; where its two looks
disagree (a slot says live, its record is gone) it looks again, and a disagreement
that persists is damage, reported, never papered over with an older checkpoint. Each
read is one function under a :class:`~statekeeper._runtime.inline.Budget`: run on the
event loop's thread first (through this thread's kept descriptors), and again in the
worker where it would block.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from ..._core.query import ScanQuery
from ..._runtime.inline import WORKER, Budget, WouldBlock
from ...errors import CheckpointDecodeError, CheckpointNotFound, ConcurrentModificationError
from ...models import Skipped
from ...record import StoredRecord, header_values
from . import layout as fmt
from .fdcache import Descriptors
from .files import Files, StateFile, WriteLock
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

T = TypeVar("T")

#: The most index slots and record files ``get_latest`` looks at inline: a tail of
#: expired checkpoints is walked in the worker, not on the loop.
INLINE_TAIL_SLOTS = 16
INLINE_TAIL_RECORDS = 2
#: What a page scan may pass over inline beyond the page: slots (deleted, expired,
#: past the cap) and records read but not listed (expired, or without the tags).
INLINE_EXTRA_SLOTS = 64
INLINE_EXTRA_RECORDS = 16
#: Deleted entries of an id that ``load`` checks inline (one ``lstat`` each).
INLINE_DELETED = 4
#: The largest record file read inline (a cold read of a large file stalls the loop).
INLINE_RECORD_BYTES = 1 << 20

#: How many times a read that concurrent writers disturbed is retried.
READ_RETRIES = 8


class _Retry(Exception):
    """A concurrent writer changed what this read was looking at."""


class Listing:
    """``list_streams``, ``info``, and the read side's shared looks."""

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
        #: Why the indexes cannot be trusted on this read-only open (``None``: they can).
        self.degraded = degraded
        #: ``(mtime, size)`` of ``streams/`` when it last held every index ``state`` counts.
        self._streams_seen: tuple[int, int] | None = None

    def records_only(self, state: fmt.State | None) -> bool:
        """Whether the indexes cannot be trusted, so the read goes to the records."""
        return state is None or self.degraded() is not None

    def unseen(self, seq: int, damaged: bool, cap: int | None) -> bool:
        """Whether a reader capped at ``cap`` leaves record ``seq`` out: a valid one
        above the cap, a damaged one only while a batch in flight holds its sequence
        (damage above the high-water mark is still reported)."""
        if cap is None or seq <= cap:
            return False
        if not damaged:
            return True
        state = self.statefile.read()
        journal = state.journal if state is not None else None
        return journal is not None and journal.op in fmt.BATCH_OPS and journal.lo <= seq

    def survey_upto(self, state: fmt.State | None) -> Survey:
        """:meth:`survey` without what a reader of ``state`` must not see."""
        cap = fmt.visible_cap(state, from_records=True)
        s = self.survey()
        if cap is not None:
            s.entries = [e for e in s.entries if not self.unseen(e.seq, e.record is None, cap)]
        return s

    def survey(self) -> Survey:
        return take_survey(self.files)

    def index_missing(self, state: fmt.State, budget: Budget) -> bool:
        """Whether there are fewer index files than ``state`` counts: one ``fstat``,
        and a listing (which blocks) if ``streams/`` changed since it held them all."""
        if not state.streams:
            return False
        st = self.files.io.fstat(self.files.fd("streams"))
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self._streams_seen:
            return False
        budget.block()
        missing = len(self.fdcache.index_files()) < state.streams
        if not missing:
            self._streams_seen = seen
        return missing

    def skipped(self, seq: int, cid: str | None, location: str, reason: str) -> Skipped:
        return Skipped.model_construct(
            id=cid,
            sequence=seq,
            location=self.files.where(location),
            reason=reason,
            error=CheckpointDecodeError.__name__,
        )

    def list_streams(self, now: datetime, prefix: str = "") -> list[str]:
        """The streams with a live checkpoint that start with ``prefix``, matched on
        each index header's stream name (file names only rule out)."""
        state = self.statefile.read()
        if state is not None and not self.records_only(state):
            cap, now_us = fmt.visible_cap(state), fmt.to_micros(now)
            names: list[str] = []
            try:
                if not self.index_missing(state, WORKER):
                    for idx in self.fdcache.readable_indexes(strict=True, prefix=prefix):
                        with idx:
                            if idx.stream.startswith(prefix) and any(
                                s.live and not s.expired(now_us) and (cap is None or s.seq <= cap)
                                for _, s in idx.walk(idx.count - 1, -1)
                            ):
                                names.append(idx.stream)
                    return names
            except IndexDamaged:
                pass
        return [n for n in view_streams(self.survey_upto(state), now) if n.startswith(prefix)]

    def info(self, now: datetime) -> dict[str, Any]:
        """Counts of the checkpoints live at ``now`` and their streams, and of the
        expired ones not yet purged (``expired``, when there are any)."""
        extra = {"path": self.files.root, "durability": "full" if self.files.durable else "fast"}
        state = self.statefile.read()
        if state is None or self.records_only(state):
            degraded = self.degraded() or "state"
        elif self.index_missing(state, WORKER):
            degraded = "a stream index is missing"
        else:
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
                degraded = str(exc)
            else:
                return {
                    "checkpoints": checkpoints,
                    "streams": streams,
                    "high_water_mark": state.hwm,
                    **({"expired": expired} if expired else {}),
                    **extra,
                }
        return {**view_info(self.survey(), now), **extra, "degraded": degraded}


class Reader:
    """Strict ``latest``/``get``/``get_many``, what each reads through by budget, and
    :meth:`heal`."""

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
        self.fdcache = fdcache
        self.statefile = statefile
        self.lock = lock
        self.listing = listing
        #: Finishes a crashed writer's journal, under the write lock.
        self.recover = recover
        self.read_only = read_only

    def heal(self, budget: Budget = WORKER) -> fmt.State | None:
        """The state (``None``: unreadable), after finishing a dead writer's journal if
        nobody holds the lock (not a save's: the next writer finishes it, and strict
        reads never show an unacknowledged save). A read-only store heals nothing. A
        torn state is read again a few times first (usually a write in flight).
        Inline, a thread holding the lock, a torn state or such a journal blocks."""
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

    def strict(
        self, budget: Budget, indexed: Callable[[fmt.State], T], surveyed: Callable[[Survey], T]
    ) -> T:
        """``indexed(state)`` after :meth:`heal`, or ``surveyed`` of the records a reader
        of that state may see when the indexes cannot be trusted or are damaged (or
        missing: ``indexed`` raises :class:`IndexDamaged`). Inline, a survey blocks,
        and so does a read that concurrent writers kept disturbing, before it raises."""
        try:
            state = self.heal(budget)
            if not self.listing.records_only(state):
                assert state is not None
                try:
                    return indexed(state)
                except IndexDamaged:
                    pass
            budget.block()
            return surveyed(self.listing.survey_upto(state))
        except ConcurrentModificationError:
            budget.block()
            raise

    def latest(self, stream: str, now: datetime, budget: Budget = WORKER) -> StoredRecord | None:
        """The live record of ``stream`` with the highest sequence, from the tail of
        its index (no other record is decoded); without a usable index, from the
        records. Inline, it blocks for a survey, an orphan newer than the answer, a
        record missing, damaged or of another stream, or a long expired tail."""

        def indexed(state: fmt.State) -> StoredRecord | None:
            got = self._latest_indexed(stream, now, fmt.visible_cap(state), budget)
            if got is None and self.listing.index_missing(state, budget):
                raise IndexDamaged("a stream index is missing")
            orphan = state.orphan
            if orphan is not None and orphan[0] > (got.sequence if got is not None else 0):
                budget.block()
                return self._past_orphan(orphan, stream, now, got)
            return got

        return self.strict(budget, indexed, lambda s: view_latest(s, stream, now))

    def _past_orphan(
        self, orphan: tuple[int, str], stream: str, now: datetime, got: StoredRecord | None
    ) -> StoredRecord | None:
        """An orphan newer than ``stream``'s winner may be its newest: raise naming it
        (unless it is gone, or readable again and another stream's)."""
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
                self.files.close_dirs(dirs)
        raise self._disturbed(f"get_latest({stream!r})")

    def _disturbed(self, call: str) -> ConcurrentModificationError:
        return ConcurrentModificationError(
            f"{call} was disturbed by concurrent writers {READ_RETRIES} times in a row "
            f"in the file store at {self.files.root}; retry"
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
        """The live record ``cid`` via the id table (``None``: missing or expired);
        without a usable table, from the records."""
        return self.strict(
            budget,
            lambda state: self._get_indexed(cid, now, fmt.visible_cap(state), budget),
            lambda s: view_get(s, cid, now),
        )

    def _get_indexed(
        self, cid: str, now: datetime, cap: int | None, budget: Budget, table: IdTable | None = None
    ) -> StoredRecord | None:
        """Through the id table (``table``, if open). :class:`IndexDamaged` when the
        record files contradict it. A record above ``cap`` is not shown, but is
        checked (a damaged entry can say any sequence); inline, that blocks."""
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
                        hidden = True
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
                if not self._names_at(seq):
                    # a damaged entry, or a record removed outside: not "not found"
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
        raise self._disturbed(f"load({cid!r})")

    def _confirm_absent(
        self, cid: str, deleted: list[int], others: list[tuple[int, int]], budget: Budget
    ) -> None:
        """Before "no such id", the entries on its probe must agree with the record
        files (id-table slots have no checksum), else :class:`IndexDamaged`: an
        ``lstat`` per deleted entry, a listing (which blocks) per other id's."""
        if others or len(deleted) > INLINE_DELETED:
            budget.block()
        if any(self._record_exists(seq, cid) for seq in deleted):
            raise IndexDamaged(f"{fmt.IDS_NAME} marks {cid!r} deleted; its record exists")
        for key, seq in others:
            ids = [p[1] for n in self._names_at(seq) if (p := fmt.parse_record_name(n))]
            if ids and not any(fmt.id_key(other) == key for other in ids):
                raise IndexDamaged(f"{fmt.IDS_NAME}: the entry for sequence {seq} is damaged")

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

    def _names_at(self, seq: int) -> list[str]:
        """The names in ``seq``'s bucket that start with its sequence (a listing)."""
        bucket = self.files.bucket(seq)
        if bucket is None:
            return []
        try:
            prefix = f"{seq:020d}."
            return [name for name in self.files.io.listdir(bucket) if name.startswith(prefix)]
        finally:
            self.files.close_bucket(bucket)

    def read_raw(self, cid: str) -> bytes:
        """The stored bytes of ``cid``, unverified (the kit's backdoor)."""
        with self.fdcache.open_ids() as ids:
            candidates = [seq for _, seq in ids.lookup(fmt.id_key(cid))]
        for seq in candidates:
            data = self.files.record_bytes(seq, cid)
            if data is not None:
                return data
        raise CheckpointNotFound(cid)

    def index_for(self, sfile: str, budget: Budget) -> StreamIndex | None:
        """The stream index ``sfile`` (``None``: none): kept inline, else a fresh open."""
        if budget.inline:
            return self.fdcache.kept_index(sfile)
        return self.fdcache.open_index(sfile)

    def ids_for(self, budget: Budget) -> IdTable:
        if budget.inline:
            return self.fdcache.kept_ids()
        return self.fdcache.open_ids()

    def load(
        self, seq: int, cid: str, dirs: dict[int, int] | None, budget: Budget
    ) -> tuple[StoredRecord, bytes] | None:
        """:meth:`.files.Files.load_record` for a read (``None``: not there). Inline,
        through the kept bucket descriptors (``budget.kept`` holds the one this call
        checked), at most :data:`INLINE_RECORD_BYTES`; an unreadable record blocks."""
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
                # keeping another bucket may close a kept one
                seen.clear()
                seen[number] = bucket
            return self.files.load_record(seq, cid, {number: bucket}, INLINE_RECORD_BYTES)
        except (OSError, IndexDamaged, CheckpointDecodeError):
            raise WouldBlock from None

    def slot_changed(self, idx: StreamIndex, pos: int, slot: fmt.Slot) -> bool:
        """Whether the index, opened afresh, no longer says ``slot`` at ``pos``."""
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
        """The live records among ``cids``, strict like :meth:`get`: one ``state``
        read, one open of the id table."""

        def indexed(state: fmt.State) -> dict[str, StoredRecord]:
            cap = fmt.visible_cap(state)
            with self.ids_for(budget) as table:
                found = {cid: self._get_indexed(cid, now, cap, budget, table) for cid in cids}
            return {cid: record for cid, record in found.items() if record is not None}

        def surveyed(s: Survey) -> dict[str, StoredRecord]:
            return {cid: record for cid in cids if (record := view_get(s, cid, now)) is not None}

        return self.strict(budget, indexed, surveyed)


def wanted(record: StoredRecord, q: ScanQuery) -> bool:
    """Whether a scan of ``q`` lists ``record``: not expired, with every tag asked for
    (from the header values: no header model is built)."""
    values = header_values(record)
    expires = values["expires_at"]
    if expires is not None and expires <= q.now:
        return False
    if not q.tags:
        return True
    tags = values["tags"]
    return all(tags.get(k) == v for k, v in q.tags.items())
