"""The bound on every walk through a listing's pages, in the kit and the checkers.

A backend whose cursors do not move on (an ``after=`` bound off by one, a cursor
that starts over) makes a loop that follows ``next_cursor`` (or ``prev_cursor``)
run for ever: the kit would hang where it must fail. Every such loop counts its
pages with a :class:`PageBound`, which fails as soon as the walk reads more pages
than the listing has checkpoints plus :data:`MARGIN`, naming the test and the
cursor it was about to follow. No walk needs more: every page but the last holds
at least one entry (an item or a skipped record), and a page is never repeated.

Plain ``AssertionError`` and no pytest import: the reliability checkers
(``invariants``, ``recording``) use it in workload processes that import no pytest.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["MARGIN", "PageBound", "checkpoints_in"]

#: Pages a walk may read beyond one per checkpoint: the first page and an empty
#: last one, where a filtered listing ends on positions that no longer match.
MARGIN = 2


def _current_test() -> str:
    # pytest names the running test in the environment; outside pytest, say "a walk".
    running = os.environ.get("PYTEST_CURRENT_TEST")
    return running.rsplit(" ", 1)[0] if running else "a walk"


class PageBound:
    """Counts the pages of one walk and fails the walk that reads too many.

    ``checkpoints`` is how many checkpoints the listing can hold (every checkpoint
    of the store is a safe upper bound for any stream or filter). Call
    :meth:`turn` before reading each page after the first.
    """

    def __init__(self, checkpoints: int, *, follows: str = "next_cursor") -> None:
        self.checkpoints = checkpoints
        self.follows = follows
        self.pages = 1

    def turn(self, cursor: Any) -> None:
        """Count the page about to be read with ``cursor``; raise ``AssertionError``
        when it would be more than ``checkpoints + MARGIN`` pages."""
        self.pages += 1
        if self.pages > self.checkpoints + MARGIN:
            raise AssertionError(
                f"{_current_test()}: page {self.pages} of a walk over at most "
                f"{self.checkpoints} checkpoints, following {self.follows} {cursor!r}: "
                f"the cursors do not move on (more pages than checkpoints + {MARGIN})"
            )


async def checkpoints_in(store: Any) -> int:
    """An upper bound on how many checkpoints any listing of ``store`` holds: the
    count ``info()`` reports, else its high-water mark (sequences are never
    reused), else 10,000 for a backend that reports neither."""
    info = await store.info()
    for count in (info.checkpoints, info.high_water_mark):
        if count is not None:
            return int(count)
    return 10_000
