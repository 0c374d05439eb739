"""Issue 16's targets: statekeeper's PostgreSQL store against LangGraph's
``AsyncPostgresSaver`` on the same server and database, in one run.

**Saves from writer processes.** A pool of writer processes (as many as the largest
level, 16 by default) is started once; each opens its own statekeeper store
(``durability="full"``, the run's own ``table_prefix``, ``pool_size=2``) and its own
``AsyncPostgresSaver`` (``from_conn_string``: one autocommit connection, in the
run's own schema), and warms both up with :data:`WARMUP` saves to a stream of its own.
In each of ``rounds`` rounds, at each level (1, 4, 16) and for
each side (the order alternates per round), the first N writers start at the same
instant (a shared ``CLOCK_MONOTONIC`` deadline) and save for ``seconds``, one save
after another, each to its own stream: statekeeper ``store.save`` of the ~1 KB
:func:`~skbench.payload.make_state` against ``aput`` of a checkpoint holding the same
state in one channel, its parent the previous one. Saves per second are the saves
acknowledged over the wall time to the last writer's last save; latencies are every
save's own. Afterwards every writer stream is counted on both sides, against the
saves acknowledged.

**Reads.** The parent builds one stream of ``size`` checkpoints on each side
(statekeeper ``save_many`` batches through a ``durability="fast"`` handle; LangGraph
``aput`` with ``synchronous_commit`` off for the build only), ANALYZEs both, checks
each read once against the ids, then times in interleaved rounds: ``get_latest``
against ``aget_tuple`` of the latest, and a page of 20 from the middle
(``list(after=cursor)`` with the cursor made beforehand, as a paging reader holds it)
against ``alist(config, before=<config of that id>, limit=20)``, both over
:data:`ROTATE` neighbouring ids.

Everything it made is dropped at the end: our tables by prefix, LangGraph's schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from .adapters.langgraph_peers import _libpq_url, next_put
from .adapters.statekeeper_stores import POSTGRES_URL, _reachable
from .integrations import Results, _measure, drop_tables_like
from .payload import make_state
from .timing import Budget

SK = "statekeeper postgresql"
LG = "AsyncPostgresSaver"
SIDES = (SK, LG)
READS = "pg-reads"
PAGE = 20
ROTATE = 10
BUILD_BATCH = 1000
POOL_SIZE = 2
WARMUP = 5  # saves per side per writer before the first measured cell

SAVE = 'save (durability="full")'
APUT = "aput"
LATEST = "get_latest"
LATEST_TUPLE = "aget_tuple (latest)"


def middle_op(size: int) -> str:
    return f"middle page of {PAGE} @" + (f"{size // 1000}k" if size % 1000 == 0 else f"{size:,}")


@dataclass
class PgSettings:
    writers: tuple[int, ...]
    seconds: float
    rounds: int
    size: int
    read_budget: Budget


@dataclass
class PgResults(Results):
    """:class:`skbench.integrations.Results` plus the writer runs."""

    writers: dict[str, Any] = field(default_factory=dict)


def _config(stream: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": stream, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def conninfo(schema: str) -> str:
    """psycopg's URL for LangGraph, its tables in ``schema`` (their names are fixed)."""
    return f"{_libpq_url()}?options=-csearch_path%3D{schema}"


async def open_sk(prefix: str, durability: str = "full") -> Any:
    import statekeeper

    store = statekeeper.open_store(
        POSTGRES_URL, durability=durability, table_prefix=prefix, pool_size=POOL_SIZE
    )
    await store.open()
    return store


# -- the writer processes ------------------------------------------------------------------


async def _writer(index: int, conn: Any, prefix: str, schema: str) -> None:
    from contextlib import AsyncExitStack

    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    store = await open_sk(prefix)
    stack = AsyncExitStack()
    saver = await stack.enter_async_context(AsyncPostgresSaver.from_conn_string(conninfo(schema)))
    heads: dict[str, tuple[str, str | None]] = {}
    stream = f"pg-writer-{index:02d}"
    step = index * 10_000_000
    # warm up both sides (connections opened, statements prepared) on a stream of
    # its own, so the first measured cell does not pay for that
    warm = f"pg-warm-{index:02d}"
    for n in range(WARMUP):
        await store.save(warm, make_state(n))
        await saver.aput(*next_put(saver, heads, warm, n))
    import statekeeper

    conn.send({"ready": index, "statekeeper": statekeeper.__file__})
    try:
        while True:
            command = conn.recv()
            if command[0] == "stop":
                return
            _, side, start_at, seconds = command
            latencies: list[float] = []
            errors: list[str] = []
            await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
            deadline = start_at + seconds
            while time.perf_counter() < deadline:
                step += 1
                if side == SK:
                    state = make_state(step)
                    t0 = time.perf_counter()
                    try:
                        await store.save(stream, state)
                    except Exception as exc:  # counted and reported
                        errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                else:
                    args = next_put(saver, heads, stream, step)
                    t0 = time.perf_counter()
                    try:
                        await saver.aput(*args)
                    except Exception as exc:
                        errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                latencies.append(time.perf_counter() - t0)
            conn.send(
                {
                    "latencies": latencies,
                    "end": time.perf_counter(),
                    "errors": errors[:3],
                    "error_count": len(errors),
                }
            )
    finally:
        await stack.aclose()
        await store.close()


def _writer_entry(index: int, conn: Any, prefix: str, schema: str) -> None:
    try:
        asyncio.run(_writer(index, conn, prefix, schema))
    except BaseException as exc:
        conn.send({"fatal": f"{type(exc).__name__}: {exc}"})
        raise


class WriterPool:
    """``count`` writer processes, started once and driven round after round."""

    def __init__(self, count: int, prefix: str, schema: str) -> None:
        ctx = mp.get_context("spawn")
        self.conns = []
        self.processes = []
        for index in range(count):
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_writer_entry, args=(index, child, prefix, schema))
            process.start()
            self.conns.append(parent)
            self.processes.append(process)
        self.modules = set()
        for conn in self.conns:
            if not conn.poll(180):
                raise RuntimeError("a writer process did not start within 180 s")
            hello = conn.recv()
            if "fatal" in hello:
                raise RuntimeError(f"a writer process failed to start: {hello['fatal']}")
            self.modules.add(hello["statekeeper"])

    def run(self, side: str, writers: int, seconds: float) -> dict[str, Any]:
        start_at = time.perf_counter() + 0.3
        for conn in self.conns[:writers]:
            conn.send(("run", side, start_at, seconds))
        reports = []
        for conn in self.conns[:writers]:
            if not conn.poll(seconds + 120):
                raise RuntimeError("a writer did not report within 120 s of its deadline")
            reports.append(conn.recv())
        fatal = [r["fatal"] for r in reports if "fatal" in r]
        if fatal:
            raise RuntimeError(fatal[0])
        latencies = [x for r in reports for x in r["latencies"]]
        wall = max(r["end"] for r in reports) - start_at
        return {
            "saves": len(latencies),
            "wall": wall,
            "rate": len(latencies) / wall if wall > 0 else 0.0,
            "p50": statistics.median(latencies) if latencies else None,
            "p90": statistics.quantiles(latencies, n=10)[-1] if len(latencies) > 1 else None,
            "errors": sum(r["error_count"] for r in reports),
            "first_error": next((e for r in reports for e in r["errors"]), None),
        }

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for process in self.processes:
            process.join(timeout=60)
            if process.is_alive():
                process.terminate()


async def run_writers(settings: PgSettings, prefix: str, schema: str, results: PgResults) -> None:
    results.mark_load("writers")
    pool = await asyncio.to_thread(WriterPool, max(settings.writers), prefix, schema)
    results.writers["modules"] = sorted(pool.modules)
    try:
        for r in range(settings.rounds):
            for writers in settings.writers:
                order = SIDES if r % 2 == 0 else SIDES[::-1]
                for side in order:
                    cell = results.writers.setdefault(side, {}).setdefault(str(writers), [])
                    try:
                        got = await asyncio.to_thread(pool.run, side, writers, settings.seconds)
                    except Exception as exc:  # reported, the run goes on
                        cell.append({"error": f"{type(exc).__name__}: {exc}"})
                        results.say(f"  {side} x{writers}: ERROR {exc}")
                        continue
                    cell.append(got)
                    p90 = f"{got['p90'] * 1e3:.2f} ms" if got["p90"] else "-"
                    results.say(
                        f"  {side} x{writers} round {r + 1}: {got['rate']:,.0f} saves/s, "
                        f"p90 {p90}, {got['errors']} errors"
                    )
    finally:
        await asyncio.to_thread(pool.close)


async def count_writes(settings: PgSettings, prefix: str, schema: str, results: PgResults) -> None:
    """Every writer stream counted on both sides, against the saves acknowledged."""
    import psycopg

    acked = {
        side: sum(
            run.get("saves", 0) for runs in results.writers.get(side, {}).values() for run in runs
        )
        for side in SIDES
    }
    store = await open_sk(prefix)
    found_sk = 0
    try:
        for index in range(max(settings.writers)):
            cursor = None
            while True:
                page = await store.list(
                    f"pg-writer-{index:02d}", limit=1000, after=cursor, include_state=False
                )
                found_sk += len(page.items)
                cursor = page.next_cursor
                if cursor is None:
                    break
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(conninfo(schema), autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id LIKE 'pg-writer-%'"
        )
        row = await cur.fetchone()
        found_lg = int(row[0]) if row else 0
    results.writers["counts"] = {
        SK: {"acknowledged": acked[SK], "found": found_sk},
        LG: {"acknowledged": acked[LG], "found": found_lg},
    }
    results.say(f"counted: {results.writers['counts']}")


# -- the reads ----------------------------------------------------------------------------


async def run_reads(settings: PgSettings, prefix: str, schema: str, results: PgResults) -> None:
    from contextlib import AsyncExitStack

    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    from statekeeper import NewCheckpoint

    results.mark_load("build")
    fast = await open_sk(prefix, "fast")
    store = await open_sk(prefix)
    stack = AsyncExitStack()
    try:
        saver = await stack.enter_async_context(
            AsyncPostgresSaver.from_conn_string(conninfo(schema))
        )
        started = time.perf_counter()
        sk_ids: list[str] = []
        for start in range(0, settings.size, BUILD_BATCH):
            items = [
                NewCheckpoint(stream=READS, state=make_state(n))
                for n in range(start, min(start + BUILD_BATCH, settings.size))
            ]
            sk_ids += [cp.id for cp in await fast.save_many(items)]
        results.subjects[SK]["build_s"] = time.perf_counter() - started
        started = time.perf_counter()
        heads: dict[str, tuple[str, str | None]] = {}
        lg_ids: list[str] = []
        await saver.conn.execute("SET synchronous_commit TO off")
        try:
            for n in range(settings.size):
                args = next_put(saver, heads, READS, n)
                await saver.aput(*args)
                lg_ids.append(str(args[1]["id"]))
        finally:
            await saver.conn.execute("RESET synchronous_commit")
        results.subjects[LG]["build_s"] = time.perf_counter() - started
        results.say(
            f"built {settings.size:,} on each side "
            f"({results.subjects[SK]['build_s']:.0f} s / {results.subjects[LG]['build_s']:.0f} s)"
        )
        import asyncpg  # type: ignore[import-untyped]

        admin = await asyncpg.connect(_libpq_url())
        try:
            rows = await admin.fetch(
                "SELECT schemaname, tablename FROM pg_tables WHERE tablename LIKE $1 "
                "OR schemaname = $2",
                prefix.replace("_", r"\_") + "%",
                schema,
            )
            for row in rows:
                await admin.execute(f'ANALYZE "{row["schemaname"]}"."{row["tablename"]}"')
        finally:
            await admin.close()

        mid = settings.size // 2
        at = [mid + r for r in range(ROTATE)]
        cursors = [await store.cursor_at(sk_ids[i]) for i in at]
        befores = [_config(READS, lg_ids[i]) for i in at]
        # each read once, against the ids, before timing
        problems: dict[tuple[str, str], str] = {}
        latest = await store.get_latest(READS)
        if latest is None or latest.id != sk_ids[-1]:
            problems[(SK, LATEST)] = "not the last checkpoint saved"
        got = await saver.aget_tuple(_config(READS))
        if got is None or got.config["configurable"]["checkpoint_id"] != lg_ids[-1]:
            problems[(LG, LATEST_TUPLE)] = "not the last checkpoint put"
        page = [c.id for c in (await store.list(READS, limit=PAGE, after=cursors[0])).items]
        if page != sk_ids[at[0] - PAGE : at[0]][::-1]:
            problems[(SK, middle_op(settings.size))] = "not the 20 just older"
        theirs = [
            t.config["configurable"]["checkpoint_id"]
            async for t in saver.alist(_config(READS), before=befores[0], limit=PAGE)
        ]
        if theirs != lg_ids[at[0] - PAGE : at[0]][::-1]:
            problems[(LG, middle_op(settings.size))] = "not the 20 just older"

        async def sk_latest(i: int) -> Any:
            return await store.get_latest(READS)

        async def lg_latest(i: int) -> Any:
            return await saver.aget_tuple(_config(READS))

        async def sk_middle(i: int) -> int:
            return len((await store.list(READS, limit=PAGE, after=cursors[i % ROTATE])).items)

        async def lg_middle(i: int) -> int:
            return len(
                [
                    t
                    async for t in saver.alist(
                        _config(READS), before=befores[i % ROTATE], limit=PAGE
                    )
                ]
            )

        ops = {
            (SK, LATEST): sk_latest,
            (LG, LATEST_TUPLE): lg_latest,
            (SK, middle_op(settings.size)): sk_middle,
            (LG, middle_op(settings.size)): lg_middle,
        }
        for key, problem in problems.items():
            results.ops.setdefault(key[0], {})[key[1]] = {"error": f"wrong: {problem}"}
            results.say(f"  {key[0]} {key[1]}: WRONG ANSWER: {problem}")
            ops.pop(key)
        await _measure(results, "reads", ops, settings.read_budget)
    finally:
        await stack.aclose()
        await store.close()
        await fast.close()


# -- the run --------------------------------------------------------------------------------


async def _server_settings() -> str:
    import asyncpg

    conn = await asyncpg.connect(_libpq_url())
    try:
        names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "commit_delay")
        return ", ".join([f"{n}={await conn.fetchval(f'SHOW {n}')}" for n in names])
    finally:
        await conn.close()


async def cleanup(prefix: str, schema: str, results: PgResults) -> None:
    import asyncpg

    conn = await asyncpg.connect(_libpq_url())
    try:
        await drop_tables_like(conn, prefix)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
    results.say(f"dropped our tables {prefix}* and LangGraph's schema {schema}")


async def run(settings: PgSettings, results: PgResults) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    _reachable(POSTGRES_URL)
    results.mark_load("start")
    prefix = f"skpg{secrets.token_hex(4)}_"
    schema = f"lgpg_{secrets.token_hex(4)}"
    results.meta["server"] = await _server_settings()
    import asyncpg

    admin = await asyncpg.connect(_libpq_url())
    try:
        await admin.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await admin.close()
    try:
        # the tables are made once, here, before any writer opens them
        store = await open_sk(prefix)
        results.subjects[SK] = {
            "backend": type(store).__name__,
            "setting": f'durability="full", table_prefix={prefix}, pool_size={POOL_SIZE}',
        }
        await store.close()
        async with AsyncPostgresSaver.from_conn_string(conninfo(schema)) as saver:
            await saver.setup()
        results.subjects[LG] = {
            "setting": f"from_conn_string defaults (autocommit, one connection), schema {schema}"
        }
        await run_writers(settings, prefix, schema, results)
        await count_writes(settings, prefix, schema, results)
        await run_reads(settings, prefix, schema, results)
        results.mark_load("end")
    finally:
        await cleanup(prefix, schema, results)
