"""The integrations over an encrypted store (SPEC S16): nothing in the clear on disk.

``StatekeeperSaver`` (LangGraph) and ``StatekeeperCheckpointStorage`` (Agent
Framework) over an encrypted SQLite store: a checkpoint, its pending writes and its
metadata carry a marker; the database and its -wal and -shm files never hold it
(read while the store is open and after it closed), and the framework's own API
gives the marker back.
"""

from __future__ import annotations

import asyncio
import operator
import os
import secrets
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from agent_framework import WorkflowCheckpoint
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.graph import END, START, StateGraph

import statekeeper
from statekeeper.encryption import Keyring
from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage
from statekeeper.integrations.langgraph import StatekeeperSaver

pytestmark = pytest.mark.asyncio


def keyring() -> Keyring:
    return Keyring({"k1": os.urandom(32)}, active="k1")


def marker(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(8)}-MARK"


def holding(db: Path, *markers: str) -> list[str]:
    """Which of the database's files (db, -wal, -shm) hold any of ``markers``."""
    out = []
    for suffix in ("", "-wal", "-shm"):
        path = Path(f"{db}{suffix}")
        if path.exists():
            data = path.read_bytes()
            out += [f"{path.name}: {m}" for m in markers if m.encode() in data]
    return out


def wal_size(db: Path) -> int:
    """The size of the database's -wal file (the saves not yet checkpointed)."""
    return Path(f"{db}-wal").stat().st_size


# -- LangGraph -------------------------------------------------------------------------


class Notes(TypedDict, total=False):
    items: Annotated[list[str], operator.add]


@pytest.mark.parametrize("meta", [True, False], ids=["encrypt_metadata", "plain_metadata"])
async def test_langgraph_saver_keeps_nothing_in_the_clear(tmp_path: Path, meta: bool) -> None:
    db = tmp_path / "lg.db"
    keys = keyring()
    state, pending, graph_marker, meta_marker = (
        marker("STATE"),
        marker("WRITE"),
        marker("GRAPH"),
        marker("META"),
    )
    url = f"sqlite:///{db}"
    async with statekeeper.open_store(
        url, codec="raw", encryption=keys, encrypt_metadata=meta
    ) as store:
        saver = StatekeeperSaver(store)
        checkpoint = generate_checkpoint(channel_values={"secret": state})
        checkpoint["channel_versions"] = {"secret": 1}
        first = await saver.aput(
            generate_config("t1"), checkpoint, generate_metadata(note=meta_marker), {"secret": 1}
        )
        await saver.aput_writes(first, [("secret", pending)], "task-1")
        # the blocking API, from a thread (not the store's loop)
        again = generate_checkpoint(channel_values={"secret": state + "-sync"})
        again["channel_versions"] = {"secret": 2}
        second = await asyncio.to_thread(
            saver.put,
            {"configurable": {**first["configurable"]}},
            again,
            generate_metadata(note=meta_marker),
            {"secret": 2},
        )

        # a real graph over the saver
        builder = StateGraph(Notes)
        builder.add_node("note", lambda s: {"items": [graph_marker]})
        builder.add_edge(START, "note")
        builder.add_edge("note", END)
        graph = builder.compile(checkpointer=saver)
        result = await graph.ainvoke({"items": []}, {"configurable": {"thread_id": "g1"}})
        assert result == {"items": [graph_marker]}

        # open: the saves are in the -wal file, not yet checkpointed
        assert wal_size(db) > 0
        assert holding(db, state, pending, graph_marker, meta_marker) == []

        got = await saver.aget_tuple(first)
        assert got is not None
        assert got.checkpoint["channel_values"] == {"secret": state}
        assert got.metadata["note"] == meta_marker  # type: ignore[typeddict-item]
        assert [w[1:] for w in got.pending_writes or []] == [("secret", pending)]
        latest = await saver.aget_tuple(generate_config("t1"))
        assert latest is not None
        assert latest.checkpoint["id"] == second["configurable"]["checkpoint_id"]
        assert latest.checkpoint["channel_values"] == {"secret": state + "-sync"}
        snapshot = await graph.aget_state({"configurable": {"thread_id": "g1"}})
        assert snapshot.values == {"items": [graph_marker]}

    # the saver packs LangGraph's metadata into the record's state (its records carry
    # no tags and no store metadata), so it is sealed with or without encrypt_metadata
    assert holding(db, state, pending, graph_marker, meta_marker) == []

    # a new process: a saver over the store reopened with the keys reads it all back
    async with statekeeper.open_store(url, codec="raw", encryption=keys) as store:
        saver = StatekeeperSaver(store)
        got = await saver.aget_tuple(first)
        assert got is not None
        assert got.checkpoint["channel_values"] == {"secret": state}
        listed = [t.checkpoint["channel_values"] async for t in saver.alist(generate_config("t1"))]
        assert listed == [{"secret": state + "-sync"}, {"secret": state}]


# -- Agent Framework --------------------------------------------------------------------


@pytest.mark.parametrize("meta", [True, False], ids=["encrypt_metadata", "plain_metadata"])
async def test_agent_framework_storage_keeps_nothing_in_the_clear(
    tmp_path: Path, meta: bool
) -> None:
    db = tmp_path / "af.db"
    keys = keyring()
    state, meta_marker = marker("STATE"), marker("META")
    url = f"sqlite:///{db}"

    def storage() -> StatekeeperCheckpointStorage:
        store = statekeeper.open_store(url, codec="raw", encryption=keys, encrypt_metadata=meta)
        return StatekeeperCheckpointStorage(store)

    def checkpoint(step: int) -> WorkflowCheckpoint:
        return WorkflowCheckpoint(
            workflow_name="wf",
            graph_signature_hash="sig",
            state={"secret": state, "step": step},
            iteration_count=step,
            metadata={"note": meta_marker},
        )

    async with storage() as s:
        first, second = checkpoint(1), checkpoint(2)
        assert await s.save(first) == first.checkpoint_id
        assert await s.save(second) == second.checkpoint_id
        assert wal_size(db) > 0  # the saves are in the -wal file
        assert holding(db, state, meta_marker) == []
        loaded = await s.load(first.checkpoint_id)
        assert loaded.state == {"secret": state, "step": 1}
        assert loaded.to_dict() == first.to_dict()

    # the framework's checkpoint metadata travels inside the state, sealed either way
    assert holding(db, state, meta_marker) == []

    async with storage() as s:  # a restarted process
        latest = await s.get_latest(workflow_name="wf")
        assert latest is not None
        assert latest.checkpoint_id == second.checkpoint_id
        assert latest.state == {"secret": state, "step": 2}
        listed = await s.list_checkpoints(workflow_name="wf")
        assert sorted(c.iteration_count for c in listed) == [1, 2]
        assert all(c.state["secret"] == state for c in listed)
