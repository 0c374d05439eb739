"""One daemon thread that runs submitted calls in order: the one thread worker.

Every store thread of statekeeper is a :class:`Worker`: the file store's pool
(:class:`~statekeeper._runtime.threads.ThreadDoor`), and each SQLite connection's
thread (its readers and its writer). A call is handed over on a ``SimpleQueue`` and
its outcome comes back with one ``call_soon_threadsafe`` of the caller's loop, which
is 15-20 µs cheaper per call than ``asyncio.to_thread`` (see :mod:`.threads`).

Semantics, the same as ``to_thread`` where a caller could tell:

- a call whose awaiting task is cancelled before the thread picks it up never
  runs; one that has started runs to its end (its result or error is dropped);
- a call's exception (any ``BaseException``) is raised in the awaiting task and
  the thread goes on;
- calls of one worker run one at a time, in the order they were submitted;
- the calling context's ``contextvars`` are not carried to the thread, unless
  telemetry turned carrying on (:mod:`.context`: then each call runs in a copy of
  its caller's context, so the caller's span is the parent of spans opened there).

A worker given a :class:`~statekeeper._runtime.group.GroupCommit` (any
:class:`Grouper`) also takes
*grouped* calls (:meth:`Worker.run_grouped`): those queued together run as one
group (one commit), see there. :meth:`Worker.stop` and :meth:`Worker.run_last`
end the thread after the calls queued before (a last call runs even if its caller
was cancelled: it is what closes a connection). Threads do not survive ``fork``;
the owner of a worker checks the pid (as :class:`.threads.ThreadDoor` does) and
never touches a parent's worker in the child.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Sequence
from queue import SimpleQueue
from typing import Any, Protocol, TypeVar

from .context import CARRY, Carried

__all__ = [
    "GROUPED",
    "LAST",
    "PLAIN",
    "Busy",
    "Grouper",
    "Job",
    "Worker",
    "deliver",
    "deliver_all",
    "pick",
    "settle",
]

T = TypeVar("T")

#: The kinds of job: a call run alone, a call a group commit may run with others,
#: and the thread's last call (run even if cancelled; the thread ends after it).
PLAIN, GROUPED, LAST = 0, 1, 2

#: A queued call: the function, its arguments, the caller's loop and future
#: (``None`` for a call nobody awaits), and its kind.
Job = tuple[
    Callable[..., Any],
    tuple[Any, ...],
    "asyncio.AbstractEventLoop | None",
    "asyncio.Future[Any] | None",
    int,
]


class Grouper(Protocol):
    """What a worker hands its grouped jobs to (:class:`.group.GroupCommit`)."""

    def take(self, first: Job, queue: SimpleQueue[Job]) -> Job | None:
        """Run ``first`` and the grouped jobs queued behind it; return the plain job
        that ended the group, if one did (the worker runs it next)."""
        ...


class Busy(Protocol):
    """Anything :func:`pick` chooses among: a worker, or an owner of one."""

    @property
    def pending(self) -> int: ...


W = TypeVar("W", bound=Busy)


def settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    """On the future's loop: its result or exception, unless the caller gave up."""
    if fut.done():  # cancelled while the thread ran
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def deliver(
    loop: asyncio.AbstractEventLoop | None,
    fut: asyncio.Future[Any] | None,
    result: Any,
    exc: BaseException | None,
) -> None:
    """Hand one outcome back to its loop (from the worker's thread)."""
    if loop is None or fut is None:
        return  # nobody awaits this call
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
        loop.call_soon_threadsafe(settle, fut, result, exc)


def deliver_all(outcomes: Sequence[tuple[Job, Any, BaseException | None]]) -> None:
    """Settle a group's futures: one wake-up of each event loop, not one per future."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, Any, BaseException | None]]] = {}
    for outcome in outcomes:
        loop = outcome[0][2]
        if loop is not None:
            by_loop.setdefault(loop, []).append(outcome)

    for loop, settled in by_loop.items():

        def settle_all(settled: list[tuple[Job, Any, BaseException | None]] = settled) -> None:
            for job, result, exc in settled:
                fut = job[3]
                if fut is not None:
                    settle(fut, result, exc)

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle_all)


def _nothing() -> None:
    """The last call of a thread stopped without one."""


class Worker:
    """A daemon thread named ``name`` running submitted calls in order (see the module)."""

    def __init__(self, name: str, *, group: Grouper | None = None) -> None:
        self.queue: SimpleQueue[Job] = SimpleQueue()
        #: Calls submitted and not yet returned to their callers.
        self.pending = 0
        self._group = group
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        queue, group = self.queue, self._group
        carry: Job | None = None
        while True:
            job = carry if carry is not None else queue.get()
            carry = None
            if job[4] == GROUPED and group is not None:
                carry = group.take(job, queue)  # a plain job it met ends the group
            elif not _run(job):
                return
            # drop the references before waiting: a call may hold its store alive
            del job

    def run(self, fn: Callable[..., T], *args: Any) -> Coroutine[Any, Any, T]:
        """``fn(*args)`` on the thread; its result, or its exception."""
        return self._submit(fn, args, PLAIN)

    def run_grouped(self, fn: Callable[..., Any], *args: Any) -> Coroutine[Any, Any, Any]:
        """A call the worker's group commit runs, alone or with the grouped calls
        queued with it; what it returns is what the group commit's runner says."""
        return self._submit(fn, args, GROUPED)

    def run_last(self, fn: Callable[..., T], *args: Any) -> Coroutine[Any, Any, T]:
        """``fn(*args)`` after the calls queued before, even if the caller is
        cancelled meanwhile; the thread ends after it."""
        return self._submit(fn, args, LAST)

    async def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kind: int) -> Any:
        # (run() and the others return this coroutine: one coroutine per call, not two)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if CARRY.on:  # telemetry: the call runs in its caller's context
            fn = Carried(fn)
        self.pending += 1
        try:
            self.queue.put((fn, args, loop, fut, kind))
            return await fut
        finally:
            self.pending -= 1

    def stop(self, fn: Callable[..., object] = _nothing, *args: Any) -> threading.Thread:
        """End the thread after the calls queued before (and ``fn(*args)``, if given),
        with nobody awaiting it (any thread may call this; it never blocks).
        Returns the thread."""
        self.queue.put((fn, args, None, None, LAST))
        return self.thread


def _run(job: Job) -> bool:
    """Run one job and hand its outcome back; False if it was the thread's last."""
    fn, args, loop, fut, kind = job
    if kind != LAST and fut is not None and fut.cancelled():
        return True  # the caller gave up before we started: do nothing at all
    try:
        result = fn(*args)
    except BaseException as exc:  # handed to the awaiting task
        deliver(loop, fut, None, exc)
    else:
        deliver(loop, fut, result, None)
    return kind != LAST


def pick(workers: list[W], size: int, make: Callable[[int], W]) -> W:
    """The worker for the next call: an idle one, else a new one (``make(n)``) while
    fewer than ``size`` exist (appended to ``workers``), else the least busy."""
    for worker in workers:
        if not worker.pending:
            return worker
    if len(workers) < size:
        worker = make(len(workers))
        workers.append(worker)
        return worker
    return min(workers, key=lambda w: w.pending)
