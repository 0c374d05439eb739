"""The inline budget: one body per read, run on the event loop's thread first.

A bounded read (a lookup, a page of at most ``INLINE_PAGE_ROWS`` rows) costs less
than the round trip to a worker thread (two thread wake-ups). So it runs right
where it is called, under a budget, and the *same* body runs again on a worker
when it reports that it would block: it would have to wait for a lock, or it
spent its budget (:func:`try_inline`). A body that only reads can always be run
again. The worker path is never a second copy of the read.

:class:`Budget` counts the work of one inline call in units the body reports
(SQLite: virtual-machine operations, through its progress handler, which stops
the statement once :meth:`Budget.spend` says so).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Final, TypeVar

__all__ = ["HOP", "Budget", "Hop", "try_inline"]

S = TypeVar("S")
T = TypeVar("T")


class Hop(Enum):
    """The answer of :func:`try_inline` when the body must run on a worker."""

    HOP = "hop"


HOP: Final = Hop.HOP


class Budget:
    """How much work one inline call may do, in steps of ``step`` units."""

    __slots__ = ("limit", "spent", "step")

    def __init__(self, limit: int, step: int) -> None:
        self.limit = limit
        self.step = step
        self.spent = 0

    def start(self) -> None:
        """A new inline call: nothing spent yet."""
        self.spent = 0

    def spend(self) -> int:
        """One more ``step`` spent; non-zero (stop) once past the limit (the shape of
        SQLite's progress handler)."""
        self.spent += self.step
        return int(self.spent > self.limit)


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
