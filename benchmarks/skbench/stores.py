"""The stores' own workloads: single saves against the peers and the bare floors,
reads and listings at each size, group commit, writer processes, and batch,
positional and filtered access.

Names: ``save/<subject>``, ``<read>@<size>/<subject>``, ``group@<tasks>/<subject>``
(time per save, ``tasks`` saving at once, each to its own stream),
``writers@<processes>/<subject>`` (time per save, processes saving at once) and
``api/<workload>/<subject>``. The floors are subjects of ``save/`` too:
``floor-durable-write`` (temp file, write, fsync, rename, fsync the directory),
``floor-plain-write`` (the same, no fsync), ``floor-sqlite-FULL`` and
``floor-sqlite-NORMAL`` (``BEGIN IMMEDIATE; INSERT; COMMIT`` in WAL mode); and
``read/floor-redis-ping``, one round trip to Redis.

``hop/worker-run`` and ``hop/to_thread``: a round trip to a worker thread and back
with no work, through statekeeper's own worker (``Worker.run``, the door of every
store thread) and through ``asyncio.to_thread``. ``wal-frames/<subject>`` is a count,
not a timing: the WAL frames one commit appends, on our SQLite store, LangGraph's
``SqliteSaver`` and the bare transaction at FULL.

The reads run at :func:`sizes`; with ``large`` (opt-in, slow) also at :func:`large_size`,
the stores and LangGraph's savers but not Agent Framework's (whose reads load every
checkpoint of the workflow).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from .harness import Context, Op, Workload, checked
from .payload import make_state
from .subjects import MAIN, NEEDS, REDIS_URL, SUBJECTS, Subject

OURS = ("memory", "file-full", "file-fast", "sqlite-full", "sqlite-fast", "postgresql-full")
READERS = ("memory", "file-full", "sqlite-full", "postgresql-full", "redis")
PEERS = ("InMemorySaver", "SqliteSaver", "AsyncSqliteSaver", "AsyncPostgresSaver")
AF = ("AF-InMemory", "AF-File")
#: Subjects read at the small size, the others at the large one (a server round trip
#: per row; a peer that reads every file of the workflow per call).
SMALL_ONLY = ("postgresql-full", "redis", "AsyncPostgresSaver", "AF-File")
FLOORS = ("floor-durable-write", "floor-plain-write", "floor-sqlite-FULL", "floor-sqlite-NORMAL")
READS = ("get_latest", "load", "first_page", "middle_page", "list_all")


#: The opt-in read size (``--large``).
LARGE = 100_000


def sizes(quick: bool) -> tuple[int, ...]:
    return (120,) if quick else (1_000, 10_000)


def large_size(quick: bool) -> int:
    return 1_200 if quick else LARGE


async def record_bytes() -> bytes:
    """The bytes statekeeper stores for one ~1 KB state (what the floors write)."""
    import statekeeper

    async with statekeeper.open_store("memory://") as store:
        cp = await store.save(MAIN, make_state(1), metadata={"step": 1})
        return bytes(await store.backdoor_read_raw(cp.id))


def durable_write(directory: Path, data: bytes, sync: bool = True) -> Op:
    """A new file each call: temp file, write, fsync, rename, fsync of the directory
    (without either fsync when ``sync`` is false)."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    names = itertools.count()

    async def op() -> None:
        i = next(names)
        tmp = directory / f".{i}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, directory / f"{i}.rec")
        if sync:
            os.fsync(dir_fd)

    return op


def sqlite_transaction(path: Path, synchronous: str, data: bytes) -> Op:
    """``BEGIN IMMEDIATE; INSERT; COMMIT`` in WAL mode at ``synchronous``."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (seq INTEGER PRIMARY KEY, stream TEXT, data BLOB)")

    async def op() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (stream, data) VALUES (?, ?)", (MAIN, data))
        conn.execute("COMMIT")

    return op


FLOOR_DB = "floor.db"


async def floor(place: Path, name: str) -> Op:
    """The floor ``name`` (one of :data:`FLOORS`) writing into the directory ``place``
    (a SQLite floor: into its database :data:`FLOOR_DB`)."""
    data = await record_bytes()
    if name.startswith("floor-sqlite-"):
        return sqlite_transaction(place / FLOOR_DB, name.rsplit("-", 1)[1], data)
    return durable_write(place, data, sync=name == "floor-durable-write")


def _noop() -> None:
    """The work of a hop: none."""


def _hop(kind: str) -> Workload:
    """One round trip to a thread and back, running :func:`_noop` there."""

    async def make(ctx: Context) -> Op:
        if kind == "to_thread":

            async def to_thread() -> None:
                await asyncio.to_thread(_noop)

            return to_thread
        from statekeeper._runtime.worker import Worker

        worker = Worker("skbench-hop")

        async def stop() -> None:
            worker.stop()

        ctx.closers.append(stop)

        async def run() -> None:
            await worker.run(_noop)

        return run

    return Workload(f"hop/{kind}", make)


WAL_HEADER, FRAME_HEADER = 32, 24
#: Commits counted per subject.
WAL_COMMITS = 50


def frames_per_commit(wal_bytes: int, page_size: int, reported: int, commits: int) -> float:
    """WAL frames per commit over ``commits`` commits from an empty WAL: its size
    after them (``wal_bytes``, a 32-byte header and frames of ``page_size`` + 24
    bytes) must hold exactly the frames SQLite reports (``reported``, the log frames
    of ``PRAGMA wal_checkpoint``). Raises ``ValueError`` if the size is not whole
    frames, or if the two counts differ: a checkpoint restarted the WAL from its
    start meanwhile, and the file is larger than the frames it holds."""
    if commits <= 0:
        raise ValueError("no commits to count frames over")
    body = wal_bytes - WAL_HEADER if wal_bytes else 0
    frames, rest = divmod(body, page_size + FRAME_HEADER)
    if body < 0 or rest:
        raise ValueError(f"a WAL of {wal_bytes} bytes is not whole frames of {page_size}")
    if frames != reported:
        raise ValueError(f"the WAL file holds {frames} frames, SQLite reports {reported}")
    return frames / commits


async def count_wal_frames(db: Path, commit: Op, commits: int = WAL_COMMITS) -> float:
    """Frames per commit of ``commit`` (one transaction on the WAL-mode database
    ``db``), called ``commits`` times after a TRUNCATE checkpoint emptied the WAL
    (see :func:`frames_per_commit`). A connection of its own empties the WAL, then
    holds a read transaction open on the database file while the commits run: no
    checkpoint can copy a frame back meanwhile (SQLite's automatic one, or a
    store's own), so none can start the WAL over, and it holds every frame."""
    wal = db.with_name(db.name + "-wal")
    observer = sqlite3.connect(db, isolation_level=None)
    try:
        page_size = observer.execute("PRAGMA page_size").fetchone()[0]
        if observer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
            raise RuntimeError(f"{db.name}: the WAL could not be emptied (busy)")
        observer.execute("BEGIN")
        observer.execute("SELECT count(*) FROM sqlite_master").fetchone()
        try:
            for _ in range(commits):
                await commit()
        finally:
            observer.execute("COMMIT")
        size = wal.stat().st_size if wal.exists() else 0
        reported = observer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    finally:
        observer.close()
    return frames_per_commit(size, page_size, reported, commits)


def _wal_frames(subject: str) -> Workload:
    async def count(ctx: Context) -> dict[str, tuple[float, str]]:
        if subject.startswith("floor-"):
            place = ctx.place(subject)
            commit, db = await floor(place, subject), place / FLOOR_DB
        else:
            made = await ctx.fresh(subject)
            assert made.place is not None
            commit, db = made.save, next(made.place.glob("*.db"))
        for _ in range(10):  # a few checkpoints there already, as in use
            await commit()
        return {f"wal-frames/{subject}": (await count_wal_frames(db, commit), "integer")}

    return Workload(f"wal-frames/{subject}", count=count, needs=NEEDS.get(subject, ()))


def _redis_ping() -> Workload:
    """One PING through ``redis.asyncio``: the floor of every Redis read."""

    async def make(ctx: Context) -> Op:
        import redis.asyncio as aioredis

        client = aioredis.from_url(REDIS_URL)
        ctx.closers.append(client.aclose)
        return await checked(client.ping, bool, "PING")

    return Workload("read/floor-redis-ping", make, needs=("redis", "redis"))


def _save(subject: str) -> Workload:
    async def make(ctx: Context) -> Op:
        if subject.startswith("floor-"):
            return await floor(ctx.place(subject), subject)
        made = await ctx.fresh(subject)
        await made.fill(10)  # a few checkpoints there already, as in use
        return made.save

    return Workload(f"save/{subject}", make, needs=NEEDS.get(subject, ()))


async def read_op(made: Subject, read: str, size: int) -> Op:
    """The call of ``read`` (one of :data:`READS`) on ``made``, a fixture of ``size``,
    checked once: the latest and a loaded checkpoint exist, a page holds 20, a
    listing the whole stream."""
    if read == "get_latest":
        return await checked(made.get_latest, lambda cp: cp is not None, read)
    if read == "load":
        ident = made.ids[len(made.ids) // 3]

        async def load() -> Any:
            return await made.load(ident)

        return await checked(load, lambda cp: cp is not None, read)
    want = size if read == "list_all" else 20
    return await checked(getattr(made, read), lambda n: n == want, read)


def _read(read: str, size: int, subject: str) -> Workload:
    async def make(ctx: Context) -> Op:
        return await read_op(await ctx.fixture(subject, size), read, size)

    heavy = read == "list_all" or subject in SMALL_ONLY or size >= LARGE
    return Workload(f"{read}@{size}/{subject}", make, needs=NEEDS.get(subject, ()), heavy=heavy)


def _group(tasks: int, subject: str) -> Workload:
    async def make(ctx: Context) -> Op:
        made = await ctx.fresh(subject)
        streams = [f"group-{i}" for i in range(tasks)]
        steps = itertools.count()

        async def op() -> None:
            await asyncio.gather(*(made.put(s, next(steps)) for s in streams))

        await op()  # one warm-up save per task
        return op

    return Workload(f"group@{tasks}/{subject}", make, needs=NEEDS.get(subject, ()), inner=tasks)


SAVES_PER_ROUND = 5


def _writer_main(subject: str, place: str, stream: str, conn: Any) -> None:
    """A writer process: its own handle on the store at ``place``; on each ``go`` it
    saves ``SAVES_PER_ROUND`` checkpoints to ``stream`` and answers."""

    async def main() -> None:
        made: Subject = SUBJECTS[subject]()
        await made.open(Path(place))
        await made.put(stream, 0)
        conn.send("ready")
        steps = itertools.count(1)
        try:
            while conn.recv() == "go":
                for _ in range(SAVES_PER_ROUND):
                    await made.put(stream, next(steps))
                conn.send("done")
        finally:
            await made.close()

    asyncio.run(main())


def _writers(processes: int, subject: str) -> Workload:
    async def make(ctx: Context) -> Op:
        place = ctx.place(f"writers-{subject}")
        first = SUBJECTS[subject]()
        await first.open(place)  # the schema exists before the writers start
        await first.close()
        spawn = multiprocessing.get_context("spawn")
        pipes = []
        for i in range(processes):
            mine, theirs = spawn.Pipe()
            proc = spawn.Process(
                target=_writer_main, args=(subject, str(place), f"writer-{i}", theirs)
            )
            proc.start()
            pipes.append((mine, proc))
        for mine, _ in pipes:
            if mine.recv() != "ready":
                raise RuntimeError("a writer process did not start")

        async def stop() -> None:
            for mine, proc in pipes:
                mine.send("stop")
                proc.join(30)

        ctx.closers.append(stop)

        def round_trip() -> None:
            for mine, _ in pipes:
                mine.send("go")
            for mine, _ in pipes:
                if mine.recv() != "done":
                    raise RuntimeError("a writer process failed")

        async def op() -> None:
            round_trip()  # the workers do the work; this process only waits

        return op

    return Workload(
        f"writers@{processes}/{subject}",
        make,
        needs=NEEDS.get(subject, ()),
        inner=processes * SAVES_PER_ROUND,
        heavy=True,
    )


# -- batch, positional and filtered access (our stores only) --------------------------


def _api(workload: str, subject: str, size: int) -> Workload:
    async def make(ctx: Context) -> Op:
        import statekeeper

        # save_many on a store of its own: the fixture stays as built for the reads
        made = await (
            ctx.fresh(subject) if workload == "save_many100" else ctx.fixture(subject, size)
        )
        store = made.store  # type: ignore[attr-defined]
        ids = made.ids
        if workload.startswith("cursor_page"):
            depth = int(workload.split("@")[1])
            ident = ids[-depth]

            async def cursor_page() -> int:
                cursor = await store.cursor_at(ident)
                return len((await store.list(MAIN, limit=20, after=cursor)).items)

            return await checked(cursor_page, lambda n: n == 20, workload)
        if workload == "filtered_page":

            async def filtered() -> int:
                page = await store.list(MAIN, limit=20, metadata={"source": "input"})
                return len(page.items)

            want = min(20, (size + 99) // 100)
            return await checked(filtered, lambda n: n == want, workload)
        hundred = ids[-100:]
        if workload == "load_many100":

            async def many() -> int:
                return len(await store.load_many(hundred))

            return await checked(many, lambda n: n == 100, workload)
        if workload == "load100":

            async def loads() -> int:
                return len([await store.load(i) for i in hundred])

            return await checked(loads, lambda n: n == 100, workload)
        steps = itertools.count(10**6)

        async def save_many() -> int:
            items = [
                statekeeper.NewCheckpoint(stream=MAIN, state=make_state(n), metadata={"step": n})
                for n in itertools.islice(steps, 100)
            ]
            return len(await store.save_many(items))

        return save_many

    return Workload(f"api/{workload}/{subject}", make, needs=NEEDS.get(subject, ()))


def catalogue(quick: bool, large: bool = False) -> list[Workload]:
    """Every store workload, in the order a run takes them: each of ours next to the
    peers and floors it is compared with, so that they are measured close in time;
    ``large`` adds the reads at :func:`large_size`."""
    have = [*OURS, "redis", *PEERS, *AF]
    out = [_save(s) for s in [*have, *FLOORS]]
    out.append(_redis_ping())
    out += [_hop("worker-run"), _hop("to_thread")]
    out += [_wal_frames(s) for s in ("sqlite-full", "SqliteSaver", "floor-sqlite-FULL")]
    small, biggest = sizes(quick)[0], sizes(quick)[-1]
    for size in sizes(quick):
        for read in READS:
            for s in [*READERS, *PEERS, *AF]:
                if (size == small) != (s in SMALL_ONLY) and small != biggest:
                    continue  # the large size, but the server rows and AF-File's at the small
                if read == "list_all" and s == "AF-File" and not quick:
                    continue  # reads every file per call: seconds
                out.append(_read(read, size, s))
    for read in READS if large else ():
        out += [
            _read(read, large_size(quick), s) for s in [*READERS, *PEERS] if s not in SMALL_ONLY
        ]
    for tasks in (1, 8, 64):
        out += [_group(tasks, s) for s in ("sqlite-full", "file-full", "AsyncSqliteSaver")]
    embedded = ("sqlite-full", "file-full", "SqliteSaver", "AsyncSqliteSaver", "AF-File")
    out += [_writers(4, s) for s in embedded]
    for processes in (1, 4) if quick else (1, 4, 16):
        out += [_writers(processes, s) for s in ("postgresql-full", "AsyncPostgresSaver")]
    api_size = sizes(quick)[-1]
    depths = (10, 60) if quick else (1_000, api_size - 1_000)
    for subject in ("memory", "file-full", "sqlite-full", "postgresql-full"):
        out.append(_read("first_page", api_size, subject))
        out += [_api(f"cursor_page@{d}", subject, api_size) for d in depths]
        for workload in ("filtered_page", "load100", "load_many100", "save_many100"):
            out.append(_api(workload, subject, api_size))
    unique = {w.name: w for w in reversed(out)}  # the first of a name keeps its place
    return [w for w in out if unique[w.name] is w]


if sys.platform == "win32":  # pragma: no cover - the floors are POSIX calls
    raise ImportError("the benchmarks run on POSIX systems")
