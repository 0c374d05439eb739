"""``StatekeeperSaver``: LangGraph's ``BaseCheckpointSaver`` over a statekeeper store."""

from __future__ import annotations

import asyncio
import builtins
import random
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from statekeeper.errors import (
    CheckpointDecodeError,
    InvalidOptions,
    StoreClosed,
)

from .._background import BackgroundSweep
from . import _layout as lay
from . import _listing, _open, _retention, _threads
from ._bridge import LoopBridge
from ._policy import ThreadRetention, no_background, thread_retention, without_interval
from ._records import Records
from ._retention import ThreadSweepReport
from ._writes import PendingWrites

if TYPE_CHECKING:
    from statekeeper._core.store import BaseCheckpointStore
    from statekeeper.sync import SyncCheckpointStore

__all__ = ["StatekeeperSaver"]


class StatekeeperSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that keeps its checkpoints in a statekeeper store.

    Three ways to make one, all storing with ``codec="raw"``: the saver's ``serde``
    (``JsonPlusSerializer`` by default) encodes checkpoints, metadata and writes,
    and its bytes are stored verbatim.

    - ``async with StatekeeperSaver.from_conn_string(url) as saver:`` (or ``with``
      for sync use), as LangGraph's own savers open: the store is opened on entry
      and closed on exit. See :meth:`from_conn_string`.
    - ``StatekeeperSaver(url, **options)``: the saver opens the store itself,
      behind the blocking facade (:mod:`statekeeper.sync`), so its sync and async
      methods both work; :meth:`close` closes it.
    - ``StatekeeperSaver(store)`` over an **opened** store (async, or the blocking
      :class:`statekeeper.sync.SyncCheckpointStore`) that was opened with
      ``codec="raw"``; the caller keeps closing it.

    **Contract.**

    - *Strict latest.* ``get_tuple`` without a ``checkpoint_id`` returns the
      checkpoint of (thread, namespace) with the highest store ``sequence``, the
      one saved last, never by timestamp or id order. If that record is damaged
      it raises :class:`~statekeeper.errors.CheckpointDecodeError` and never
      returns the previous checkpoint. A damaged checkpoint asked for by id raises
      too.
    - *Tolerant listing.* ``list`` leaves out a checkpoint whose record cannot be
      read (as ``store.list`` does) and logs a warning naming it.
    - *Order.* ``list`` yields newest first by sequence; ``before=`` means saved
      before that checkpoint (its position, via ``cursor_at``).
    - *Cost.* ``get_tuple`` is two store round trips (the checkpoint, then its
      pending writes; one when a ``checkpoint_id`` is given), whatever the depth
      of the thread. ``list`` costs two per page of up to 250 checkpoints: the
      page, then every pending-writes record of the page in one ``load_many``.
      ``put_writes`` reads and rewrites the one writes record of its checkpoint,
      so writing to an old checkpoint after time travel costs the same.
    - *Concurrency.* Concurrent ``put_writes`` to one checkpoint merge through an
      etag compare-and-set (and an in-process lock), so no write is lost, also
      across processes where the backend is shared.

    **Retention** (``ttl=``, ``keep_last=``): ``ttl`` is LangGraph's
    ``checkpointer.ttl`` dict from ``langgraph.json`` (``strategy``,
    ``default_ttl``, ``sweep_interval_minutes``, ``sweep_limit``), checked strictly
    (:class:`InvalidOptions`); :meth:`asweep` says what a sweep does, and
    :meth:`from_conn_string` when the background sweep runs.

    Async methods may be awaited from any event loop: a call from another loop is
    run on the store's loop (the loop running when the saver was created, or
    ``loop=``). Sync methods block the calling thread while the store's loop runs
    the call; called on the store's loop thread they raise
    :class:`asyncio.InvalidStateError`, as LangGraph's async savers do.
    """

    def __init__(
        self,
        store: BaseCheckpointStore[Any] | SyncCheckpointStore | str,
        *,
        serde: SerializerProtocol | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        ttl: Mapping[str, Any] | None = None,
        keep_last: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(serde=serde)
        from statekeeper.sync import SyncCheckpointStore

        retention = thread_retention(ttl, keep_last)
        self._owned: SyncCheckpointStore | None = None
        self._background: BackgroundSweep[ThreadSweepReport] | None = None
        if isinstance(store, str):
            if loop is not None:
                raise TypeError("loop= goes with an opened store; a URL gets a loop of its own")
            store = self._owned = _open.open_sync(store, options)
        elif options:
            raise TypeError(
                f"store options ({', '.join(sorted(options))}) go with a URL; "
                "an opened store already has its own"
            )
        else:
            no_background(retention)  # the saver does not know when the store closes
        thread: threading.Thread | None = None
        if isinstance(store, SyncCheckpointStore):
            if loop is None:
                loop, thread = store.loop  # the facade's own thread runs the store
            store = store.store
        if store.options.codec != "raw":
            raise InvalidOptions(
                f"StatekeeperSaver needs a store opened with codec='raw', but "
                f"{store.describe()} uses codec={store.options.codec!r}: open it with "
                'open_store(url, codec="raw") (LangGraph\'s serializer makes the bytes)'
            )
        if not store.is_open:
            raise StoreClosed(
                f"{store.describe()} is not open; open it first "
                "('async with open_store(url, codec=\"raw\") as store:')"
            )
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None  # learnt at the first async call
        #: The store the checkpoints live in.
        self.store: BaseCheckpointStore[Any] = store
        self._bridge = LoopBridge(loop, thread)
        self._locks: dict[str, asyncio.Lock] = {}
        self._codec = Records(self.serde)
        self._writes = PendingWrites(store)
        self._sweeper = _retention.ThreadSweeper(store, retention)
        if self._owned is not None and retention is not None and retention.sweep_every:
            self._background = self._sweeper.background(retention.sweep_every)
            try:
                self._background.start_on(self._owned.loop[0])
            except BaseException:
                self.close()
                raise

    @classmethod
    def from_conn_string(
        cls,
        url: str,
        *,
        serde: SerializerProtocol | None = None,
        ttl: Mapping[str, Any] | None = None,
        keep_last: int | None = None,
        **options: Any,
    ) -> _open.SaverContext[Self]:
        """A saver over the store at ``url``, as a context manager, sync or async.

        ``async with StatekeeperSaver.from_conn_string("sqlite:///graph.db") as
        saver:`` opens the store on the running loop (``open_store(url,
        codec="raw", **options)``) and closes it when the block ends, as
        ``AsyncSqliteSaver.from_conn_string`` does; ``with`` does the same for sync
        code (``SqliteSaver.from_conn_string``), the store running behind the
        blocking facade. ``options`` are the store's (``durability=``,
        ``table_prefix=``, ...); a ``codec`` other than ``"raw"`` is refused
        (:class:`~statekeeper.errors.InvalidOptions`), and so is an option the
        backend does not know, before anything is opened or created.

        ``ttl`` and ``keep_last`` are the saver's retention (see the class
        docstring), checked before anything is opened. With
        ``ttl["sweep_interval_minutes"]`` a background sweep runs on the store's
        loop from entry to exit: the first ``m`` minutes after entry, each next
        ``m`` minutes after the previous one ended; on exit it is stopped (a sweep
        under way finishes the thread it is on) before the store closes.
        """
        policy = thread_retention(ttl, keep_last)
        every = None if policy is None else policy.sweep_every
        inner = without_interval(ttl)  # the context runs the background sweep
        return _open.SaverContext(
            url,
            lambda store: cls(store, serde=serde, ttl=inner, keep_last=keep_last),
            options,
            sweeping=None if every is None else (lambda saver: saver._sweeper.background(every)),
        )

    def close(self) -> None:
        """Close the store this saver opened from a URL (``StatekeeperSaver(url)``),
        after stopping its background sweep (a sweep under way finishes the thread
        it is on).

        A saver over a store the caller passed leaves it open: the caller closes it.
        Idempotent; blocks while the store closes, so call it outside the store's
        loop (it has its own thread for a URL)."""
        owned, self._owned = self._owned, None
        background, self._background = self._background, None
        if owned is not None:
            try:
                if background is not None:
                    background.stop_on(owned.loop[0])
            finally:
                owned.close()

    # -- retention --------------------------------------------------------------------

    @property
    def retention(self) -> ThreadRetention | None:
        """The retention policy of ``ttl=`` and ``keep_last=`` (``None``: none)."""
        return self._sweeper.policy

    async def asweep(self) -> ThreadSweepReport:
        """Apply the saver's retention (``ttl=``, ``keep_last=``) to every thread once.

        A thread is idle once more than ``default_ttl`` minutes have passed, by the
        store's clock, since its newest checkpoint or pending write in any namespace
        was written. An idle thread is deleted whole (``"delete"``, the default) or
        kept down to what a resume needs, the newest checkpoint of each namespace
        and its pending writes (``"keep_latest"``); every other thread keeps its
        newest ``keep_last`` checkpoints per namespace. While it runs,
        ``get_tuple`` never returns an older checkpoint than the newest that
        survives, a checkpoint put after the sweep judged its thread is kept, and
        no pending writes are left without their checkpoint. Raises
        :class:`InvalidOptions` when the saver has no policy.
        """
        return await self._bridge.call(self._sweeper.once())

    # -- versions -------------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The next channel version, in the format of LangGraph's own savers."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- async API ------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config``, or the latest of its (thread, namespace).

        Strict: a damaged checkpoint (or writes record) raises
        :class:`CheckpointDecodeError`; an older checkpoint is never returned instead.
        """
        return await self._bridge.call(self._get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first (by sequence), filtered by metadata, ``before=``
        a checkpoint and at most ``limit``. Tolerant: see the class docstring."""
        query = await self._bridge.call(self._plan(config, filter, before, limit))
        while not query.done:
            for item in await self._bridge.call(self._page(query)):
                yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Save a checkpoint (replacing one with the same id in its thread and
        namespace, keeping its position) and return its config."""
        return await self._bridge.call(self._put(config, checkpoint, metadata))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store pending writes of the checkpoint ``config`` names (merged, idempotent)."""
        await self._bridge.call(self._put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of the thread, in every namespace."""
        await self._bridge.call(_threads.delete_thread(self.store, str(thread_id)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is listed."""
        await self._bridge.call(_threads.delete_for_runs(self.store, self._records, run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another, ids and order kept."""
        await self._bridge.call(
            _threads.copy_thread(self.store, str(source_thread_id), str(target_thread_id))
        )

    async def aprune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str | None = None,
        keep_last: int | None = None,
    ) -> None:
        """Prune the threads: ``strategy="keep_latest"`` (the default) keeps the newest
        checkpoint (by sequence) of each namespace and its pending writes;
        ``"delete"`` deletes the threads; ``keep_last=N`` (instead of ``strategy``)
        keeps the newest ``N`` of each namespace and their pending writes. The
        pending writes of the checkpoints removed go with them."""
        await self._bridge.call(_retention.prune(self.store, thread_ids, strategy, keep_last))

    # -- sync API -------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Blocking :meth:`aget_tuple` (not on the store's loop thread)."""
        return self._bridge.call_sync(self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Blocking :meth:`alist`: one store call per page, as the iterator advances."""
        query = self._bridge.call_sync(self._plan(config, filter, before, limit))
        while not query.done:
            yield from self._bridge.call_sync(self._page(query))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Blocking :meth:`aput`."""
        return self._bridge.call_sync(self._put(config, checkpoint, metadata))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Blocking :meth:`aput_writes`."""
        self._bridge.call_sync(self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Blocking :meth:`adelete_thread`."""
        self._bridge.call_sync(_threads.delete_thread(self.store, str(thread_id)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Blocking :meth:`adelete_for_runs`."""
        self._bridge.call_sync(_threads.delete_for_runs(self.store, self._records, run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Blocking :meth:`acopy_thread`."""
        self._bridge.call_sync(
            _threads.copy_thread(self.store, str(source_thread_id), str(target_thread_id))
        )

    def prune(
        self,
        thread_ids: Sequence[str],
        *,
        strategy: str | None = None,
        keep_last: int | None = None,
    ) -> None:
        """Blocking :meth:`aprune`."""
        self._bridge.call_sync(_retention.prune(self.store, thread_ids, strategy, keep_last))

    def sweep(self) -> ThreadSweepReport:
        """Blocking :meth:`asweep`."""
        return self._bridge.call_sync(self._sweeper.once())

    # -- reading --------------------------------------------------------------------

    @property
    def _records(self) -> Records:
        # made per use: LangGraph lets ``serde`` be replaced after construction
        records = self._codec
        if records.serde is not self.serde:
            records = self._codec = Records(self.serde)
        return records

    async def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread, ns = _thread_ns(config)
        checkpoint_id = get_checkpoint_id(config)
        records = self._records
        if checkpoint_id:
            key = lay.checkpoint_key(thread, ns, checkpoint_id)
            wkey = lay.writes_key(thread, ns, checkpoint_id)
            found = await self.store.load_many([key, wkey])
            record = found.get(key)
            if record is None:
                return None
            return records.tuple(*records.decode(record), found.get(wkey))
        try:
            record = await self.store.get_latest(lay.checkpoint_stream(thread, ns))
            if record is None:
                return None
            ids, checkpoint, metadata = records.decode(record)
        except CheckpointDecodeError as exc:
            raise CheckpointDecodeError(
                f"{exc.reason} (the newest checkpoint of thread {thread!r}, namespace "
                f"{ns!r}; statekeeper never falls back to an older checkpoint: see "
                "`statekeeper verify` and `statekeeper repair`)",
                id=exc.id,
                location=exc.location,
                sequence=exc.sequence,
            ) from exc
        wkey = lay.writes_key(thread, ns, ids.checkpoint_id)
        writes = (await self.store.load_many([wkey])).get(wkey)
        return records.tuple(ids, checkpoint, metadata, writes)

    async def _plan(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> _listing.Query:
        return await _listing.plan(self.store, config, filter, before, limit)

    async def _page(self, query: _listing.Query) -> builtins.list[CheckpointTuple]:
        return await _listing.next_page(self.store, self._records, self._get_tuple, query)

    # -- writing --------------------------------------------------------------------

    async def _put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> RunnableConfig:
        thread, ns = _thread_ns(config)
        parent = config["configurable"].get("checkpoint_id") or None
        ids = lay.Ids(thread, ns, checkpoint["id"], parent)
        state = self._records.checkpoint_state(
            ids, checkpoint, get_checkpoint_metadata(config, metadata)
        )
        await _threads.upsert(
            self.store,
            lay.checkpoint_stream(thread, ns),
            state,
            lay.checkpoint_key(thread, ns, parent) if parent else None,
            lay.checkpoint_key(thread, ns, ids.checkpoint_id),
        )
        return {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": ids.checkpoint_id,
            }
        }

    async def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        thread, ns = _thread_ns(config)
        checkpoint_id = config["configurable"]["checkpoint_id"]
        new = self._records.writes(writes, task_id, task_path)
        if not new:
            return
        key = lay.writes_key(thread, ns, checkpoint_id)
        lock = self._locks.setdefault(key, asyncio.Lock())
        try:
            async with lock:  # tasks of one super-step write to one record: queue them here
                await self._writes.merge(
                    key,
                    lay.writes_stream(thread, ns),
                    lay.checkpoint_key(thread, ns, checkpoint_id),
                    new,
                )
        finally:
            if not lock.locked() and self._locks.get(key) is lock:
                del self._locks[key]


def _thread_ns(config: RunnableConfig) -> tuple[str, str]:
    conf = config["configurable"]
    return str(conf["thread_id"]), conf.get("checkpoint_ns") or ""
