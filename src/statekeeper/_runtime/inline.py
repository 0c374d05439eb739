"""The inline budget: one body per call, run on the event loop's thread first.

A bounded call (a lookup, a page of at most ``INLINE_PAGE_ROWS`` rows, a fast
save) costs less than the round trip to a worker thread (two thread wake-ups). So
it runs right where it is called, under a :class:`Budget`, and the *same* body
runs again on a worker when it reports that it would block: it would have to wait
for a lock, sync, or it spent its budget (:func:`try_inline`). A body that blocks
before it writes anything can always be run again. The worker path is never a
second copy of the call.

One :class:`Budget` serves every backend that runs calls inline:

- SQLite counts virtual-machine operations through its progress handler, which
  stops the statement once :meth:`Budget.spend` says so;
- the file store's reads and fast saves call :meth:`Budget.block` wherever they
  would block, which raises :class:`WouldBlock` inline and does nothing under the
  worker's budget, :data:`WORKER`.

An ``await`` of a call that ran inline never gives the loop a turn, so a task that
only reads would keep every other task waiting (a save whose worker has finished
included) until it stops. :class:`Turns` makes every store that runs calls inline
yield once every :data:`TURN_EVERY` of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import Enum
from typing import Final, TypeVar

__all__ = ["HOP", "TURN_EVERY", "WORKER", "Budget", "Hop", "Turns", "WouldBlock", "try_inline"]

S = TypeVar("S")
T = TypeVar("T")


class Hop(Enum):
    """The answer of :func:`try_inline` when the body must run on a worker."""

    HOP = "hop"


HOP: Final = Hop.HOP


class WouldBlock(Exception):
    """An inline call met what only a worker may do: run it again there."""


class Budget:
    """How much one call may do: ``inline`` on the event loop's thread, up to
    ``limit`` units counted in steps of ``step``; a worker's budget
    (``inline=False``) never blocks and never runs out.

    ``kept`` is the call's own scratch between its steps (the file store keeps the
    bucket directory descriptor it last checked there), empty at :meth:`start`.
    """

    __slots__ = ("inline", "kept", "limit", "spent", "step")

    def __init__(self, limit: int = sys.maxsize, step: int = 1, *, inline: bool = True) -> None:
        self.inline = inline
        self.limit = limit
        self.step = step
        self.spent = 0
        self.kept: dict[int, int] = {}

    def start(self) -> None:
        """A new inline call: nothing spent, nothing kept yet."""
        self.spent = 0
        self.kept.clear()

    def spend(self) -> int:
        """One more ``step`` spent; non-zero (stop) once an inline call is past the
        limit (the shape of SQLite's progress handler)."""
        self.spent += self.step
        return int(self.inline and self.spent > self.limit)

    def block(self) -> None:
        """Here the call would block: inline, raise :class:`WouldBlock` (the caller
        runs the call again on a worker); on a worker, go on."""
        if self.inline:
            raise WouldBlock


#: Inline calls of one store between two turns it gives the event loop.
TURN_EVERY = 16


class Turns:
    """The count of one store's inline calls: :meth:`due` is true for every
    :data:`TURN_EVERY`-th, which then yields first (``await asyncio.sleep(0)``), so
    that a task whose calls all run inline still lets the loop run the others. Only
    the event loop's thread counts; a miscount under several loops only moves a turn.
    """

    __slots__ = ("_left",)

    def __init__(self) -> None:
        self._left = TURN_EVERY

    def due(self) -> bool:
        self._left -= 1
        if self._left > 0:
            return False
        self._left = TURN_EVERY
        return True


#: A worker's budget: unlimited, and :meth:`Budget.block` does nothing.
WORKER: Final = Budget(inline=False)


def try_inline(
    body: Callable[[S], T],
    here: S,
    would_block: Callable[[Exception], bool],
    budget: Budget | None = None,
) -> T | Hop:
    """``body(here)`` on this thread, or :data:`HOP` if it raised an error that
    ``would_block`` says means "run me on a worker" (any other error is raised)."""
    if budget is not None:
        budget.start()
    try:
        return body(here)
    except Exception as exc:
        if would_block(exc):
            return HOP
        raise
