"""statekeeper._runtime: the one worker, the one group commit and the inline budget,
on their own (the SQLite writer's use is in tests/sql/test_sql_group_commit.py).

The runner here is the shape the file store's saves take: a lone job is one call, a
group is one ``insert_group``-like call with one outcome per job. Held workers make
the groups known without relying on timing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from statekeeper._runtime.group import GroupCommit, Settled
from statekeeper._runtime.inline import HOP, Budget, try_inline
from statekeeper._runtime.worker import Job, Worker

pytestmark = pytest.mark.asyncio


class Runner:
    """Records what ran: ``alone`` calls ``fn(*args)``; ``group`` runs every job and
    commits once (a job's exception is its own outcome)."""

    def __init__(self) -> None:
        self.groups: list[list[Any]] = []
        self.aborted = 0
        self.broken = False
        self.split = False

    def alone(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        self.groups.append([args])
        return fn(*args)

    def group(self, jobs: Sequence[Job]) -> tuple[list[Settled], Sequence[Job]]:
        if self.broken:
            raise RuntimeError("the machinery broke")
        if self.split:  # commit the first job alone, hand back the rest
            self.split = False
            first = jobs[0]
            self.groups.append([first[1]])
            return [(first, first[0](*first[1]), None)], jobs[1:]
        self.groups.append([job[1] for job in jobs])
        settled: list[Settled] = []
        for job in jobs:
            try:
                settled.append((job, job[0](*job[1]), None))
            except Exception as exc:
                settled.append((job, None, exc))
        return settled, []

    def abort(self) -> None:
        self.aborted += 1


class Held:
    """The worker blocked in a plain call until :meth:`release`."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.gate = threading.Event()
        self.job = asyncio.ensure_future(worker.run(self.gate.wait, 10))

    async def queued(self, n: int) -> None:
        for _ in range(1000):
            if self.worker.pending >= n + 1:
                return
            await asyncio.sleep(0.002)
        raise AssertionError(f"only {self.worker.pending - 1} of {n} calls were queued")

    async def release(self) -> None:
        self.gate.set()
        assert await self.job is True


async def _grouped(worker: Worker, calls: list[Any]) -> list[Any]:
    held = Held(worker)
    await asyncio.sleep(0)
    tasks = [asyncio.ensure_future(call) for call in calls]
    await held.queued(len(tasks))
    await held.release()
    return await asyncio.gather(*tasks, return_exceptions=True)


def _double(x: int) -> int:
    if x < 0:
        raise ValueError(x)
    return 2 * x


@pytest.fixture
def runner() -> Runner:
    return Runner()


@pytest.fixture
def worker(runner: Runner) -> Any:
    worker = Worker("sk-test-group", group=GroupCommit(runner))
    yield worker
    worker.stop().join(5)


async def test_a_lone_job_runs_alone(worker: Worker, runner: Runner) -> None:
    assert await worker.run_grouped(_double, 4) == 8
    assert runner.groups == [[(4,)]]


async def test_queued_jobs_share_one_group_and_each_gets_its_outcome(
    worker: Worker, runner: Runner
) -> None:
    results = await _grouped(worker, [worker.run_grouped(_double, i) for i in (1, -2, 3)])
    assert results[0] == 2 and results[2] == 6
    assert isinstance(results[1], ValueError)
    assert runner.groups == [[(1,), (-2,), (3,)]]


async def test_a_job_cancelled_before_its_group_never_runs(worker: Worker, runner: Runner) -> None:
    held = Held(worker)
    await asyncio.sleep(0)
    tasks = [asyncio.ensure_future(worker.run_grouped(_double, i)) for i in (1, 2, 3)]
    await held.queued(3)
    tasks[1].cancel()
    await held.release()
    assert await tasks[0] == 2 and await tasks[2] == 6
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert runner.groups == [[(1,), (3,)]]


async def test_a_plain_call_ends_the_group_and_runs_in_queue_order(
    worker: Worker, runner: Runner
) -> None:
    order: list[str] = []
    calls = [
        worker.run_grouped(_double, 1),
        worker.run(order.append, "plain"),
        worker.run_grouped(_double, 2),
        worker.run_grouped(_double, 3),
    ]
    results = await _grouped(worker, calls)
    assert results == [2, None, 4, 6]
    assert runner.groups == [[(1,)], [(2,), (3,)]]
    assert order == ["plain"]


async def test_groups_are_bounded(runner: Runner) -> None:
    worker = Worker("sk-test-bounded", group=GroupCommit(runner, max_group=2))
    try:
        results = await _grouped(worker, [worker.run_grouped(_double, i) for i in range(5)])
    finally:
        worker.stop()
    assert results == [0, 2, 4, 6, 8]
    assert [len(g) for g in runner.groups] == [2, 2, 1]


async def test_the_rest_a_runner_hands_back_runs_as_a_new_group(
    worker: Worker, runner: Runner
) -> None:
    runner.split = True
    results = await _grouped(worker, [worker.run_grouped(_double, i) for i in (1, 2, 3)])
    assert results == [2, 4, 6]
    assert runner.groups == [[(1,)], [(2,), (3,)]]


async def test_a_broken_runner_fails_its_group_and_the_worker_goes_on(
    worker: Worker, runner: Runner
) -> None:
    runner.broken = True
    results = await _grouped(worker, [worker.run_grouped(_double, i) for i in (1, 2)])
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    runner.broken = False
    assert await asyncio.wait_for(worker.run_grouped(_double, 5), 10) == 10
    assert runner.aborted == 1  # (the thread cleans up after it has answered)


async def test_run_last_runs_even_if_its_caller_is_cancelled_and_ends_the_thread() -> None:
    worker = Worker("sk-test-last")
    gate = threading.Event()
    ran: list[str] = []
    first = asyncio.ensure_future(worker.run(gate.wait, 10))
    await asyncio.sleep(0)
    last = asyncio.ensure_future(worker.run_last(ran.append, "last"))
    await asyncio.sleep(0.01)
    last.cancel()
    gate.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await last
    worker.thread.join(5)
    assert not worker.thread.is_alive()
    assert ran == ["last"]


async def test_a_stopped_worker_runs_what_was_queued_then_its_last_call_and_ends() -> None:
    worker = Worker("sk-test-stop")
    ran: list[int] = []
    worker.stop(ran.append, 1).join(5)
    assert not worker.thread.is_alive()
    assert ran == [1]


async def test_try_inline_runs_here_or_says_hop() -> None:
    budget = Budget(limit=3, step=1)

    def would_block(exc: Exception) -> bool:
        return isinstance(exc, TimeoutError)

    def spends(n: int) -> int:
        for _ in range(n):
            if budget.spend():
                raise TimeoutError("over budget")
        return n

    assert try_inline(spends, 3, would_block, budget) == 3
    assert try_inline(spends, 4, would_block, budget) is HOP  # the budget starts anew
    assert try_inline(spends, 2, would_block, budget) == 2
    with pytest.raises(ZeroDivisionError):
        try_inline(lambda x: 1 // x, 0, would_block)
