"""``StatekeeperSaver``'s own promises beyond LangGraph's suite: strict latest by
sequence, damage never answered with older state, the stream and id layout, the
codec check, and the round trips of get_tuple, list and put_writes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)

import statekeeper
from statekeeper.errors import CheckpointDecodeError, InvalidOptions, StoreClosed
from statekeeper.integrations.langgraph import StatekeeperSaver
from statekeeper.integrations.langgraph import _layout as layout

pytestmark = pytest.mark.asyncio


@asynccontextmanager
async def saver_on(url: str) -> AsyncIterator[StatekeeperSaver]:
    async with statekeeper.open_store(url, codec="raw") as store:
        yield StatekeeperSaver(store)


async def put(
    saver: StatekeeperSaver,
    thread: str,
    checkpoint_id: str | None = None,
    *,
    ns: str = "",
    parent: str | None = None,
    **metadata: Any,
) -> dict[str, Any]:
    config = generate_config(thread, checkpoint_ns=ns)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent
    checkpoint = generate_checkpoint(checkpoint_id=checkpoint_id, channel_values={"v": thread})
    checkpoint["channel_versions"] = {"v": 1}
    return dict(await saver.aput(config, checkpoint, generate_metadata(**metadata), {"v": 1}))


def cid(result: CheckpointTuple | None) -> str:
    assert result is not None
    return str(result.checkpoint["id"])


async def test_damaged_newest_checkpoint_raises_and_never_returns_the_older(
    store_url: Callable[[], str],
) -> None:
    async with saver_on(store_url()) as saver:
        store = saver.store
        if not store.capabilities.raw_access:
            pytest.skip(f"{store.backend_name} has no raw record access")
        first = await put(saver, "t", step=0)
        second = await put(saver, "t", parent=first["configurable"]["checkpoint_id"], step=1)
        newest = layout.checkpoint_key("t", "", second["configurable"]["checkpoint_id"])
        raw = await store.backdoor_read_raw(newest)
        await store.backdoor_write_raw(newest, raw[: len(raw) // 2])

        latest = generate_config("t")
        with pytest.raises(CheckpointDecodeError, match="never falls back") as caught:
            await saver.aget_tuple(latest)
        assert caught.value.id == newest
        with pytest.raises(CheckpointDecodeError):
            await saver.aget_tuple(second)  # by id: strict as well
        with pytest.raises(CheckpointDecodeError):
            await asyncio.to_thread(saver.get_tuple, latest)
        # the older one is still there by id, and list() reports the gap it leaves
        assert cid(await saver.aget_tuple(first)) == first["configurable"]["checkpoint_id"]


async def test_damaged_checkpoint_is_left_out_of_list_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with saver_on("memory://") as saver:
        first = await put(saver, "t")
        second = await put(saver, "t", parent=first["configurable"]["checkpoint_id"])
        key = layout.checkpoint_key("t", "", second["configurable"]["checkpoint_id"])
        raw = await saver.store.backdoor_read_raw(key)
        await saver.store.backdoor_write_raw(key, raw[:-3])
        with caplog.at_level(logging.WARNING, logger="statekeeper.integrations.langgraph"):
            listed = [cid(t) async for t in saver.alist(generate_config("t"))]
        assert listed == [first["configurable"]["checkpoint_id"]]
        assert key in caplog.text


async def test_damaged_state_inside_a_sound_record_is_strict_too() -> None:
    async with saver_on("memory://") as saver:
        await put(saver, "t", checkpoint_id="1")
        # a record the store reads fine whose LangGraph frame is cut short (either frame)
        for frame in (b"SKLG2C", b"SKLG1C"):
            await saver.store.update(
                layout.checkpoint_key("t", "", "1"), frame + b"\x00\x00\x00\x04"
            )
            with pytest.raises(CheckpointDecodeError, match="truncated"):
                await saver.aget_tuple(generate_config("t"))


async def test_latest_is_the_last_saved_not_the_highest_id() -> None:
    async with saver_on("memory://") as saver:
        await put(saver, "t", checkpoint_id="2")
        await put(saver, "t", checkpoint_id="1", parent="2")
        # InMemorySaver and SqliteSaver would answer "2" (the highest id)
        assert cid(await saver.aget_tuple(generate_config("t"))) == "1"
        assert [cid(t) async for t in saver.alist(generate_config("t"))] == ["1", "2"]
        # putting an existing id again replaces it and keeps its position
        await put(saver, "t", checkpoint_id="2", step=7)
        again = await saver.aget_tuple(generate_config("t", checkpoint_id="2"))
        assert again is not None and again.metadata["step"] == 7
        assert cid(await saver.aget_tuple(generate_config("t"))) == "1"


async def test_a_json_store_is_refused_with_the_fix() -> None:
    async with statekeeper.open_store("memory://") as store:
        with pytest.raises(InvalidOptions, match=r'open_store\(url, codec="raw"\)'):
            StatekeeperSaver(store)
    with pytest.raises(StoreClosed):
        StatekeeperSaver(statekeeper.open_store("memory://", codec="raw"))


TRICKY_THREADS = ["a", "ab", "a/b", "a%2Fb", "a:b", "#a", "=a", "x" * 300, "x" * 299 + "y", "é/ü"]


async def test_threads_namespaces_and_ids_never_collide(store_url: Callable[[], str]) -> None:
    async with saver_on(store_url()) as saver:
        # the same checkpoint id in every thread and in two namespaces of each
        for thread in TRICKY_THREADS:
            for ns in ("", "child:1"):
                await put(saver, thread, checkpoint_id="same", ns=ns, owner=f"{thread}|{ns}")
        for thread in TRICKY_THREADS:
            for ns in ("", "child:1"):
                got = await saver.aget_tuple(generate_config(thread, checkpoint_ns=ns))
                assert got is not None and got.metadata["owner"] == f"{thread}|{ns}"
            every_ns = [t async for t in saver.alist({"configurable": {"thread_id": thread}})]
            assert sorted(t.config["configurable"]["checkpoint_ns"] for t in every_ns) == [
                "",
                "child:1",
            ]
        await saver.adelete_thread("a")
        assert await saver.aget_tuple(generate_config("a")) is None
        for thread in TRICKY_THREADS[1:]:
            assert await saver.aget_tuple(generate_config(thread, checkpoint_ns="child:1"))
        await saver.acopy_thread("x" * 300, "copy")
        copied = await saver.aget_tuple(generate_config("copy", checkpoint_id="same"))
        assert copied is not None and copied.metadata["owner"] == "x" * 300 + "|"


async def test_store_records_are_raw_serde_bytes_with_readable_ids() -> None:
    async with saver_on("memory://") as saver:
        stored = await put(saver, "t", checkpoint_id="c1", ns="child:1", step=3)
        await saver.aput_writes(stored, [("ch", "v")], "task-1")
        record = await saver.store.load(layout.checkpoint_key("t", "child:1", "c1"))
        assert record.stream == "langgraph/t/child%3A1/checkpoints"
        assert isinstance(record.state, bytes) and b"base64" not in record.state
        # the ids travel in the frame: a save is one row, nothing else to index
        assert (record.tags, record.metadata) == ({}, {})
        ids, _, _ = layout.unpack_checkpoint(record.state, record.id, record.metadata)
        assert ids == layout.Ids("t", "child:1", "c1", None)
        writes = await saver.store.load(layout.writes_key("t", "child:1", "c1"))
        assert writes.stream == "langgraph/t/child%3A1/writes"
        assert writes.parent_id == record.id
        assert (writes.tags, writes.metadata) == ({}, {})


class Spy:
    """Counts the store calls a saver makes (the store itself is real)."""

    def __init__(self, store: Any) -> None:
        self.calls: list[str] = []
        for name in ("get_latest", "load", "load_many", "list", "save", "update", "cursor_at"):
            self._wrap(store, name)

    def _wrap(self, store: Any, name: str) -> None:
        method = getattr(store, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await method(*args, **kwargs)

        setattr(store, name, counted)


async def test_no_round_trip_per_checkpoint() -> None:
    async with saver_on("memory://") as saver:
        parent = None
        configs = []
        for step in range(60):
            stored = await put(saver, "t", parent=parent, step=step)
            await saver.aput_writes(stored, [("ch", step), ("other", -step)], f"task-{step}")
            parent = stored["configurable"]["checkpoint_id"]
            configs.append(stored)
        spy = Spy(saver.store)
        listed = [t async for t in saver.alist(generate_config("t"))]
        assert len(listed) == 60 and all(len(t.pending_writes or []) == 2 for t in listed)
        assert spy.calls == ["list", "load_many"]  # one page, its writes in one call

        spy.calls.clear()
        page = [t async for t in saver.alist(generate_config("t"), before=configs[30], limit=5)]
        assert [t.metadata["step"] for t in page] == [29, 28, 27, 26, 25]
        assert spy.calls == ["cursor_at", "list", "load_many"]

        spy.calls.clear()
        latest = await saver.aget_tuple(generate_config("t"))
        assert latest is not None and latest.pending_writes == [
            ("task-59", "ch", 59),
            ("task-59", "other", -59),
        ]
        assert spy.calls == ["get_latest", "load_many"]

        spy.calls.clear()
        assert await saver.aget_tuple(configs[3]) is not None
        assert spy.calls == ["load_many"]

        # a checkpoint's first writes are one save, the next task's one update
        spy.calls.clear()
        stored = await put(saver, "t", parent=parent, step=60)
        await saver.aput_writes(stored, [("ch", 60)], "task-a")
        await saver.aput_writes(stored, [("ch", 61)], "task-b")
        assert spy.calls == ["save", "save", "update"]

        # time travel: writing to an old checkpoint costs what writing to the newest does
        spy.calls.clear()
        await saver.aput_writes(configs[2], [("late", 1)], "task-late")
        assert spy.calls == ["update"]
        # a saver that did not write the record reads it first, and merges
        other = StatekeeperSaver(saver.store)
        await other.aput_writes(configs[2], [("later", 2)], "task-later")
        assert spy.calls == ["update", "save", "load_many", "update"]
        # and the first saver's remembered etag is stale now: it merges too
        await saver.aput_writes(configs[2], [("last", 3)], "task-last")
        old = await saver.aget_tuple(configs[2])
        assert old is not None and [w[1] for w in old.pending_writes or []] == [
            "ch",
            "other",
            "last",  # in LangGraph's order: by task path, task id, index
            "late",
            "later",
        ]


async def test_concurrent_put_writes_to_one_checkpoint_lose_nothing(
    store_url: Callable[[], str],
) -> None:
    async with saver_on(store_url()) as saver:
        stored = await put(saver, "t")
        await asyncio.gather(
            *(saver.aput_writes(stored, [("ch", i)], f"task-{i:02}") for i in range(20))
        )
        got = await saver.aget_tuple(stored)
        assert got is not None
        assert sorted(w[2] for w in got.pending_writes or []) == list(range(20))


async def test_a_second_saver_on_the_same_store_merges_writes_too() -> None:
    # two savers share no lock: the etag compare-and-set alone keeps every write
    async with statekeeper.open_store("memory://", codec="raw") as store:
        one, two = StatekeeperSaver(store), StatekeeperSaver(store)
        stored = await put(one, "t")
        await asyncio.gather(
            *(
                (one if i % 2 else two).aput_writes(stored, [("ch", i)], f"task-{i}")
                for i in range(12)
            )
        )
        got = await two.aget_tuple(stored)
        assert got is not None and len(got.pending_writes or []) == 12


async def test_filters_langgraph_semantics() -> None:
    async with saver_on("memory://") as saver:
        await put(saver, "t", checkpoint_id="1", step=1, note=None, tags_=["x"])
        await put(saver, "t", checkpoint_id="2", step=2, note="n")

        async def ids(**kwargs: Any) -> list[str]:
            return [cid(t) async for t in saver.alist(generate_config("t"), **kwargs)]

        assert await ids(filter={"step": 2}) == ["2"]
        # None matches a missing key as in LangGraph; a list value is compared here
        assert await ids(filter={"missing": None}) == ["2", "1"]
        assert await ids(filter={"note": None}) == ["1"]
        assert await ids(filter={"tags_": ["x"]}) == ["1"]
        assert await ids(filter={"step": 1}, limit=1) == ["1"]
        assert await ids(before=generate_config("t", checkpoint_id="2")) == ["1"]
        # `before` a checkpoint that is not stored: LangGraph's rule, by id
        assert await ids(before=generate_config("t", checkpoint_id="0")) == []
        assert await ids(before=generate_config("t", checkpoint_id="3")) == ["2", "1"]
        every = [cid(t) async for t in saver.alist(None, filter={"step": 1})]
        assert every == ["1"]
        single = generate_config("t", checkpoint_id="1")
        assert [cid(t) async for t in saver.alist(single)] == ["1"]
        assert [cid(t) async for t in saver.alist(single, filter={"step": 2})] == []


@asynccontextmanager
async def another_application() -> AsyncIterator[None]:
    """PostgreSQL: a transaction of another application on the same cluster, holding
    an xid (it wrote to a table of its own) and left open: ``idle in transaction``."""
    import asyncpg

    from statekeeper.testing import service_url

    dsn = service_url("postgres").replace("postgresql+asyncpg://", "postgresql://")
    other = await asyncpg.connect(dsn)
    tr = other.transaction()
    await tr.start()
    try:
        await other.execute("CREATE TEMP TABLE other_app(x int)")
        await other.execute("INSERT INTO other_app VALUES (1)")
        yield
    finally:
        await tr.rollback()
        await other.close()


async def _thread_with_namespaces(saver: StatekeeperSaver) -> list[str]:
    parent = None
    for i in range(4):
        for ns in ("", "child"):
            stored = await put(saver, "t", f"{i}{ns}", ns=ns, parent=parent, step=i)
            await saver.aput_writes(stored, [("ch", i)], f"task-{i}")
        parent = f"{i}"
    return [f"{i}{ns}" for i in range(4) for ns in ("", "child")]


@pytest.mark.parametrize("backend", ["postgres"])
async def test_history_of_every_namespace_is_whole_while_another_application_runs(
    store_url: Callable[[], str],
) -> None:
    """``alist`` without a namespace (``get_state_history``) lists every stream of
    the store; another application's open transaction never shortens it."""
    async with another_application(), saver_on(store_url()) as saver:
        saved = await _thread_with_namespaces(saver)
        every_ns = [cid(t) async for t in saver.alist({"configurable": {"thread_id": "t"}})]
        assert sorted(every_ns) == sorted(saved)
        newest = [cid(t) async for t in saver.alist({"configurable": {"thread_id": "t"}}, limit=2)]
        assert newest == every_ns[:2]


@pytest.mark.parametrize("backend", ["postgres"])
async def test_copy_thread_is_whole_while_another_application_runs(
    store_url: Callable[[], str],
) -> None:
    """``copy_thread`` lists every stream of the source thread at once; another
    application's open transaction never leaves a checkpoint behind."""
    async with another_application(), saver_on(store_url()) as saver:
        await _thread_with_namespaces(saver)
        await saver.acopy_thread("t", "copy")
        for ns in ("", "child"):
            source = [t async for t in saver.alist(generate_config("t", checkpoint_ns=ns))]
            copied = [t async for t in saver.alist(generate_config("copy", checkpoint_ns=ns))]
            assert [cid(t) for t in copied] == [cid(t) for t in source] != []
            assert [t.pending_writes for t in copied] == [t.pending_writes for t in source]
