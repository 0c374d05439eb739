"""The saver stores its frames deflated where that pays (``SKLGZ1``), reads frames
written plain before, and refuses a damaged deflated frame by name, never falling
back to an older checkpoint."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_metadata,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

import statekeeper
from statekeeper.errors import CheckpointDecodeError
from statekeeper.integrations.langgraph import StatekeeperSaver
from statekeeper.integrations.langgraph import _layout as layout

pytestmark = pytest.mark.asyncio

_LEN = struct.Struct(">I")
TEXT = " ".join(["plan", "fetch", "parse", "rank", "merge", "answer"] * 60)


def _config(thread: str, checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


@pytest_asyncio.fixture
async def saver() -> AsyncIterator[StatekeeperSaver]:
    async with statekeeper.open_store("memory://", codec="raw") as store:
        yield StatekeeperSaver(store)


async def _put(saver: StatekeeperSaver, thread: str, value: Any, parent: str | None = None) -> str:
    checkpoint = generate_checkpoint(channel_values={"state": value})
    checkpoint["channel_versions"] = {"state": 1}
    done = await saver.aput(_config(thread, parent), checkpoint, generate_metadata(), {})
    return str(done["configurable"]["checkpoint_id"])


async def _state(saver: StatekeeperSaver, thread: str, checkpoint_id: str) -> bytes:
    record = await saver.store.load(layout.checkpoint_key(thread, "", checkpoint_id))
    assert isinstance(record.state, bytes)
    return record.state


async def test_a_large_checkpoint_is_stored_deflated_and_reads_back(
    saver: StatekeeperSaver,
) -> None:
    cid = await _put(saver, "t", {"text": TEXT})
    stored = await _state(saver, "t", cid)
    assert stored.startswith(b"SKLGZ1")
    frame = zlib.decompress(stored[6:], -15)
    assert frame.startswith(b"SKLG2C")
    assert len(stored) < len(frame) / 3  # repetitive text: most of it goes
    got = await saver.aget_tuple(_config("t"))
    assert got is not None and got.checkpoint["channel_values"] == {"state": {"text": TEXT}}


async def test_a_small_or_incompressible_checkpoint_is_stored_plain(
    saver: StatekeeperSaver,
) -> None:
    small = await _put(saver, "small", 1)
    assert (await _state(saver, "small", small)).startswith(b"SKLG2C")
    noise = os.urandom(4096)  # random bytes do not shrink by a tenth
    big = await _put(saver, "noise", noise)
    assert (await _state(saver, "noise", big)).startswith(b"SKLG2C")
    got = await saver.aget_tuple(_config("noise"))
    assert got is not None and got.checkpoint["channel_values"] == {"state": noise}


async def test_pending_writes_are_deflated_and_read_back(saver: StatekeeperSaver) -> None:
    cid = await _put(saver, "w", 0)
    config = _config("w", cid)
    await saver.aput_writes(config, [("state", {"text": TEXT}), ("n", 1)], "task-1", "")
    record = await saver.store.load(layout.writes_key("w", "", cid))
    assert isinstance(record.state, bytes) and record.state.startswith(b"SKLGZ1")
    got = await saver.aget_tuple(config)
    assert got is not None
    assert got.pending_writes == [("task-1", "state", {"text": TEXT}), ("task-1", "n", 1)]


async def test_a_plain_frame_written_before_reads_as_it_did(saver: StatekeeperSaver) -> None:
    """Records of the saver before compression are plain ``SKLG2C`` frames."""
    serde = JsonPlusSerializer()
    checkpoint = generate_checkpoint(channel_values={"state": {"text": TEXT}})
    ck, md = serde.dumps_typed(checkpoint), serde.dumps_typed(generate_metadata(step=3))
    fields = [b"old", b"", checkpoint["id"].encode(), b"", ck[0].encode(), ck[1]]
    fields += [md[0].encode(), md[1]]
    out = [b"SKLG2C", _LEN.pack(len(fields))]
    for f in fields:
        out += [_LEN.pack(len(f)), f]
    await saver.store.save(
        layout.checkpoint_stream("old", ""),
        b"".join(out),
        id=layout.checkpoint_key("old", "", checkpoint["id"]),
    )
    got = await saver.aget_tuple(_config("old"))
    assert got is not None and got.checkpoint["id"] == checkpoint["id"]
    assert got.metadata["step"] == 3


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda z: z[:-5], id="truncated"),
        pytest.param(lambda z: z + b"tail", id="trailing bytes"),
        pytest.param(lambda z: z[:6] + b"\xff" * 8 + z[14:], id="not deflate"),
        pytest.param(lambda z: b"SKLGZ1" + _deflate(z), id="deflated twice"),
    ],
)
async def test_a_damaged_deflated_frame_is_refused_never_an_older_checkpoint(
    saver: StatekeeperSaver, damage: Any
) -> None:
    older = await _put(saver, "d", {"text": TEXT})
    newest = await _put(saver, "d", {"text": TEXT + " more"}, parent=older)
    key = layout.checkpoint_key("d", "", newest)
    stored = await _state(saver, "d", newest)
    assert stored.startswith(b"SKLGZ1")
    await saver.store.update(key, damage(stored))
    with pytest.raises(CheckpointDecodeError) as caught:
        await saver.aget_tuple(_config("d"))
    assert caught.value.id == key
    with pytest.raises(CheckpointDecodeError):
        await saver.aget_tuple(_config("d", newest))


def _deflate(data: bytes) -> bytes:
    deflate = zlib.compressobj(1, zlib.DEFLATED, -15)
    return deflate.compress(data) + deflate.flush()
