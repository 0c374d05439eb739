"""Telemetry (SPEC S18) through both adapters: a real LangGraph graph and a real
Agent Framework workflow, run inside a caller's span, give spans whose parent is
that span, across the saver's loop bridge (sync graphs on another thread, async
calls from another loop) and the stores' worker threads."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Never, TypedDict

import pytest
from agent_framework import Executor, WorkflowBuilder, WorkflowContext, handler
from langgraph.graph import END, START, StateGraph
from opentelemetry.sdk.trace import ReadableSpan

import statekeeper
from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage
from statekeeper.integrations.langgraph import StatekeeperSaver
from telemetry_helpers import Recorder


class Chain(TypedDict, total=False):
    items: Annotated[list[str], operator.add]


def step(name: str) -> Callable[[Chain], Chain]:
    def node(state: Chain) -> Chain:
        return {"items": [name]}

    return node


def graph_on(saver: StatekeeperSaver) -> Any:
    builder = StateGraph(Chain)
    builder.add_node("a", step("a"))
    builder.add_node("b", step("b"))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    return builder.compile(checkpointer=saver)


def children_of(rec: Recorder, parent: Any) -> list[ReadableSpan]:
    """Our spans; each must be a child of ``parent`` in ``parent``'s trace."""
    ours = [s for s in rec.spans() if "db.operation.name" in (s.attributes or {})]
    assert ours
    context = parent.get_span_context()
    for span in ours:
        assert span.context.trace_id == context.trace_id, span.name
        assert span.parent is not None and span.parent.span_id == context.span_id, span.name
    return ours


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["memory", "sqlite", "file"])
async def test_langgraph_async_graph(backend: str, tmp_path: Path) -> None:
    rec = Recorder()
    url = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path / 'g.db'}"}.get(
        backend, f"file://{tmp_path / 'g'}"
    )
    async with statekeeper.open_store(url, codec="raw", telemetry=rec.options()) as store:
        graph = graph_on(StatekeeperSaver(store))
        with rec.tracer.start_as_current_span("graph run") as run:
            out = await graph.ainvoke({"items": []}, {"configurable": {"thread_id": "t1"}})
    assert out == {"items": ["a", "b"]}
    ours = children_of(rec, run)
    assert {(s.attributes or {})["db.operation.name"] for s in ours} >= {"save"}


@pytest.mark.asyncio
async def test_langgraph_sync_graph_on_another_thread(tmp_path: Path) -> None:
    rec = Recorder()
    url = f"sqlite:///{tmp_path / 's.db'}"
    async with statekeeper.open_store(url, codec="raw", telemetry=rec.options()) as store:
        graph = graph_on(StatekeeperSaver(store))

        def sync_run() -> tuple[Any, Any]:
            # the caller's span is opened on this thread; the saver bridges each
            # call to the store's loop (this test's), which keeps running meanwhile
            with rec.tracer.start_as_current_span("sync graph run") as run:
                return graph.invoke({"items": []}, {"configurable": {"thread_id": "t"}}), run

        out, run = await asyncio.to_thread(sync_run)
    assert out == {"items": ["a", "b"]}
    children_of(rec, run)


@pytest.mark.asyncio
async def test_langgraph_async_calls_from_another_loop() -> None:
    rec = Recorder()
    async with statekeeper.open_store("memory://", codec="raw", telemetry=rec.options()) as store:
        graph = graph_on(StatekeeperSaver(store))

        def other_loop() -> Any:
            async def run_there() -> Any:
                with rec.tracer.start_as_current_span("other loop run") as run:
                    await graph.ainvoke({"items": []}, {"configurable": {"thread_id": "t"}})
                return run

            return asyncio.run(run_there())

        run = await asyncio.to_thread(other_loop)
    children_of(rec, run)


class Upper(Executor):
    @handler
    async def run(self, message: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(message.upper())


class Finish(Executor):
    @handler
    async def run(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"<{message}>")


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_agent_framework_workflow(backend: str, tmp_path: Path) -> None:
    rec = Recorder()
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'w.db'}"
    store = statekeeper.open_store(url, codec="raw", telemetry=rec.options())
    storage = StatekeeperCheckpointStorage(store)
    upper, finish = Upper(id="upper"), Finish(id="finish")
    workflow = (
        WorkflowBuilder(start_executor=upper, checkpoint_storage=storage, name="chain")
        .add_edge(upper, finish)
        .build()
    )
    try:
        with rec.tracer.start_as_current_span("workflow run") as run:
            result = await workflow.run("hi")
    finally:
        await store.close()
    assert result.get_outputs() == ["<HI>"]
    ours = children_of(rec, run)
    assert "save" in {(s.attributes or {})["db.operation.name"] for s in ours}
