"""Issue 36: PostgreSQL restarts and idle kills, on a server of the test's own.

A scratch server (``initdb`` into a temp dir, a free port; ``faultenv``) is
restarted with ``pg_ctl``'s ``fast`` and ``immediate`` shutdowns while 4 writers and
2 readers work, and its store's connections are killed while idle
(``pg_terminate_backend``) before each public operation. Counted: calls raised by
type, acknowledged saves lost, unknown outcomes (``OutcomeUnknown``), duplicates,
wrong answers, unsignalled unknown outcomes, and whether ``verify`` is clean; all
but the raised calls and the signalled unknowns must be 0, and every error raised
must be retryable. After an idle kill every operation answers on its first call.

Without PostgreSQL server binaries the tests skip (fail in CI, which has them).
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import secrets
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from faultenv import (
    every_operation,
    postgres_maker,
    restart,
    run_workload,
    terminate_store_backends,
)
from reliability_support import FIGURES
from scratch_postgres import ScratchPostgres

from statekeeper import open_store

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]


class _Count(TypedDict):
    count: Annotated[int, operator.add]


@pytest.fixture
def scratch_pg() -> Iterator[Callable[..., ScratchPostgres]]:
    make, made = postgres_maker()
    try:
        yield make
    finally:
        for server in made:
            server.destroy()


def _url(server: ScratchPostgres) -> str:
    return server.url(table_prefix=f"f{secrets.token_hex(3)}_")


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_during_writes_and_reads(
    scratch_pg: Callable[..., ScratchPostgres], mode: str
) -> None:
    server = scratch_pg()

    async def main() -> dict[str, object]:
        async with open_store(_url(server)) as store:
            tally = await run_workload(store, lambda: asyncio.to_thread(restart, server, mode))
        FIGURES[f"connection faults: PostgreSQL -m {mode} restarts"] += 1
        FIGURES["connection faults: acknowledged saves checked"] += len(tally.acked)
        FIGURES["connection faults: unknown outcomes signalled"] += tally.unknown
        tally.assert_clean()
        return tally.summary()

    print(asyncio.run(main()))


def test_idle_kill_then_every_operation_answers_first_time(
    scratch_pg: Callable[..., ScratchPostgres],
) -> None:
    server = scratch_pg()
    admin = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"

    async def main() -> None:
        killed = 0

        async def kill() -> None:
            nonlocal killed
            killed += await terminate_store_backends(admin)

        async with open_store(_url(server), pool_size=2) as store:
            done = await every_operation(store, kill)
            latest = await store.get_latest("ops")
            assert latest is not None and latest.state == {"n": 10}
            assert (await store.verify()).ok
        assert killed >= len(done)  # every operation met killed connections
        FIGURES["connection faults: PostgreSQL idle kills answered"] += len(done)

    asyncio.run(main())


def test_langgraph_run_through_a_restart_keeps_one_history(
    scratch_pg: Callable[..., ScratchPostgres],
) -> None:
    """A LangGraph graph on StatekeeperSaver over PostgreSQL, invoked again and again
    on one thread while the server restarts (``-m fast``): every invocation completes
    or raises a retryable error, and the thread's history stays one chain (each
    checkpoint's parent is the one before it: no fork, no checkpoint twice)."""
    pytest.importorskip("langgraph")
    from langgraph.graph import END, START, StateGraph

    from statekeeper.errors import StatekeeperError
    from statekeeper.integrations.langgraph import StatekeeperSaver

    server = scratch_pg()

    builder = StateGraph(_Count)
    builder.add_node("inc", lambda s: {"count": 1})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", END)

    async def main() -> tuple[int, int]:
        config: Any = {"configurable": {"thread_id": "t"}}
        done, failed, after = 0, [], 0
        async with open_store(_url(server), codec="raw") as store:
            graph = builder.compile(checkpointer=StatekeeperSaver(store))
            for _ in range(10):
                await graph.ainvoke({"count": 0}, config)
            done += 10
            # invoke all through the restart, and 5 times after it
            restarting = asyncio.create_task(asyncio.to_thread(restart, server, "fast"))
            while after < 5:
                after += restarting.done()
                try:
                    await graph.ainvoke({"count": 0}, config)
                    done += 1
                except StatekeeperError as exc:
                    failed.append(exc)
                    await asyncio.sleep(0.05)
            await restarting
            history = [s async for s in graph.aget_state_history(config)]
        assert all(exc.retryable for exc in failed), failed
        ids = [s.config["configurable"]["checkpoint_id"] for s in history]
        assert len(ids) == len(set(ids)), "a checkpoint twice"
        for newer, older in itertools.pairwise(history):
            assert newer.parent_config is not None
            parent = newer.parent_config["configurable"]["checkpoint_id"]
            assert parent == older.config["configurable"]["checkpoint_id"], "a forked history"
        assert history[0].values["count"] >= done
        return done, len(failed)

    done, failed = asyncio.run(main())
    FIGURES["connection faults: LangGraph invocations through a restart"] += done + failed
    print({"invocations completed": done, "failed (retryable)": failed})


def test_agent_framework_saves_through_a_restart_keep_one_history(
    scratch_pg: Callable[..., ScratchPostgres],
) -> None:
    """Agent Framework's storage over PostgreSQL, saving a workflow's checkpoints one
    after another while the server restarts (``-m fast``), each failed save retried
    by the caller with the same checkpoint, as the errors' ``retryable`` flag says it
    may be: every error raised is retryable, and afterwards the workflow holds each
    checkpoint exactly once, in the order saved, the last one latest."""
    pytest.importorskip("agent_framework")
    from agent_framework import WorkflowCheckpoint

    from statekeeper.errors import StatekeeperError
    from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage

    server = scratch_pg()

    async def main() -> tuple[int, int]:
        failed: list[StatekeeperError] = []
        saved: list[str] = []
        async with open_store(_url(server), codec="raw") as store:
            storage = StatekeeperCheckpointStorage(store)

            async def save(n: int) -> None:
                checkpoint = WorkflowCheckpoint(
                    workflow_name="wf", graph_signature_hash="sig", iteration_count=n
                )
                while True:  # the caller's retry: the same checkpoint, so the same id
                    try:
                        saved.append(await storage.save(checkpoint))
                        return
                    except StatekeeperError as exc:
                        failed.append(exc)
                        await asyncio.sleep(0.05)

            for n in range(10):
                await save(n)
            restarting = asyncio.create_task(asyncio.to_thread(restart, server, "fast"))
            n, after = 10, 0
            while after < 5:
                after += restarting.done()
                await save(n)
                n += 1
            await restarting
            ids = await storage.list_checkpoint_ids(workflow_name="wf")
            latest = await storage.get_latest(workflow_name="wf")
            await storage.aclose()
        assert all(exc.retryable for exc in failed), failed
        assert ids == saved, "a checkpoint lost, twice or out of order"
        assert latest is not None and latest.checkpoint_id == saved[-1]
        return len(saved), len(failed)

    done, failed = asyncio.run(main())
    FIGURES["connection faults: Agent Framework saves through a restart"] += done + failed
    print({"saves acknowledged": done, "failed and retried": failed})
