"""Retention of a storage's workflows: ``retention=statekeeper.Retention(...)``.

A workflow is one stream (:mod:`._codec`), so the store's own rules (SPEC S17)
apply to it as they are, ranked by the store's own planner
(:class:`statekeeper._core.retention.Plan`, one body for both):

- ``keep_last=N``: each workflow keeps its newest ``N`` checkpoints;
- ``max_age``: a checkpoint last written longer ago than this goes, except its
  workflow's newest;
- ``idle``: a workflow whose newest checkpoint was last written longer ago than
  this goes whole, its newest checkpoint last.

Only this storage's streams are swept (those of its ``namespace``), never the
rest of a store it shares. Each workflow is read newest first, in pages of
headers (no state decoded); a checkpoint saved after its workflow was read is
never removed, and ``get_latest`` of a workflow returns its newest or ``None``,
never an older one, at every moment of a sweep.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..._core.retention import Plan
from ..._core.store import BaseCheckpointStore
from ...models import Retention, SweepReport

_PAGE = 500


async def _remove(store: BaseCheckpointStore, ids: list[str], dry_run: bool) -> int:
    if dry_run:
        return len(ids)
    removed = 0
    for start in range(0, len(ids), _PAGE):
        removed += await store.delete_many(ids[start : start + _PAGE])
    return removed


async def _read(store: BaseCheckpointStore, stream: str, plan: Plan) -> None:
    """Rank ``stream``'s checkpoints into ``plan``, newest first; only its newest
    when no rule looks past it (``idle`` alone, and the workflow not idle)."""
    page = await store.list(stream, limit=1, include_state=False)
    while True:
        for item in page.items:
            plan.consider(stream, item.id, item.updated_at)
        if page.next_cursor is None:
            return
        policy = plan.policy
        if policy.keep_last is None and policy.max_age is None and stream not in plan.idle:
            return
        page = await store.list(stream, limit=_PAGE, after=page.next_cursor, include_state=False)


async def sweep_workflows(
    store: BaseCheckpointStore,
    namespace: str,
    policy: Retention,
    *,
    dry_run: bool,
    stopping: Callable[[], bool] = lambda: False,
) -> SweepReport:
    """Apply ``policy`` once to the workflows of ``namespace`` (see the module
    docstring); ``stopping()`` is asked between workflows."""
    started = time.perf_counter()
    plan = Plan(policy, store.now())

    async def remove(ids: list[str]) -> int:
        return await _remove(store, ids, dry_run)

    streams = [
        *await store.list_streams(prefix=f"{namespace}:"),
        *await store.list_streams(prefix=f"{namespace}#"),
    ]
    for stream in streams:
        if stopping():
            break
        await _read(store, stream, plan)
        if len(plan.victims) >= _PAGE:
            await plan.flush(remove)
    removed, workflows = await plan.finish(remove)  # each workflow's newest last
    reclaimed = None
    if not dry_run:
        # a sweep without rules only purges expired records and gives space back
        reclaimed = (await store.sweep(policy=Retention())).bytes_reclaimed
    return SweepReport(
        streams_removed=workflows,
        checkpoints_removed=removed,
        bytes_reclaimed=reclaimed,
        seconds=time.perf_counter() - started,
        dry_run=dry_run,
    )
