"""``statekeeper import --from langgraph-postgres``: a database made by LangGraph's real
``PostgresSaver`` comes across whole (subgraph namespaces and pending writes), re-runs
are safe, an unreadable row is reported, and the source is never written to."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint import postgres
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import statekeeper.sync
from cli_helpers import run_cli
from statekeeper.integrations.importers import postgres_conninfo
from statekeeper.integrations.langgraph import StatekeeperSaver
from statekeeper.testing import service_url


class State(TypedDict):
    log: list[str]


def _node(name: str) -> Any:
    def run(state: State) -> dict[str, list[str]]:
        return {"log": [*state["log"], name]}

    return run


def _ask(state: State) -> dict[str, list[str]]:
    answer = interrupt("go on?")
    return {"log": [*state["log"], f"ask:{answer}"]}


def _graph(checkpointer: Any) -> Any:
    child = StateGraph(State)
    child.add_node("inner", _node("inner"))
    child.add_node("ask", _ask)
    child.add_edge(START, "inner")
    child.add_edge("inner", "ask")
    child.add_edge("ask", END)
    parent = StateGraph(State)
    parent.add_node("first", _node("first"))
    parent.add_node("sub", child.compile())
    parent.add_edge(START, "first")
    parent.add_edge("first", "sub")
    parent.add_edge("sub", END)
    return parent.compile(checkpointer=checkpointer)


@pytest.fixture
def source() -> Iterator[str]:
    """The connection string of a fresh database filled by the real PostgresSaver:
    thread t1 paused inside its subgraph (pending writes), t2 run to the end."""
    server = postgres_conninfo(service_url("postgres"))
    name = f"lgimport_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    conninfo = server.rsplit("/", 1)[0] + "/" + name
    try:
        with postgres.PostgresSaver.from_conn_string(conninfo) as saver:
            saver.setup()
            graph = _graph(saver)
            for thread in ("t1", "t2"):
                graph.invoke({"log": []}, {"configurable": {"thread_id": thread}})
            graph.invoke(Command(resume="yes"), {"configurable": {"thread_id": "t2"}})
        yield conninfo
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _cli(*args: str, cwd: Path, expect: int) -> dict[str, Any]:
    doc: dict[str, Any] = run_cli(*args, "--json", cwd=cwd, expect=expect, timeout=180).json()
    return doc


def _namespaces(conninfo: str) -> list[tuple[str, str]]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT DISTINCT thread_id, checkpoint_ns FROM checkpoints ORDER BY 1, 2"
        ).fetchall()
    return [(str(t), str(ns)) for t, ns in rows]


def _view(saver: Any, thread: str, ns: str) -> list[tuple[Any, ...]]:
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
    return sorted(
        (
            t.config["configurable"]["checkpoint_id"],
            repr(t.checkpoint["channel_values"]),
            t.metadata.get("step"),
            t.metadata.get("source"),
            None if t.parent_config is None else t.parent_config["configurable"]["checkpoint_id"],
            sorted((w[0], w[1], repr(w[2])) for w in t.pending_writes or ()),
        )
        for t in saver.list(config)
    )


def test_a_postgres_saver_database_imports_whole_and_reads_as_the_framework_did(
    source: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/target.db"
    spaces = _namespaces(source)
    assert any(ns for _, ns in spaces), "the source has subgraph namespaces"
    with psycopg.connect(source) as conn:
        total = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
        writes_before = conn.execute("SELECT count(*) FROM checkpoint_writes").fetchone()[0]
    assert writes_before > 0, "the paused thread has pending writes"

    # trust auth ignores the password; it must never be printed
    secret = source.replace("postgres@", "postgres:hunter2@", 1)
    assert secret != source
    first = _cli(
        "import", secret, "--from", "langgraph-postgres", "--url", url, cwd=tmp_path, expect=0
    )
    assert (first["seen"], first["imported"], first["problems"]) == (total, total, [])
    assert "hunter2" not in json.dumps(first)
    again = _cli(
        "import", source, "--from", "langgraph-postgres", "--url", url, cwd=tmp_path, expect=0
    )
    assert (again["seen"], again["imported"], again["already_present"]) == (total, 0, total)

    with (
        postgres.PostgresSaver.from_conn_string(source) as theirs,
        statekeeper.sync.open_store(url, codec="raw") as store,
    ):
        ours = StatekeeperSaver(store)
        for thread, ns in spaces:
            assert _view(ours, thread, ns) == _view(theirs, thread, ns), (thread, ns)
            config = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
            mine, original = ours.get_tuple(config), theirs.get_tuple(config)
            assert mine is not None and original is not None
            assert mine.checkpoint == original.checkpoint
        # the paused thread resumes from the imported state as from the source
        graph = _graph(ours)
        state = graph.get_state({"configurable": {"thread_id": "t1"}}, subgraphs=True)
        assert state.tasks and state.tasks[0].interrupts
        done = graph.invoke(Command(resume="later"), {"configurable": {"thread_id": "t1"}})
        assert done["log"] == ["first", "inner", "ask:later"]
    # the import only read the source
    with psycopg.connect(source) as conn:
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == total
        assert conn.execute("SELECT count(*) FROM checkpoint_writes").fetchone()[0] == writes_before


def test_an_unreadable_postgres_row_is_reported_not_dropped(source: str, tmp_path: Path) -> None:
    with psycopg.connect(source, autocommit=True) as conn:
        victim = conn.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = 't2' AND checkpoint_ns = '' "
            "ORDER BY checkpoint_id DESC LIMIT 1"
        ).fetchone()[0]
        conn.execute(
            "UPDATE checkpoint_blobs SET blob = %s, type = 'msgpack' WHERE thread_id = 't2' "
            "AND checkpoint_ns = '' AND channel = 'log'",
            (b"\xc1 not msgpack",),
        )
    url = f"sqlite:///{tmp_path}/target.db"
    doc = _cli(
        "import", source, "--from", "langgraph-postgres", "--url", url, cwd=tmp_path, expect=1
    )
    assert doc["problems"], doc
    assert any(victim in p["location"] for p in doc["problems"])
    assert doc["imported"] == doc["seen"] - len(doc["problems"])


def test_a_source_without_langgraph_tables_creates_no_target(tmp_path: Path) -> None:
    server = postgres_conninfo(service_url("postgres"))
    name = f"lgempty_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        empty = server.rsplit("/", 1)[0] + "/" + name
        target = tmp_path / "never.db"
        doc = _cli(
            "import",
            empty,
            "--from",
            "langgraph-postgres",
            "--url",
            f"sqlite:///{target}",
            cwd=tmp_path,
            expect=1,
        )
        assert "PostgresSaver" in json.dumps(doc)
        assert not target.exists()
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
