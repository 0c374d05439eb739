"""Pruning a LangGraph thread through the store (``statekeeper prune``,
``store.prune``) removes checkpoint records and leaves the records of their pending
writes: ``statekeeper verify`` reports each such orphan and ``statekeeper repair``
removes them, and the thread still resumes from what was kept."""

from __future__ import annotations

import asyncio
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import statekeeper
from cli_helpers import run_cli
from statekeeper.integrations.langgraph import StatekeeperSaver


class Steps(TypedDict):
    n: Annotated[int, operator.add]


def _graph(saver: StatekeeperSaver) -> Any:
    builder = StateGraph(Steps)
    builder.add_node("one", lambda state: {"n": 1})
    builder.add_node("two", lambda state: {"n": 1})
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", END)
    return builder.compile(checkpointer=saver)


async def _run_thread(url: str) -> tuple[str, str, int]:
    """Run a graph three times on one thread: the checkpoints stream, the writes
    stream, and how many writes records there are."""
    config = {"configurable": {"thread_id": "t"}}
    async with StatekeeperSaver.from_conn_string(url) as saver:
        graph = _graph(saver)
        for _ in range(3):
            await graph.ainvoke({"n": 0}, config)
        streams = await saver.store.list_streams(prefix="langgraph/")
        writes = (await saver.store.list(streams[1], limit=1000, include_state=False)).items
    checkpoints, writes_stream = sorted(streams)
    assert checkpoints.endswith("/checkpoints") and writes_stream.endswith("/writes")
    return checkpoints, writes_stream, len(writes)


def test_verify_reports_the_writes_a_prune_left_behind_and_repair_removes_them(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'graph.db'}"
    checkpoints, writes_stream, writes = asyncio.run(_run_thread(url))
    assert writes >= 3, "the graph left pending writes to orphan"
    assert run_cli("verify", "--url", url, "--json", cwd=tmp_path).json()["ok"] is True
    run_cli("prune", checkpoints, "--keep-last", "1", "--url", url, cwd=tmp_path)

    report = run_cli("verify", "--url", url, "--json", cwd=tmp_path, expect=1).json()
    orphans = [p for p in report["problems"] if p["kind"] == "orphan"]
    assert report["ok"] is False and orphans == report["problems"]
    assert {p["stream"] for p in orphans} == {writes_stream}
    assert all(p["id"].startswith("lgw-") for p in orphans)
    human = run_cli("verify", "--url", url, cwd=tmp_path, expect=1)
    assert "pending writes of a LangGraph checkpoint that is gone" in human.out
    assert "statekeeper repair" in human.out

    repaired = run_cli("repair", "--url", url, "--json", cwd=tmp_path).json()
    assert repaired["ok"] is True
    assert repaired["rebuilt"]["langgraph_orphaned_writes"] == len(orphans)
    assert run_cli("verify", "--url", url, "--json", cwd=tmp_path).json()["ok"] is True

    async def resumes() -> None:
        config = {"configurable": {"thread_id": "t"}}
        async with StatekeeperSaver.from_conn_string(url) as saver:
            left = (await saver.store.list(writes_stream, limit=1000)).items
            kept = (await saver.store.list(checkpoints, limit=1000)).items
            assert len(kept) == 1 and len(left) <= 1
            assert (await _graph(saver).ainvoke({"n": 0}, config))["n"] == 8

    asyncio.run(resumes())


def test_a_store_without_langgraph_records_is_checked_as_before(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plain.db'}"

    async def seed() -> None:
        async with statekeeper.open_store(url) as store:
            await store.save("langgraphish/writes", {"x": 1}, id="lgw-not-ours")

    asyncio.run(seed())
    assert run_cli("verify", "--url", url, "--json", cwd=tmp_path).json()["problems"] == []
