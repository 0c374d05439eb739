"""The one-line switch: ``StatekeeperSaver.from_conn_string`` (async and sync, as
LangGraph's own savers open), a saver built from a URL, and metadata filters that
answer what LangGraph's SQL savers answer, nested keys and values included."""

from __future__ import annotations

import asyncio
import operator
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

import statekeeper
from statekeeper.errors import InvalidOptions
from statekeeper.integrations.importers import postgres_conninfo
from statekeeper.integrations.langgraph import StatekeeperSaver
from statekeeper.testing import service_url


class Counter(TypedDict):
    n: Annotated[int, operator.add]


def counting_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    builder = StateGraph(Counter)
    builder.add_node("step", lambda state: {"n": 1})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=checkpointer)


@pytest.mark.asyncio
async def test_from_conn_string_async_opens_runs_a_graph_and_closes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/graph.db"
    config = {"configurable": {"thread_id": "t"}}
    async with StatekeeperSaver.from_conn_string(url) as saver:
        graph = counting_graph(saver)
        assert (await graph.ainvoke({"n": 0}, config))["n"] == 1
        assert (await graph.ainvoke({"n": 0}, config))["n"] == 2
        store = saver.store
        assert store.is_open and store.options.codec == "raw"
    assert not store.is_open
    # a new context on the same file sees what the first one saved
    async with StatekeeperSaver.from_conn_string(url) as saver:
        latest = await saver.aget_tuple(config)
        assert latest is not None and latest.checkpoint["channel_values"]["n"] == 2


@pytest.mark.asyncio
async def test_from_conn_string_closes_the_store_when_the_block_raises(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    seen: list[Any] = []

    async def fail() -> None:
        async with StatekeeperSaver.from_conn_string(url) as saver:
            seen.append(saver.store)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await fail()
    assert not seen[0].is_open


def test_from_conn_string_sync_serves_sync_code_and_other_loops(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sync.db"
    config = {"configurable": {"thread_id": "t"}}
    with StatekeeperSaver.from_conn_string(url, durability="fast") as saver:
        graph = counting_graph(saver)
        assert graph.invoke({"n": 0}, config)["n"] == 1
        assert saver.store.options.durability == "fast"
        # the async methods work from any loop: the store has a thread of its own
        got = asyncio.run(saver.aget_tuple(config))
        assert got is not None and got.checkpoint["channel_values"]["n"] == 1
        store = saver.store
    assert not store.is_open


@pytest.mark.parametrize("bad", [{"codec": "json"}, {"no_such_option": 1}])
@pytest.mark.asyncio
async def test_from_conn_string_refuses_bad_options_before_creating_anything(
    tmp_path: Path, bad: dict[str, Any]
) -> None:
    target = tmp_path / "never.db"
    with pytest.raises(InvalidOptions, match="codec" if "codec" in bad else "no_such_option"):
        async with StatekeeperSaver.from_conn_string(f"sqlite:///{target}", **bad):
            pass

    def enter_sync() -> None:
        with StatekeeperSaver.from_conn_string(f"sqlite:///{target}", **bad):
            pass

    with pytest.raises(InvalidOptions):
        enter_sync()
    assert not target.exists()


def test_a_saver_made_from_a_url_owns_its_store(tmp_path: Path) -> None:
    saver = StatekeeperSaver(f"sqlite:///{tmp_path}/own.db")
    try:
        config = {"configurable": {"thread_id": "t"}}
        assert counting_graph(saver).invoke({"n": 0}, config)["n"] == 1
        assert asyncio.run(saver.aget_tuple(config)) is not None
    finally:
        saver.close()
        saver.close()  # idempotent
    assert not saver.store.is_open


@pytest.mark.asyncio
async def test_options_with_an_opened_store_are_refused() -> None:
    async with statekeeper.open_store("memory://", codec="raw") as store:
        with pytest.raises(TypeError, match="go with a URL"):
            StatekeeperSaver(store, durability="fast")
        StatekeeperSaver(store).close()  # the caller's store stays open
        assert store.is_open


# -- metadata filters, against LangGraph's own SQL savers on the same data -----------

METADATA: list[dict[str, Any]] = [
    {"user": {"access-level": "admin", "name": "ann"}, "tags": ["a", "b"], "score": 1},
    {"user": {"access-level": "reader", "name": "bob"}, "tags": ["b"], "score": 2},
    {"user": {"access-level": "admin"}, "tags": [], "score": 2, "user.access-level": "odd"},
    {"user": "flat", "score": None},
    {"score": 3},
]

#: Filters every LangGraph SQL saver answers alike (scalars, dotted paths in
#: SqliteSaver's idiom, whole objects).
COMMON_FILTERS: list[dict[str, Any]] = [
    {"score": 2},
    {"score": 2, "source": "loop"},
    {"score": None},
    {"user.access-level": "admin"},
    {"user.name": "bob"},
    {"user.access-level": "admin", "score": 1},
    {"user": {"access-level": "reader", "name": "bob"}},
    {"user": "flat"},
    {"missing.path": "x"},
]


@pytest.mark.asyncio
async def _put_all(saver: BaseCheckpointSaver[Any], thread: str) -> dict[str, int]:
    """The same checkpoints on any saver; checkpoint id -> index into METADATA."""
    ids: dict[str, int] = {}
    parent: str | None = None
    for i, extra in enumerate(METADATA):
        config = generate_config(thread)
        if parent is not None:
            config["configurable"]["checkpoint_id"] = parent
        checkpoint = generate_checkpoint()
        out = await saver.aput(config, checkpoint, generate_metadata(step=i, **extra), {})
        parent = out["configurable"]["checkpoint_id"]
        ids[parent] = i
    return ids


@pytest.mark.asyncio
async def _answers(
    saver: BaseCheckpointSaver[Any],
    filters: list[dict[str, Any]],
    *,
    thread: str = "filters",
    every_thread: bool = True,
) -> list[list[int]]:
    """For each filter, the METADATA indexes that ``alist`` yields: in the thread,
    and (``every_thread``) across every thread."""
    ids = await _put_all(saver, thread)
    out = []
    for query in filters:
        configs = [generate_config(thread)] + ([None] if every_thread else [])
        for config in configs:
            found = [ids[t.checkpoint["id"]] async for t in saver.alist(config, filter=query)]
            out.append(sorted(found))
    return out


@asynccontextmanager
@pytest.mark.asyncio
async def _ours(url: str) -> AsyncIterator[StatekeeperSaver]:
    async with StatekeeperSaver.from_conn_string(url) as saver:
        yield saver


@pytest.mark.asyncio
async def test_filters_answer_what_sqlite_saver_answers(
    store_url: Callable[[], str], tmp_path: Path
) -> None:
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "peer.db")) as peer:
        expected = await _answers(peer, COMMON_FILTERS)
    async with _ours(store_url()) as saver:
        assert await _answers(saver, COMMON_FILTERS) == expected
    # the answers are not vacuous: the nested ones find what they should
    by_filter = dict(zip(map(repr, COMMON_FILTERS), expected[::2], strict=True))
    assert by_filter[repr({"user.access-level": "admin"})] == [0, 2]
    assert by_filter[repr({"user.name": "bob"})] == [1]
    assert by_filter[repr({"missing.path": "x"})] == []


#: Containment (PostgresSaver's ``metadata @> filter``): part of an object, part of
#: an array. SqliteSaver compares whole values here, so only PostgresSaver is the
#: reference for these.
CONTAINMENT_FILTERS: list[dict[str, Any]] = [
    {"user": {"access-level": "admin"}},
    {"user": {"name": "ann"}},
    {"tags": ["b"]},
    {"tags": ["b", "a"]},
    {"tags": []},
    {"user": {"access-level": "admin"}, "score": 2},
]


@pytest.mark.asyncio
async def test_containment_filters_answer_what_postgres_saver_answers(
    store_url: Callable[[], str],
) -> None:
    conninfo = postgres_conninfo(service_url("postgres"))
    thread = f"filters-{secrets.token_hex(6)}"
    async with AsyncPostgresSaver.from_conn_string(conninfo) as peer:
        await peer.setup()
        try:
            expected = await _answers(peer, CONTAINMENT_FILTERS, thread=thread, every_thread=False)
        finally:
            await peer.adelete_thread(thread)
    async with _ours(store_url()) as saver:
        got = await _answers(saver, CONTAINMENT_FILTERS, thread=thread, every_thread=False)
    assert got == expected
    assert expected[:4] == [[0, 2], [0], [0, 1], [0]]
