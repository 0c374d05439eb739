"""Retention of the saver's threads: ``prune`` and the sweep of a :class:`ThreadRetention`.

A thread is every stream under ``langgraph/<thread>/`` (:mod:`._layout`): a
checkpoints stream and a writes stream per namespace. Retention works on whole
threads, never on one stream alone, because a namespace's pending writes belong
to its checkpoints and a subgraph's namespace to its parent's checkpoint.

What holds while a sweep runs beside graphs that write:

- *Never an older latest.* Checkpoints are removed oldest first and a
  namespace's newest goes last (``delete``) or never (``keep_latest``,
  ``keep_last``), so ``get_tuple`` of a thread returns its newest surviving
  checkpoint, never an older one, at every moment of the sweep.
- *Nothing written after the sweep judged a thread is removed.* ``delete``
  removes, per namespace, only the checkpoints up to the newest one it saw when
  it found the thread idle (by sequence); ``keep_latest`` and ``keep_last``
  keep the newest, so a checkpoint put meanwhile is among those kept. A
  checkpoint put into a thread while ``delete`` removes it survives, with its
  pending writes; the checkpoints before it do not.
- *No orphaned pending writes.* Once a namespace's checkpoints are trimmed, the
  writes records whose checkpoint is gone are removed: a page of writes records
  is read *before* the checkpoints are looked up (``load_many``), and LangGraph
  puts a checkpoint before its writes, so a writes record of a checkpoint put
  meanwhile is never taken for an orphan. A writes record left by a
  ``put_writes`` that raced a removal is an orphan the next sweep removes.

Each step is a page of at most 1000 records; nothing holds a lock across steps.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from statekeeper.errors import CheckpointDecodeError, InvalidOptions
from statekeeper.models import Retention

from .._background import BackgroundSweep
from . import _layout as lay
from ._policy import ThreadRetention
from ._threads import delete_thread

if TYPE_CHECKING:
    from statekeeper._core.store import BaseCheckpointStore

logger = logging.getLogger("statekeeper.integrations.langgraph")

_PAGE = 1000
#: The first page of a namespace's writes records: after a trim most namespaces
#: hold a few, and a small page is read inline where a backend can (SQLite reads
#: a page of 1000 on its worker thread, a hop that cost more than the read).
_FIRST_PAGE = 64
_WRITES_SUFFIX = "/writes"


@dataclass(frozen=True, slots=True)
class ThreadSweepReport:
    """What one sweep of the saver's threads did; each count is of what this sweep
    removed itself, so sweeps running at once never count a thing twice.

    ``threads_deleted``: idle threads removed (``"delete"``); ``threads_trimmed``:
    threads kept down to their newest checkpoints (an idle thread under
    ``"keep_latest"``, or any thread over ``keep_last``); ``checkpoints_removed``
    and ``writes_removed``: the checkpoints and the pending-writes records (one per
    checkpoint that had writes) removed; ``bytes_reclaimed``: the space the store
    gave back, where the backend can tell (``None`` elsewhere); ``seconds``: how
    long the sweep took; ``complete``: ``False`` when it stopped early (the saver
    closing, or ``sweep_limit`` reached), so that some threads were not looked at.
    """

    threads_deleted: int = 0
    threads_trimmed: int = 0
    checkpoints_removed: int = 0
    writes_removed: int = 0
    bytes_reclaimed: int | None = None
    seconds: float = 0.0
    complete: bool = True


class _Tally:
    __slots__ = ("checkpoints", "writes")

    def __init__(self) -> None:
        self.checkpoints = 0
        self.writes = 0


def thread_groups(streams: Sequence[str]) -> dict[str, builtins.list[str]]:
    """The saver's streams among ``streams``, grouped by thread (its stream prefix)."""
    groups: dict[str, builtins.list[str]] = {}
    for stream in streams:
        parts = stream.split("/")
        if len(parts) == 4 and parts[0] == lay.RESERVED and parts[3] in ("checkpoints", "writes"):
            groups.setdefault(f"{parts[0]}/{parts[1]}/", []).append(stream)
    return groups


def _namespaces(streams: Sequence[str]) -> builtins.list[str]:
    """The ``langgraph/<thread>/<namespace>/`` prefix of each namespace in ``streams``."""
    return sorted({stream[: stream.rindex("/") + 1] for stream in streams})


# -- the steps -----------------------------------------------------------------------


async def _drop_orphan_writes(store: BaseCheckpointStore[Any], namespace: str) -> int:
    """Remove the writes records of ``namespace`` whose checkpoint is gone."""
    removed = 0
    cursor = None
    limit = _FIRST_PAGE
    while True:
        page = await store.list(
            namespace + "writes", limit=limit, order="asc", after=cursor, include_state=False
        )
        limit = _PAGE
        owners = {
            item.id: "lg-" + item.id.removeprefix("lgw-")
            for item in page.items
            if item.id.startswith("lgw-")
        }
        if owners:
            # looked up after the page was read: see the module docstring
            try:
                live = set(await store.load_many(owners.values(), include_state=False))
            except CheckpointDecodeError as exc:
                logger.warning("kept a page of pending writes: a checkpoint is damaged: %s", exc)
                live = set(owners.values())
            doomed = [wid for wid, owner in owners.items() if owner not in live]
            if doomed:
                removed += await store.delete_many(doomed)
        if page.next_cursor is None:
            return removed
        cursor = page.next_cursor


async def _over(store: BaseCheckpointStore[Any], stream: str, keep_last: int) -> bool:
    """Whether ``stream`` may hold more than ``keep_last`` checkpoints: a read of
    their headers, so that a sweep that finds nothing to remove writes nothing (a
    prune is a write transaction even when it removes nothing)."""
    if keep_last >= _PAGE:
        return True
    page = await store.list(stream, limit=keep_last + 1, include_state=False)
    return page.has_more or len(page.items) + len(page.skipped) > keep_last


async def trim_thread(
    store: BaseCheckpointStore[Any], streams: Sequence[str], keep_last: int, tally: _Tally
) -> int:
    """Keep the newest ``keep_last`` checkpoints of each namespace of a thread (and
    their pending writes); return how many checkpoints went."""
    removed = 0
    present = set(streams)
    for namespace in _namespaces(streams):
        stream = namespace + "checkpoints"
        if stream in present and await _over(store, stream, keep_last):
            removed += await store.prune(stream, keep_last=keep_last)
        if namespace + "writes" in present:
            tally.writes += await _drop_orphan_writes(store, namespace)
    tally.checkpoints += removed
    return removed


async def _delete_up_to(store: BaseCheckpointStore[Any], stream: str, mark: int) -> int:
    """Remove the checkpoints of ``stream`` up to sequence ``mark``, oldest first."""
    removed = 0
    cursor = None
    while True:
        page = await store.list(stream, limit=_PAGE, order="asc", after=cursor, include_state=False)
        doomed = [item.id for item in page.items if item.sequence <= mark]
        doomed += [
            s.id
            for s in page.skipped
            if s.id is not None and s.sequence is not None and s.sequence <= mark
        ]
        if doomed:
            removed += await store.delete_many(doomed)
        if page.next_cursor is None or any(item.sequence > mark for item in page.items):
            return removed
        cursor = page.next_cursor


async def _delete_thread(
    store: BaseCheckpointStore[Any], streams: Sequence[str], marks: dict[str, int], tally: _Tally
) -> None:
    """Remove an idle thread: each namespace's checkpoints up to its mark, then the
    writes records left without their checkpoint."""
    for stream, mark in marks.items():
        tally.checkpoints += await _delete_up_to(store, stream, mark)
    present = set(streams)
    for namespace in _namespaces(streams):
        if namespace + "writes" in present:
            tally.writes += await _drop_orphan_writes(store, namespace)


async def _last_written(
    store: BaseCheckpointStore[Any], streams: Sequence[str]
) -> tuple[datetime, dict[str, int]] | None:
    """When the thread was last written (the newest ``updated_at`` of each stream's
    newest record), and each checkpoints stream's newest sequence; ``None`` when a
    newest record cannot be read, or the thread has no record left."""
    last: datetime | None = None
    marks: dict[str, int] = {}
    for stream in streams:
        page = await store.list(stream, limit=1, include_state=False)
        if page.skipped:
            logger.warning(
                "retention left %s alone: its newest record cannot be read (%s)",
                stream,
                page.skipped[0].reason,
            )
            return None
        if not page.items:
            continue
        newest = page.items[0]
        last = newest.updated_at if last is None else max(last, newest.updated_at)
        if stream.endswith(lay.CHECKPOINTS_SUFFIX):
            marks[stream] = newest.sequence
    return None if last is None else (last, marks)


# -- the public operations -----------------------------------------------------------


async def sweep(
    store: BaseCheckpointStore[Any],
    policy: ThreadRetention,
    *,
    stopping: Callable[[], bool] = lambda: False,
) -> ThreadSweepReport:
    """Apply ``policy`` once to every thread of the store (see the module docstring).

    A thread is idle when more than ``policy.idle`` has passed, by the store's
    clock, since its newest checkpoint or pending write in any namespace was
    written. An idle thread is deleted or kept down to its newest checkpoint per
    namespace (``policy.strategy``); every other thread is kept down to
    ``policy.keep_last`` per namespace. ``stopping()`` is asked between threads.
    Each thread costs a few header reads per namespace, and writes only where
    something goes (one removal per namespace trimmed, one for its writes).
    """
    started = time.perf_counter()
    now = store.now()
    tally = _Tally()
    deleted = trimmed = 0
    complete = True
    groups = thread_groups(await store.list_streams(prefix=lay.ROOT))
    for streams in groups.values():
        if stopping() or (
            policy.sweep_limit is not None and deleted + trimmed >= policy.sweep_limit
        ):
            complete = False
            break
        before = tally.checkpoints
        seen = None if policy.idle is None else await _last_written(store, streams)
        if seen is not None and policy.idle is not None and now - seen[0] > policy.idle:
            if policy.strategy == "delete":
                await _delete_thread(store, streams, seen[1], tally)
                deleted += tally.checkpoints > before
            else:
                await trim_thread(store, streams, 1, tally)
                trimmed += tally.checkpoints > before
            continue
        if policy.keep_last is not None:
            await trim_thread(store, streams, policy.keep_last, tally)
            trimmed += tally.checkpoints > before
    # S17's space: a sweep without rules only purges expired records and gives
    # back what the backend can (SQLite's freed pages)
    reclaimed = (await store.sweep(policy=Retention())).bytes_reclaimed
    return ThreadSweepReport(
        threads_deleted=deleted,
        threads_trimmed=trimmed,
        checkpoints_removed=tally.checkpoints,
        writes_removed=tally.writes,
        bytes_reclaimed=reclaimed,
        seconds=time.perf_counter() - started,
        complete=complete,
    )


async def prune(
    store: BaseCheckpointStore[Any],
    thread_ids: Sequence[str],
    strategy: str | None,
    keep_last: int | None,
) -> None:
    """LangGraph's ``prune``: ``"keep_latest"`` (the default), ``"delete"``, or, with
    ``keep_last=N``, each namespace's newest ``N`` checkpoints and their writes."""
    if keep_last is not None:
        if strategy is not None:
            raise ValueError("pass strategy= or keep_last=, not both")
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be a whole number of at least 1, got {keep_last!r}")
        keep = keep_last
    elif strategy in (None, "keep_latest"):
        keep = 1
    elif strategy == "delete":
        keep = 0
    else:
        raise ValueError(f"strategy must be 'keep_latest' or 'delete', got {strategy!r}")
    for thread_id in thread_ids:
        if keep == 0:
            await delete_thread(store, str(thread_id))
            continue
        streams = await store.list_streams(prefix=lay.thread_prefix(str(thread_id)))
        await trim_thread(store, streams, keep, _Tally())


class ThreadSweeper:
    """A saver's retention: its policy (``None``: none) over its store, swept once
    (:meth:`once`) or in the background (:meth:`background`)."""

    def __init__(self, store: BaseCheckpointStore[Any], policy: ThreadRetention | None) -> None:
        self.store = store
        self.policy = policy

    async def once(self, stopping: Callable[[], bool] = lambda: False) -> ThreadSweepReport:
        """:func:`sweep` under the policy; :class:`InvalidOptions` without one."""
        if self.policy is None:
            raise InvalidOptions(
                "this saver has no retention policy to sweep with: pass ttl= "
                '({"strategy": "delete", "default_ttl": minutes}) or keep_last= '
                "when making it"
            )
        return await sweep(self.store, self.policy, stopping=stopping)

    def background(self, every: timedelta) -> BackgroundSweep[ThreadSweepReport]:
        """A background sweep under the policy, every ``every`` (not started)."""
        return BackgroundSweep(self.once, every)
