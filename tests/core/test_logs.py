"""Logs (SPEC S18): every module logs through a ``statekeeper.<part>`` logger, and
nothing logs a state, an encryption key or a password, also on the paths that do
log (damaged records skipped by the adapters, a file store rebuilding its
indexes), with telemetry on."""

from __future__ import annotations

import ast
import base64
import logging
import operator
import os
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import statekeeper as sk
from statekeeper.encryption import Keyring
from statekeeper.integrations.langgraph import StatekeeperSaver
from telemetry_helpers import Recorder, damage, plant_unreadable


class Chain(TypedDict, total=False):
    items: Annotated[list[str], operator.add]


def graph_on(saver: StatekeeperSaver) -> Any:
    builder = StateGraph(Chain)
    builder.add_node("a", lambda state: {"items": ["a"]})
    builder.add_edge(START, "a")
    builder.add_edge("a", END)
    return builder.compile(checkpointer=saver)


ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "src", *sorted((ROOT / "backends").glob("*/src"))]
SECRET = "state-value-that-must-never-be-logged-5c1e"


def logger_names() -> list[tuple[Path, object]]:
    """Every ``logging.getLogger(...)`` call's argument in the sources."""
    found: list[tuple[Path, object]] = []
    for src in SOURCES:
        for path in src.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "getLogger"
                ):
                    arg = node.args[0] if node.args else None
                    found.append((path, arg.value if isinstance(arg, ast.Constant) else arg))
    return found


def test_every_logger_is_named_statekeeper_part() -> None:
    names = logger_names()
    assert names  # the walk found the loggers
    wrong = [
        (str(p.relative_to(ROOT)), n)
        for p, n in names
        if not (isinstance(n, str) and n.startswith("statekeeper."))
    ]
    assert not wrong, wrong


@pytest.mark.asyncio
async def test_nothing_logs_a_state_a_key_or_a_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key = os.urandom(32)
    keyring = Keyring({"k1": key}, active="k1")
    rec = Recorder()

    # a file store that logs: a damaged index rebuilt at open, a record skipped
    root = tmp_path / "files"
    async with sk.open_store(f"file://{root}", telemetry=rec.options()) as store:
        for i in range(3):
            await store.save("s", {"v": SECRET, "i": i})
    (root / "streams" / "s.idx").write_bytes(b"\0garbage")
    async with sk.open_store(f"file://{root}", telemetry=rec.options()) as store:
        await plant_unreadable(store, "s")
        page = await store.list("s")
        assert len(page.items) == 3 and len(page.skipped) == 1

    # an encrypted SQLite store, and a LangGraph listing that skips a damaged record
    url = f"sqlite:///{tmp_path / 'enc.db'}"
    async with sk.open_store(url, encryption=keyring, telemetry=rec.options()) as store:
        await store.save("s", {"v": SECRET})
        assert (await store.get_latest("s")) is not None
    async with sk.open_store("memory://", codec="raw", telemetry=rec.options()) as store:
        graph = graph_on(StatekeeperSaver(store))
        config = {"configurable": {"thread_id": "user-1"}}
        await graph.ainvoke({"items": [SECRET]}, config)
        listed = (await store.list(None, limit=1000)).items
        for cp in listed:
            await damage(store, cp.id, cp.sequence)
        assert [x async for x in graph.checkpointer.alist(config)] == []

    # a password in a store URL: the store is made and described, never connected
    server = sk.open_store("postgresql+asyncpg://app:hunter2-pw@127.0.0.1:1/db")
    logging.getLogger("statekeeper.tests").info("opened %s", server.describe())

    records = [r for r in caplog.records if r.name.startswith("statekeeper")]
    by = {r.name for r in records if r.levelno >= logging.WARNING}
    assert {"statekeeper.backends.file", "statekeeper.integrations.langgraph"} <= by
    logged = "\n".join(
        r.getMessage() + (caplog.handler.format(r) if r.exc_info else "") for r in records
    )
    forbidden = [
        SECRET,
        key.hex(),
        base64.b64encode(key).decode(),
        base64.urlsafe_b64encode(key).decode().rstrip("="),
        "hunter2-pw",
    ]
    assert not [f for f in forbidden if f in logged]
    assert not [r for r in records if key in repr(r.args).encode()]
