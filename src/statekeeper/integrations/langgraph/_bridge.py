"""Running the saver's coroutines on the event loop that owns the store.

A store is bound to the loop that opened it (SQL engines and Redis connections
are). LangGraph calls a saver's async methods from the graph's loop and its sync
methods from plain threads, so every call goes through :class:`LoopBridge`:

- on the store's loop, a coroutine is awaited directly;
- from another loop, it is submitted to the store's loop and awaited there;
- from sync code in another thread, it is submitted and the thread blocks;
- from sync code ON the store's loop thread it is refused (blocking there would
  deadlock), as LangGraph's own async savers refuse it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ON_LOOP_MESSAGE = (
    "a synchronous StatekeeperSaver method was called on the event loop that runs "
    "the store, where blocking would deadlock; use the async interface there "
    "(await saver.aget_tuple(...), await graph.ainvoke(...)), or call the sync "
    "methods from another thread"
)


class LoopBridge:
    """Where the store's coroutines run; see the module docstring."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None,
        thread: threading.Thread | None = None,
    ) -> None:
        self.loop = loop
        self._thread = thread

    def _adopt_running(self) -> asyncio.AbstractEventLoop:
        running = asyncio.get_running_loop()
        if self.loop is None:
            # the first async call tells which loop the store lives on
            self.loop = running
        return running

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        running = self._adopt_running()
        loop = self.loop
        assert loop is not None
        if loop is running:
            return await coro
        if not loop.is_running():
            coro.close()
            raise RuntimeError(
                "the event loop that opened the store is not running; "
                "open the store in the loop that runs the graph"
            )
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        loop = self.loop
        if loop is None:
            coro.close()
            raise RuntimeError(
                "StatekeeperSaver does not know the event loop of its store yet: create "
                "the saver inside the loop that opened the store (or pass loop=), or "
                "open the store with statekeeper.sync.open_store(url, codec='raw')"
            )
        if running is loop or threading.current_thread() is self._thread:
            coro.close()
            raise asyncio.InvalidStateError(ON_LOOP_MESSAGE)
        if not loop.is_running():
            coro.close()
            raise RuntimeError(
                "the event loop that opened the store is not running, so a synchronous "
                "call cannot reach the store; run the graph while that loop runs (for "
                "example from a worker thread), or open the store with "
                "statekeeper.sync.open_store(url, codec='raw')"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()
