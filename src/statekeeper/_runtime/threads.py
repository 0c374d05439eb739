"""A store's own worker threads: one hop per call, cheaper than ``asyncio.to_thread``.

``asyncio.to_thread`` goes through the loop's default executor: a
``concurrent.futures`` future, a copy of the context, a wrapper future, a
callback chain. For a store whose every operation is one such hop, that is
15-20 µs per call on the machines we measure on (a no-op ``to_thread`` round trip
40-46 µs, this pool's 27-28 µs). :class:`ThreadDoor` keeps a few threads of its
own, each waiting on its own queue, and hands the result back with one
``call_soon_threadsafe``.

Semantics, the same as ``to_thread`` where a caller could tell:

- a call whose awaiting task is cancelled before a thread picks it up never runs;
  one that has started runs to its end (its result or error is dropped);
- calls run concurrently, up to ``size`` at once (a call goes to an idle thread,
  one is started if none is idle and fewer than ``size`` run, else it queues on
  the thread with the fewest pending calls);
- after ``fork``, the child starts threads of its own on first use (the parent's
  do not exist there) and never touches the parent's;
- the calling context's ``contextvars`` are not carried to the thread.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, TypeVar

from .context import CARRY, Carried
from .worker import PLAIN, Worker, pick

__all__ = ["ThreadDoor"]

T = TypeVar("T")


class ThreadDoor:
    """Up to ``size`` daemon threads (:class:`~.worker.Worker`) named ``name-<n>``,
    started on demand."""

    def __init__(self, name: str, size: int = 4) -> None:
        self._name = name
        self._size = size
        self._threads: list[Worker] = []
        self._pid = os.getpid()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the threads; its result, or its exception."""
        # Worker.run's body, here: the thread is picked when the call starts, and one
        # coroutine per call, not two (this is every file-store operation's hop).
        worker = self._pick()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        call: Callable[..., Any] = Carried(fn) if CARRY.on else fn  # as Worker does
        worker.pending += 1
        try:
            worker.queue.put((call, args, loop, fut, PLAIN))
            return await fut
        finally:
            worker.pending -= 1

    def _pick(self) -> Worker:
        if self._pid != os.getpid():  # forked: the parent's threads are not here
            self._threads, self._pid = [], os.getpid()
        return pick(self._threads, self._size, self._make)

    def _make(self, n: int) -> Worker:
        return Worker(f"{self._name}-{n}")

    def close(self) -> None:
        """Let every thread end once it has run the calls queued before this."""
        threads, self._threads = self._threads, []
        if self._pid != os.getpid():
            return
        for worker in threads:
            worker.stop()
