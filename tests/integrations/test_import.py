"""``statekeeper import``: Agent Framework directories and LangGraph SqliteSaver
databases come across whole, unreadable items are reported, re-runs are safe, and
the integrations then read what the frameworks read."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, TypedDict

import pytest
from agent_framework import FileCheckpointStorage, WorkflowCheckpoint
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

import statekeeper.sync
from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage
from statekeeper.integrations.langgraph import StatekeeperSaver


def _cli(*args: str, cwd: Path, expect: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "STATEKEEPER_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "statekeeper.cli", *args, "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == expect, proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


# -- Agent Framework ------------------------------------------------------------------


def _maf_directory(root: Path) -> list[WorkflowCheckpoint]:
    storage = FileCheckpointStorage(root)
    saved = []
    for i in range(6):
        checkpoint = WorkflowCheckpoint(
            workflow_name="orders" if i % 2 else "billing",
            graph_signature_hash="sig",
            checkpoint_id=f"cp-{i}",
            # the same second for all: only the save order tells them apart
            timestamp=f"2026-12-01T10:00:00.{i:06d}+00:00",
            state={"step": i},
            iteration_count=i,
        )
        asyncio.run(storage.save(checkpoint))
        saved.append(checkpoint)
    return saved


def test_agent_framework_directory_imports_whole_and_reads_as_the_framework_did(
    tmp_path: Path,
) -> None:
    source = tmp_path / "maf"
    source.mkdir()
    _maf_directory(source)
    (source / "torn.json").write_text('{"checkpoint_id": "torn", "work', "utf-8")
    url = f"sqlite:///{tmp_path}/target.db"

    first = _cli(
        "import", str(source), "--from", "agent-framework", "--url", url, cwd=tmp_path, expect=1
    )
    assert (first["seen"], first["imported"], first["already_present"]) == (7, 6, 0)
    assert [p["location"] for p in first["problems"]] == [str(source / "torn.json")]

    again = _cli(
        "import", str(source), "--from", "agent-framework", "--url", url, cwd=tmp_path, expect=1
    )
    assert (again["imported"], again["already_present"]) == (0, 6)

    async def compare() -> None:
        framework = FileCheckpointStorage(source)
        async with StatekeeperCheckpointStorage(url) as ours:
            for workflow in ("orders", "billing"):
                theirs_latest = await framework.get_latest(workflow_name=workflow)
                our_latest = await ours.get_latest(workflow_name=workflow)
                assert theirs_latest is not None and our_latest is not None
                assert our_latest.to_dict() == theirs_latest.to_dict()
                theirs = sorted(await framework.list_checkpoint_ids(workflow_name=workflow))
                assert sorted(await ours.list_checkpoint_ids(workflow_name=workflow)) == theirs

    asyncio.run(compare())


def test_a_missing_source_directory_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "statekeeper.cli",
            "import",
            str(missing),
            "--from",
            "agent-framework",
            "--url",
            f"sqlite:///{tmp_path}/t.db",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "not a directory" in result.stderr + result.stdout
    assert not missing.exists()


# -- LangGraph ------------------------------------------------------------------------


class Steps(TypedDict):
    log: list[str]


def _step(name: str) -> Any:
    def run(state: Steps) -> dict[str, list[str]]:
        return {"log": [*state["log"], name]}

    return run


def _build() -> Any:
    builder = StateGraph(Steps)
    builder.add_node("a", _step("a"))
    builder.add_node("b", _step("b"))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    return builder


def _langgraph_database(path: Path) -> None:
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        graph = _build().compile(checkpointer=SqliteSaver(conn))
        for thread in ("t1", "t2"):
            graph.invoke({"log": []}, {"configurable": {"thread_id": thread}})
        graph.invoke({"log": ["again"]}, {"configurable": {"thread_id": "t1"}})
    finally:
        conn.close()


def _tuples(saver: Any, thread: str) -> list[tuple[Any, ...]]:
    return [
        (
            t.config["configurable"]["checkpoint_id"],
            t.checkpoint["channel_values"],
            t.metadata.get("step"),
            t.metadata.get("source"),
            None if t.parent_config is None else t.parent_config["configurable"]["checkpoint_id"],
            sorted((w[1], repr(w[2])) for w in t.pending_writes or ()),
        )
        for t in saver.list({"configurable": {"thread_id": thread}})
    ]


def test_langgraph_database_imports_whole_and_reads_as_the_framework_did(
    tmp_path: Path,
) -> None:
    source = tmp_path / "graph.db"
    _langgraph_database(source)
    url = f"sqlite:///{tmp_path}/target.db"
    first = _cli(
        "import", str(source), "--from", "langgraph-sqlite", "--url", url, cwd=tmp_path, expect=0
    )
    with sqlite3.connect(source) as conn:
        total = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    assert (first["seen"], first["imported"], first["problems"]) == (total, total, [])
    again = _cli(
        "import", str(source), "--from", "langgraph-sqlite", "--url", url, cwd=tmp_path, expect=0
    )
    assert (again["imported"], again["already_present"]) == (0, total)

    theirs_conn = sqlite3.connect(source, check_same_thread=False)
    try:
        theirs = SqliteSaver(theirs_conn)
        with statekeeper.sync.open_store(url, codec="raw") as store:
            ours = StatekeeperSaver(store)
            for thread in ("t1", "t2"):
                assert _tuples(ours, thread) == _tuples(theirs, thread)
                config = {"configurable": {"thread_id": thread}}
                mine, original = ours.get_tuple(config), theirs.get_tuple(config)
                assert mine is not None and original is not None
                assert mine.checkpoint == original.checkpoint
            # the graph resumes from the imported state as it would have from the source
            graph = _build().compile(checkpointer=ours)
            state = graph.get_state({"configurable": {"thread_id": "t1"}})
            assert state.values["log"] == ["again", "a", "b"]
    finally:
        theirs_conn.close()


def test_an_unreadable_langgraph_row_is_reported_not_dropped(tmp_path: Path) -> None:
    source = tmp_path / "graph.db"
    _langgraph_database(source)
    with sqlite3.connect(source) as conn:
        victim = conn.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = 't2' "
            "ORDER BY checkpoint_id DESC LIMIT 1"
        ).fetchone()[0]
        conn.execute(
            "UPDATE checkpoints SET checkpoint = ?, type = 'msgpack' WHERE checkpoint_id = ?",
            (b"\xc1 not msgpack", victim),
        )
    url = f"sqlite:///{tmp_path}/target.db"
    doc = _cli(
        "import", str(source), "--from", "langgraph-sqlite", "--url", url, cwd=tmp_path, expect=1
    )
    assert len(doc["problems"]) == 1
    assert victim in doc["problems"][0]["location"]
    assert doc["imported"] == doc["seen"] - 1


@pytest.mark.parametrize("kind", ["agent-framework", "langgraph-sqlite"])
def test_import_refuses_a_source_of_the_wrong_kind(tmp_path: Path, kind: str) -> None:
    bogus = tmp_path / "bogus"
    bogus.write_text("not checkpoints", "utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "statekeeper.cli",
            "import",
            str(bogus),
            "--from",
            kind,
            "--url",
            f"sqlite:///{tmp_path}/t.db",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
