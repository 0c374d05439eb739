"""Real Agent Framework workflows checkpoint to and resume from the adapter, on every
backend; and the adapter's lazy lifecycle (the framework never opens or closes it)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any, Never

import pytest
from agent_framework import (
    Executor,
    InMemoryCheckpointStorage,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
    response_handler,
)
from agent_framework_stores import Backend, backend_fixture  # noqa: F401  (the fixture)

import statekeeper
from statekeeper.errors import InvalidOptions
from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage


class Upper(Executor):
    @handler
    async def run(self, message: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(message.upper())


class Exclaim(Executor):
    @handler
    async def run(self, message: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(message + "!")


class Finish(Executor):
    @handler
    async def run(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"<{message}>")


def chain(storage: Any) -> Workflow:
    upper, exclaim, finish = Upper(id="upper"), Exclaim(id="exclaim"), Finish(id="finish")
    return (
        WorkflowBuilder(start_executor=upper, checkpoint_storage=storage, name="chain")
        .add_edge(upper, exclaim)
        .add_edge(exclaim, finish)
        .build()
    )


class Drafter(Executor):
    @handler
    async def draft(self, topic: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(f"draft about {topic}")


class Reviewer(Executor):
    @handler
    async def review(self, draft: str, ctx: WorkflowContext) -> None:
        await ctx.request_info(request_data=draft, response_type=bool)

    @response_handler
    async def on_review(
        self, original: str, approved: bool, ctx: WorkflowContext[Never, str]
    ) -> None:
        await ctx.yield_output(f"{original}: {'approved' if approved else 'rejected'}")


def review(storage: Any) -> Workflow:
    drafter, reviewer = Drafter(id="drafter"), Reviewer(id="reviewer")
    return (
        WorkflowBuilder(start_executor=drafter, checkpoint_storage=storage, name="review")
        .add_edge(drafter, reviewer)
        .build()
    )


@pytest.mark.asyncio
async def test_a_workflow_checkpoints_like_with_the_in_memory_storage_and_resumes(
    backend: Backend,
) -> None:
    storage = backend.storage()
    result = await chain(storage).run("hi")
    assert result.get_outputs() == ["<HI!>"]

    reference = InMemoryCheckpointStorage()
    assert (await chain(reference).run("hi")).get_outputs() == ["<HI!>"]
    ours = await storage.list_checkpoints(workflow_name="chain")
    theirs = sorted(
        await reference.list_checkpoints(workflow_name="chain"), key=lambda c: c.timestamp
    )
    assert [c.iteration_count for c in ours] == [c.iteration_count for c in theirs]
    assert len(ours) >= 3
    # save order is the chain: each checkpoint points at the one saved before it
    assert ours[0].previous_checkpoint_id is None
    for before, after in itertools.pairwise(ours):
        assert after.previous_checkpoint_id == before.checkpoint_id
    latest = await storage.get_latest(workflow_name="chain")
    assert latest is not None and latest.checkpoint_id == ours[-1].checkpoint_id

    # a restarted process: new storage object, new workflow, same store
    for checkpoint in ours[:-1]:
        resumed = await chain(backend.storage()).run(checkpoint_id=checkpoint.checkpoint_id)
        assert resumed.get_outputs() == ["<HI!>"], checkpoint.iteration_count


@pytest.mark.asyncio
async def test_a_paused_workflow_resumes_from_get_latest_in_a_new_process(
    backend: Backend,
) -> None:
    first = await review(backend.storage()).run("cats")
    assert first.get_final_state() == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    (request,) = first.get_request_info_events()

    storage = backend.storage()
    latest = await storage.get_latest(workflow_name="review")
    assert latest is not None
    assert list(latest.pending_request_info_events) == [request.request_id]
    resumed = await review(storage).run(
        checkpoint_id=latest.checkpoint_id, responses={request.request_id: True}
    )
    assert resumed.get_outputs() == ["draft about cats: approved"]
    assert resumed.get_final_state() == WorkflowRunState.IDLE
    newest = await storage.get_latest(workflow_name="review")
    assert newest is not None and newest.checkpoint_id != latest.checkpoint_id


# -- lifecycle --------------------------------------------------------------------------


def test_built_synchronously_and_opened_on_first_use(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lazy.db'}"
    storage = StatekeeperCheckpointStorage(url)  # no loop, nothing opened or created
    assert not storage.store.is_open
    assert not (tmp_path / "lazy.db").exists()
    workflow = chain(storage)

    async def run() -> list[Any]:
        outputs = (await workflow.run("a")).get_outputs()
        await storage.aclose()
        return outputs

    assert asyncio.run(run()) == ["<A!>"]
    assert not storage.store.is_open


@pytest.mark.asyncio
async def test_concurrent_first_calls_open_the_store_once(tmp_path: Path) -> None:
    store = statekeeper.open_store(f"file://{tmp_path / 'store'}", codec="raw")
    opens = 0
    real_open = store._open

    async def counted_open() -> Any:
        nonlocal opens
        opens += 1
        await asyncio.sleep(0.01)  # let the other callers pile up behind the lock
        return await real_open()

    store._open = counted_open  # type: ignore[method-assign]
    storage = StatekeeperCheckpointStorage(store)
    results = await asyncio.gather(*(storage.get_latest(workflow_name=f"wf{i}") for i in range(10)))
    assert results == [None] * 10 and opens == 1
    await storage.aclose()
    assert not store.is_open
    await storage.aclose()  # idempotent


def test_successive_asyncio_runs_reopen_a_store_the_storage_opened(tmp_path: Path) -> None:
    storage = StatekeeperCheckpointStorage(f"sqlite:///{tmp_path / 'runs.db'}")
    workflow = chain(storage)
    for _ in range(3):  # a CLI calling asyncio.run per command, never closing
        assert asyncio.run(workflow.run("x")).get_outputs() == ["<X!>"]

    async def count() -> int:
        ids = await storage.list_checkpoint_ids(workflow_name="chain")
        await storage.aclose()
        return len(ids)

    assert asyncio.run(count()) >= 9
    # aclose from a later loop than the one that opened the store
    assert asyncio.run(workflow.run("y")).get_outputs() == ["<Y!>"]
    asyncio.run(storage.aclose())
    assert not storage.store.is_open


def test_a_call_from_a_second_running_loop_is_refused(tmp_path: Path) -> None:
    storage = StatekeeperCheckpointStorage(f"sqlite:///{tmp_path / 'loops.db'}")
    started, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    async def owner() -> None:
        await storage.get_latest(workflow_name="wf")
        started.set()
        await asyncio.to_thread(release.wait, 10)
        await storage.aclose()

    thread = threading.Thread(target=lambda: asyncio.run(owner()))
    thread.start()
    started.wait(10)
    try:
        asyncio.run(storage.get_latest(workflow_name="wf"))
    except RuntimeError as exc:
        errors.append(exc)
    finally:
        release.set()
        thread.join()
    assert errors and "another running event loop" in str(errors[0])


@pytest.mark.asyncio
async def test_an_open_store_passed_in_stays_the_callers(tmp_path: Path) -> None:
    async with statekeeper.open_store(f"file://{tmp_path / 's'}", codec="raw") as store:
        async with StatekeeperCheckpointStorage(store) as storage:
            assert await storage.get_latest(workflow_name="wf") is None
        assert store.is_open  # not closed by the storage


def test_a_store_without_codec_raw_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptions, match="codec='raw'"):
        StatekeeperCheckpointStorage(statekeeper.open_store(f"file://{tmp_path / 's'}"))
    with pytest.raises(ValueError, match="namespace"):
        StatekeeperCheckpointStorage("memory://", namespace="a:b")


@pytest.mark.asyncio
async def test_namespaces_share_a_store_without_seeing_each_other(tmp_path: Path) -> None:
    from agent_framework import WorkflowCheckpoint

    url = f"file://{tmp_path / 'shared'}"
    one = StatekeeperCheckpointStorage(url, namespace="team-a")
    two = StatekeeperCheckpointStorage(url, namespace="team-b")
    item = WorkflowCheckpoint(workflow_name="wf", graph_signature_hash="h", checkpoint_id="same")
    await one.save(item)
    assert await two.get_latest(workflow_name="wf") is None
    assert await two.list_checkpoint_ids(workflow_name="wf") == []
    await two.save(item)
    assert await one.delete("same") is True
    assert (await two.load("same")).checkpoint_id == "same"
    await one.aclose()
    await two.aclose()
