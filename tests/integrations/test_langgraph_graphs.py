"""Real LangGraph graphs, end to end, on ``StatekeeperSaver``: each scenario runs on
our saver and on LangGraph's ``InMemorySaver`` and the observable results (outputs,
states, histories, metadata) must be equal.

Checkpoint ids, task ids and timestamps differ between any two runs, so results
are compared without them.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt

import statekeeper
import statekeeper.sync
from statekeeper.integrations.langgraph import StatekeeperSaver

Scenario = Callable[[BaseCheckpointSaver[Any]], Awaitable[Any]]


@asynccontextmanager
async def saver_on(url: str) -> AsyncIterator[StatekeeperSaver]:
    async with statekeeper.open_store(url, codec="raw") as store:
        yield StatekeeperSaver(store)


async def same_as_in_memory(url: str, scenario: Scenario) -> Any:
    expected = await scenario(InMemorySaver())
    async with saver_on(url) as saver:
        got = await scenario(saver)
    assert got == expected
    return got


def plain(value: Any) -> Any:
    """``value`` without what differs between runs (interrupt ids, configs)."""
    if isinstance(value, dict):
        return {
            k: ([i.value for i in v] if k == "__interrupt__" else plain(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def snapshot_view(snapshot: Any) -> tuple[Any, ...]:
    md = snapshot.metadata or {}
    return (
        plain(snapshot.values),
        tuple(snapshot.next),
        md.get("source"),
        md.get("step"),
        [plain([i.value for i in t.interrupts]) for t in snapshot.tasks],
        snapshot.parent_config is not None,
    )


# -- graphs --------------------------------------------------------------------------


class Chain(TypedDict, total=False):
    items: Annotated[list[str], operator.add]
    answer: str


def append(name: str) -> Callable[[Chain], Chain]:
    def node(state: Chain) -> Chain:
        return {"items": [name]}

    return node


def ask(state: Chain) -> Chain:
    answer = interrupt({"question": "go on?", "seen": len(state.get("items", []))})
    return {"answer": answer, "items": [f"asked:{answer}"]}


def interrupting_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    builder = StateGraph(Chain)
    builder.add_node("start", append("start"))
    builder.add_node("ask", ask)
    builder.add_node("finish", append("finish"))
    builder.add_edge(START, "start")
    builder.add_edge("start", "ask")
    builder.add_edge("ask", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer)


def chain_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    builder = StateGraph(Chain)
    for name in ("a", "b", "c"):
        builder.add_node(name, append(name))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder.compile(checkpointer=checkpointer)


class Fan(TypedDict, total=False):
    topics: list[str]
    results: Annotated[list[str], operator.add]


def fan_graph(checkpointer: BaseCheckpointSaver[Any], calls: dict[str, int]) -> Any:
    async def work(arg: dict[str, str]) -> Fan:
        topic = arg["topic"]
        calls[topic] = calls.get(topic, 0) + 1
        await asyncio.sleep(0.01 if topic != "c" else 0.03)
        if topic == "c" and calls[topic] == 1:
            raise RuntimeError("c fails once")
        return {"results": [topic.upper()]}

    def route(state: Fan) -> list[Send]:
        return [Send("work", {"topic": t}) for t in state["topics"]]

    builder = StateGraph(Fan)
    builder.add_node("work", work)
    builder.add_conditional_edges(START, route, ["work"])
    builder.add_edge("work", END)
    return builder.compile(checkpointer=checkpointer)


def nested_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    sub = StateGraph(Chain)
    sub.add_node("inner", append("inner"))
    sub.add_node("sub_ask", ask)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", "sub_ask")
    sub.add_edge("sub_ask", END)
    parent = StateGraph(Chain)
    parent.add_node("outer", append("outer"))
    parent.add_node("child", sub.compile())
    parent.add_edge(START, "outer")
    parent.add_edge("outer", "child")
    parent.add_edge("child", END)
    return parent.compile(checkpointer=checkpointer)


# -- scenarios -----------------------------------------------------------------------


async def interrupt_and_resume(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    graph = interrupting_graph(checkpointer)
    config = {"configurable": {"thread_id": "interrupt"}}
    first = await graph.ainvoke({"items": []}, config)
    paused = await graph.aget_state(config)
    second = await graph.ainvoke(Command(resume="yes"), config)
    done = await graph.aget_state(config)
    history = [snapshot_view(s) async for s in graph.aget_state_history(config)]
    return plain(first), snapshot_view(paused), plain(second), snapshot_view(done), history


async def fan_out_with_a_retry(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    calls: dict[str, int] = {}
    graph = fan_graph(checkpointer, calls)
    config = {"configurable": {"thread_id": "fan"}}
    with pytest.raises(RuntimeError, match="c fails once"):
        await graph.ainvoke({"topics": ["a", "b", "c", "d", "e"]}, config)
    failed = await graph.aget_state(config)
    # the successful tasks' writes are pending on the checkpoint: only "c" runs again
    resumed = await graph.ainvoke(None, config)
    history = [snapshot_view(s) async for s in graph.aget_state_history(config)]
    return snapshot_view(failed), plain(resumed), dict(sorted(calls.items())), history


async def subgraph_namespace(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    graph = nested_graph(checkpointer)
    config = {"configurable": {"thread_id": "nested"}}
    first = await graph.ainvoke({"items": []}, config)
    state = await graph.aget_state(config, subgraphs=True)
    (task,) = state.tasks
    inner = task.state
    namespaces = {
        t.config["configurable"]["checkpoint_ns"]
        async for t in checkpointer.alist({"configurable": {"thread_id": "nested"}})
    }
    resumed = await graph.ainvoke(Command(resume="ok"), config)
    return (
        plain(first),
        snapshot_view(state),
        snapshot_view(inner),
        inner.config["configurable"]["checkpoint_ns"].split(":")[0],
        sorted(ns.split(":")[0] for ns in namespaces),
        plain(resumed),
    )


async def time_travel(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    graph = chain_graph(checkpointer)
    config = {"configurable": {"thread_id": "travel"}}
    await graph.ainvoke({"items": ["in"]}, config)
    history = [s async for s in graph.aget_state_history(config)]
    before_b = next(s for s in history if s.next == ("b",))
    # fork: edit the state as of "before b", then run on from the fork
    fork = await graph.aupdate_state(before_b.config, {"items": ["edited"]})
    forked = await graph.ainvoke(None, fork)
    # replay from an older checkpoint: a second branch
    before_c = next(s for s in history if s.next == ("c",))
    replayed = await graph.ainvoke(None, before_c.config)
    latest = await graph.aget_state(config)
    full = [snapshot_view(s) async for s in graph.aget_state_history(config)]
    loops = [
        snapshot_view(s) async for s in graph.aget_state_history(config, filter={"source": "loop"})
    ]
    updates = [
        snapshot_view(s)
        async for s in graph.aget_state_history(config, filter={"source": "update", "step": 2})
    ]
    older = [
        snapshot_view(s)
        async for s in graph.aget_state_history(config, before=full_configs(history)[1], limit=2)
    ]
    return plain(forked), plain(replayed), snapshot_view(latest), full, loops, updates, older


def full_configs(history: list[Any]) -> list[Any]:
    return [s.config for s in history]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "scenario",
    [interrupt_and_resume, fan_out_with_a_retry, subgraph_namespace, time_travel],
    ids=lambda f: f.__name__,
)
async def test_graph_matches_in_memory_saver(
    scenario: Scenario, store_url: Callable[[], str]
) -> None:
    await same_as_in_memory(store_url(), scenario)


@pytest.mark.asyncio
async def test_the_fan_out_reran_only_the_failed_task() -> None:
    async with saver_on("memory://") as saver:
        _, resumed, calls, _ = await fan_out_with_a_retry(saver)
    assert calls == {"a": 1, "b": 1, "c": 2, "d": 1, "e": 1}
    assert sorted(resumed["results"]) == ["A", "B", "C", "D", "E"]


@pytest.mark.asyncio
async def test_subgraph_checkpoints_live_in_their_namespace() -> None:
    async with saver_on("memory://") as saver:
        result = await subgraph_namespace(saver)
    assert result[3] == "child"
    assert result[4][0] == "" and "child" in result[4]


# -- sync code -----------------------------------------------------------------------


def sync_run(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    graph = interrupting_graph(checkpointer)
    config = {"configurable": {"thread_id": "sync"}}
    first = graph.invoke({"items": []}, config)
    second = graph.invoke(Command(resume="sync-yes"), config)
    history = [snapshot_view(s) for s in graph.get_state_history(config)]
    return plain(first), plain(second), history


@pytest.mark.asyncio
async def test_sync_invoke_from_a_worker_thread(store_url: Callable[[], str]) -> None:
    expected = sync_run(InMemorySaver())
    async with saver_on(store_url()) as saver:
        # the store's loop (this one) keeps running while the thread blocks on it
        got = await asyncio.to_thread(sync_run, saver)
    assert got == expected


def test_sync_invoke_on_a_sync_store() -> None:
    expected = sync_run(InMemorySaver())
    with statekeeper.sync.open_store("memory://", codec="raw") as store:
        assert sync_run(StatekeeperSaver(store)) == expected


@pytest.mark.asyncio
async def test_sync_call_on_the_store_loop_is_refused() -> None:
    async with saver_on("memory://") as saver:
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        with pytest.raises(asyncio.InvalidStateError, match="async interface"):
            saver.get_tuple(config)
        with pytest.raises(asyncio.InvalidStateError):
            list(saver.list(config))


@pytest.mark.asyncio
async def test_async_calls_from_another_loop_run_on_the_store_loop() -> None:
    async with saver_on("memory://") as saver:

        def other_loop() -> Any:
            return asyncio.run(interrupt_and_resume(saver))

        got = await asyncio.to_thread(other_loop)
    assert got == await interrupt_and_resume(InMemorySaver())


@pytest.mark.asyncio
async def test_async_graph_on_a_sync_store() -> None:
    # the blocking facade runs the store on its own loop thread; ainvoke hops there
    expected = await interrupt_and_resume(InMemorySaver())
    store = statekeeper.sync.open_store("memory://", codec="raw")
    await asyncio.to_thread(store.open)
    try:
        assert await interrupt_and_resume(StatekeeperSaver(store)) == expected
    finally:
        await asyncio.to_thread(store.close)
