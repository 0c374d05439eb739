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
from langgraph.checkpoint.memory import InMemorySaver
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
async def _put_all(
    saver: BaseCheckpointSaver[Any], thread: str, metadata: list[dict[str, Any]] = METADATA
) -> dict[str, int]:
    """The same checkpoints on any saver; checkpoint id -> index into ``metadata``."""
    ids: dict[str, int] = {}
    parent: str | None = None
    for i, extra in enumerate(metadata):
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
    metadata: list[dict[str, Any]] = METADATA,
) -> list[list[int]]:
    """For each filter, the ``metadata`` indexes that ``alist`` yields: in the
    thread, and (``every_thread``) across every thread."""
    ids = await _put_all(saver, thread, metadata)
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


# -- numbers and booleans, at the top level and nested, against each peer ---------------

#: One value each, at the top level (``v``) and nested (``n.v``).
SCALARS: list[Any] = [1, 1.0, True, 0, 0.0, False, "1", 2.5, None]
SCALAR_METADATA: list[dict[str, Any]] = [{"v": v, "n": {"v": v}} for v in SCALARS]

#: filter value -> the stored values InMemorySaver and SqliteSaver find (Python's
#: ``==``: 1 is 1.0 is True, 0 is 0.0 is False). PostgresSaver (jsonb) agrees on
#: numbers and keeps booleans apart from them (a filter True finds only True).
SCALAR_TABLE: list[tuple[Any, list[Any]]] = [
    (1, [1, 1.0, True]),
    (1.0, [1, 1.0, True]),
    (True, [1, 1.0, True]),
    (0, [0, 0.0, False]),
    (0.0, [0, 0.0, False]),
    (False, [0, 0.0, False]),
    ("1", ["1"]),
    (2.5, [2.5]),
]


def _index(value: Any) -> int:
    """The index of ``value`` in SCALARS, by type too (``SCALARS.index(1.0)`` is 0)."""
    return next(i for i, v in enumerate(SCALARS) if type(v) is type(value) and v == value)


def _scalar_filters(key: str) -> list[dict[str, Any]]:
    return [{key: value} for value, _ in SCALAR_TABLE]


@pytest.mark.parametrize("key", ["v", "n.v"])
@pytest.mark.asyncio
async def test_numbers_and_booleans_match_as_in_memory_and_sqlite_savers_match_them(
    store_url: Callable[[], str], tmp_path: Path, key: str
) -> None:
    """Top-level and dotted filters alike: ``{"v": 1}`` finds a stored ``1.0`` and a
    stored ``True`` (it once compared top-level scalars by JSON kind, and found
    only the ``1``)."""
    filters = _scalar_filters(key)
    table = [sorted(_index(v) for v in found) for _, found in SCALAR_TABLE]
    table = [ids for ids in table for _ in range(2)]  # in the thread, then every thread
    peers: dict[str, list[list[int]]] = {}
    peers["InMemorySaver"] = await _answers(InMemorySaver(), filters, metadata=SCALAR_METADATA)
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "peer.db")) as peer:
        peers["SqliteSaver"] = await _answers(peer, filters, metadata=SCALAR_METADATA)
    if key == "v":
        assert peers == {"InMemorySaver": table, "SqliteSaver": table}, "the peers moved"
    async with _ours(store_url()) as saver:
        assert await _answers(saver, filters, metadata=SCALAR_METADATA) == peers["SqliteSaver"]


@pytest.mark.asyncio
async def test_numbers_match_as_postgres_saver_matches_them(
    store_url: Callable[[], str],
) -> None:
    """PostgresSaver compares jsonb: 1 is 1.0, but True is not 1. The saver answers
    the numbers as it does and the booleans as InMemorySaver and SqliteSaver do
    (docs/langgraph.md says so)."""
    conninfo = postgres_conninfo(service_url("postgres"))
    thread = f"scalars-{secrets.token_hex(6)}"
    stored = [{"v": v} for v in SCALARS if type(v) is not bool]
    filters = [{"v": v} for v, _ in SCALAR_TABLE if type(v) is not bool]
    async with AsyncPostgresSaver.from_conn_string(conninfo) as peer:
        await peer.setup()
        try:
            expected = await _answers(
                peer, filters, thread=thread, every_thread=False, metadata=stored
            )
        finally:
            await peer.adelete_thread(thread)
    async with _ours(store_url()) as saver:
        got = await _answers(saver, filters, thread=thread, every_thread=False, metadata=stored)
    assert got == expected
    assert expected[0] == [0, 1], "PostgresSaver finds 1 and 1.0 for {'v': 1}"
