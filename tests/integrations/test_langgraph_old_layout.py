"""Records written by the saver's first layout are read as they always were.

Before the ``SKLG2C`` frame, a checkpoint record kept its LangGraph ids in the
store metadata under ``"langgraph"``, beside indexed copies of LangGraph's scalar
metadata, with two tags (``langgraph=checkpoint``, ``langgraph.thread==<thread>``),
and its writes record had a tag and the ids too. Those records are planted here
exactly as that saver wrote them, next to records of the current layout, and every
read and whole-thread operation must treat both alike.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

import statekeeper
from statekeeper.integrations.langgraph import StatekeeperSaver
from statekeeper.integrations.langgraph import _layout as layout

pytestmark = pytest.mark.asyncio

_LEN = struct.Struct(">I")


def _frame(magic: bytes, fields: list[bytes]) -> bytes:
    out = [magic, _LEN.pack(len(fields))]
    for f in fields:
        out += [_LEN.pack(len(f)), f]
    return b"".join(out)


async def plant_old(
    store: Any,
    thread: str,
    ns: str,
    checkpoint_id: str,
    parent: str | None,
    writes: list[tuple[str, Any]],
    **metadata: Any,
) -> None:
    """One checkpoint and its writes, as the first layout's saver saved them."""
    serde = JsonPlusSerializer()
    checkpoint = generate_checkpoint(checkpoint_id=checkpoint_id, channel_values={"v": thread})
    checkpoint["channel_versions"] = {"v": 1}
    lg_metadata = {**generate_metadata(**metadata), "thread_id": thread}
    ck, md = serde.dumps_typed(checkpoint), serde.dumps_typed(lg_metadata)
    ids = {
        "thread_id": thread,
        "checkpoint_ns": ns,
        "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": parent,
    }
    scalars = {k: v for k, v in lg_metadata.items() if isinstance(v, str | int)}
    key = layout.checkpoint_key(thread, ns, checkpoint_id)
    await store.save(
        layout.checkpoint_stream(thread, ns),
        _frame(b"SKLG1C", [ck[0].encode(), ck[1], md[0].encode(), md[1]]),
        tags={"langgraph": "checkpoint", "langgraph.thread": "=" + thread},
        metadata={**scalars, "langgraph": ids},
        parent_id=layout.checkpoint_key(thread, ns, parent) if parent else None,
        id=key,
    )
    if writes:
        fields: list[bytes] = []
        for idx, (channel, value) in enumerate(writes):
            kind, data = serde.dumps_typed(value)
            fields += [
                b"task-old",
                str(WRITES_IDX_MAP.get(channel, idx)).encode(),
                channel.encode(),
                b"",
                kind.encode(),
                data,
            ]
        await store.save(
            layout.writes_stream(thread, ns),
            _frame(b"SKLG1W", fields),
            tags={"langgraph": "writes"},
            metadata={"langgraph": {**ids, "parent_checkpoint_id": None}},
            parent_id=key,
            id=layout.writes_key(thread, ns, checkpoint_id),
        )


async def put_new(saver: StatekeeperSaver, thread: str, checkpoint_id: str, parent: str) -> None:
    config = generate_config(thread)
    config["configurable"]["checkpoint_id"] = parent
    checkpoint = generate_checkpoint(checkpoint_id=checkpoint_id, channel_values={"v": thread})
    checkpoint["channel_versions"] = {"v": 1}
    stored = await saver.aput(config, checkpoint, generate_metadata(step=9, run_id="r-new"), {})
    await saver.aput_writes(stored, [("ch", "new")], "task-new")


def ids_of(tuples: list[Any]) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in tuples]


async def test_old_and_new_records_read_alike(store_url: Callable[[], str]) -> None:
    async with statekeeper.open_store(store_url(), codec="raw") as store:
        saver = StatekeeperSaver(store)
        await plant_old(store, "t", "", "1", None, [("ch", "a")], step=1, run_id="r-old")
        await plant_old(store, "t", "child", "1c", None, [], step=1, run_id="r-old")
        await plant_old(store, "t", "", "2", "1", [("ch", "b"), ("ch2", 2)], step=2)
        await put_new(saver, "t", "3", "2")

        latest = await saver.aget_tuple(generate_config("t"))
        assert latest is not None and latest.checkpoint["id"] == "3"
        assert latest.parent_config == generate_config("t", checkpoint_id="2")
        old = await saver.aget_tuple(generate_config("t", checkpoint_id="2"))
        assert old is not None and old.metadata["step"] == 2
        assert old.parent_config == generate_config("t", checkpoint_id="1")
        assert [(w[1], w[2]) for w in old.pending_writes or []] == [("ch", "b"), ("ch2", 2)]

        history = [t async for t in saver.alist(generate_config("t"))]
        assert ids_of(history) == ["3", "2", "1"]
        every_ns = [t async for t in saver.alist({"configurable": {"thread_id": "t"}})]
        assert ids_of(every_ns) == ["3", "2", "1c", "1"]
        assert ids_of([t async for t in saver.alist(None)]) == ["3", "2", "1c", "1"]
        # filters match old and new records alike (the old ones' index rows unused)
        by_run = [t async for t in saver.alist(None, filter={"run_id": "r-old"})]
        assert ids_of(by_run) == ["1c", "1"]
        assert ids_of([t async for t in saver.alist(None, filter={"step": 9})]) == ["3"]

        await saver.acopy_thread("t", "copy")
        copied = [t async for t in saver.alist({"configurable": {"thread_id": "copy"}})]
        assert ids_of(copied) == ["3", "2", "1c", "1"]
        assert [t.pending_writes for t in copied] == [t.pending_writes for t in every_ns]
        assert all(t.config["configurable"]["thread_id"] == "copy" for t in copied)

        # writes added to an old checkpoint merge into its old writes record
        await saver.aput_writes(generate_config("t", checkpoint_id="1"), [("ch", "c")], "task-x")
        one = await saver.aget_tuple(generate_config("t", checkpoint_id="1"))
        assert one is not None and [w[2] for w in one.pending_writes or []] == ["a", "c"]

        # an old checkpoint put again is rewritten in the current layout, in place
        again = generate_checkpoint(checkpoint_id="2", channel_values={"v": "again"})
        again["channel_versions"] = {"v": 2}
        parent = generate_config("t", checkpoint_id="1")
        await saver.aput(parent, again, generate_metadata(step=2), {})
        record = await store.load(layout.checkpoint_key("t", "", "2"))
        assert (record.tags, record.metadata) == ({}, {})
        assert ids_of([t async for t in saver.alist(generate_config("t"))]) == ["3", "2", "1"]

        await saver.aprune(["copy"], strategy="keep_latest")
        kept = [t async for t in saver.alist({"configurable": {"thread_id": "copy"}})]
        assert ids_of(kept) == ["3", "1c"]
        assert [w[2] for w in kept[0].pending_writes or []] == ["new"]
        await saver.adelete_for_runs(["r-old"])
        every = {"configurable": {"thread_id": "t"}}
        assert ids_of([t async for t in saver.alist(every)]) == ["3", "2"]
        kept = [t async for t in saver.alist({"configurable": {"thread_id": "copy"}})]
        assert ids_of(kept) == ["3"]
