"""``BaseCheckpointStore``: the contract, written once for every backend.

``BaseCheckpointStore`` implements every public method once: argument validation,
the codec, TTL arithmetic, cursors and paging. A backend implements a handful of
primitives over :class:`~statekeeper.record.StoredRecord` values (declared in
``primitives.py``, which this class inherits). That split is what makes every
backend behave the same: a backend cannot accept state another would refuse, or
page differently, because it never sees those decisions.

Each public method checks that the store is open (or writable), then hands the rest
to a helper (``paging``, ``batch``, ``writes``, ``integrity``, ``codecs``) that takes
what it uses: the primitives (this store), the clock, the codecs, the cursor signer.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, ClassVar, Generic, Literal, Self, cast, overload

from typing_extensions import TypeVar

from .._url import StoreURL
from ..codec import Codec
from ..config import Capabilities, StoreOptions, validate_options
from ..cursor import CursorSigner
from ..errors import CheckpointNotFound, ReadOnlyStore, StoreClosed, StoreFormatError
from ..models import (
    Checkpoint,
    CheckpointHeader,
    NewCheckpoint,
    Page,
    RepairReport,
    Retention,
    SweepReport,
    VerifyReport,
)
from ..rawcodec import RawCodec
from ..record import StoredRecord
from ..telemetry._switch import instrument, resolve
from . import batch, retention, validate, writes
from .codecs import decode_strict, store_codecs
from .integrity import verify_store
from .interface import TTL, Order, StoreInfo, store_info
from .paging import list_page
from .primitives import StoreIdentity, StorePrimitives
from .rekey import with_key_notices
from .sealing import Encryption, SealedPrimitives
from .validate import Scalar, check_id, check_if_match, check_stream

__all__ = ["BaseCheckpointStore", "OptionsT"]


#: The options model of a backend; ``BaseCheckpointStore[MyOptions]`` types
#: ``self.options`` as ``MyOptions`` (bare ``BaseCheckpointStore`` means ``StoreOptions``).
OptionsT = TypeVar("OptionsT", bound=StoreOptions, default=StoreOptions, covariant=True)


@instrument  # S18: a span per public operation (OPERATIONS in telemetry/_switch.py)
class BaseCheckpointStore(StorePrimitives, Generic[OptionsT]):
    """Base class for backends: implement the ``_`` primitives, inherit the contract.

    **The contract** (SPEC S1-S12), which the public methods here enforce for every
    backend:

    - *Strict reads.* :meth:`get_latest` and :meth:`load` return the newest / the
      requested checkpoint decoded, or raise :class:`CheckpointDecodeError`. They
      never fall back to an older checkpoint.
    - *Tolerant listing.* :meth:`list` leaves an unreadable checkpoint out of
      ``items`` and reports it in ``page.skipped``.
    - *Order* is the store-wide creation ``sequence``, never a timestamp.
    - *Symmetry.* :meth:`save` and :meth:`update` refuse, with
      :class:`CheckpointEncodeError` and nothing written, any state that
      :meth:`load` under the same configuration would refuse.
    - *Concurrency.* Every method is safe to call concurrently from many tasks;
      what holds across processes and hosts is declared in :attr:`capabilities`.

    **Subclassing.** Subclass ``BaseCheckpointStore[MyOptions]``, set
    :attr:`Options` to the same frozen :class:`StoreOptions` subclass (so
    ``self.options`` is typed ``MyOptions``, no casts) and :attr:`capabilities`,
    and implement ``_open``, ``_close``, ``_insert``, ``_update``, ``_get``,
    ``_scan``, ``_delete`` and ``_list_streams``. The other primitives have
    defaults built on those; override them where the backend can do better or
    must be atomic (the defaults' notes say where they are racy).
    Run :class:`statekeeper.testing.CheckpointStoreTests` against the result.
    """

    #: The options model of this backend (frozen, unknown options are errors).
    Options: ClassVar[type[StoreOptions]] = StoreOptions
    #: What this backend guarantees; the conformance kit reads it.
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: A short backend name for messages and ``info()``.
    backend_name: ClassVar[str] = "base"

    def __init__(
        self,
        *,
        clock: Callable[[], datetime] | None = None,
        **options: Any,
    ) -> None:
        #: The validated options, an instance of :attr:`Options`.
        self.options: OptionsT = cast(OptionsT, validate_options(self.Options, options))
        codecs = store_codecs(self.options)
        #: The JSON codec: metadata always, and states when ``codec="json"``.
        self.json_codec: Codec = codecs.json
        #: The codec new states are encoded with (the ``codec`` option).
        self.codec: Codec | RawCodec = codecs.state
        # Records name their codec, so this store reads records of either.
        self._decoders: dict[str, Codec | RawCodec] = codecs.decoders
        self._clock = clock or partial(datetime.now, UTC)
        self._ttl_rule = writes.TtlRule(self.capabilities.ttl, self.backend_name)
        self._identity: StoreIdentity | None = None
        self._signer: CursorSigner | None = None
        self._encryption = Encryption.of(self.options)  # S16 (None: plaintext)
        self._sealed: SealedPrimitives | None = None  # while open and encrypted
        self._sweeper: retention.BackgroundSweep | None = None  # while open, with sweep_every
        self._telemetry = resolve(self.options.telemetry)  # S18 (None: the process's)

    # -- construction -----------------------------------------------------------------

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> Self:
        """Build an unopened store from a parsed URL plus keyword options.

        The default takes the URL's query parameters as options; backends that read
        a path or host from the URL override this.
        """
        return cls(**url.merge_options(options))

    def describe(self) -> str:
        """Where this store lives, safe to print (no credentials)."""
        return f"{self.backend_name}://"

    # -- lifecycle --------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether the store is open: between a successful ``open()`` and ``close()``."""
        return self._identity is not None

    @property
    def store_id(self) -> str:
        """The persisted store id (raises :class:`StoreClosed` before :meth:`open`)."""
        return self._require_open().store_id

    async def open(self) -> None:
        """Open (create if needed) the store. Opening an open store does nothing."""
        if self._identity is None:
            identity = await self._open()
            if self._encryption is not None:  # sealed first: the check reads records
                self._sealed = self._encryption.seal(self, identity.store_id, self.describe())
            self._signer = CursorSigner(identity.cursor_key)
            self._identity = identity
            if self._encryption is not None:
                await self._encryption.check(self, self.describe(), self.now())
            # S17: a part of its own, only with retention's sweep_every
            self._sweeper = retention.background_sweep(self.options, self.sweep, self.describe())

    async def close(self) -> None:
        """Close the store. Closing a closed store does nothing; reopening is allowed."""
        if self._identity is not None:
            sweeper, self._sweeper = self._sweeper, None
            if sweeper is not None:
                await sweeper.stop()
            self._identity = None
            self._signer = None
            self._sealed = None
            await self._close()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _require_open(self) -> StoreIdentity:
        identity = self._identity
        if identity is None:
            raise StoreClosed(
                f"{self.describe()} is not open; use 'async with store:' or 'await store.open()'"
            )
        return identity

    def _open_signer(self) -> CursorSigner:
        """The cursor signer of the open store (raises :class:`StoreClosed` otherwise)."""
        self._require_open()
        signer = self._signer
        assert signer is not None, "an open store has its signer"
        return signer

    def _require_writable(self, what: str) -> StoreIdentity:
        identity = self._require_open()
        if self.options.read_only:
            raise ReadOnlyStore(
                f"{what} would write to {self.describe()}, which was opened with "
                "read_only=True; open it without read_only to change it"
            )
        return identity

    def now(self) -> datetime:
        """The store's clock: timezone-aware UTC (injectable for tests via ``clock=``)."""
        return self._clock()

    # -- the public API ---------------------------------------------------------------

    async def save(
        self,
        stream: str,
        state: Any,
        *,
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        parent_id: str | None = None,
        ttl: TTL | None = None,
        id: str | None = None,
    ) -> Checkpoint:
        """Save a new checkpoint at the end of ``stream`` and return it.

        The checkpoint gets a ``sequence`` greater than any this store ever assigned
        (S1). ``id`` is store-assigned unless given; a given id must match
        ``[A-Za-z0-9._:-]{1,200}`` and saving an id that is live raises
        :class:`PreconditionFailed`. ``ttl`` (seconds or a ``timedelta``) makes the
        checkpoint expire, and slides on every update.

        Strict: state that this store could not load raises
        :class:`CheckpointEncodeError` and nothing is written. Bad arguments raise
        :class:`InvalidQuery`. The returned ``state`` is the object you passed.
        Concurrent saves, from tasks or (where declared) processes, get distinct
        sequences in commit order.
        """
        self._require_writable("save")
        record = writes.new_record(
            self.codec,
            self.json_codec,
            self.now,
            self._ttl_rule,
            stream,
            state,
            tags=tags,
            metadata=metadata,
            parent_id=parent_id,
            ttl=ttl,
            id=id,
        )
        return await (self._sealed or self)._insert_checkpoint(record, state)

    async def import_checkpoint(self, checkpoint: CheckpointHeader, state: Any) -> Checkpoint:
        """Insert a checkpoint copied from another store, keeping its id, timestamps,
        etag, parent link, tags, metadata and expiry; it gets a new sequence here.

        Used by ``statekeeper copy``. Raises :class:`PreconditionFailed` if the id is
        live. The same validation as :meth:`save` applies.
        """
        self._require_writable("import")
        record = writes.imported_record(self.codec, self.json_codec, self.now, checkpoint, state)
        return await (self._sealed or self)._insert_checkpoint(record, state)

    async def get_latest(self, stream: str) -> Checkpoint | None:
        """The live checkpoint of ``stream`` with the highest sequence, or ``None``.

        Strict: if that checkpoint cannot be read or decoded this raises
        :class:`CheckpointDecodeError` naming it; it never returns an older one.
        Only the winner is decoded. If concurrent writers keep disturbing the read,
        the backend retries a bounded number of times, then raises
        :class:`~statekeeper.errors.ConcurrentModificationError`.
        """
        self._require_open()
        check_stream(stream)
        record = await (self._sealed or self)._latest(stream, self.now())
        return None if record is None else self._decode_strict(record)

    @overload
    async def load(self, id: str, *, include_state: Literal[True] = True) -> Checkpoint: ...
    @overload
    async def load(self, id: str, *, include_state: bool) -> CheckpointHeader: ...
    async def load(self, id: str, *, include_state: bool = True) -> CheckpointHeader:
        """The live checkpoint ``id``, decoded.

        Raises :class:`CheckpointNotFound` if there is none (never existed, deleted,
        expired) and :class:`CheckpointDecodeError` if it cannot be read or decoded.
        With ``include_state=False`` it returns the :class:`CheckpointHeader` and
        decodes no state (a record whose envelope is damaged still raises).
        """
        self._require_open()
        check_id(id, what="id")
        record = await (self._sealed or self)._get(id, self.now())
        if record is None:
            raise CheckpointNotFound(id)
        return self._decode_strict(record) if include_state else record.header

    @overload
    async def load_many(
        self, ids: Iterable[str], *, include_state: Literal[True] = True
    ) -> dict[str, Checkpoint]: ...
    @overload
    async def load_many(
        self, ids: Iterable[str], *, include_state: bool
    ) -> dict[str, CheckpointHeader]: ...
    async def load_many(
        self, ids: Iterable[str], *, include_state: bool = True
    ) -> dict[str, Checkpoint] | dict[str, CheckpointHeader]:
        """The live checkpoints among ``ids`` by id (missing, expired ids absent), strict
        like :meth:`load` (a damaged one raises, named). At most 1000 ids, duplicates read
        once, in one round trip or pass. ``include_state=False`` gives headers, as list."""
        self._require_open()
        return await batch.load_many(
            self._sealed or self, self.now, self._decode_strict, ids, include_state
        )

    async def cursor_at(
        self,
        id: str,
        *,
        order: Order = "desc",
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Scalar] | None = None,
    ) -> str:
        """The cursor of checkpoint ``id``'s position in ``list(<its stream>, order=,
        tags=, metadata=)``.

        ``list(stream, after=c)`` continues strictly past the checkpoint and
        ``list(stream, before=c)`` gives the page before it, with the same query
        arguments (the cursor is bound to them). It costs what one :meth:`load`
        costs (no state is decoded), whatever the checkpoint's depth. Raises
        :class:`CheckpointNotFound` and :class:`CheckpointDecodeError` like
        :meth:`load`. The checkpoint need not match the filters: a cursor marks a
        position, not an item.
        """
        signer = self._open_signer()
        if self._sealed is not None:  # a cursor for a filter no listing can answer
            self._sealed.check_filters(tags, metadata)
        return await batch.cursor_at(
            self._sealed or self, self.now, signer, id, order, tags, metadata
        )

    async def list(
        self,
        stream: str | None = None,
        *,
        limit: int = 20,
        order: Order = "desc",
        after: str | None = None,
        before: str | None = None,
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Scalar] | None = None,
        include_state: bool = True,
    ) -> Page:
        """One page of checkpoints of ``stream`` (of every stream when ``None``).

        Tolerant: a checkpoint that cannot be read or decoded is left out of
        ``items`` and reported in ``page.skipped``. It still uses a slot of the page,
        so a page can be short while ``has_more`` is true.

        Order is by sequence, ``"desc"`` (newest first, the default) or ``"asc"``.
        ``after=page.next_cursor`` continues in that order; ``before=page.prev_cursor``
        gives the adjacent preceding page, still in the requested order. Cursors
        mark positions, not items, so they survive deletion, expiry and tag
        filtering of their item; they are bound to this store and to
        ``(stream, order, tags, metadata)`` and raise :class:`InvalidCursor` elsewhere.
        ``tags`` keeps checkpoints that have all those tags; ``metadata`` keeps those
        whose top-level metadata keys equal the given JSON scalars, by JSON kind and
        value (``True`` is not ``1``, ``1`` is not ``1.0``). ``limit`` is 1..1000.
        ``include_state=False`` gives :class:`CheckpointHeader` items, with no ``state``
        (never a stored ``None``; as load). A page costs O(limit), at any offset.
        """
        signer = self._open_signer()
        if self._sealed is not None:
            self._sealed.check_filters(tags, metadata)
        return await list_page(
            self._sealed or self,
            signer,
            self.now,
            self._decode_strict,
            self.capabilities.metadata_filter,
            stream,
            limit=limit,
            order=order,
            after=after,
            before=before,
            tags=tags,
            metadata=metadata,
            include_state=include_state,
        )

    async def update(
        self,
        id: str,
        state: Any,
        *,
        if_match: str | None = None,
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        parent_id: str | None = None,
    ) -> Checkpoint:
        """Replace the state of checkpoint ``id``, and its ``tags``, ``metadata`` and
        ``parent_id`` where given (``None`` keeps them).

        Keeps ``id``, ``sequence`` (its position) and ``created_at``; changes
        ``etag`` and ``updated_at``; a TTL slides. With ``if_match`` this is a true
        compare-and-set: it raises :class:`PreconditionFailed` unless the current
        etag equals ``if_match``. Raises :class:`CheckpointNotFound` if ``id`` is not
        live and :class:`CheckpointEncodeError` (nothing written) for state this
        store could not load.
        """
        self._require_writable("update")
        return await writes.update(
            self._sealed or self, self.codec, self.json_codec, self.now, id, state,
            if_match=if_match, tags=tags, metadata=metadata, parent_id=parent_id,
        )  # fmt: skip

    async def delete(self, id: str, *, if_match: str | None = None) -> bool:
        """Delete checkpoint ``id``; return whether anything was removed.

        Idempotent: deleting a missing or expired checkpoint returns ``False``. With
        ``if_match``, a live checkpoint whose etag differs raises
        :class:`PreconditionFailed`. The sequence is never reused.
        """
        self._require_writable("delete")
        check_id(id, what="id")
        check_if_match(if_match)
        return await self._delete(id, if_match=if_match, now=self.now())

    async def delete_stream(self, stream: str) -> int:
        """Delete every checkpoint of ``stream``; return how many. Other streams are untouched."""
        self._require_writable("delete_stream")
        check_stream(stream)
        return await self._delete_stream(stream, self.now())

    async def list_streams(self, *, prefix: str | None = None) -> builtins.list[str]:
        """The names of the streams that have a live checkpoint, sorted; only those
        that start with ``prefix`` when it is given (SQL answers from its index)."""
        self._require_open()
        if prefix is None:
            return sorted(await self._list_streams(self.now()))
        validate.check_prefix(prefix)
        return sorted(await self._list_streams_prefixed(self.now(), prefix))

    async def save_many(self, items: Sequence[NewCheckpoint]) -> builtins.list[Checkpoint]:
        """Save several checkpoints atomically and return them in the order given.

        Every item is validated and encoded first: one bad item raises (as
        :meth:`save` would) and nothing is written. Items may span streams and get
        consecutive sequences in the order given; a concurrent save never lands
        between them. After a crash either every item is there or none is, and no
        reader sees part of a batch. It costs one commit (one fsync group), not one
        per item. At most 1000 items; two items with the same ``id`` raise
        :class:`PreconditionFailed`. Atomicity needs ``capabilities.atomic_batches``.
        """
        self._require_writable("save_many")
        make = partial(writes.new_record, self.codec, self.json_codec, self.now, self._ttl_rule)
        return await batch.save_many(self._sealed or self, make, items)

    async def delete_many(self, ids: Iterable[str]) -> int:
        """Delete the live checkpoints among ``ids``; return how many were removed.

        Idempotent like :meth:`delete` (missing ids count 0); one pass or one round
        trip, not one per id. At most 1000 ids.
        """
        self._require_writable("delete_many")
        return await batch.delete_many(self, self.now, ids)

    async def prune(self, stream: str, *, keep_last: int) -> int:
        """Delete all but the ``keep_last`` newest checkpoints of ``stream``; return how many."""
        self._require_writable("prune")
        check_stream(stream)
        validate.check_keep_last(keep_last)
        return await self._prune(stream, keep_last, self.now())

    async def purge_expired(self) -> int:
        """Remove expired checkpoints for good and reclaim their space; return how many."""
        self._require_writable("purge_expired")
        return await self._purge_expired(self.now())

    async def sweep(
        self,
        *,
        dry_run: bool = False,
        policy: Retention | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> SweepReport:
        """Apply a retention policy once (SPEC S17): ``policy`` if given, else the
        store's ``retention`` option; return what was removed.

        ``keep_last`` and ``max_age`` never remove a stream's newest checkpoint.
        ``idle`` removes a stream whole, its newest checkpoint last, so
        :meth:`get_latest` returns the stream's newest or ``None``, never an older
        one, while a sweep runs. A checkpoint saved after the sweep started is never
        removed (a save into a stream being removed as idle survives, whole). Work
        goes in bounded batches, so other tasks and processes save and read
        meanwhile. Sweeps may run at once, in tasks or processes: each counts only
        the checkpoints it removed itself. Ages come from the store's clock. A
        sweep also purges expired records (not counted: they already behave as
        deleted) and gives space back where the backend can (SQLite's freed pages).

        ``dry_run=True`` writes nothing and reports what would go; it is allowed on
        a store opened ``read_only=True`` (a real sweep raises
        :class:`ReadOnlyStore` there). With no policy at all (no ``retention``
        option and no ``policy``) it raises :class:`InvalidQuery`: like a bad
        argument, the call itself is wrong, and sweeping with no rule by default
        would hide the mistake. ``progress``, if given, is called with the number of
        checkpoints examined since its last call. Costs O(store) reads and
        O(streams) memory.
        """
        if dry_run:
            self._require_open()
        else:
            self._require_writable("sweep")
        chosen = retention.chosen_policy(self.options.retention, policy, self.describe())
        return await retention.sweep(
            self,
            chosen,
            self.now(),
            dry_run=dry_run,
            purge=self.capabilities.ttl,
            progress=progress,
        )

    async def compact(self) -> int | None:
        """Give all free space back to the file system, as thoroughly as the backend
        can; return the bytes given back, or ``None`` where it cannot tell.

        SQLite runs a full ``VACUUM``: it rewrites the whole database into a new
        file (time O(store), a moment of up to twice the disk space, and writers
        wait for it), which is what a store created before incremental
        auto-vacuum needs once. Other backends return ``None`` and have little or
        nothing to do: the file store and Redis give space back as they remove
        (the file store removes empty bucket directories here, as after a
        sweep), and PostgreSQL and MySQL reclaim it on the server's schedule
        (autovacuum, ``OPTIMIZE TABLE``). Raises :class:`ReadOnlyStore` on a
        read-only store.
        """
        self._require_writable("compact")
        return await self._reclaim(full=True)

    async def info(self) -> StoreInfo:
        """Backend, format version, store id, counts and the sequence high-water mark."""
        identity = self._require_open()
        extra = await self._info()
        return store_info(self.backend_name, self.describe(), identity, self.capabilities, extra)

    async def verify(self, *, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Check every record and every index or table against the records.

        Read-only: it writes nothing, so it is the check to run on a store opened
        with ``read_only=True`` (``statekeeper verify`` does). It reads every record
        through the tolerant listing (decoding each state), loads each one's header
        by id (it must be the same record), and reads the latest of
        every stream strictly, so each read path is exercised; then the backend
        checks its own derived metadata (:meth:`_verify`). A backend that cannot
        check its metadata says so with an ``"unchecked"`` problem, so the report
        is never ``ok`` about a store that was not fully checked. Costs O(store).
        Writers may run meanwhile; a checkpoint deleted or expired during the walk
        is not a problem. ``progress``, if given, is called with the number of
        records checked since its last call. Where a read path refuses to answer
        (:class:`StoreFormatError`), the report is the backend's own walk
        (:meth:`_verify_refused`, ``complete=False``) if it has one; else it raises.
        """
        self._require_open()
        try:
            report = await verify_store(self, progress)
            return await with_key_notices(report, self._sealed, self.now)
        except StoreFormatError as exc:
            walked = await self._verify_refused(exc)
            if walked is None:
                raise
            return walked

    async def repair(self, *, drop_damaged: bool = False) -> RepairReport:
        """Rebuild what can be rebuilt from the records, and report what stays damaged.

        Records are the truth: every acknowledged checkpoint keeps its sequence.
        A damaged record stays, and strict reads keep raising
        :class:`CheckpointDecodeError` for it, unless ``drop_damaged=True``: that
        is the only way a damaged acknowledged checkpoint goes away. Raises
        :class:`ReadOnlyStore` on a read-only store. Costs O(store); backends hold
        their write lock for the rebuild where they have one.
        """
        self._require_writable("repair")
        return await self._repair(drop_damaged)

    # -- helpers for subclasses ------------------------------------------------------
    def _decode_strict(self, record: StoredRecord) -> Checkpoint:
        """Decode a record's state, or raise :class:`CheckpointDecodeError` naming it."""
        return decode_strict(self._decoders, record)
