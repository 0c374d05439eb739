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
import contextlib
import os
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

__all__ = ["ThreadDoor"]

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():  # cancelled while the thread ran
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class _Thread:
    def __init__(self, name: str) -> None:
        self.queue: SimpleQueue[_Job | None] = SimpleQueue()
        self.pending = 0
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        queue = self.queue
        while True:
            job = queue.get()
            if job is None:  # close()
                return
            fn, args, loop, fut = job
            if fut.cancelled():
                continue  # its caller gave up before it started: it never runs
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting task
                outcome: tuple[Any, BaseException | None] = (None, exc)
            else:
                outcome = (result, None)
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_settle, fut, *outcome)
            del job, fn, args, fut, outcome


class ThreadDoor:
    """Up to ``size`` daemon threads named ``name-<n>``, started on demand."""

    def __init__(self, name: str, size: int = 4) -> None:
        self._name = name
        self._size = size
        self._threads: list[_Thread] = []
        self._pid = os.getpid()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the threads; its result, or its exception."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        worker = self._pick()
        worker.pending += 1
        try:
            worker.queue.put((fn, args, loop, fut))
            return await fut
        finally:
            worker.pending -= 1

    def _pick(self) -> _Thread:
        if self._pid != os.getpid():  # forked: the parent's threads are not here
            self._threads, self._pid = [], os.getpid()
        for worker in self._threads:
            if not worker.pending:
                return worker
        if len(self._threads) < self._size:
            worker = _Thread(f"{self._name}-{len(self._threads)}")
            self._threads.append(worker)
            return worker
        return min(self._threads, key=lambda w: w.pending)

    def close(self) -> None:
        """Let every thread end once it has run the calls queued before this."""
        threads, self._threads = self._threads, []
        if self._pid != os.getpid():
            return
        for worker in threads:
            worker.queue.put(None)
