"""Retention of ``StatekeeperSaver`` (SPEC S17, §5): ``ttl=`` in LangGraph's shape,
``keep_last=``, ``aprune(keep_last=)`` and the background sweep, with real graphs.

Time comes from the stores' fake clock (``clock=``); the background sweep's wait is
replaced by one the test releases, so nothing here waits on the wall clock. A
resumed thread is compared with LangGraph's ``InMemorySaver`` after the same
deletions made on it by hand.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import statekeeper
from statekeeper.errors import InvalidOptions
from statekeeper.integrations import _background
from statekeeper.integrations.langgraph import (
    StatekeeperSaver,
    ThreadSweepReport,
    _retention,
)
from statekeeper.integrations.langgraph import _layout as layout
from statekeeper.testing import FakeClock

DAY = 24 * 60  # minutes
DELETE = {"strategy": "delete", "default_ttl": DAY}
KEEP_LATEST = {"strategy": "keep_latest", "default_ttl": DAY}


@asynccontextmanager
async def saver_on(url: str, clock: FakeClock, **retention: Any) -> AsyncIterator[StatekeeperSaver]:
    async with statekeeper.open_store(url, codec="raw", clock=clock) as store:
        yield StatekeeperSaver(store, **retention)


# -- a graph with history and an interrupt ------------------------------------------


class Chain(TypedDict, total=False):
    items: Annotated[list[str], operator.add]


def append(name: str) -> Callable[[Chain], Chain]:
    def node(state: Chain) -> Chain:
        return {"items": [name]}

    return node


def ask(state: Chain) -> Chain:
    answer = interrupt({"question": "go on?", "seen": len(state.get("items", []))})
    return {"items": [f"asked:{answer}"]}


def graph_on(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    builder = StateGraph(Chain)
    for name in ("a", "b", "c"):
        builder.add_node(name, append(name))
    builder.add_node("ask", ask)
    builder.add_node("finish", append("finish"))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", "ask")
    builder.add_edge("ask", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer)


def nested_graph_on(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    sub = StateGraph(Chain)
    sub.add_node("inner", append("inner"))
    sub.add_node("sub_ask", ask)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", "sub_ask")
    sub.add_edge("sub_ask", END)
    parent = StateGraph(Chain)
    parent.add_node("outer", append("outer"))
    parent.add_node("child", sub.compile())
    parent.add_edge(START, "outer")
    parent.add_edge("outer", "child")
    parent.add_edge("child", END)
    return parent.compile(checkpointer=checkpointer)


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ([i.value for i in v] if k == "__interrupt__" else plain(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def view(snapshot: Any) -> tuple[Any, ...]:
    md = snapshot.metadata or {}
    return (
        plain(snapshot.values),
        tuple(snapshot.next),
        md.get("source"),
        md.get("step"),
        [plain([i.value for i in t.interrupts]) for t in snapshot.tasks],
    )


async def observed(graph: Any, thread: str) -> tuple[Any, list[Any]]:
    state = await graph.aget_state(config(thread))
    return view(state), [view(s) async for s in graph.aget_state_history(config(thread))]


def peer_keep_last(peer: InMemorySaver, thread: str, keep: int) -> None:
    """The deletions ``keep_last`` / ``keep_latest`` make, made on InMemorySaver."""
    for ns, checkpoints in peer.storage[thread].items():
        for checkpoint_id in sorted(checkpoints, reverse=True)[keep:]:
            del checkpoints[checkpoint_id]
            peer.writes.pop((thread, ns, checkpoint_id), None)


async def no_orphan_writes(store: statekeeper.BaseCheckpointStore) -> None:
    """Every pending-writes record of the store still has its checkpoint."""
    for stream in await store.list_streams(prefix=layout.ROOT):
        if stream.endswith("/writes"):
            page = await store.list(stream, limit=1000, include_state=False)
            owners = ["lg-" + i.id.removeprefix("lgw-") for i in page.items]
            found = await store.load_many(owners, include_state=False)
            assert set(owners) <= set(found), f"orphaned pending writes in {stream}"


async def thread_streams(store: statekeeper.BaseCheckpointStore, thread: str) -> list[str]:
    return await store.list_streams(prefix=layout.thread_prefix(thread))


# -- the ttl dict ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "keep_last", "message"),
    [
        ({"strategy": "delete", "default_ttl": 60, "sweep_every": 5}, None, "unknown keys"),
        ({"strategy": "archive", "default_ttl": 60}, None, "strategy"),
        ({"strategy": "delete", "default_ttl": 0}, None, "positive"),
        ({"strategy": "delete", "default_ttl": -5}, None, "positive"),
        ({"strategy": "delete", "default_ttl": True}, None, "number of minutes"),
        ({"strategy": "delete", "default_ttl": "60"}, None, "number of minutes"),
        ({"default_ttl": 60, "sweep_interval_minutes": 0}, None, "positive"),
        ({"default_ttl": 60, "sweep_limit": 0}, None, "at least 1"),
        ({"strategy": "delete"}, None, "default_ttl"),
        ({"sweep_interval_minutes": 5}, None, "sweeps nothing"),
        (["delete", 60], None, "dict"),
        (None, 0, "keep_last"),
        (None, 2.5, "keep_last"),
    ],
)
@pytest.mark.asyncio
async def test_ttl_is_checked_strictly_before_anything_is_opened(
    tmp_path: Path, ttl: Any, keep_last: Any, message: str
) -> None:
    target = tmp_path / "never"
    with pytest.raises(InvalidOptions, match=message):
        StatekeeperSaver.from_conn_string(f"file://{target}", ttl=ttl, keep_last=keep_last)
    with pytest.raises(InvalidOptions, match=message):
        StatekeeperSaver(f"file://{target}", ttl=ttl, keep_last=keep_last)
    assert not target.exists()


@pytest.mark.asyncio
async def test_a_langgraph_json_block_is_taken_as_it_is() -> None:
    block = {"strategy": "delete", "sweep_interval_minutes": 60, "default_ttl": 43200}
    async with StatekeeperSaver.from_conn_string("memory://", ttl=block) as saver:
        assert saver.retention is not None
        assert saver.retention.idle is not None and saver.retention.idle.days == 30


@pytest.mark.asyncio
async def test_a_background_sweep_needs_a_saver_that_owns_its_store() -> None:
    async with statekeeper.open_store("memory://", codec="raw") as store:
        with pytest.raises(InvalidOptions, match="from_conn_string"):
            StatekeeperSaver(store, ttl={"default_ttl": 60, "sweep_interval_minutes": 5})
        saver = StatekeeperSaver(store)
        with pytest.raises(InvalidOptions, match="no retention policy"):
            await saver.asweep()


# -- idle threads, on schedule ---------------------------------------------------------


@pytest.mark.asyncio
async def test_idle_threads_are_deleted_on_schedule(store_url: Callable[[], str]) -> None:
    clock = FakeClock()
    async with saver_on(store_url(), clock, ttl=DELETE) as saver:
        graph = graph_on(saver)
        for thread in ("old", "busy"):
            await graph.ainvoke({"items": []}, config(thread))  # paused at the interrupt
        clock.advance(12 * 3600)
        await graph.ainvoke(Command(resume="yes"), config("busy"))
        clock.advance(12 * 3600)  # "old": exactly a day idle, not more
        report = await saver.asweep()
        assert report.threads_deleted == 0 and report.checkpoints_removed == 0
        clock.advance(1)
        report = await saver.asweep()
        assert report.threads_deleted == 1
        assert report.checkpoints_removed == 5  # input, a, b, c, the interrupted step
        assert report.writes_removed >= 1
        assert await thread_streams(saver.store, "old") == []
        assert await saver.aget_tuple(config("old")) is None
        # as LangGraph's own saver after delete_thread: the thread starts afresh
        peer = InMemorySaver()
        peer_graph = graph_on(peer)
        await peer_graph.ainvoke({"items": []}, config("old"))
        peer.delete_thread("old")
        assert await observed(graph, "old") == await observed(peer_graph, "old")
        for g in (graph, peer_graph):
            await g.ainvoke({"items": ["again"]}, config("old"))
        assert await observed(graph, "old") == await observed(peer_graph, "old")
        await saver.adelete_thread("old")  # done with "old"
        busy = [s async for s in graph.aget_state_history(config("busy"))]
        assert len(busy) == 7 and busy[0].values["items"][-1] == "finish"
        clock.advance(12 * 3600 + 1)  # "busy" idle for a day now
        assert (await saver.asweep()).threads_deleted == 1
        assert await saver.store.list_streams(prefix=layout.ROOT) == []


@pytest.mark.asyncio
async def test_sweep_limit_bounds_the_threads_of_one_sweep(store_url: Callable[[], str]) -> None:
    clock = FakeClock()
    async with saver_on(store_url(), clock, ttl={**DELETE, "sweep_limit": 2}) as saver:
        graph = graph_on(saver)
        for i in range(5):
            await graph.ainvoke({"items": []}, config(f"t{i}"))
        clock.advance(DAY * 60 + 1)
        reports = [await saver.asweep() for _ in range(4)]
        assert [r.threads_deleted for r in reports] == [2, 2, 1, 0]
        assert [r.complete for r in reports] == [False, False, True, True]
        assert await saver.store.list_streams(prefix=layout.ROOT) == []


@pytest.mark.asyncio
async def test_a_thread_is_idle_only_when_every_namespace_is(
    store_url: Callable[[], str],
) -> None:
    clock = FakeClock()
    async with saver_on(store_url(), clock, ttl=DELETE) as saver:
        graph = graph_on(saver)
        await graph.ainvoke({"items": []}, config("t"))
        clock.advance(2 * DAY * 60)
        # a subgraph's namespace written recently keeps the whole thread
        sub = {"configurable": {"thread_id": "t", "checkpoint_ns": "child:1"}}
        tuple_ = await saver.aget_tuple(config("t"))
        assert tuple_ is not None
        await saver.aput(sub, tuple_.checkpoint, {"source": "loop", "step": 0}, {})
        assert (await saver.asweep()).threads_deleted == 0
        assert len(await thread_streams(saver.store, "t")) == 3


# -- keep_latest: a thread with a pending interrupt resumes ----------------------------


@pytest.mark.asyncio
async def test_keep_latest_sweep_keeps_what_a_resume_needs(
    store_url: Callable[[], str],
) -> None:
    clock = FakeClock()
    peer = InMemorySaver()
    peer_graph = graph_on(peer)
    await peer_graph.ainvoke({"items": []}, config("t"))
    async with saver_on(store_url(), clock, ttl=KEEP_LATEST) as saver:
        graph = graph_on(saver)
        await graph.ainvoke({"items": []}, config("t"))
        assert await observed(graph, "t") == await observed(peer_graph, "t")
        clock.advance(DAY * 60 + 1)
        report = await saver.asweep()
        assert report.threads_trimmed == 1 and report.threads_deleted == 0
        assert report.checkpoints_removed == 4
        peer_keep_last(peer, "t", 1)
        await no_orphan_writes(saver.store)
        after = await observed(graph, "t")
        assert after == await observed(peer_graph, "t")
        assert after[0][4] == [[{"question": "go on?", "seen": 3}]]  # the interrupt is pending
        assert len(after[1]) == 1
        # the resume runs from the kept checkpoint and its pending writes, as on the peer
        got = await graph.ainvoke(Command(resume="yes"), config("t"))
        expected = await peer_graph.ainvoke(Command(resume="yes"), config("t"))
        assert plain(got) == plain(expected) == {"items": ["a", "b", "c", "asked:yes", "finish"]}
        assert await observed(graph, "t") == await observed(peer_graph, "t")
        # a second sweep of the (still idle by then) thread keeps its latest only
        clock.advance(DAY * 60 + 1)
        await saver.asweep()
        peer_keep_last(peer, "t", 1)
        assert await observed(graph, "t") == await observed(peer_graph, "t")


@pytest.mark.asyncio
async def test_keep_latest_keeps_a_paused_subgraphs_namespace(
    store_url: Callable[[], str],
) -> None:
    clock = FakeClock()
    peer = InMemorySaver()
    peer_graph = nested_graph_on(peer)
    await peer_graph.ainvoke({"items": []}, config("n"))
    async with saver_on(store_url(), clock, ttl=KEEP_LATEST) as saver:
        graph = nested_graph_on(saver)
        await graph.ainvoke({"items": []}, config("n"))
        streams = await thread_streams(saver.store, "n")
        assert len(streams) == 4  # the root namespace and the subgraph's, two streams each
        clock.advance(DAY * 60 + 1)
        report = await saver.asweep()
        assert report.threads_trimmed == 1 and report.checkpoints_removed > 0
        assert await thread_streams(saver.store, "n") == streams
        peer_keep_last(peer, "n", 1)
        await no_orphan_writes(saver.store)
        ours = await graph.aget_state(config("n"), subgraphs=True)
        theirs = await peer_graph.aget_state(config("n"), subgraphs=True)
        assert view(ours) == view(theirs)
        assert view(ours.tasks[0].state) == view(theirs.tasks[0].state)
        got = await graph.ainvoke(Command(resume="ok"), config("n"))
        expected = await peer_graph.ainvoke(Command(resume="ok"), config("n"))
        assert plain(got) == plain(expected)
        # and the resume's output is the one a thread that lost nothing gives
        untouched = nested_graph_on(InMemorySaver())
        await untouched.ainvoke({"items": []}, config("n"))
        assert plain(got) == plain(await untouched.ainvoke(Command(resume="ok"), config("n")))
        assert await observed(graph, "n") == await observed(peer_graph, "n")


@pytest.mark.asyncio
async def test_keep_last_and_aprune_keep_each_namespaces_newest_n(
    store_url: Callable[[], str],
) -> None:
    clock = FakeClock()
    peer = InMemorySaver()
    peer_graph = graph_on(peer)
    async with saver_on(store_url(), clock, keep_last=3) as saver:
        graph = graph_on(saver)
        for g in (graph, peer_graph):
            for thread in ("x", "y"):
                await g.ainvoke({"items": []}, config(thread))
        report = await saver.asweep()  # keep_last applies to active threads too
        assert report.threads_trimmed == 2 and report.checkpoints_removed == 4
        for thread in ("x", "y"):
            peer_keep_last(peer, thread, 3)
            assert await observed(graph, thread) == await observed(peer_graph, thread)
        await saver.aprune(["x"], keep_last=1)
        peer_keep_last(peer, "x", 1)
        assert await observed(graph, "x") == await observed(peer_graph, "x")
        assert len((await observed(graph, "y"))[1]) == 3
        await no_orphan_writes(saver.store)
        for g in (graph, peer_graph):
            await g.ainvoke(Command(resume="ok"), config("x"))
        assert await observed(graph, "x") == await observed(peer_graph, "x")
        with pytest.raises(ValueError, match="not both"):
            await saver.aprune(["x"], strategy="delete", keep_last=1)
        with pytest.raises(ValueError, match="keep_last"):
            await saver.aprune(["x"], keep_last=0)


@pytest.mark.asyncio
async def test_a_sweep_that_finds_nothing_to_remove_writes_nothing(
    store_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    async with saver_on(store_url(), clock, ttl=KEEP_LATEST, keep_last=3) as saver:
        graph = graph_on(saver)
        for thread in ("idle", "busy"):
            await graph.ainvoke({"items": []}, config(thread))
        clock.advance(DAY * 60 + 1)
        await graph.ainvoke(Command(resume="go"), config("busy"))
        first = await saver.asweep()
        assert first.threads_trimmed == 2 and first.checkpoints_removed == 4 + 4
        writes: list[str] = []
        for name in ("prune", "delete_many", "delete", "delete_stream"):
            monkeypatch.setattr(saver.store, name, lambda *a, _n=name, **k: writes.append(_n))
        again = await saver.asweep()
        assert writes == [] and again.threads_trimmed == again.checkpoints_removed == 0


# -- what holds while a sweep runs -----------------------------------------------------


@pytest.mark.asyncio
async def test_latest_is_never_older_while_a_thread_is_deleted(
    store_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    async with saver_on(store_url(), clock, ttl=DELETE) as saver:
        graph = graph_on(saver)
        await graph.ainvoke({"items": []}, config("t"))
        newest = (await saver.aget_tuple(config("t"))).checkpoint["id"]  # type: ignore[union-attr]
        store = saver.store
        seen: list[str | None] = []
        delete_many = store.delete_many

        async def checked(ids: Any) -> int:
            removed = await delete_many(ids)
            latest = await saver.aget_tuple(config("t"))
            seen.append(None if latest is None else latest.checkpoint["id"])
            return removed

        monkeypatch.setattr(store, "delete_many", checked)
        clock.advance(DAY * 60 + 1)
        await saver.asweep()
        assert seen and set(seen) <= {newest, None}
        assert seen[-1] is None


@pytest.mark.asyncio
async def test_a_checkpoint_put_after_the_sweep_judged_its_thread_survives(
    store_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    async with saver_on(store_url(), clock, ttl=DELETE) as saver:
        graph = graph_on(saver)
        await graph.ainvoke({"items": []}, config("t"))
        clock.advance(DAY * 60 + 1)
        judged = _retention._last_written

        async def then_resume(store: Any, streams: Any) -> Any:
            seen = await judged(store, streams)
            # the thread wakes up between the sweep's look and its removals
            await graph.ainvoke(Command(resume="late"), config("t"))
            return seen

        monkeypatch.setattr(_retention, "_last_written", then_resume)
        report = await saver.asweep()
        assert report.threads_deleted == 1 and report.checkpoints_removed == 5
        state = await graph.aget_state(config("t"))
        assert state.values["items"][-2:] == ["asked:late", "finish"]
        history = [s async for s in graph.aget_state_history(config("t"))]
        assert len(history) == 2  # the resume's two checkpoints, nothing before them
        await no_orphan_writes(saver.store)


@pytest.mark.asyncio
async def test_orphaned_pending_writes_go_with_the_next_sweep(
    store_url: Callable[[], str],
) -> None:
    clock = FakeClock()
    async with saver_on(store_url(), clock, keep_last=10) as saver:
        graph = graph_on(saver)
        await graph.ainvoke({"items": []}, config("t"))
        newest = await saver.aget_tuple(config("t"))
        assert newest is not None and newest.pending_writes
        checkpoint_id = newest.checkpoint["id"]
        # a checkpoint removed under its writes (a put_writes that raced a removal)
        await saver.store.delete(layout.checkpoint_key("t", "", checkpoint_id))
        report = await saver.asweep()
        assert report.checkpoints_removed == 0 and report.writes_removed == 1
        await no_orphan_writes(saver.store)


@pytest.mark.asyncio
async def test_sweeps_at_once_count_nothing_twice(store_url: Callable[[], str]) -> None:
    clock = FakeClock()
    async with saver_on(store_url(), clock, ttl=DELETE) as saver:
        graph = graph_on(saver)
        threads = [f"t{i}" for i in range(6)]
        for thread in threads:
            await graph.ainvoke({"items": []}, config(thread))
        clock.advance(DAY * 60 + 1)
        other = StatekeeperSaver(saver.store, ttl=DELETE)
        reports = await asyncio.gather(saver.asweep(), other.asweep(), saver.asweep())
        assert sum(r.checkpoints_removed for r in reports) == 5 * len(threads)
        assert sum(r.threads_deleted for r in reports) == len(threads)
        assert await saver.store.list_streams(prefix=layout.ROOT) == []


@pytest.mark.asyncio
async def test_graphs_run_on_while_a_sweep_removes_idle_threads(
    store_url: Callable[[], str],
) -> None:
    clock = FakeClock()
    async with saver_on(store_url(), clock, ttl=DELETE, keep_last=4) as saver:
        graph = graph_on(saver)
        idle = [f"idle{i}" for i in range(8)]
        for thread in idle:
            await graph.ainvoke({"items": []}, config(thread))
        clock.advance(DAY * 60 + 1)
        busy = [f"busy{i}" for i in range(4)]

        async def run(thread: str) -> Any:
            await graph.ainvoke({"items": []}, config(thread))
            return await graph.ainvoke(Command(resume=thread), config(thread))

        *outputs, report = await asyncio.gather(*(run(t) for t in busy), saver.asweep())
        for thread, output in zip(busy, outputs, strict=True):
            assert output == {"items": ["a", "b", "c", f"asked:{thread}", "finish"]}
            state = await graph.aget_state(config(thread))
            assert state.values == output and state.next == ()
        assert report.threads_deleted == len(idle)
        for thread in idle:
            assert await thread_streams(saver.store, thread) == []
        # No orphan check here: a put_writes of a busy thread may race the trim of
        # its checkpoint and leave an orphan, which the next sweep removes (the
        # contract in _retention's docstring); the check after that sweep holds it.
        await saver.asweep()  # the busy threads, done now, keep their newest 4
        for thread in busy:
            history = [s async for s in graph.aget_state_history(config(thread))]
            assert len(history) == 4 and history[0].values["items"][-1] == "finish"
        await no_orphan_writes(saver.store)


# -- the background sweep ------------------------------------------------------------


class Ticks:
    """Stands in for the background sweep's wait: ``waits`` gets the interval of
    each wait as it starts, and :meth:`sweep_now` ends the wait under way."""

    def __init__(self) -> None:
        self.waits: asyncio.Queue[float] = asyncio.Queue()
        self.go: asyncio.Queue[None] = asyncio.Queue()
        self.stopped = False

    async def wait(self, stop: asyncio.Event, seconds: float) -> bool:
        self.waits.put_nowait(seconds)
        done = asyncio.ensure_future(stop.wait())
        tick = asyncio.ensure_future(self.go.get())
        await asyncio.wait([done, tick], return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        tick.cancel()
        self.stopped = stop.is_set()
        return self.stopped

    async def sweep_now(self) -> None:
        """End the wait under way, and return once the sweep after it has ended
        (the next wait has started)."""
        self.go.put_nowait(None)
        assert await self.waits.get() == 30 * 60


@pytest.mark.asyncio
async def test_the_background_sweep_runs_every_interval_and_stops_on_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks = Ticks()
    monkeypatch.setattr(_background, "wait_or_stop", ticks.wait)
    clock = FakeClock()
    ttl = {**DELETE, "sweep_interval_minutes": 30}
    context = StatekeeperSaver.from_conn_string("memory://", ttl=ttl, clock=clock)
    async with context as saver:
        graph = graph_on(saver)
        await graph.ainvoke({"items": []}, config("t"))
        assert await ticks.waits.get() == 30 * 60  # it waits before the first sweep
        await ticks.sweep_now()  # nothing is idle yet
        assert await saver.aget_tuple(config("t")) is not None
        clock.advance(DAY * 60 + 1)
        await ticks.sweep_now()
        assert await saver.aget_tuple(config("t")) is None
        sweep = context._sweep
        assert sweep is not None and sweep.running
        assert isinstance(sweep.last, ThreadSweepReport) and sweep.last.threads_deleted == 1
    assert ticks.stopped and not sweep.running


def test_the_background_sweep_of_a_sync_saver_stops_on_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_background, "wait_or_stop", _until_stopped)
    ttl = {**KEEP_LATEST, "sweep_interval_minutes": 1}
    url = f"sqlite:///{tmp_path}/sync.db"
    with StatekeeperSaver.from_conn_string(url, ttl=ttl) as saver:
        graph = graph_on(saver)
        graph.invoke({"items": []}, config("t"))
        assert saver.sweep().threads_trimmed == 0  # nothing idle by the real clock
    saver = StatekeeperSaver(url, ttl=ttl)
    background = saver._background
    assert background is not None and background.running
    saver.close()
    assert not background.running


async def _until_stopped(stop: asyncio.Event, seconds: float) -> bool:
    await stop.wait()
    return True
