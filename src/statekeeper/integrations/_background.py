"""The adapters' background sweep: the LangGraph saver's
(``ttl={"sweep_interval_minutes": m}``) and the Agent Framework storage's
(``retention=Retention(sweep_every=...)``).

:class:`BackgroundSweep` is one task on the event loop that runs the store. It
waits the interval, sweeps, and waits again: the first sweep runs one interval
after the task starts, and each next one an interval after the previous one
ended, so two never overlap. A sweep that raises is logged (logger
``statekeeper.integrations``) and the next one runs on schedule.

:meth:`BackgroundSweep.stop` ends it before the store closes: a wait ends at
once, and a sweep under way is told to stop (``stopping()`` turns true) and
stops at its next safe point (the LangGraph sweep after the thread it is on,
so a thread is never left with writes whose checkpoint is gone). Whoever
starts it stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Generic, TypeVar

logger = logging.getLogger("statekeeper.integrations")

R = TypeVar("R")
#: ``(stopping) -> report``: one sweep, asking ``stopping()`` at its safe points.
SweepOnce = Callable[[Callable[[], bool]], Awaitable[R]]


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` or until ``stop`` is set; ``True`` if it was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


class BackgroundSweep(Generic[R]):
    """Runs ``sweep`` every ``every`` on the loop it is started on (see the module)."""

    def __init__(self, sweep: SweepOnce[R], every: timedelta) -> None:
        self._sweep = sweep
        self._seconds = every.total_seconds()
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        #: The report of the last sweep that finished, or ``None``.
        self.last: R | None = None

    @property
    def running(self) -> bool:
        """Whether the task is started and not stopped."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the task on the running loop (the store's). Starting twice raises."""
        if self._task is not None:
            raise RuntimeError("this background sweep is already started")
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._run(self._stop), name="statekeeper-langgraph-sweep"
        )

    async def stop(self) -> None:
        """Stop the task and wait for it (on the loop it runs on). Idempotent."""
        task, stop = self._task, self._stop
        if task is None or stop is None:
            return
        stop.set()
        await task
        self._task = None

    async def _run(self, stop: asyncio.Event) -> None:
        while not await wait_or_stop(stop, self._seconds):
            try:
                self.last = await self._sweep(stop.is_set)
            except Exception:
                logger.exception("a background sweep failed; the next runs on schedule")

    # -- from another thread (the blocking facade's loop runs the store) ----------------

    def start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """:meth:`start` on ``loop``, running in another thread; blocks until started."""
        asyncio.run_coroutine_threadsafe(_call(self.start), loop).result()

    def stop_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """:meth:`stop` on ``loop``, running in another thread; blocks until stopped."""
        if self._task is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self.stop(), loop).result()


async def _call(function: Callable[[], None]) -> None:
    function()
