"""StatekeeperCheckpointStorage against every behaviour the framework checks of a
checkpoint storage (agent-framework's storage conformance and checkpoint tests),
written afresh, on every backend.

Ownership (every result is the caller's own copy, a save is a snapshot), filtering
by workflow name, missing ids, deletion, the latest checkpoint, and round trips of
every kind of value a checkpoint carries, compared with what the framework's own
``FileCheckpointStorage`` gives back for the same checkpoint.
"""

from __future__ import annotations

import copy
import json
import pickle
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agent_framework import (
    CheckpointStorage,
    FileCheckpointStorage,
    WorkflowCheckpoint,
    WorkflowCheckpointException,
    WorkflowEvent,
    register_checkpoint_type,
)
from agent_framework._workflows._runner_context import WorkflowMessage
from agent_framework_stores import Backend, backend_fixture  # noqa: F401  (the fixture)

pytestmark = pytest.mark.asyncio

WF = "conformance-wf"


@dataclass
class Order:
    number: int
    lines: list[str]
    placed: datetime


@dataclass
class Approval:
    action: str
    args: tuple[int, ...]


class NoDeepcopy:
    """Pickles fine, refuses copy.deepcopy: a storage must not rely on deepcopy."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __deepcopy__(self, memo: dict[int, Any]) -> NoDeepcopy:
        raise TypeError("NoDeepcopy refuses deepcopy")

    def __reduce__(self) -> tuple[Any, ...]:
        return (NoDeepcopy, (self.value,))


for _type in (Order, Approval, NoDeepcopy):
    register_checkpoint_type(_type)


def cp(**fields: Any) -> WorkflowCheckpoint:
    fields.setdefault("workflow_name", WF)
    fields.setdefault("graph_signature_hash", "sig")
    return WorkflowCheckpoint(**fields)


async def test_the_storage_satisfies_the_protocol(backend: Backend) -> None:
    storage: CheckpointStorage = backend.storage()  # type-checks as the Protocol
    for name in ("save", "load", "list_checkpoints", "list_checkpoint_ids", "delete", "get_latest"):
        assert callable(getattr(storage, name))


async def test_save_returns_the_checkpoint_id_and_load_gives_it_back(backend: Backend) -> None:
    storage = backend.storage()
    original = cp(state={"k": "v"}, iteration_count=3, metadata={"superstep": 3})
    assert await storage.save(original) == original.checkpoint_id
    loaded = await storage.load(original.checkpoint_id)
    assert loaded is not original
    assert loaded.to_dict() == original.to_dict()


async def test_a_loaded_checkpoint_is_the_callers_copy(backend: Backend) -> None:
    storage = backend.storage()
    saved = await storage.save(cp(state={"key": "original", "nested": {"deep": {"v": 1}}}))
    first = await storage.load(saved)
    second = await storage.load(saved)
    first.state["key"] = "mutated"
    first.state["nested"]["deep"]["v"] = 2
    assert second.state == {"key": "original", "nested": {"deep": {"v": 1}}}
    assert (await storage.load(saved)).state == {"key": "original", "nested": {"deep": {"v": 1}}}


async def test_get_latest_and_list_return_the_callers_copies(backend: Backend) -> None:
    storage = backend.storage()
    await storage.save(cp(state={"key": "one"}))
    await storage.save(cp(state={"key": "two"}))
    latest = await storage.get_latest(workflow_name=WF)
    assert latest is not None
    latest.state["key"] = "mutated"
    listed = await storage.list_checkpoints(workflow_name=WF)
    for item in listed:
        item.state["key"] = "mutated"
    again = await storage.get_latest(workflow_name=WF)
    assert again is not None and again.state["key"] == "two"
    assert [c.state["key"] for c in await storage.list_checkpoints(workflow_name=WF)] == [
        "one",
        "two",
    ]


async def test_save_snapshots_the_checkpoint_at_call_time(backend: Backend) -> None:
    storage = backend.storage()
    original = cp(state={"key": "original", "nested": {"deep": {"value": "original"}}})
    saved = await storage.save(original)
    original.state["key"] = "mutated"
    original.state["nested"]["deep"]["value"] = "mutated"
    assert (await storage.load(saved)).state == {
        "key": "original",
        "nested": {"deep": {"value": "original"}},
    }


async def test_messages_events_and_metadata_are_isolated(backend: Backend) -> None:
    storage = backend.storage()
    saved = await storage.save(
        cp(
            messages={"exec": [WorkflowMessage(data="original", source_id="a", target_id="b")]},
            pending_request_info_events={"req": WorkflowEvent(type="test", data="original")},
            metadata={"nested": {"value": "original"}},
        )
    )
    loaded = await storage.load(saved)
    loaded.messages["exec"][0].data = "mutated"
    loaded.pending_request_info_events["req"].data = "mutated"
    loaded.metadata["nested"]["value"] = "mutated"
    again = await storage.load(saved)
    assert again.messages["exec"][0].data == "original"
    assert again.pending_request_info_events["req"].data == "original"
    assert again.metadata["nested"]["value"] == "original"


async def test_a_value_that_pickles_but_refuses_deepcopy_round_trips(backend: Backend) -> None:
    with pytest.raises(TypeError):
        copy.deepcopy(NoDeepcopy("x"))
    storage = backend.storage()
    saved = await storage.save(cp(state={"custom": NoDeepcopy("test")}))
    loaded = await storage.load(saved)
    assert isinstance(loaded.state["custom"], NoDeepcopy)
    assert loaded.state["custom"].value == "test"
    loaded.state["custom"].value = "mutated"
    assert (await storage.load(saved)).state["custom"].value == "test"


async def test_list_and_ids_filter_by_workflow_name(backend: Backend) -> None:
    storage = backend.storage()
    one_a = cp(workflow_name="wf-1", graph_signature_hash="h1")
    two = cp(workflow_name="wf-2", graph_signature_hash="h2")
    one_b = cp(workflow_name="wf-1", graph_signature_hash="h3")
    for item in (one_a, two, one_b):
        await storage.save(item)
    listed = await storage.list_checkpoints(workflow_name="wf-1")
    assert [c.checkpoint_id for c in listed] == [one_a.checkpoint_id, one_b.checkpoint_id]
    assert all(c.workflow_name == "wf-1" for c in listed)
    assert await storage.list_checkpoint_ids(workflow_name="wf-1") == [
        one_a.checkpoint_id,
        one_b.checkpoint_id,
    ]
    assert [c.checkpoint_id for c in await storage.list_checkpoints(workflow_name="wf-2")] == [
        two.checkpoint_id
    ]
    assert await storage.list_checkpoint_ids(workflow_name="wf-2") == [two.checkpoint_id]
    assert await storage.list_checkpoints(workflow_name="nope") == []
    assert await storage.list_checkpoint_ids(workflow_name="nope") == []


async def test_get_latest_is_per_workflow_and_none_for_an_unknown_one(backend: Backend) -> None:
    storage = backend.storage()
    first, second = cp(workflow_name="wf-1"), cp(workflow_name="wf-1")
    other = cp(workflow_name="wf-2")
    for item in (first, second, other):
        await storage.save(item)
    latest = await storage.get_latest(workflow_name="wf-1")
    assert latest is not None and latest.checkpoint_id == second.checkpoint_id
    latest2 = await storage.get_latest(workflow_name="wf-2")
    assert latest2 is not None and latest2.checkpoint_id == other.checkpoint_id
    assert await storage.get_latest(workflow_name="unknown") is None


async def test_load_of_a_missing_id_raises_the_frameworks_exception(backend: Backend) -> None:
    storage = backend.storage()
    with pytest.raises(WorkflowCheckpointException, match="No checkpoint found"):
        await storage.load("nonexistent-id")
    # ids the store could not hold, and path tricks, are just missing ids here
    for odd in ("../../etc/passwd", "", "x" * 500, "sp ace", "ünï"):
        with pytest.raises(WorkflowCheckpointException):
            await storage.load(odd)


async def test_delete_removes_once(backend: Backend) -> None:
    storage = backend.storage()
    item = cp()
    await storage.save(item)
    assert await storage.delete(item.checkpoint_id) is True
    with pytest.raises(WorkflowCheckpointException):
        await storage.load(item.checkpoint_id)
    assert await storage.delete(item.checkpoint_id) is False
    assert await storage.list_checkpoint_ids(workflow_name=WF) == []
    assert await storage.get_latest(workflow_name=WF) is None


async def test_ids_and_names_the_store_cannot_hold_are_mapped(backend: Backend) -> None:
    storage = backend.storage()
    odd_id = "ckpt/with spaces/" + "é" * 300
    odd_name = "workflow\x00" + "n" * 600
    item = cp(checkpoint_id=odd_id, workflow_name=odd_name)
    assert await storage.save(item) == odd_id
    assert (await storage.load(odd_id)).workflow_name == odd_name
    assert await storage.list_checkpoint_ids(workflow_name=odd_name) == [odd_id]
    latest = await storage.get_latest(workflow_name=odd_name)
    assert latest is not None and latest.checkpoint_id == odd_id
    assert await storage.delete(odd_id) is True


def _states() -> dict[str, dict[str, Any]]:
    when = datetime(2025, 6, 15, 10, 30, 45, 123456, tzinfo=UTC)
    order = Order(7, ["a", "b"], when)
    return {
        "json-native": {
            "s": "hello world",
            "i": 42,
            "neg": -100,
            "f": 3.14159,
            "t": True,
            "no": False,
            "null": None,
            "zero": 0,
            "empty": "",
            "unicode": "世界 🌍",
        },
        "datetime": {"now": datetime.now(UTC), "when": when, "nested": {"at": when}},
        "dataclass": {"order": order, "nested": {"inner": order}},
        "tuple-and-set": {"tup": (1, "two", 3.0, None), "fs": frozenset({1, 2}), "n": {"t": ()}},
        "nested": {
            "l1": {"l2": {"l3": {"s": "deep", "dt": when, "tup": (1, 2, 3)}}},
            "mixed": ["s", 42, 3.14, True, None, when, (7, 8, 9), [{"a": when}]],
        },
        "bytes": {"bin": b"\x00\x01\xff", "utf8": "Hello 世界".encode(), "n": {"b": b""}},
        "empty": {"d": {}, "l": [], "t": (), "n": {"d": {}, "l": []}},
        "marker-keys": {"x": {"__pickled__": "not really", "__type__": "x:y"}},
        "odd-keys": {"m": {1: "int key", "1": "str key"}},
    }


@pytest.mark.parametrize("kind", list(_states()))
async def test_values_round_trip_as_through_the_frameworks_file_storage(
    backend: Backend, kind: str, tmp_path: Path
) -> None:
    storage = backend.storage()
    reference = FileCheckpointStorage(tmp_path / "af-files")
    item = cp(state=_states()[kind])
    await storage.save(item)
    await reference.save(item)
    ours = await storage.load(item.checkpoint_id)
    theirs = await reference.load(item.checkpoint_id)
    assert _shape(ours.state) == _shape(theirs.state)
    assert ours.state == theirs.state


async def test_a_full_checkpoint_round_trips_every_field(backend: Backend) -> None:
    storage = backend.storage()
    when = datetime(2025, 1, 1, tzinfo=UTC)
    event = WorkflowEvent.request_info(
        request_id="req1",
        source_executor_id="exec1",
        request_data=Approval("approve", (1, 2, 3)),
        response_type=bool,
    )
    item = cp(
        checkpoint_id="full-test-checkpoint",
        workflow_name="comprehensive",
        graph_signature_hash="hash-abc",
        previous_checkpoint_id="previous-id",
        timestamp=datetime(2025, 6, 15, 12, tzinfo=UTC).isoformat(),
        messages={
            "e1": [WorkflowMessage(data={"text": "hi", "at": when}, source_id="s", target_id="t")],
            "e2": [WorkflowMessage(data=(1, 2), source_id="s2", target_id=None)],
        },
        state={"user": {"created": when}, "_executor_state": {"e1": Order(5, ["x"], when)}},
        pending_request_info_events={"req1": event},
        iteration_count=10,
        metadata={"superstep": 5, "started_at": when},
        version="1.0",
    )
    await storage.save(item)
    loaded = await storage.load("full-test-checkpoint")
    for name in (
        "checkpoint_id",
        "workflow_name",
        "graph_signature_hash",
        "previous_checkpoint_id",
        "timestamp",
        "iteration_count",
        "version",
        "state",
        "metadata",
    ):
        assert getattr(loaded, name) == getattr(item, name), name
    message = loaded.messages["e1"][0]
    assert isinstance(message, WorkflowMessage)
    assert (message.data, message.source_id, message.target_id) == (
        {"text": "hi", "at": when},
        "s",
        "t",
    )
    assert loaded.messages["e2"][0].data == (1, 2) and loaded.messages["e2"][0].target_id is None
    got = loaded.pending_request_info_events["req1"]
    assert isinstance(got, WorkflowEvent)
    assert (got.type, got.request_id, got.source_executor_id) == ("request_info", "req1", "exec1")
    assert got.data == Approval("approve", (1, 2, 3)) and got.response_type is bool


async def test_an_unreadable_item_is_left_out_of_listings_but_load_raises(
    backend: Backend,
) -> None:
    storage = backend.storage()
    good = cp()
    await storage.save(good)
    raw = backend.raw_store()
    async with raw:
        await raw.save(
            storage.stream_for(WF),
            b"{ invalid json }",
            id=storage.store_id_for("corrupted"),
            metadata={
                "format": "agent-framework/json",
                "checkpoint_id": "corrupted",
                "workflow_name": WF,
            },
        )
    assert [c.checkpoint_id for c in await storage.list_checkpoints(workflow_name=WF)] == [
        good.checkpoint_id
    ]
    assert (await storage.list_checkpoint_ids(workflow_name=WF)) == [
        good.checkpoint_id,
        "corrupted",
    ]
    with pytest.raises(WorkflowCheckpointException, match="not valid UTF-8 JSON"):
        await storage.load("corrupted")


async def test_what_is_stored_is_the_frameworks_json_as_raw_bytes(backend: Backend) -> None:
    storage = backend.storage()
    item = cp(state={"list": [1, 2, 3], "when": datetime(2025, 1, 1, tzinfo=UTC)})
    await storage.save(item)
    raw = backend.raw_store()
    async with raw:
        record = await raw.load(storage.store_id_for(item.checkpoint_id))
    assert isinstance(record.state, bytes)
    document = json.loads(record.state)
    assert document["state"]["list"] == [1, 2, 3]
    assert set(document["state"]["when"]) == {"__pickled__", "__type__"}
    assert document["timestamp"] == item.timestamp  # the checkpoint's fields are its state
    # the metadata holds what the storage reads back, under one key, so no backend
    # indexes a field of it (SQL indexes top-level scalars for list(metadata=))
    assert record.metadata == {
        "agent_framework": {
            "format": "agent-framework/json",
            "checkpoint_id": item.checkpoint_id,
            "workflow_name": WF,
        }
    }


async def test_records_of_the_earlier_metadata_layout_read_as_before(backend: Backend) -> None:
    """Records written before the metadata moved under one key (format, ids and the
    checkpoint's timestamp, parent and iteration count at the top level) load, list,
    are the latest, are listed by id, are replaced by a re-save and are deleted."""
    storage = backend.storage()
    first, second = cp(state={"n": 1}), cp(state={"n": 2})
    raw = backend.raw_store()
    async with raw:
        for item in (first, second):
            new = storage.encode(item)
            await raw.save(
                new.stream,
                new.state,
                id=new.id,
                parent_id=new.parent_id,
                metadata={
                    "format": "agent-framework/json",
                    "checkpoint_id": item.checkpoint_id,
                    "workflow_name": item.workflow_name,
                    "timestamp": item.timestamp,
                    "previous_checkpoint_id": item.previous_checkpoint_id,
                    "iteration_count": item.iteration_count,
                },
            )
    assert (await storage.load(first.checkpoint_id)).state == {"n": 1}
    latest = await storage.get_latest(workflow_name=WF)
    assert latest is not None and latest.checkpoint_id == second.checkpoint_id
    listed = await storage.list_checkpoints(workflow_name=WF)
    assert [(c.checkpoint_id, c.state) for c in listed] == [
        (first.checkpoint_id, {"n": 1}),
        (second.checkpoint_id, {"n": 2}),
    ]
    ids = await storage.list_checkpoint_ids(workflow_name=WF)
    assert ids == [first.checkpoint_id, second.checkpoint_id]
    other = cp(state={"n": 3}, workflow_name="other-wf", checkpoint_id=first.checkpoint_id)
    with pytest.raises(WorkflowCheckpointException, match=f"under workflow {WF!r}"):
        await storage.save(other)
    first.state = {"n": 10}
    await storage.save(first)
    assert (await storage.load(first.checkpoint_id)).state == {"n": 10}
    assert await storage.list_checkpoint_ids(workflow_name=WF) == ids
    assert await storage.delete(second.checkpoint_id)
    latest = await storage.get_latest(workflow_name=WF)
    assert latest is not None and latest.state == {"n": 10}


def _shape(value: Any) -> Any:
    """A value's types and contents, comparable across two loads."""
    if isinstance(value, dict):
        return ("dict", sorted((repr(k), _shape(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_shape(v) for v in value])
    return (type(value).__qualname__, pickle.dumps(value))
