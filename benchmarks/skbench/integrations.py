"""Issue 14's targets: statekeeper under LangGraph and Agent Framework, beside their own.

**LangGraph.** ``StatekeeperSaver`` over a store opened with ``codec="raw"`` and
``durability="full"``, against ``AsyncSqliteSaver`` (its default connection: WAL,
SQLite's default ``synchronous``) and against ``AsyncPostgresSaver`` on the same
PostgreSQL server and database (its own schema; ours in its own tables). Every saver
gets the same ``size`` checkpoints of one thread, in order, each the parent of the
next, through its own ``aput``: the build is the ``aput`` measurement, one put per
saver per round. Each checkpoint has one channel, ``state``, holding the ~1 KB
:func:`~skbench.payload.make_state`, as the main run's LangGraph adapter writes it.
Then, in interleaved rounds: ``aget_tuple`` of the latest, ``aget_tuple`` by id,
``alist(limit=None)`` of the whole thread and ``alist(before=<the 1,000th>,
limit=20)``. Every read is checked once against the ids put, before timing. Last,
the SQLite databases' size on disk, after ``wal_checkpoint(TRUNCATE)`` on both.

**Agent Framework.** In :mod:`skbench.integrations_af`, which also holds ``run``.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import sqlite3
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .adapters.base import StoreUnavailable
from .adapters.langgraph_peers import _libpq_url, graph_put
from .adapters.statekeeper_stores import POSTGRES_URL, _reachable
from .api import measure_round_robin
from .integrations_graph import GRAPH_STEPS, graph_op, writes_op
from .payload import make_state
from .timing import Budget, Op, Stat, format_stat

THREAD = "bench-thread"
PAGE = 20

# workload names, as the report shows them
APUT = "aput"
APUT_WRITES = "aput_writes"
LATEST = "aget_tuple (latest)"
BY_ID = "aget_tuple (by id)"
LIST_ALL = "alist(limit=None)"
LIST_10 = "alist(limit=10)"
GRAPH = "100-step graph, ainvoke"
GET_LATEST = "get_latest"

SK_SQLITE = "StatekeeperSaver, SQLite"
LG_SQLITE = "AsyncSqliteSaver"
SK_SQLITE_FAST = 'StatekeeperSaver, SQLite, durability="fast"'
LG_SQLITE_NORMAL = "AsyncSqliteSaver, synchronous=NORMAL"
SK_PG = "StatekeeperSaver, PostgreSQL"
LG_PG = "AsyncPostgresSaver"
AF_SK_SQLITE = "StatekeeperCheckpointStorage, SQLite"
AF_SK_FILE = "StatekeeperCheckpointStorage, file"
AF_FILE = "FileCheckpointStorage"
AF_MEMORY = "InMemoryCheckpointStorage"


def before_op(at: int) -> str:
    return f"alist(before=<the {at:,}th>, limit={PAGE})"


def latest_at(size: int) -> str:
    return f"{GET_LATEST} @{size:,}"


@dataclass
class Settings:
    size: int
    before_at: int  # 1-based: before=<the before_at-th checkpoint put>
    maf_sizes: tuple[int, ...]
    read_budget: Budget
    latest_budget: Budget
    graph_budget: Budget
    save_budget: Budget
    writes: int  # aput_writes calls, each to its own checkpoint
    postgres: bool
    only: list[str] = field(default_factory=list)

    def wants(self, part: str) -> bool:
        return not self.only or any(k in part for k in self.only)


@dataclass
class Results:
    meta: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    subjects: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> facts
    ops: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> bytes
    loads: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
        self.log.append(message)

    def stat(self, subject: str, op: str) -> Stat | None:
        cell = self.ops.get(subject, {}).get(op, {})
        return Stat(**cell["stat"]) if "stat" in cell else None

    def mark_load(self, phase: str) -> None:
        self.loads.append(f"{phase}: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


@dataclass
class Subject:
    """One saver or storage under test, how to close it, and what was put into it."""

    name: str
    handle: Any
    close: Callable[[], Awaitable[None]]
    directory: Path | None = None  # its files, for the size on disk (SQLite pair)
    ids: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


# -- LangGraph: the savers ----------------------------------------------------------


_SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def _sqlite_sync(connect: Callable[[], sqlite3.Connection]) -> str:
    conn = connect()
    try:
        value = conn.execute("PRAGMA synchronous").fetchone()[0]
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()
    return f"journal_mode={mode}, synchronous={_SYNC_NAMES.get(value, value)}"


async def open_sk_sqlite(workdir: Path, durability: str = "full") -> Subject:
    import statekeeper
    from statekeeper.integrations.langgraph import StatekeeperSaver

    name = SK_SQLITE if durability == "full" else SK_SQLITE_FAST
    directory = workdir / f"sk-sqlite-{durability}"
    directory.mkdir()
    store = statekeeper.open_store(
        f"sqlite:///{directory / 'sk.db'}", codec="raw", durability=durability
    )
    await store.open()
    # the writer connection's settings, read from a connection made the same way
    # (the store's runtime applies them to every connection it makes)
    setting = await asyncio.to_thread(_sqlite_sync, store._runtime.connect)
    facts = {
        "setting": f'durability="{store.options.durability}": {setting}, BEGIN IMMEDIATE '
        "per put (the store's own connection settings)",
        "backend": type(store).__name__,
    }
    return Subject(name, StatekeeperSaver(store), store.close, directory, facts=facts)


async def open_sk_sqlite_fast(workdir: Path) -> Subject:
    return await open_sk_sqlite(workdir, "fast")


async def open_lg_sqlite(workdir: Path, synchronous: str | None = None) -> Subject:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    name = LG_SQLITE if synchronous is None else LG_SQLITE_NORMAL
    directory = workdir / f"lg-sqlite-{synchronous or 'default'}"
    directory.mkdir()
    stack = AsyncExitStack()
    saver = await stack.enter_async_context(
        AsyncSqliteSaver.from_conn_string(str(directory / "lg.db"))
    )
    await saver.setup()
    if synchronous is not None:  # on its one connection, which every call uses
        await saver.conn.execute(f"PRAGMA synchronous={synchronous}")
    async with saver.conn.execute("PRAGMA synchronous") as cur:
        value = (await cur.fetchone())[0]
    async with saver.conn.execute("PRAGMA journal_mode") as cur:
        mode = (await cur.fetchone())[0]
    how = (
        "from_conn_string defaults"
        if synchronous is None
        else f"from_conn_string, then PRAGMA synchronous={synchronous} on its connection"
    )
    origin = " (not set by the saver: SQLite's compiled default)" if synchronous is None else ""
    facts = {
        "setting": f"{how}: journal_mode={mode}, synchronous="
        f"{_SYNC_NAMES.get(value, value)}{origin}, one commit per put",
    }
    return Subject(name, saver, stack.aclose, directory, facts=facts)


async def open_lg_sqlite_normal(workdir: Path) -> Subject:
    return await open_lg_sqlite(workdir, "NORMAL")


async def _pg_settings(fetch: Callable[[str], Awaitable[Any]]) -> str:
    out = []
    for name in ("synchronous_commit", "fsync", "wal_sync_method"):
        out.append(f"{name}={await fetch(name)}")
    return ", ".join(out)


async def drop_tables_like(conn: Any, prefix: str) -> None:
    """Drop every table, in any schema, whose name starts with ``prefix`` (over an
    asyncpg connection)."""
    rows = await conn.fetch(
        "SELECT schemaname, tablename FROM pg_tables WHERE tablename LIKE $1",
        prefix.replace("_", r"\_") + "%",
    )
    for row in rows:
        await conn.execute(
            f'DROP TABLE IF EXISTS "{row["schemaname"]}"."{row["tablename"]}" CASCADE'
        )


async def open_sk_pg(workdir: Path) -> Subject:
    import asyncpg  # type: ignore[import-untyped]

    import statekeeper
    from statekeeper.integrations.langgraph import StatekeeperSaver

    _reachable(POSTGRES_URL)
    prefix = f"skbi{secrets.token_hex(4)}_"
    store = statekeeper.open_store(
        POSTGRES_URL, codec="raw", durability="full", table_prefix=prefix
    )
    await store.open()
    admin = await asyncpg.connect(_libpq_url())

    async def close() -> None:
        try:
            await store.close()
            await drop_tables_like(admin, prefix)
        finally:
            await admin.close()

    async def show(name: str) -> Any:
        return await admin.fetchval(f"SHOW {name}")

    facts = {
        "setting": f'durability="{store.options.durability}": one transaction per put; '
        f"server {await _pg_settings(show)}",
        "prefix": prefix,
        "backend": type(store).__name__,
    }
    subject = Subject(SK_PG, StatekeeperSaver(store), close, facts=facts)
    subject.facts["size_sql"] = (
        "SELECT coalesce(sum(pg_total_relation_size(format('%I.%I', schemaname, tablename))), 0)"
        " FROM pg_tables WHERE tablename LIKE '" + prefix.replace("_", r"\_") + "%'"
    )
    return subject


async def open_lg_pg(workdir: Path) -> Subject:
    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    _reachable(POSTGRES_URL)
    schema = f"lgbi_{secrets.token_hex(4)}"
    admin = await psycopg.AsyncConnection.connect(_libpq_url(), autocommit=True)
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    stack = AsyncExitStack()
    # its table names are fixed: a schema of its own on the same database isolates it
    conninfo = f"{_libpq_url()}?options=-csearch_path%3D{schema}"
    saver = await stack.enter_async_context(AsyncPostgresSaver.from_conn_string(conninfo))
    await saver.setup()

    async def close() -> None:
        try:
            await stack.aclose()
            await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await admin.close()

    async def show(name: str) -> Any:
        cur = await admin.execute(f"SHOW {name}")
        row = await cur.fetchone()
        return row[0] if row else "?"

    facts = {
        "setting": "from_conn_string defaults: autocommit, blobs then checkpoint in one "
        f"pipeline per put; server {await _pg_settings(show)}",
        "schema": schema,
        "size_sql": "SELECT coalesce(sum(pg_total_relation_size(format('%I.%I', schemaname, "
        f"tablename))), 0) FROM pg_tables WHERE schemaname = '{schema}'",
    }
    return Subject(LG_PG, saver, close, facts=facts)


# -- LangGraph: the checkpoints and workloads -----------------------------------------


def make_checkpoints(size: int) -> list[tuple[dict[str, Any], ...]]:
    """``size`` puts of one thread, as a compiled graph makes them: each checkpoint's
    parent is the previous one, ids are time-ordered uuid6, one channel version bumps."""
    rng = random.Random(14)
    out = []
    parent: str | None = None
    version: str | None = None
    for step in range(size):
        new_version = f"{step + 1:032}.{rng.random():016}"
        put = graph_put(THREAD, step, parent, version, new_version)
        out.append(put)
        parent, version = str(put[1]["id"]), new_version
    ids = [str(c[1]["id"]) for c in out]
    if ids != sorted(ids) or len(set(ids)) != len(ids):
        raise RuntimeError("uuid6 ids are not strictly increasing; LangGraph orders by them")
    return out


def _config(checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": THREAD, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def put_op(subject: Subject, checkpoints: list[tuple[dict[str, Any], ...]]) -> Op:
    async def op(i: int) -> Any:
        config, checkpoint, metadata, versions = checkpoints[i]
        done = await subject.handle.aput(config, checkpoint, metadata, versions)
        subject.ids.append(done["configurable"]["checkpoint_id"])
        return done

    return op


def read_ops(subject: Subject, settings: Settings) -> dict[str, Op]:
    saver, ids = subject.handle, subject.ids
    before = _config(ids[settings.before_at - 1])
    stride = 7919  # prime: by-id reads walk the whole thread, not neighbouring rows

    async def latest(i: int) -> Any:
        return await saver.aget_tuple(_config())

    async def by_id(i: int) -> Any:
        return await saver.aget_tuple(_config(ids[(i * stride) % len(ids)]))

    async def list_all(i: int) -> int:
        seen = 0
        async for _ in saver.alist(_config()):
            seen += 1
        return seen

    async def page(i: int) -> int:
        return len([t async for t in saver.alist(_config(), before=before, limit=PAGE)])

    async def newest(i: int) -> int:
        return len([t async for t in saver.alist(_config(), limit=10)])

    return {
        LATEST: latest,
        BY_ID: by_id,
        LIST_ALL: list_all,
        LIST_10: newest,
        before_op(settings.before_at): page,
    }


async def check_reads(subject: Subject, settings: Settings, size: int) -> dict[str, str]:
    """Each read once, against the ids put; op -> what is wrong."""
    saver, ids = subject.handle, subject.ids
    problems: dict[str, str] = {}
    if len(ids) != size:
        ops = (LATEST, BY_ID, LIST_ALL, LIST_10, before_op(settings.before_at))
        return dict.fromkeys(ops, f"{len(ids)} of {size} puts acknowledged")
    got = await saver.aget_tuple(_config())
    if got is None or got.config["configurable"]["checkpoint_id"] != ids[-1]:
        problems[LATEST] = "not the last checkpoint put"
    elif got.checkpoint["channel_values"].get("state") != make_state(size - 1):
        problems[LATEST] = "the last checkpoint's state differs from what was put"
    got = await saver.aget_tuple(_config(ids[size // 3]))
    if got is None or got.checkpoint["channel_values"].get("state") != make_state(size // 3):
        problems[BY_ID] = "by id: not the checkpoint put under that id"
    listed = [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(_config())]
    if listed != ids[::-1]:
        problems[LIST_ALL] = f"{len(listed)} listed, not the {size} put, newest first"
    newest = [
        t.config["configurable"]["checkpoint_id"] async for t in saver.alist(_config(), limit=10)
    ]
    if newest != ids[::-1][:10]:
        problems[LIST_10] = "not the 10 newest, newest first"
    at = settings.before_at - 1
    before = _config(ids[at])
    page = [
        t.config["configurable"]["checkpoint_id"]
        async for t in saver.alist(_config(), before=before, limit=PAGE)
    ]
    if page != ids[at - PAGE : at][::-1]:
        problems[before_op(settings.before_at)] = "not the 20 checkpoints just older"
    return problems


def _sqlite_files(directory: Path) -> dict[str, Any]:
    """Checkpoint the WAL into the database and truncate it, then sum the files; and
    where the bytes are, per table and index (SQLite's ``dbstat``, when compiled in)."""
    objects: dict[str, list[int]] = {}  # name -> [bytes of its pages, payload bytes]
    for db in directory.glob("*.db"):
        conn = sqlite3.connect(db)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            try:
                rows = conn.execute(
                    "SELECT name, sum(pgsize), sum(payload) FROM dbstat GROUP BY name "
                    "ORDER BY 2 DESC"
                ).fetchall()
                objects.update({str(n): [int(size), int(used)] for n, size, used in rows})
            except sqlite3.OperationalError:
                pass  # no dbstat in this build: the files' sizes still stand
        finally:
            conn.close()
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
    return {"total": sum(files.values()), "files": files, "objects": objects}


# -- running -----------------------------------------------------------------------


async def _measure(
    results: Results,
    phase: str,
    ops: dict[tuple[str, str], Op],
    budget: Budget,
    warmup: int = 1,
) -> None:
    results.mark_load(phase)
    results.say(f"measure {phase}: {len(ops)} workloads, interleaved")
    keyed = {f"{s}\t{o}": fn for (s, o), fn in ops.items()}
    measured = await measure_round_robin(keyed, budget, warmup=warmup)
    for key, value in measured.items():
        name, op = key.split("\t")
        cell = results.ops.setdefault(name, {})
        if isinstance(value, str):
            cell[op] = {"error": value}
            results.say(f"  {name} {op}: ERROR {value}")
        elif value:
            stat = Stat.of(value)
            cell[op] = {"stat": stat.as_dict()}
            results.say(f"  {name} {op}: {format_stat(stat)} (n={len(value)})")
        else:
            cell[op] = {"error": "no samples"}


async def _open_all(
    openers: list[tuple[str, Callable[[Path], Awaitable[Subject]]]],
    workdir: Path,
    results: Results,
) -> list[Subject]:
    subjects = []
    for name, opener in openers:
        try:
            subject = await opener(workdir)
        except (StoreUnavailable, ImportError, OSError) as exc:
            results.subjects[name] = {"unavailable": f"{type(exc).__name__}: {exc}"}
            results.say(f"skip {name}: {exc}")
            continue
        results.subjects[name] = subject.facts
        subjects.append(subject)
        results.say(f"opened {name}: {subject.facts.get('setting', '')}")
    return subjects


async def _close_all(subjects: list[Subject], results: Results) -> None:
    for subject in subjects:
        try:
            await subject.close()
        except Exception as exc:  # cleanup must not hide the run's own error
            results.say(f"cleanup of {subject.name} failed: {exc}")


async def run_langgraph(settings: Settings, workdir: Path, results: Results) -> None:
    openers: list[tuple[str, Callable[[Path], Awaitable[Subject]]]] = []
    if settings.wants("sqlite"):
        openers += [(SK_SQLITE, open_sk_sqlite), (LG_SQLITE, open_lg_sqlite)]
        openers += [
            (SK_SQLITE_FAST, open_sk_sqlite_fast),
            (LG_SQLITE_NORMAL, open_lg_sqlite_normal),
        ]
    if settings.wants("postgres"):
        if settings.postgres:
            openers += [(SK_PG, open_sk_pg), (LG_PG, open_lg_pg)]
        else:
            results.say("PostgreSQL left out: STATEKEEPER_TEST_POSTGRES_URL is not set")
    if not openers:
        return
    checkpoints = make_checkpoints(settings.size)
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    _, blob = JsonPlusSerializer().dumps_typed(checkpoints[-1][1])
    results.meta["checkpoint_bytes"] = len(blob)
    subjects = await _open_all(openers, workdir, results)
    try:
        # the build is the aput measurement: every put timed, one per saver per round
        everyone = Budget(reps=settings.size - 1, seconds=float("inf"), min_reps=1)
        await _measure(
            results,
            f"aput x{settings.size:,}",
            {(s.name, APUT): put_op(s, checkpoints) for s in subjects},
            everyone,
        )
        # pending writes of the first checkpoints, each a task's first writes, as a
        # graph step makes them (the reads below then return them too)
        writes = Budget(reps=settings.writes, seconds=float("inf"), min_reps=1)
        await _measure(
            results,
            f"aput_writes x{settings.writes:,}",
            {(s.name, APUT_WRITES): writes_op(s) for s in subjects},
            writes,
        )
        broken = {s.name: await check_reads(s, settings, settings.size) for s in subjects}
        ops: dict[tuple[str, str], Op] = {}
        for subject in subjects:
            for op, fn in read_ops(subject, settings).items():
                problem = broken[subject.name].get(op)
                if problem:
                    results.ops.setdefault(subject.name, {})[op] = {"error": f"wrong: {problem}"}
                    results.say(f"  {subject.name} {op}: WRONG ANSWER: {problem}")
                else:
                    ops[(subject.name, op)] = fn
        await _measure(results, "LangGraph reads", ops, settings.read_budget)
        await _measure(
            results,
            f"{GRAPH} ({GRAPH_STEPS} steps, a new thread per run)",
            {(s.name, GRAPH): graph_op(s) for s in subjects},
            settings.graph_budget,
        )
        for subject in subjects:
            if "size_sql" in subject.facts:
                results.sizes[subject.name] = {"total": await _pg_size(subject.facts["size_sql"])}
    finally:
        await _close_all(subjects, results)
    for subject in subjects:
        if subject.directory is not None:
            results.sizes[subject.name] = _sqlite_files(subject.directory)
            results.say(f"size {subject.name}: {results.sizes[subject.name]}")


async def _pg_size(sql: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(_libpq_url())
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()
