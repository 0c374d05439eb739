"""Retention (SPEC S17): the one sweep of a policy, written over the primitives
(:func:`sweep`, which ``BaseCheckpointStore.sweep`` calls), its planner
(:class:`Plan`), and the background task that runs it every ``sweep_every``
(:class:`BackgroundSweep`, a part the store holds while open).

**How a sweep works.** It walks every live checkpoint of the store newest-first
(a keyset scan of every stream, 500 headers a page, no state decoded), so it meets
each stream's newest checkpoint before the stream's older ones and ranks them as
it goes, in one pass and O(streams) memory. The first page fixes the *horizon*:
the newest sequence when the sweep started. The walk never goes above it, so a
checkpoint saved after the sweep started is never looked at, let alone removed.
What goes, per stream, ranked newest-first among the checkpoints at or below the
horizon:

- ``keep_last=N``: ranks above ``N``;
- ``max_age``: checkpoints last written (``updated_at``) longer ago than it,
  except rank 1;
- ``idle``: every checkpoint of a stream whose rank 1 is older than it. The
  older ones are removed first, and the rank-1 checkpoints only once all of those
  are gone, so ``get_latest`` sees the stream's newest or ``None``, never an
  older one. A save into such a stream during the sweep is above the horizon: it
  survives whole, and the stream lives on with it.

Removals go through :meth:`~StorePrimitives._delete_many` in batches of at most
500 ids, so other tasks' and processes' saves and reads run between batches (a
SQL backend removes a batch in one statement); up to 50,000 are gathered first and
sorted by stream, so that a batch touches few streams. ``_delete_many`` counts only what
it removed itself, so sweeps running at once in several processes never count a
checkpoint twice. Ranks follow the scan's order, so a scan that repeats an entry
or goes back (a backend's bug) stops the sweep with :class:`BackendError` before it
removes by a wrong rank. A record that cannot be read is never removed by a sweep
(``verify`` reports it; ``repair(drop_damaged=True)`` removes it).

After removing, a sweep purges expired records (S8: they already behave as
deleted; they are not counted in the report) and asks the backend to give the
space back (:meth:`StorePrimitives._reclaim`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from ..config import StoreOptions
from ..errors import BackendError, InvalidQuery
from ..models import Retention, Skipped, SweepReport
from .primitives import StorePrimitives
from .query import ScanQuery

__all__ = ["BATCH", "BackgroundSweep", "Plan", "background_sweep", "chosen_policy", "sweep"]

_log = logging.getLogger("statekeeper.retention")

#: How a plan removes ids: how many it removed (a dry run: how many it would).
Remove = Callable[[list[str]], Awaitable[int]]

#: Checkpoints per scanned page and per removal batch.
BATCH = 500
#: Victims gathered before they are removed, sorted by stream, so that a batch
#: touches few streams (the file store writes one index file per stream touched):
#: streams that were saved to in turn have only a few victims in any one page.
#: About 4 MB of ids at most.
GATHER = 100 * BATCH


@dataclass
class Plan:
    """What one sweep decided so far: ranks per stream, ids to remove."""

    policy: Retention
    at: datetime
    ranks: dict[str, int] = field(default_factory=dict)
    idle: set[str] = field(default_factory=set)
    #: (stream, id) of what goes; flushed a few batches at a time, by stream
    victims: list[tuple[str, str]] = field(default_factory=list)
    #: the newest checkpoint of each idle stream, removed after everything else
    last: list[str] = field(default_factory=list)
    #: how many checkpoints the removals so far removed (a dry run: would remove)
    removed: int = 0

    def consider(self, stream: str, id: str, written: datetime) -> None:
        rank = self.ranks.get(stream, 0) + 1
        self.ranks[stream] = rank
        age = self.at - written
        policy = self.policy
        if rank == 1:
            if policy.idle is not None and age > policy.idle:
                self.idle.add(stream)
                self.last.append(id)
        elif (
            stream in self.idle
            or (policy.keep_last is not None and rank > policy.keep_last)
            or (policy.max_age is not None and age > policy.max_age)
        ):
            self.victims.append((stream, id))

    async def flush(self, remove: Remove) -> None:
        """Remove the victims gathered so far, sorted by stream (a batch then
        touches few streams: the file store writes one index file per stream)."""
        ids = [id for _, id in sorted(self.victims)]
        self.victims = []
        self.removed += await remove(ids)

    async def finish(self, remove: Remove) -> tuple[int, int]:
        """Remove what is left, then each idle stream's newest, last of all, so that
        ``get_latest`` never sees an older checkpoint: ``(checkpoints removed,
        streams removed)``, each counting only what ``remove`` said it removed."""
        await self.flush(remove)
        streams = await remove(self.last)
        self.last = []
        return self.removed + streams, streams


async def sweep(
    store: StorePrimitives,
    policy: Retention,
    at: datetime,
    *,
    dry_run: bool,
    purge: bool,
    progress: Callable[[int], None] | None = None,
) -> SweepReport:
    """Apply ``policy`` once to ``store`` at the store-clock time ``at`` (see the
    module docstring); with ``purge``, also purge expired records."""
    started = time.perf_counter()
    plan = Plan(policy, at)
    remove = partial(_remove, store, at=at, dry_run=dry_run)
    bound: int | None = None
    rules = policy.has_rules
    while rules:
        entries = await store._scan(ScanQuery(None, "desc", bound, BATCH, {}, at, False))
        if not entries:
            break
        below = bound
        for entry in entries:
            if isinstance(entry, Skipped):  # damaged: left to verify and repair
                continue
            if below is not None and entry.sequence >= below:
                # ranks follow scan order: a repeat would rank a newest one as old
                raise BackendError(
                    f"a sweep's scan went back (sequence {entry.sequence} after "
                    f"{below}); it stopped rather than remove by wrong ranks"
                )
            below = entry.sequence
            plan.consider(entry.stream, entry.id, entry.updated_at)
        bound = entries[-1].sequence
        if len(plan.victims) >= GATHER:
            await plan.flush(remove)
        if progress is not None:
            progress(len(entries))
    removed, streams = await plan.finish(remove)
    reclaimed: int | None = None
    if not dry_run:
        if purge:
            await store._purge_expired(at)
        reclaimed = await store._reclaim(full=False)
    return SweepReport(
        streams_removed=streams,
        checkpoints_removed=removed,
        bytes_reclaimed=reclaimed,
        seconds=time.perf_counter() - started,
        dry_run=dry_run,
    )


async def _remove(store: StorePrimitives, ids: list[str], *, at: datetime, dry_run: bool) -> int:
    """Remove ``ids`` in batches of the backend's ``_sweep_batch`` (at most
    :data:`BATCH`); how many this call removed (on a dry run, how many it would)."""
    if dry_run:
        return len(ids)
    removed = 0
    step = max(1, min(BATCH, store._sweep_batch))
    for start in range(0, len(ids), step):
        removed += await store._delete_many(ids[start : start + step], at)
    return removed


class BackgroundSweep:
    """The task that sweeps every ``sweep_every`` while a store is open.

    Started by ``open()`` and cancelled (and awaited) by ``close()``. A sweep that
    fails is logged on the ``statekeeper.retention`` logger and tried again at
    the next interval: it never ends the task or reaches the application.
    """

    def __init__(self, interval: float, run: Callable[[], Awaitable[SweepReport]], name: str):
        self._interval = interval
        self._run = run
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._loop(), name=f"statekeeper-sweep {self._name}"
        )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                report = await self._run()
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("background sweep of %s failed; retrying in %ss",
                               self._name, self._interval)  # fmt: skip
            else:
                _log.debug(
                    "background sweep of %s: removed=%d streams_removed=%d",
                    self._name, report.checkpoints_removed, report.streams_removed,
                )  # fmt: skip


def chosen_policy(option: Retention | None, given: Retention | None, where: str) -> Retention:
    """The policy a sweep applies: ``given`` if any, else the store's ``retention``
    option; :class:`InvalidQuery` when there is neither (the call itself is wrong,
    and sweeping with no rule by default would hide the mistake)."""
    chosen = option if given is None else given
    if not isinstance(chosen, Retention):
        raise InvalidQuery(
            f"sweep() needs a retention policy: pass policy=statekeeper.Retention(...) "
            f"or open {where} with retention=...; got {chosen!r}"
        )
    return chosen


def background_sweep(
    options: StoreOptions, run: Callable[[], Awaitable[SweepReport]], name: str
) -> BackgroundSweep | None:
    """The started background sweep of a store opened with ``options``, if its policy
    has ``sweep_every`` (never on a read-only store)."""
    policy = options.retention
    if policy is None or policy.sweep_every is None or options.read_only:
        return None
    sweeper = BackgroundSweep(policy.sweep_every.total_seconds(), run, name)
    sweeper.start()
    return sweeper
