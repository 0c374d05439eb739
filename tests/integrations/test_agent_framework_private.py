"""The one private module of agent-framework-core the adapter uses, pinned.

agent-framework-core does not export the checkpoint encoder of its
``FileCheckpointStorage`` (up to 1.23), and the adapter needs that very encoder to
store the framework's own format under its allowlist. ``_codec.framework_encoding``
is the one place that imports it; these tests fail loudly when the module changes
shape, and check that the adapter then refuses to import with a clear error.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import types
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agent_framework import FileCheckpointStorage, WorkflowCheckpoint, register_checkpoint_type

from statekeeper.integrations.agent_framework import _codec


@dataclass
class Parcel:
    weight: int
    sent: datetime


register_checkpoint_type(Parcel)


def test_the_private_module_has_the_shape_the_adapter_uses() -> None:
    module = importlib.import_module(_codec.PRIVATE_ENCODING)
    assert _codec.framework_encoding() == (
        module.encode_checkpoint_value,
        module.decode_checkpoint_value,
    )
    assert list(inspect.signature(module.encode_checkpoint_value).parameters) == ["value"]
    decode = inspect.signature(module.decode_checkpoint_value).parameters
    assert list(decode) == ["value", "allowed_types"]
    assert decode["allowed_types"].kind is inspect.Parameter.KEYWORD_ONLY
    value = {"parcel": Parcel(3, datetime(2025, 1, 1, tzinfo=UTC)), "n": [1, "two"]}
    encoded = module.encode_checkpoint_value(value)
    json.dumps(encoded)  # JSON all the way down, the pickled parts as strings
    assert module.decode_checkpoint_value(encoded, allowed_types=frozenset()) == value


@pytest.mark.asyncio
async def test_the_adapter_writes_what_file_checkpoint_storage_writes(tmp_path: Path) -> None:
    checkpoint = WorkflowCheckpoint(
        workflow_name="wf",
        graph_signature_hash="sig",
        state={"parcel": Parcel(1, datetime(2025, 1, 1, tzinfo=UTC))},
    )
    await FileCheckpointStorage(str(tmp_path)).save(checkpoint)
    ours = _codec.CheckpointCodec("af", None).encode(checkpoint).state
    assert isinstance(ours, bytes)
    assert json.loads(ours) == _the_one_json_file(tmp_path)


def _the_one_json_file(directory: Path) -> Any:
    (written,) = directory.glob("*.json")
    return json.loads(written.read_text("utf-8"))


def _without(name: str) -> types.ModuleType:
    real = importlib.import_module(_codec.PRIVATE_ENCODING)
    fake = types.ModuleType(_codec.PRIVATE_ENCODING)
    fake.__dict__.update({k: v for k, v in vars(real).items() if k != name})
    return fake


def _old_decoder(value: Any) -> Any:
    return value


@pytest.mark.parametrize(
    ("module", "says"),
    [
        (None, "cannot be imported"),
        (_without("encode_checkpoint_value"), "has no encode_checkpoint_value"),
        (_without("decode_checkpoint_value"), "has no encode_checkpoint_value"),
        (
            types.SimpleNamespace(
                encode_checkpoint_value=_old_decoder, decode_checkpoint_value=_old_decoder
            ),
            "takes no allowed_types=",
        ),
    ],
    ids=["moved", "no-encoder", "no-decoder", "no-allowlist"],
)
def test_a_changed_private_module_is_a_clear_import_error(
    monkeypatch: pytest.MonkeyPatch, module: Any, says: str
) -> None:
    monkeypatch.setitem(sys.modules, _codec.PRIVATE_ENCODING, module)
    with pytest.raises(ImportError, match=says) as info:
        _codec.framework_encoding()
    message = str(info.value)
    assert "agent-framework-core" in message and "does not export" in message
    assert "statekeeper[agent-framework]" in message
