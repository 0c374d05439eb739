"""Retention (SPEC S17): ``sweep()`` and ``compact()`` of every store, one sweep
of a policy written once over the primitives, and the background task that runs
it every ``sweep_every``.

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
checkpoint twice. A record that cannot be read is never removed by a sweep
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
from typing import TYPE_CHECKING, ClassVar, cast

from ..config import Capabilities, StoreOptions
from ..errors import InvalidQuery
from ..models import Retention, Skipped, SweepReport
from .primitives import StoreIdentity, StorePrimitives
from .query import ScanQuery

__all__ = ["BATCH", "BackgroundSweep", "RetentionMethods", "sweep"]

_log = logging.getLogger("statekeeper.retention")

#: Checkpoints per scanned page and per removal batch.
BATCH = 500
#: Victims gathered before they are removed, sorted by stream, so that a batch
#: touches few streams (the file store writes one index file per stream touched):
#: streams that were saved to in turn have only a few victims in any one page.
#: About 4 MB of ids at most.
GATHER = 100 * BATCH


@dataclass
class _Plan:
    """What one sweep decided so far: ranks per stream, ids to remove."""

    policy: Retention
    at: datetime
    ranks: dict[str, int] = field(default_factory=dict)
    idle: set[str] = field(default_factory=set)
    #: (stream, id) of what goes; flushed a few batches at a time, by stream
    victims: list[tuple[str, str]] = field(default_factory=list)
    #: the newest checkpoint of each idle stream, removed after everything else
    last: list[str] = field(default_factory=list)

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
    plan = _Plan(policy, at)
    removed = 0
    bound: int | None = None
    rules = policy.has_rules
    while rules:
        entries = await store._scan(ScanQuery(None, "desc", bound, BATCH, {}, at, False))
        if not entries:
            break
        for entry in entries:
            if not isinstance(entry, Skipped):  # damaged: left to verify and repair
                plan.consider(entry.stream, entry.id, entry.updated_at)
        bound = entries[-1].sequence
        if len(plan.victims) >= GATHER:
            removed += await _remove(store, _by_stream(plan.victims), at, dry_run)
            plan.victims = []
        if progress is not None:
            progress(len(entries))
    removed += await _remove(store, _by_stream(plan.victims), at, dry_run)
    streams = await _remove(store, plan.last, at, dry_run)  # only now: newest last
    reclaimed: int | None = None
    if not dry_run:
        if purge:
            await store._purge_expired(at)
        reclaimed = await store._reclaim(full=False)
    return SweepReport(
        streams_removed=streams,
        checkpoints_removed=removed + streams,
        bytes_reclaimed=reclaimed,
        seconds=time.perf_counter() - started,
        dry_run=dry_run,
    )


def _by_stream(victims: list[tuple[str, str]]) -> list[str]:
    return [id for _, id in sorted(victims)]


async def _remove(store: StorePrimitives, ids: list[str], at: datetime, dry_run: bool) -> int:
    """Remove ``ids`` in batches of :data:`BATCH`; how many this call removed (on a
    dry run, how many it would)."""
    if dry_run:
        return len(ids)
    removed = 0
    for start in range(0, len(ids), BATCH):
        removed += await store._delete_many(ids[start : start + BATCH], at)
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


class RetentionMethods:
    """The retention half of :class:`~statekeeper.BaseCheckpointStore`, which
    inherits it: :meth:`sweep`, :meth:`compact`, and the background sweep that
    ``open()`` starts and ``close()`` stops."""

    if TYPE_CHECKING:  # what BaseCheckpointStore provides
        options: StoreOptions
        capabilities: ClassVar[Capabilities]

        def now(self) -> datetime: ...
        def describe(self) -> str: ...
        def _require_open(self) -> StoreIdentity: ...
        def _require_writable(self, what: str) -> StoreIdentity: ...

    _sweeper: BackgroundSweep | None = None

    async def sweep(
        self,
        *,
        dry_run: bool = False,
        policy: Retention | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> SweepReport:
        """Apply a retention policy once (SPEC S17): ``policy`` if given, else the
        store's ``retention`` option; return what was removed.

        ``keep_last`` and ``max_age`` never remove a stream's newest checkpoint.
        ``idle`` removes a stream whole, its newest checkpoint last, so
        :meth:`get_latest` returns the stream's newest or ``None``, never an older
        one, while a sweep runs. A checkpoint saved after the sweep started is never
        removed (a save into a stream being removed as idle survives, whole). Work
        goes in bounded batches, so other tasks and processes save and read
        meanwhile. Sweeps may run at once, in tasks or processes: each counts only
        the checkpoints it removed itself. Ages come from the store's clock. A
        sweep also purges expired records (not counted: they already behave as
        deleted) and gives space back where the backend can (SQLite's freed pages).

        ``dry_run=True`` writes nothing and reports what would go; it is allowed on
        a store opened ``read_only=True`` (a real sweep raises
        :class:`ReadOnlyStore` there). With no policy at all (no ``retention``
        option and no ``policy``) it raises :class:`InvalidQuery`: like a bad
        argument, the call itself is wrong, and sweeping with no rule by default
        would hide the mistake. ``progress``, if given, is called with the number of
        checkpoints examined since its last call. Costs O(store) reads and
        O(streams) memory.
        """
        if dry_run:
            self._require_open()
        else:
            self._require_writable("sweep")
        chosen = self.options.retention if policy is None else policy
        if not isinstance(chosen, Retention):
            raise InvalidQuery(
                f"sweep() needs a retention policy: pass policy=statekeeper.Retention(...) "
                f"or open {self.describe()} with retention=...; got {chosen!r}"
            )
        return await sweep(
            cast(StorePrimitives, self),
            chosen,
            self.now(),
            dry_run=dry_run,
            purge=self.capabilities.ttl,
            progress=progress,
        )

    async def compact(self) -> int | None:
        """Give all free space back to the file system, as thoroughly as the backend
        can; return the bytes given back, or ``None`` where it cannot tell.

        SQLite runs a full ``VACUUM``: it rewrites the whole database into a new
        file (time O(store), a moment of up to twice the disk space, and writers
        wait for it), which is what a store created before incremental
        auto-vacuum needs once. Other backends return ``None`` and have little or
        nothing to do: the file store and Redis give space back as they remove
        (the file store removes empty bucket directories here, as after a
        sweep), and PostgreSQL and MySQL reclaim it on the server's schedule
        (autovacuum, ``OPTIMIZE TABLE``). Raises :class:`ReadOnlyStore` on a
        read-only store.
        """
        self._require_writable("compact")
        return await cast(StorePrimitives, self)._reclaim(full=True)

    def _start_sweeping(self) -> None:
        """Start the background sweep if the store's policy has ``sweep_every``."""
        policy = self.options.retention
        if policy is not None and policy.sweep_every is not None and not self.options.read_only:
            self._sweeper = BackgroundSweep(
                policy.sweep_every.total_seconds(), self.sweep, self.describe()
            )
            self._sweeper.start()

    async def _stop_sweeping(self) -> None:
        """Cancel the background sweep (if any) and wait for it to end."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            await sweeper.stop()
