"""The adapter's JSON is the framework's: ``_codec._framework_json`` writes plain
fields as they are and leaves everything else to ``encode_checkpoint_value``; the
bytes must equal what the framework's encoder gives, whatever the checkpoint holds.
Bytes without a pickled value are not decoded at save (nothing in them can be
refused); bytes with one are."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException
from hypothesis import given, settings
from hypothesis import strategies as st

import statekeeper
from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage, _codec


class Text(str):
    pass


@dataclass
class Unlisted:
    n: int


def reference(fields: dict[str, Any]) -> bytes:
    """What the adapter wrote before the plain shortcut: the framework's encoder, then
    the compact JSON of ``json.dumps``."""
    value = _codec.encode_checkpoint_value(fields)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


STATES: dict[str, Any] = {
    "plain": {"step": 1, "messages": [{"role": "user", "content": "hi é 世界"}], "x": 0.5},
    "empty": {},
    "reserved-key": {"a": {"__pickled__": "not really", "__type__": "x:y"}},
    "reserved-key-alone": {"a": [{"__type__": "x:y"}]},
    "reserved-text": {"a": "__pickled__", "b": '"__pickled__"', "c": ["__type__"]},
    "sk-key": {"$sk": "tag", "v": 1},
    "nan": {"f": float("nan"), "g": [float("inf")]},
    "str-subclass": {"s": Text("t")},
    "int-key": {"m": {1: "int key", "2": "str key"}},
    "tuple": {"t": (1, 2)},
    "datetime": {"at": datetime(2025, 1, 1, tzinfo=UTC)},
    "dataclass": {"u": Unlisted(3)},
    "deep": {"d": [[[[[[[[[[[[{"k": 1}]]]]]]]]]]]]},
    "big-int": {"i": 10**4000},
}


def checkpoint(state: Any) -> WorkflowCheckpoint:
    return WorkflowCheckpoint(
        workflow_name="wf",
        graph_signature_hash="sig",
        previous_checkpoint_id="p",
        timestamp="2025-01-01T00:00:00+00:00",
        state=state,
        metadata={"superstep": 2},
    )


@pytest.mark.parametrize("kind", list(STATES))
def test_the_bytes_are_the_framework_encoders(kind: str) -> None:
    fields = checkpoint(STATES[kind]).to_dict()
    assert _codec._framework_json(fields) == reference(fields)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["__pickled__", "__type__", '"__pickled__"']),
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(
            st.text(max_size=6) | st.sampled_from(["__pickled__", "__type__", "$sk"]),
            kids,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_fuzz_the_bytes_are_the_framework_encoders(state: Any) -> None:
    fields = checkpoint({"s": state}).to_dict()
    assert _codec._framework_json(fields) == reference(fields)


@pytest.mark.asyncio
async def test_bytes_without_a_pickled_value_are_not_decoded_at_save(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[str] = []
    real = _codec.CheckpointCodec.decode

    def counting(self: _codec.CheckpointCodec, data: object, cid: str) -> WorkflowCheckpoint:
        decoded.append(cid)
        return real(self, data, cid)

    monkeypatch.setattr(_codec.CheckpointCodec, "decode", counting)
    async with StatekeeperCheckpointStorage(statekeeper.open_store("memory://", codec="raw")) as s:
        plain = checkpoint(STATES["plain"])
        await s.save(plain)
        assert decoded == []
        assert (await s.load(plain.checkpoint_id)).state == STATES["plain"]
        texts = checkpoint(STATES["reserved-text"])  # the quoted text: a false alarm
        await s.save(texts)
        assert (await s.load(texts.checkpoint_id)).state == STATES["reserved-text"]
        decoded.clear()
        dated = checkpoint(STATES["datetime"])
        await s.save(dated)
        assert decoded[:1] == [dated.checkpoint_id]
        with pytest.raises(WorkflowCheckpointException, match="allowed types"):
            await s.save(checkpoint(STATES["dataclass"]))
