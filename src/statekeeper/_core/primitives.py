"""What a backend implements: the storage primitives, and honest defaults for the
optional ones.

:class:`StorePrimitives` is the backend-facing half of
:class:`~statekeeper.BaseCheckpointStore`, which inherits it. Every primitive works
on :class:`~statekeeper.record.StoredRecord` values that the base class has
already validated and encoded, so a backend never decides what is valid, how a
page is cut or what a cursor means. The eight abstract primitives are the whole
of a minimal backend; the others have defaults built on them, each saying where
it is racy and when to override it.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, cast

from ..errors import CheckpointDecodeError, StoreFormatError
from ..models import (
    Checkpoint,
    CheckpointHeader,
    Problem,
    RepairReport,
    Skipped,
    VerifyReport,
    checkpoint_with_state,
)
from ..record import NewRecord, StoredRecord, Update
from .integrity import RecordWalker, repair_records
from .query import PageScan, ScanQuery, probe_bound, probe_query

__all__ = ["StoreIdentity", "StorePrimitives"]


@dataclass(frozen=True, slots=True)
class StoreIdentity:
    """What ``_open`` returns: the persisted store id, cursor key and format version."""

    store_id: str
    cursor_key: bytes
    format_version: int | None = None


class StorePrimitives(ABC):
    """The primitives a backend implements (the ``_`` methods), and the backdoor.

    Concurrency: the base class calls these from many tasks at once; each
    primitive documented as atomic must be atomic against other tasks and, where
    the backend declares it, other processes and hosts.
    """

    #: At most how many checkpoints a sweep (S17) removes in one ``_delete_many``
    #: call. Other writers run between calls, so a backend that holds a lock for a
    #: whole call and does work per stream under it lowers this (the file store
    #: syncs one index file per stream a batch touches); it bounds their wait.
    _sweep_batch: ClassVar[int] = 500

    # -- the backdoor (conformance kit and repair tools only) ------------------------

    async def backdoor_read_raw(self, id: str) -> bytes:
        """The stored envelope bytes of ``id``, bypassing decoding. For the test kit.

        Backends that declare ``capabilities.raw_access`` implement this and
        :meth:`backdoor_write_raw`.
        """
        raise NotImplementedError(f"{type(self).__name__} has no raw-record backdoor")

    async def backdoor_write_raw(self, id: str, data: bytes) -> None:
        """Overwrite the stored bytes of ``id`` without validation. For the test kit."""
        raise NotImplementedError(f"{type(self).__name__} has no raw-record backdoor")

    # -- primitives: the abstract core ------------------------------------------------

    @abstractmethod
    async def _open(self) -> StoreIdentity:
        """Open or create the underlying storage; return its persisted identity.

        Create a random store id and a random cursor key (at least 16 bytes) on
        first open and persist them; raise :class:`StoreFormatError` for storage
        that is not a store or has a newer format.
        """

    @abstractmethod
    async def _close(self) -> None:
        """Release connections, handles and locks."""

    @abstractmethod
    async def _insert(self, record: NewRecord) -> CheckpointHeader:
        """Atomically assign the next sequence and persist ``record.seal(sequence)``.

        The sequence must exceed every sequence this store ever assigned (keep a
        persisted high-water mark; ``max(existing) + 1`` is wrong) and sequence order
        must equal commit order. Raise :class:`PreconditionFailed` if a checkpoint
        with ``record.id`` is live at ``record.now`` (the store's clock, not
        ``record.created_at``, which ``import_checkpoint`` copies from elsewhere);
        an expired one may be replaced.
        """

    @abstractmethod
    async def _update(self, update: Update) -> CheckpointHeader:
        """Atomically replace the state of live checkpoint ``update.id``.

        Read the current record, raise :class:`CheckpointNotFound` if it is not live
        at ``update.now``, :class:`PreconditionFailed` if ``update.if_match`` is given
        and differs from its etag, then persist ``update.applied_to(current)``,
        re-indexing tags (and metadata) where the backend indexes them, and return
        its header. The read and the write form one compare-and-set.
        ``update.codec`` names the codec of the new state (the record's codec
        changes with it); ``update.edits`` is ``None`` when only the state changes.
        """

    @abstractmethod
    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        """The live record ``id`` (``None`` if missing or expired at ``now``).

        Raise :class:`CheckpointDecodeError` if it exists but its bytes are unreadable.
        """

    @abstractmethod
    async def _scan(self, query: ScanQuery) -> builtins.list[StoredRecord | Skipped]:
        """Keyset scan; see :class:`ScanQuery`. Cost must be O(limit), not O(offset).

        A record whose bytes cannot be read is returned as a :class:`Skipped` whose
        ``sequence`` is set (the position must be known for cursors). Use
        :func:`skipped_from` to build it from a :class:`CheckpointDecodeError`.
        """

    async def _scan_page(self, query: ScanQuery, probe: bool) -> PageScan:
        """The scan of one listed page and, with ``probe``, its neighbour: whether a
        candidate exists one step the other way from the page's edge
        (:func:`~statekeeper._core.query.probe_query` of
        :func:`~statekeeper._core.query.probe_bound`), which decides the page's other
        cursor. ``probe`` is only asked for a query with a bound.

        The default makes two :meth:`_scan` calls. A backend may override it to read
        both in one hop or round trip; it must give the same answer as the default
        (the kit holds it to that) and return records only, as :meth:`_scan` does.
        """
        entries = await self._scan(query)
        if not probe:
            return PageScan(entries)
        found = await self._scan(probe_query(query, probe_bound(query, entries)))
        return PageScan(entries, bool(found))

    @abstractmethod
    async def _delete(self, id: str, *, if_match: str | None, now: datetime) -> bool:
        """Atomically delete live ``id``; ``False`` if missing or expired.

        With ``if_match``, raise :class:`PreconditionFailed` if the etag differs.
        """

    @abstractmethod
    async def _list_streams(self, now: datetime) -> builtins.list[str]:
        """Names of streams with at least one live checkpoint (any order)."""

    # -- primitives with defaults ----------------------------------------------------

    async def _insert_checkpoint(self, record: NewRecord, state: Any) -> Checkpoint:
        """:meth:`_insert`, then what ``save`` and ``import_checkpoint`` return: the
        inserted checkpoint with ``state`` (the caller's object, not decoded).

        The same rules as :meth:`_insert`. The default builds the checkpoint from
        the header :meth:`_insert` returns. A backend may override it to build that
        one model from ``record.header_values(sequence)`` without a header model in
        between (the memory store does); it must return what the default would.
        """
        return checkpoint_with_state(await self._insert(record), state)

    async def _get_many(self, ids: builtins.list[str], now: datetime) -> dict[str, StoredRecord]:
        """The live records among ``ids`` (distinct, valid), by id; missing ones absent.

        Raise :class:`CheckpointDecodeError` for one that exists but is unreadable,
        as :meth:`_get` does. Note for implementers: the default calls :meth:`_get`
        once per id; override it to answer in one round trip or one pass.
        """
        found: dict[str, StoredRecord] = {}
        for id in ids:
            record = await self._get(id, now)
            if record is not None:
                found[id] = record
        return found

    async def _insert_many(
        self, records: builtins.list[NewRecord]
    ) -> builtins.list[CheckpointHeader]:
        """Insert ``records`` atomically, with consecutive sequences in the given order.

        All or nothing, also after a crash; no reader sees part of the batch, and no
        concurrent insert takes a sequence between its items; one commit or one
        fsync group. The same id rules as :meth:`_insert` apply to each record (if
        one fails, none is written). Note for implementers: the default inserts one
        by one and is NOT atomic; override it and declare
        ``Capabilities(atomic_batches=True)``.
        """
        return [await self._insert(record) for record in records]

    async def _delete_many(self, ids: builtins.list[str], now: datetime) -> int:
        """Delete the live records among ``ids``; return how many. Note for
        implementers: the default calls :meth:`_delete` once per id; override it to
        delete in one pass or one round trip."""
        removed = 0
        for id in ids:
            removed += await self._delete(id, if_match=None, now=now)
        return removed

    async def _list_streams_prefixed(self, now: datetime, prefix: str) -> builtins.list[str]:
        """Names of live streams that start with ``prefix``. The default filters
        :meth:`_list_streams`; backends with an index on stream names override it."""
        return [name for name in await self._list_streams(now) if name.startswith(prefix)]

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        """The live record of ``stream`` with the highest sequence.

        The default is a one-item descending scan: correct and O(1) for backends
        whose scan is keyset-indexed. If the winner is unreadable it raises rather
        than falling back. Note for implementers: a backend whose scan is not
        atomic with respect to writers must retry here and finally raise
        :class:`~statekeeper.errors.ConcurrentModificationError`.
        """
        entries = await self._scan(ScanQuery(stream, "desc", None, 1, {}, now))
        if not entries:
            return None
        top = entries[0]
        if isinstance(top, Skipped):
            raise CheckpointDecodeError(
                top.reason, id=top.id, location=top.location, sequence=top.sequence
            )
        return top

    async def _delete_stream(self, stream: str, now: datetime) -> int:
        """Delete all of ``stream``. Note for implementers: the default deletes page by
        page through ``_scan``/``_delete``, so a save that commits meanwhile may
        survive; override with one atomic statement where the backend can."""
        removed = 0
        bound: int | None = None
        while True:
            batch = await self._scan(ScanQuery(stream, "asc", bound, 500, {}, now, False))
            if not batch:
                return removed
            for entry in batch:
                if entry.id is not None:
                    removed += await self._delete(entry.id, if_match=None, now=now)
            bound = batch[-1].sequence

    async def _prune(self, stream: str, keep_last: int, now: datetime) -> int:
        """Delete all but the newest ``keep_last`` of ``stream``. Same note as
        ``_delete_stream``."""
        removed = 0
        bound: int | None = None
        if keep_last:
            kept = await self._scan(ScanQuery(stream, "desc", None, keep_last, {}, now, False))
            if len(kept) < keep_last:
                return 0
            bound = kept[-1].sequence
        while True:
            batch = await self._scan(ScanQuery(stream, "desc", bound, 500, {}, now, False))
            if not batch:
                return removed
            for entry in batch:
                if entry.id is not None:
                    removed += await self._delete(entry.id, if_match=None, now=now)
            bound = batch[-1].sequence

    async def _purge_expired(self, now: datetime) -> int:
        """Remove records expired at ``now``; backends with ``capabilities.ttl`` override."""
        return 0

    async def _reclaim(self, full: bool) -> int | None:
        """Give the space of removed records back to the file system; return how
        many bytes came back, or ``None`` where the backend cannot tell.

        A sweep calls it with ``full=False`` after removing (cheap: SQLite's
        ``incremental_vacuum``); ``compact()`` with ``full=True`` (as thorough as
        the backend offers: SQLite's ``VACUUM``). The default does nothing and
        returns ``None``: right for a backend whose removals give space back
        themselves or whose server reclaims it on its own schedule.
        """
        return None

    async def _info(self) -> dict[str, Any]:
        """Counts for :meth:`info`: keys ``checkpoints``, ``streams``,
        ``high_water_mark`` and any backend-specific extras. ``checkpoints`` and
        ``streams`` count what reads see at ``self.now()`` (expired means deleted);
        a backend with TTL reports expired records not yet purged as ``expired``,
        when there are any."""
        return {}

    async def _verify(self) -> builtins.list[Problem] | None:
        """Check the backend's derived metadata (indexes, id tables, counters) against
        the records, without writing; return the problems found.

        The default returns ``None``: "not checked", which :meth:`verify` reports as
        an ``"unchecked"`` problem. A backend with no derived metadata returns
        ``[]``; one with indexes or tables must override this to be verifiable.
        """
        return None

    async def _verify_refused(self, error: StoreFormatError) -> VerifyReport | None:
        """The report of :meth:`verify` when a read path refused to answer with
        ``error`` (damaged derived data the reads will not work around), or
        ``None`` to let ``error`` propagate.

        The default returns ``None``. A backend that can still walk its keys or
        files without the read paths returns that walk's findings instead:
        ``complete=False``, with the refusal among the problems.
        """
        return None

    async def _repair(self, drop_damaged: bool) -> RepairReport:
        """Rebuild derived metadata from the records, then deal with damaged records.

        The default rebuilds nothing and only walks the records; with
        ``drop_damaged`` it deletes each damaged record by id through :meth:`_delete`.
        Backends with derived metadata override this, rebuild, then call
        :func:`statekeeper.repair_records` for the damaged records.
        """
        # Only BaseCheckpointStore subclasses this class, and the walk needs its
        # public reads and clock (what RecordWalker names).
        return await repair_records(cast(RecordWalker, self), drop_damaged, rebuilt={}, actions=[])
