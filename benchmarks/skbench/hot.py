"""Issue 15's hot paths, side by side in one run: listing, positional pages, the
latest and by-id reads against the store's own worker hop, single saves against
the bare writes, and (in :mod:`skbench.hot_group`) saves from many tasks at once.

**Stores.** statekeeper's memory, file and SQLite stores (opened by URL, as the main
run's adapters do) and LangGraph's ``SqliteSaver`` and ``AsyncSqliteSaver`` (both on
one database file: they share its schema and rows) each hold three streams,
interleaved evenly: :data:`BIG` (``big`` checkpoints, 100,000 by default),
:data:`LIST` (10,000) and :data:`SMALL` (1,000), every checkpoint the same ~1 KB
:func:`~skbench.payload.make_state`. Ours are built with ``save_many`` batches
through the ``durability="fast"`` handle, LangGraph's through ``put`` with
``synchronous=OFF``; the builds are untimed, every measured call uses each store's
durable default (ours ``durability="full"``; SQLite's ``synchronous=FULL`` for the
peers). ``InMemorySaver`` holds :data:`SMALL` only.

**Workloads**, each phase measured in interleaved rounds, one call of every workload
per round in an order shuffled each round (:func:`skbench.api.measure_round_robin`),
after each read was checked once against the ids the build returned:

- *list all* of :data:`LIST`: ours page by page (``limit=100``, ``after=next_cursor``),
  ``SqliteSaver.list(config)`` and ``AsyncSqliteSaver.alist(config)`` (one call each,
  consumed item by item); reported per item. The worker hops of one listing are
  counted once, untimed, as the event loop's ``call_soon_threadsafe`` wake-ups (every
  worker thread hands its result back that way).
- *a middle page* of 20 at :data:`BIG`: ``list(BIG, limit=20, after=cursor_at(id))``
  with the cursor made beforehand (a paging reader holds it from its previous page),
  against ``SqliteSaver.list(config, before=<config of id>, limit=20)``; both walk the
  same :data:`ROTATE` neighbouring ids around the middle.
- ``get_latest`` and ``load`` (by id, over 64 ids spread through the stream) at
  :data:`SMALL` and :data:`BIG`, against a no-op round trip to the store's own worker
  (:meth:`~skbench.adapters.statekeeper_stores.StatekeeperAdapter.noop_hop`); memory's
  ``get_latest`` against ``InMemorySaver.get_tuple`` of the latest.
- single saves into a stream of their own: file full and fast, SQLite full, memory,
  against the bare writes of the same record bytes (:class:`skbench.floors.WriteFloors`)
  and ``InMemorySaver.put`` (its checkpoints made beforehand, as our states are).
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .adapters.base import open_adapter
from .adapters.langgraph_peers import AsyncSqliteSaverStore, InMemorySaverStore, SqliteSaverStore
from .adapters.statekeeper_stores import FileStore, MemoryStore, SqliteStore, StatekeeperAdapter
from .floors import WriteFloors, record_bytes
from .integrations import Results, _measure
from .payload import make_state
from .timing import Budget, Op

BIG = "hot-big"
LIST = "hot-10k"
SMALL = "hot-1k"
WRITES = "hot-writes"
LIST_SIZE = 10_000
SMALL_SIZE = 1_000
LIST_PAGE = 100
PAGE = 20
ROTATE = 10
BUILD_BATCH = 1000
LOAD_IDS = 64

SK_MEMORY = "statekeeper memory"
SK_FILE = "statekeeper file"
SK_SQLITE = "statekeeper sqlite"
LG_SQLITE = "SqliteSaver"
LG_ASYNC = "AsyncSqliteSaver"
LG_MEMORY = "InMemorySaver"
FLOOR = "floor"

LIST_ALL = f"list all of {LIST_SIZE:,}"
HOP = "no-op hop to the store's worker"
SAVE_FULL = 'save (durability="full")'
SAVE_FAST = 'save (durability="fast")'
SAVE = "save"
PUT = "put"
LATEST_TUPLE = "get_tuple (latest) @1k"
DURABLE = "write + fsync + rename + fsync dir"
PLAIN = "write + rename"
SQLITE_FULL = "BEGIN IMMEDIATE; INSERT; COMMIT (synchronous=FULL)"


def k(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else f"{n:,}"


def middle_op(big: int) -> str:
    return f"middle page of {PAGE} @{k(big)}"


def latest_op(n: int) -> str:
    return f"get_latest @{k(n)}"


def load_op(n: int) -> str:
    return f"load @{k(n)}"


@dataclass
class HotSettings:
    big: int
    list_budget: Budget
    read_budget: Budget
    write_budget: Budget
    group_tasks: tuple[int, ...]
    group_saves: int  # saves per child run, split over its tasks
    group_rounds: int
    strace: bool = True

    @property
    def sizes(self) -> dict[str, int]:
        return {BIG: self.big, LIST: LIST_SIZE, SMALL: SMALL_SIZE}


@dataclass
class HotResults(Results):
    """:class:`skbench.integrations.Results` plus what only this run has: hops per
    page, the hop floors' recipes and the group-commit runs."""

    hops: dict[str, dict[str, Any]] = field(default_factory=dict)
    group: dict[str, Any] = field(default_factory=dict)


def interleave(counts: dict[str, int]) -> list[tuple[str, int]]:
    """``(stream, index)`` in save order, each stream spread evenly over the whole."""
    keyed = [
        ((i + 0.5) / count, order, stream, i)
        for order, (stream, count) in enumerate(counts.items())
        for i in range(count)
    ]
    keyed.sort()
    return [(stream, i) for _, _, stream, i in keyed]


# -- subjects ---------------------------------------------------------------------------


@dataclass
class Subject:
    name: str
    handle: Any  # our adapter, or the LangGraph adapter (its .saver)
    ids: dict[str, list[str]] = field(default_factory=dict)
    cursors: list[str] = field(default_factory=list)  # middle-page cursors (ours)

    @property
    def ours(self) -> bool:
        return isinstance(self.handle, StatekeeperAdapter)


def _config(stream: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": stream, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


async def build_ours(subject: Subject, plan: list[tuple[str, int]], results: HotResults) -> None:
    from statekeeper import NewCheckpoint

    adapter: StatekeeperAdapter = subject.handle
    bulk = adapter.stores.get("fast", adapter.main)
    started = time.perf_counter()
    step = 0
    for start in range(0, len(plan), BUILD_BATCH):
        chunk = plan[start : start + BUILD_BATCH]
        items = []
        for stream, _ in chunk:
            step += 1
            items.append(NewCheckpoint(stream=stream, state=make_state(step), metadata={"s": step}))
        saved = await bulk.save_many(items)
        for (stream, _), cp in zip(chunk, saved, strict=True):
            subject.ids.setdefault(stream, []).append(cp.id)
    results.subjects[subject.name]["build_s"] = time.perf_counter() - started
    results.say(f"built {subject.name}: {len(plan):,} in {time.perf_counter() - started:.1f} s")


def build_langgraph(
    adapter: Any, plan: list[tuple[str, int]], results: HotResults, name: str
) -> dict[str, list[str]]:
    """Put ``plan`` through a sync LangGraph saver (``synchronous=OFF`` on SQLite: the
    build is untimed); return the ids per stream."""
    saver = adapter.saver
    ids: dict[str, list[str]] = {}
    started = time.perf_counter()
    sync = None
    if hasattr(saver, "conn") and hasattr(saver.conn, "execute"):
        sync = saver.conn.execute("PRAGMA synchronous").fetchone()[0]
        saver.conn.execute("PRAGMA synchronous=OFF")
    try:
        for step, (stream, _) in enumerate(plan):
            config, checkpoint, metadata, versions = adapter._checkpoint(stream, step)
            saver.put(config, checkpoint, metadata, versions)
            ids.setdefault(stream, []).append(str(checkpoint["id"]))
    finally:
        if sync is not None:
            saver.conn.execute(f"PRAGMA synchronous={sync}")
    results.subjects[name]["build_s"] = time.perf_counter() - started
    results.say(f"built {name}: {len(plan):,} in {time.perf_counter() - started:.1f} s")
    return ids


async def open_subjects(
    settings: HotSettings, workdir: Path, results: HotResults
) -> tuple[list[Subject], list[Callable[[], Awaitable[None]]]]:
    """Open and build every store; return them and how to close each."""
    plan = interleave(settings.sizes)
    subjects: list[Subject] = []
    closers: list[Callable[[], Awaitable[None]]] = []
    for cls in (MemoryStore, FileStore, SqliteStore):
        adapter, problem = await open_adapter(cls, workdir, results.say)
        if adapter is None:
            results.subjects[cls.name] = {"unavailable": problem}
            continue
        closers.append(adapter.close)
        results.subjects[cls.name] = {"backend": type(adapter.main).__name__}
        subject = Subject(cls.name, adapter)
        results.mark_load(f"build {cls.name}")
        await build_ours(subject, plan, results)
        subjects.append(subject)
    try:
        lg = SqliteSaverStore()
        place = workdir / "langgraph"
        place.mkdir()
        await lg.open(place)
    except ImportError as exc:
        for name in (LG_SQLITE, LG_ASYNC, LG_MEMORY):
            results.subjects[name] = {"unavailable": f"{type(exc).__name__}: {exc}"}
        results.say(f"skip the LangGraph savers: {exc}")
        return subjects, closers
    closers.append(lg.close)
    results.subjects[LG_SQLITE] = {"setting": lg.default_mode().detail}
    results.mark_load(f"build {LG_SQLITE}")
    ids = build_langgraph(lg, plan, results, LG_SQLITE)
    subjects.append(Subject(LG_SQLITE, lg, ids))
    lg_async = AsyncSqliteSaverStore()
    lg_async.path = lg.path  # the same file: LangGraph's two SQLite savers share it
    await lg_async.attach()
    lg_async._heads = dict(lg._heads)
    closers.append(lg_async.close)
    results.subjects[LG_ASYNC] = {"setting": "the same database file, through aiosqlite"}
    subjects.append(Subject(LG_ASYNC, lg_async, ids))
    memory = InMemorySaverStore()
    await memory.open(place)
    closers.append(memory.close)
    results.subjects[LG_MEMORY] = {"setting": "in-process memory"}
    memory_ids = build_langgraph(
        memory, [(SMALL, i) for i in range(SMALL_SIZE)], results, LG_MEMORY
    )
    subjects.append(Subject(LG_MEMORY, memory, memory_ids))
    return subjects, closers


# -- the checks (each read once, against the build) --------------------------------------


async def count_hops(call: Callable[[], Awaitable[Any]]) -> tuple[Any, int]:
    """Run ``call`` once, counting the event loop's ``call_soon_threadsafe`` calls: each
    worker-thread round trip (``asyncio.to_thread``, a SQLite ``_Worker``) wakes the loop
    that way once to deliver its result."""
    loop = asyncio.get_running_loop()
    original = loop.call_soon_threadsafe
    count = 0

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        return original(*args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        result = await call()
    finally:
        del loop.call_soon_threadsafe
    return result, count


async def _list_ours(store: Any) -> list[str]:
    out: list[str] = []
    cursor = None
    while True:
        page = await store.list(LIST, limit=LIST_PAGE, after=cursor)
        out += [c.id for c in page.items]
        cursor = page.next_cursor
        if cursor is None:
            return out


def _middle_ids(ids: list[str]) -> list[int]:
    mid = len(ids) // 2
    return [mid + r for r in range(ROTATE)]


async def check(subject: Subject, settings: HotSettings, results: HotResults) -> dict[str, str]:
    """Each read workload once; op -> what is wrong. Also counts the hops of a listing."""
    problems: dict[str, str] = {}
    ids = subject.ids
    if subject.name == LG_MEMORY:
        got = subject.handle.saver.get_tuple(_config(SMALL))
        if got is None or got.config["configurable"]["checkpoint_id"] != ids[SMALL][-1]:
            problems[LATEST_TUPLE] = "not the last checkpoint put"
        return problems
    if subject.ours:
        store = subject.handle.main
        listed, hops = await count_hops(lambda: _list_ours(store))
        pages = -(-len(ids[LIST]) // LIST_PAGE)
        results.hops[subject.name] = {"hops": hops, "pages": pages}
        for index in _middle_ids(ids[BIG]):
            subject.cursors.append(await store.cursor_at(ids[BIG][index]))
        at = _middle_ids(ids[BIG])[0]
        got = [c.id for c in (await store.list(BIG, limit=PAGE, after=subject.cursors[0])).items]
        if got != ids[BIG][at - PAGE : at][::-1]:
            problems[middle_op(settings.big)] = "not the 20 checkpoints just older"
        for stream, n in ((SMALL, SMALL_SIZE), (BIG, settings.big)):
            latest = await store.get_latest(stream)
            if latest is None or latest.id != ids[stream][-1]:
                problems[latest_op(n)] = "not the last checkpoint saved"
            probe = ids[stream][len(ids[stream]) // 3]
            if (await store.load(probe)).id != probe:
                problems[load_op(n)] = "load returned another checkpoint"
    elif subject.name == LG_SQLITE:
        saver = subject.handle.saver
        listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(_config(LIST))]
        at = _middle_ids(ids[BIG])[0]
        got = [
            t.config["configurable"]["checkpoint_id"]
            for t in saver.list(_config(BIG), before=_config(BIG, ids[BIG][at]), limit=PAGE)
        ]
        if got != ids[BIG][at - PAGE : at][::-1]:
            problems[middle_op(settings.big)] = "not the 20 checkpoints just older"
    else:  # AsyncSqliteSaver
        saver, config = subject.handle.saver, _config(LIST)
        listed = [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(config)]
    if listed != ids[LIST][::-1]:
        problems[LIST_ALL] = f"{len(listed)} listed, not the {len(ids[LIST])} saved, newest first"
    return problems


# -- the workloads -----------------------------------------------------------------------


def list_ops(subject: Subject, settings: HotSettings) -> dict[str, Op]:
    if subject.ours:
        store = subject.handle.main

        async def ours(i: int) -> int:
            return len(await _list_ours(store))

        return {LIST_ALL: ours}
    if subject.name == LG_SQLITE:
        saver = subject.handle.saver

        async def listing(i: int) -> int:
            return sum(1 for _ in saver.list(_config(LIST)))

        return {LIST_ALL: listing}
    if subject.name == LG_ASYNC:
        saver = subject.handle.saver

        async def alisting(i: int) -> int:
            seen = 0
            async for _ in saver.alist(_config(LIST)):
                seen += 1
            return seen

        return {LIST_ALL: alisting}
    return {}


def middle_ops(subject: Subject, settings: HotSettings) -> dict[str, Op]:
    op = middle_op(settings.big)
    if subject.ours:
        store, cursors = subject.handle.main, subject.cursors

        async def ours(i: int) -> int:
            page = await store.list(BIG, limit=PAGE, after=cursors[i % len(cursors)])
            return len(page.items)

        return {op: ours}
    if subject.name == LG_SQLITE:
        saver = subject.handle.saver
        befores = [_config(BIG, subject.ids[BIG][j]) for j in _middle_ids(subject.ids[BIG])]

        async def theirs(i: int) -> int:
            return len(list(saver.list(_config(BIG), before=befores[i % ROTATE], limit=PAGE)))

        return {op: theirs}
    return {}


def read_ops(subject: Subject, settings: HotSettings, results: HotResults) -> dict[str, Op]:
    rng = random.Random(15)
    if subject.name == LG_MEMORY:
        saver = subject.handle.saver

        async def get_tuple(i: int) -> Any:
            return saver.get_tuple(_config(SMALL))

        return {LATEST_TUPLE: get_tuple}
    if not subject.ours:
        return {}
    adapter: StatekeeperAdapter = subject.handle
    store = adapter.main
    ops: dict[str, Op] = {}
    sizes = ((SMALL, SMALL_SIZE), (BIG, settings.big))
    for stream, n in sizes if subject.name != SK_MEMORY else sizes[:1]:

        async def latest(i: int, stream: str = stream) -> Any:
            return await store.get_latest(stream)

        wanted = rng.sample(subject.ids[stream], LOAD_IDS)

        async def load(i: int, wanted: list[str] = wanted) -> Any:
            return await store.load(wanted[i % LOAD_IDS])

        ops[latest_op(n)] = latest
        ops[load_op(n)] = load
    hop, how = adapter.noop_hop(store)
    if subject.name != SK_MEMORY:
        results.subjects[subject.name]["hop"] = how
        if hop is not None:
            call = hop

            async def noop(i: int) -> Any:
                return await call()

            ops[HOP] = noop
    return ops


def write_ops(subject: Subject, reps: int, floors: WriteFloors | None) -> dict[tuple[str, str], Op]:
    """Single saves into :data:`WRITES`, their arguments made beforehand."""
    calls = reps + 2
    ops: dict[tuple[str, str], Op] = {}
    if subject.ours:
        adapter: StatekeeperAdapter = subject.handle
        states = [make_state(1_000_000 + n) for n in range(calls)]
        labels = {"full": SAVE_FULL, "fast": SAVE_FAST, "memory": SAVE}
        for mode, store in adapter.stores.items():
            if subject.name == SK_SQLITE and mode == "fast":
                continue  # no target names it

            async def save(i: int, store: Any = store) -> Any:
                return await store.save(WRITES, states[i % calls])

            ops[(subject.name, labels[mode])] = save
    elif subject.name == LG_MEMORY:
        lg = subject.handle
        args = [lg._checkpoint(WRITES, 1_000_000 + n) for n in range(calls)]
        saver = lg.saver

        async def put(i: int) -> Any:
            return saver.put(*args[i % calls])

        ops[(LG_MEMORY, PUT)] = put
    if floors is not None and subject.name == SK_FILE:
        ops[(FLOOR, DURABLE)] = floors.durable
        ops[(FLOOR, PLAIN)] = floors.plain
    if floors is not None and subject.name == SK_SQLITE:
        ops[(FLOOR, SQLITE_FULL)] = floors.sqlite_full
    return ops


async def run(settings: HotSettings, workdir: Path, results: HotResults) -> None:
    results.mark_load("start")
    record = await record_bytes(WRITES)
    results.meta["record_bytes"] = len(record)
    floors = WriteFloors(workdir, record)
    subjects, closers = await open_subjects(settings, workdir, results)
    try:
        broken: dict[str, dict[str, str]] = {}
        for subject in subjects:
            broken[subject.name] = await check(subject, settings, results)
            for op, problem in broken[subject.name].items():
                results.ops.setdefault(subject.name, {})[op] = {"error": f"wrong: {problem}"}
                results.say(f"  {subject.name} {op}: WRONG ANSWER: {problem}")
        for name, hops in results.hops.items():
            results.say(f"  {name}: {hops['hops']} hops over {hops['pages']} pages")
        # the builds' objects live for the whole run: out of the collector's way
        gc.collect()
        gc.freeze()

        def gather(make: Callable[[Subject], dict[str, Op]]) -> dict[tuple[str, str], Op]:
            out = {}
            for subject in subjects:
                for op, fn in make(subject).items():
                    if op not in broken.get(subject.name, {}):
                        out[(subject.name, op)] = fn
            return out

        await _measure(
            results, "list all", gather(lambda s: list_ops(s, settings)), settings.list_budget
        )
        await _measure(
            results,
            "middle page",
            gather(lambda s: middle_ops(s, settings)),
            settings.read_budget,
        )
        await _measure(
            results,
            "get_latest and load",
            gather(lambda s: read_ops(s, settings, results)),
            settings.read_budget,
        )
        writes: dict[tuple[str, str], Op] = {}
        for subject in subjects:
            writes.update(write_ops(subject, settings.write_budget.reps, floors))
        await _measure(results, "single saves", writes, settings.write_budget)
    finally:
        for close in reversed(closers):
            try:
                await close()
            except Exception as exc:  # cleanup must not hide the run's own error
                results.say(f"cleanup failed: {exc}")
        floors.close()
        gc.unfreeze()
