"""Several streams listed as one, in sequence order: every namespace of a thread.

A thread's namespaces are separate streams, and its checkpoint records carry no
tag to list them together by, so ``list({"thread_id": t})`` and ``copy_thread``
page through each checkpoints stream of the thread and merge the pages by store
sequence. A thread has few namespaces (one per subgraph), so this is a few
listings side by side, each paged as one stream's listing is.
"""

from __future__ import annotations

import builtins
from collections import deque
from typing import TYPE_CHECKING, Any, Literal

from statekeeper.models import Checkpoint, Skipped

if TYPE_CHECKING:
    from statekeeper._core.store import BaseCheckpointStore

_PAGE = 250


class _Source:
    __slots__ = ("buffer", "cursor", "exhausted", "stream")

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.cursor: str | None = None
        self.buffer: deque[Checkpoint] = deque()
        self.exhausted = False


class Merge:
    """The checkpoints of ``streams`` in ``order`` of sequence, taken a batch at a time."""

    def __init__(
        self,
        store: BaseCheckpointStore[Any],
        streams: builtins.list[str],
        order: Literal["asc", "desc"],
        *,
        page: int = _PAGE,
    ) -> None:
        self._store = store
        self._sources = [_Source(s) for s in streams]
        self._order: Literal["asc", "desc"] = order
        self._page = page

    @property
    def done(self) -> bool:
        """Whether every record of every stream has been taken."""
        return all(s.exhausted and not s.buffer for s in self._sources)

    async def _fill(self, source: _Source, skipped: builtins.list[Skipped]) -> None:
        page = await self._store.list(
            source.stream, limit=self._page, order=self._order, after=source.cursor
        )
        source.buffer.extend(page.items)
        skipped.extend(page.skipped)
        source.cursor = page.next_cursor
        source.exhausted = page.next_cursor is None

    async def take(self, n: int) -> tuple[builtins.list[Checkpoint], builtins.list[Skipped]]:
        """Up to ``n`` records, next in order across the streams, and what the pages
        read for them left out as unreadable."""
        out: builtins.list[Checkpoint] = []
        skipped: builtins.list[Skipped] = []
        newest_first = self._order == "desc"
        while len(out) < n:
            for source in self._sources:
                # a page can be all skipped entries: read on until one has an item
                while not source.buffer and not source.exhausted:
                    await self._fill(source, skipped)
            live = [s for s in self._sources if s.buffer]
            if not live:
                break
            if len(live) == 1:  # one namespace left: its page in one go
                buffer = live[0].buffer
                while buffer and len(out) < n:
                    out.append(buffer.popleft())
                continue
            if newest_first:
                best = max(live, key=lambda s: s.buffer[0].sequence)
            else:
                best = min(live, key=lambda s: s.buffer[0].sequence)
            out.append(best.buffer.popleft())
        return out, skipped
