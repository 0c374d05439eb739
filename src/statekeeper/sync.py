"""A blocking facade for callers without an event loop (scripts, WSGI apps, the CLI).

::

    from statekeeper.sync import open_store

    with open_store("sqlite:///state.db") as store:
        store.save("job-1", {"step": 1})
        print(store.get_latest("job-1"))

Each :class:`SyncCheckpointStore` runs its async store on a private event loop in
a daemon thread; every method blocks until the call finishes there. The methods
have the same names, arguments, results, errors and contract as
:class:`statekeeper.CheckpointStore`. It is safe to call from several threads
(calls are serialised through the one loop). Do not call it from inside a running
event loop's thread: use the async store there.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, overload

from ._core.interface import TTL, Order, StoreInfo
from ._core.store import BaseCheckpointStore
from ._registry import open_store as _open_async
from ._url import StoreURL
from .models import (
    Checkpoint,
    CheckpointHeader,
    NewCheckpoint,
    Page,
    RepairReport,
    Retention,
    SweepReport,
    VerifyReport,
)

__all__ = ["SyncCheckpointStore", "open_store"]

T = TypeVar("T")


def open_store(
    url_or_config: str | StoreURL | Mapping[str, Any] | None = None, **options: Any
) -> SyncCheckpointStore:
    """Like :func:`statekeeper.open_store`, but blocking. The store is not yet open."""
    return SyncCheckpointStore(_open_async(url_or_config, **options))


class SyncCheckpointStore:
    """Blocking wrapper around one async store. See the module docstring."""

    def __init__(self, store: BaseCheckpointStore) -> None:
        self.store = store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="statekeeper-sync", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    @property
    def loop(self) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        """The event loop that runs the wrapped store, and the thread it runs on
        (started on first use). For adapters that must schedule the store's
        coroutines themselves, e.g. the LangGraph saver over a blocking store;
        never run blocking calls of this facade on that thread."""
        loop = self._ensure_loop()
        assert self._thread is not None
        return loop, self._thread

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._ensure_loop()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("SyncCheckpointStore called from its own event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # lifecycle

    def open(self) -> None:
        self._run(self.store.open())

    def close(self) -> None:
        """Close the store and stop the private loop thread."""
        try:
            if self._loop is not None:
                self._run(self.store.close())
        finally:
            with self._guard:
                loop, thread = self._loop, self._thread
                self._loop = self._thread = None
            if loop is not None and thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                thread.join()
                loop.close()

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # the API

    def save(
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
        return self._run(
            self.store.save(
                stream, state, tags=tags, metadata=metadata, parent_id=parent_id, ttl=ttl, id=id
            )
        )

    def get_latest(self, stream: str) -> Checkpoint | None:
        return self._run(self.store.get_latest(stream))

    @overload
    def load(self, id: str, *, include_state: Literal[True] = True) -> Checkpoint: ...
    @overload
    def load(self, id: str, *, include_state: bool) -> CheckpointHeader: ...
    def load(self, id: str, *, include_state: bool = True) -> CheckpointHeader:
        return self._run(self.store.load(id, include_state=include_state))

    @overload
    def load_many(
        self, ids: Iterable[str], *, include_state: Literal[True] = True
    ) -> dict[str, Checkpoint]: ...
    @overload
    def load_many(
        self, ids: Iterable[str], *, include_state: bool
    ) -> dict[str, CheckpointHeader]: ...
    def load_many(
        self, ids: Iterable[str], *, include_state: bool = True
    ) -> dict[str, Checkpoint] | dict[str, CheckpointHeader]:
        return self._run(self.store.load_many(ids, include_state=include_state))

    def cursor_at(
        self,
        id: str,
        *,
        order: Order = "desc",
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        return self._run(self.store.cursor_at(id, order=order, tags=tags, metadata=metadata))

    def save_many(self, items: Sequence[NewCheckpoint]) -> builtins.list[Checkpoint]:
        return self._run(self.store.save_many(items))

    def delete_many(self, ids: Iterable[str]) -> int:
        return self._run(self.store.delete_many(ids))

    def list(
        self,
        stream: str | None = None,
        *,
        limit: int = 20,
        order: Order = "desc",
        after: str | None = None,
        before: str | None = None,
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        include_state: bool = True,
    ) -> Page:
        return self._run(
            self.store.list(
                stream,
                limit=limit,
                order=order,
                after=after,
                before=before,
                tags=tags,
                metadata=metadata,
                include_state=include_state,
            )
        )

    def update(
        self,
        id: str,
        state: Any,
        *,
        if_match: str | None = None,
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        parent_id: str | None = None,
    ) -> Checkpoint:
        return self._run(
            self.store.update(
                id, state, if_match=if_match, tags=tags, metadata=metadata, parent_id=parent_id
            )
        )

    def delete(self, id: str, *, if_match: str | None = None) -> bool:
        return self._run(self.store.delete(id, if_match=if_match))

    def delete_stream(self, stream: str) -> int:
        return self._run(self.store.delete_stream(stream))

    def list_streams(self, *, prefix: str | None = None) -> builtins.list[str]:
        return self._run(self.store.list_streams(prefix=prefix))

    def prune(self, stream: str, *, keep_last: int) -> int:
        return self._run(self.store.prune(stream, keep_last=keep_last))

    def purge_expired(self) -> int:
        return self._run(self.store.purge_expired())

    def info(self) -> StoreInfo:
        return self._run(self.store.info())

    def verify(self, *, progress: Callable[[int], None] | None = None) -> VerifyReport:
        return self._run(self.store.verify(progress=progress))

    def repair(self, *, drop_damaged: bool = False) -> RepairReport:
        return self._run(self.store.repair(drop_damaged=drop_damaged))

    def sweep(
        self,
        *,
        dry_run: bool = False,
        policy: Retention | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> SweepReport:
        return self._run(self.store.sweep(dry_run=dry_run, policy=policy, progress=progress))

    def compact(self) -> int | None:
        return self._run(self.store.compact())
