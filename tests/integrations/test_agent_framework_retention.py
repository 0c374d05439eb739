"""``StatekeeperCheckpointStorage(store, retention=Retention(...))`` (SPEC S17, §5): real
Agent Framework workflows, their checkpoints bounded per workflow, on every backend.

Time is the store's fake clock (``clock=``); the background sweep's wait is one the
test releases, never the wall clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agent_framework import WorkflowRunState
from agent_framework_stores import Backend, backend_fixture  # noqa: F401  (the fixture)
from test_agent_framework_workflows import chain, review

import statekeeper
from statekeeper import Retention
from statekeeper.integrations import _background
from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage
from statekeeper.testing import FakeClock

DAY = 24 * 3600


async def ids(storage: StatekeeperCheckpointStorage, name: str) -> list[str]:
    return await storage.list_checkpoint_ids(workflow_name=name)


@pytest.mark.asyncio
async def test_keep_last_keeps_each_workflows_newest_and_it_still_resumes(
    backend: Backend,
) -> None:
    storage = backend.storage(retention=Retention(keep_last=2))
    for word in ("one", "two"):
        assert (await chain(storage).run(word)).get_outputs() == [f"<{word.upper()}!>"]
    first = await review(storage).run("cats")
    (request,) = first.get_request_info_events()
    chained, reviewed = await ids(storage, "chain"), await ids(storage, "review")
    assert len(chained) > 2 and len(reviewed) > 2

    dry = await storage.sweep(dry_run=True)
    assert dry.dry_run and dry.checkpoints_removed == len(chained) + len(reviewed) - 4
    assert await ids(storage, "chain") == chained  # a dry run removes nothing

    report = await storage.sweep()
    assert report.checkpoints_removed == dry.checkpoints_removed and report.streams_removed == 0
    assert await ids(storage, "chain") == chained[-2:]
    assert await ids(storage, "review") == reviewed[-2:]

    # the pending request resumes from the kept newest checkpoint, in a new process
    again = backend.storage()
    latest = await again.get_latest(workflow_name="review")
    assert latest is not None and latest.checkpoint_id == reviewed[-1]
    resumed = await review(again).run(
        checkpoint_id=latest.checkpoint_id, responses={request.request_id: True}
    )
    assert resumed.get_outputs() == ["draft about cats: approved"]
    assert resumed.get_final_state() == WorkflowRunState.IDLE


@pytest.mark.asyncio
async def test_idle_workflows_go_whole_and_max_age_keeps_the_newest(backend: Backend) -> None:
    clock = FakeClock()
    policy = Retention(idle=7 * DAY, max_age=DAY)
    storage = backend.storage(retention=policy, store_options={"clock": clock})
    await chain(storage).run("old")
    clock.advance(2 * DAY)
    first = await review(storage).run("cats")
    assert first.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    clock.advance(DAY + 1)
    await chain(storage).run("new")  # "chain" is busy again; its older run is past max_age
    chained = await ids(storage, "chain")
    reviewed = await ids(storage, "review")

    report = await storage.sweep()
    assert report.streams_removed == 0
    kept_chain = await ids(storage, "chain")
    assert kept_chain == chained[-len(kept_chain) :] and len(kept_chain) < len(chained)
    assert await ids(storage, "review") == reviewed[-1:]  # all past max_age but its newest

    clock.advance(7 * DAY)  # "chain" idle exactly 7 days (not more), "review" 8 days
    report = await storage.sweep()
    assert report.streams_removed == 1
    assert await storage.get_latest(workflow_name="review") is None
    assert await ids(storage, "chain") == kept_chain[-1:]  # max_age: all but the newest
    clock.advance(1)
    report = await storage.sweep()
    assert report.streams_removed == 1 and report.checkpoints_removed == 1
    assert await storage.get_latest(workflow_name="chain") is None


@pytest.mark.asyncio
async def test_only_the_storages_namespace_is_swept() -> None:
    async with statekeeper.open_store("memory://", codec="raw") as store:
        mine = StatekeeperCheckpointStorage(store, retention=Retention(keep_last=1))
        theirs = StatekeeperCheckpointStorage(store, namespace="other")
        await chain(mine).run("a")
        await chain(theirs).run("b")
        await store.save("app/stream", b"x")
        await store.save("app/stream", b"y")
        before = await ids(theirs, "chain")
        await mine.sweep()
        assert len(await ids(mine, "chain")) == 1
        assert await ids(theirs, "chain") == before
        assert len((await store.list("app/stream")).items) == 2


def test_retention_must_be_a_retention_policy() -> None:
    with pytest.raises(TypeError, match=r"statekeeper\.Retention"):
        StatekeeperCheckpointStorage("memory://", retention={"keep_last": 2})  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_sweep_without_a_policy_is_refused() -> None:
    storage = StatekeeperCheckpointStorage("memory://")
    with pytest.raises(ValueError, match="retention policy"):
        await storage.sweep()
    await storage.aclose()


@pytest.mark.asyncio
async def test_the_background_sweep_runs_from_the_first_call_until_aclose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: asyncio.Queue[float] = asyncio.Queue()
    go: asyncio.Queue[None] = asyncio.Queue()
    stopped: list[bool] = []

    async def wait(stop: asyncio.Event, seconds: float) -> bool:
        waits.put_nowait(seconds)
        done, tick = asyncio.ensure_future(stop.wait()), asyncio.ensure_future(go.get())
        await asyncio.wait([done, tick], return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        tick.cancel()
        stopped.append(stop.is_set())
        return stop.is_set()

    monkeypatch.setattr(_background, "wait_or_stop", wait)
    storage = StatekeeperCheckpointStorage(
        "memory://", retention=Retention(keep_last=1, sweep_every=3600)
    )
    await chain(storage).run("hi")
    assert await waits.get() == 3600  # it waits before its first sweep
    assert len(await ids(storage, "chain")) > 1
    go.put_nowait(None)
    assert await waits.get() == 3600  # that sweep ended, the next wait began
    assert len(await ids(storage, "chain")) == 1
    background: Any = storage._background
    assert background is not None and background.running
    assert background.last.checkpoints_removed > 0
    await storage.aclose()
    assert stopped[-1] is True and not background.running


@pytest.mark.asyncio
async def test_get_latest_is_never_older_while_an_idle_workflow_goes(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    storage = backend.storage(retention=Retention(idle=DAY), store_options={"clock": clock})
    await chain(storage).run("a")
    await chain(storage).run("b")
    newest = (await ids(storage, "chain"))[-1]
    store = storage.store
    seen: list[str | None] = []
    delete_many = store.delete_many

    async def checked(doomed: Any) -> int:
        removed = await delete_many(doomed)
        latest = await storage.get_latest(workflow_name="chain")
        seen.append(None if latest is None else latest.checkpoint_id)
        return removed

    monkeypatch.setattr(store, "delete_many", checked)
    monkeypatch.setattr("statekeeper.integrations.agent_framework._retention._PAGE", 2)
    clock.advance(DAY + 1)
    await storage.sweep()
    assert len(seen) > 2 and set(seen) == {newest, None} and seen[-1] is None
