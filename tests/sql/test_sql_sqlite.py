"""SQLite-specific behaviour of the SQL backend: URLs, locking, crashes, fork, schema."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import statekeeper
from sql_helpers import finish_children, start_children
from statekeeper.backends import sql as sql_module
from statekeeper.backends.sql import SqlCheckpointStore, SqliteCheckpointStore
from statekeeper.backends.sql import migrations as migrations_module
from statekeeper.backends.sql.migrations import MIGRATIONS, Migration
from statekeeper.backends.sql.schema import SCHEMA_VERSION, Tables
from statekeeper.errors import (
    BackendError,
    BackendNotFound,
    InvalidOptions,
    InvalidURL,
    ReadOnlyStore,
    StoreFormatError,
    StoreNotFound,
    StoreTimeout,
)
from statekeeper.testing import FakeClock

#: The version of a test migration one step past this code's schema.
NEXT = SCHEMA_VERSION + 1


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest_asyncio.fixture
async def store(db: Path) -> Any:
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}") as opened:
        yield opened


# -- URLs and options ------------------------------------------------------------------


def test_urls_resolve_to_the_sqlite_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rel = statekeeper.open_store("sqlite:///rel.db")
    assert isinstance(rel, SqliteCheckpointStore)
    assert rel.path == str(tmp_path / "rel.db")  # relative to the cwd at construction
    absolute = statekeeper.open_store(f"sqlite:///{tmp_path}/abs.db")
    assert absolute.describe() == f"sqlite:///{tmp_path}/abs.db"
    assert isinstance(statekeeper.open_store("sqlite+pysqlite:///x.db"), SqliteCheckpointStore)
    opts = statekeeper.open_store("sqlite:///x.db?busy_timeout=2.5&table_prefix=jobs_")
    assert opts.options.busy_timeout == 2.5
    assert "jobs_" in opts.describe()
    direct = SqlCheckpointStore.from_url("sqlite:///x.db?busy_timeout=2.5")
    assert direct.options.busy_timeout == 2.5
    with pytest.raises(InvalidOptions, match="both"):
        SqlCheckpointStore.from_url("sqlite:///x.db?busy_timeout=2.5", busy_timeout=1)


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("sqlite://", InvalidURL),
        ("sqlite:///:memory:", InvalidURL),
        ("sqlite://host/x.db", InvalidURL),
        ("sqlite+nosuchdriver:///x.db", InvalidURL),
        ("sqlite:///x.db?nosuchoption=1", InvalidOptions),
        ("sqlite:///x.db?table_prefix=Bad-Prefix", InvalidOptions),
        ("sqlite:///x.db?table_prefix=", InvalidOptions),
        ("sqlite:///x.db?schema=other", InvalidOptions),
        ("sqlite:///x.db?busy_timeout=0", InvalidOptions),
        ("postgresql://u@h/db?inline_reads=false", InvalidOptions),
        ("mysql://u@h/db?inline_reads=true", InvalidOptions),
    ],
)
def test_bad_urls_and_options_are_refused_at_once(url: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        statekeeper.open_store(url)


@pytest.mark.parametrize(
    "make",
    [
        lambda: statekeeper.open_store("sqlite+aiosqlite:///x.db"),
        lambda: SqlCheckpointStore.from_url("sqlite+aiosqlite:///x.db"),
        lambda: SqliteCheckpointStore("sqlite+aiosqlite:///x.db"),
    ],
)
def test_sqlite_aiosqlite_is_refused_with_the_url_to_write(make: Any) -> None:
    """The runtime is always the stdlib sqlite3 on the store's own threads, so the URL
    must not promise aiosqlite."""
    with pytest.raises(InvalidURL, match=r"stdlib sqlite3.*sqlite:///"):
        make()


@pytest.mark.parametrize(
    ("url", "options", "dialect"),
    [
        ("sqlite:///x.db?listing_wait=1", {}, "PostgreSQL's"),
        ("sqlite:///x.db", {"listing_wait": 0.5}, "PostgreSQL's"),
        ("sqlite:///x.db?schema=other", {}, "PostgreSQL's and MySQL's"),
        ("sqlite:///x.db", {"schema": "other"}, "PostgreSQL's and MySQL's"),
        ("sqlite:///x.db", {"db_schema": "other"}, "PostgreSQL's and MySQL's"),
        # accepted and silently unused before: an option nobody reads is an error
        ("sqlite:///x.db", {"connect_args": {"timeout": 1}}, "PostgreSQL's and MySQL's"),
    ],
)
def test_another_dialects_option_is_refused_naming_that_dialect(
    url: str, options: dict[str, Any], dialect: str
) -> None:
    with pytest.raises(InvalidOptions, match=dialect):
        SqlCheckpointStore.from_url(url, **options)


def test_the_sqlite_store_has_its_own_options_class() -> None:
    from statekeeper.backends.sql.sqlite import SqliteOptions

    store = SqlCheckpointStore.from_url("sqlite:///x.db?inline_reads=false")
    assert isinstance(store.options, SqliteOptions)
    assert store.options.inline_reads is False
    assert SqliteCheckpointStore("sqlite:///x.db").options.inline_reads is True


def test_missing_server_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = sql_module.SqlCheckpointStore  # the driver check only looks the module up
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackendNotFound, match=r"statekeeper\[postgres\]"):
        real.from_url("postgresql://u@h/db")


# -- the file: WAL, synchronous, not-a-database, missing directory ---------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(("durability", "expected"), [("full", 2), ("fast", 1)])
async def test_wal_and_synchronous_follow_durability(
    db: Path, durability: str, expected: int
) -> None:
    store = SqlCheckpointStore.from_url(f"sqlite:///{db}", durability=durability)
    async with store:
        runtime = store._runtime
        assert runtime is not None
        conn = runtime.connect()  # the settings every connection of this store gets
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("PRAGMA synchronous").fetchone()[0] == expected
            assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        finally:
            conn.close()


@pytest.mark.asyncio
async def test_echo_logs_each_statement(db: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="statekeeper.sql")
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}", echo=True) as store:
        await store.save("job", 1)
    assert any("BEGIN IMMEDIATE" in r.getMessage() for r in caplog.records)
    assert any("INSERT INTO statekeeper_checkpoints" in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
async def test_a_file_that_is_not_a_database_is_a_format_error(db: Path) -> None:
    await asyncio.to_thread(db.write_bytes, b"this is not a database" * 100)
    with pytest.raises(StoreFormatError):
        await SqlCheckpointStore.from_url(f"sqlite:///{db}").open()


@pytest.mark.asyncio
async def test_a_missing_directory_is_a_backend_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="does not exist"):
        await SqlCheckpointStore.from_url(f"sqlite:///{tmp_path}/nope/store.db").open()


# -- errors: busy timeout and driver errors --------------------------------------------


@pytest.mark.asyncio
async def test_busy_timeout_runs_out_as_store_timeout(store: SqlCheckpointStore, db: Path) -> None:
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process's writer, holding the lock
    try:
        slow = SqlCheckpointStore.from_url(f"sqlite:///{db}", busy_timeout=0.2)
        async with slow:
            started = time.monotonic()
            with pytest.raises(StoreTimeout) as caught:
                await slow.save("job", {"n": 1})
            assert 0.15 < time.monotonic() - started < 5
            assert isinstance(caught.value.orig, sqlite3.OperationalError)
            assert caught.value.retryable
            assert await slow.list_streams() == []  # reads never wait in WAL mode
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert (await store.save("job", {"n": 2})).sequence == 1  # nothing was half-written


@pytest.mark.asyncio
async def test_driver_errors_are_backend_errors_with_orig(
    store: SqlCheckpointStore, db: Path
) -> None:
    await store.save("job", 1)
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("DROP TABLE statekeeper_tags")  # damage behind the store's back
    raw.close()
    with pytest.raises(BackendError) as caught:
        await store.save("job", 2, tags={"k": "v"})
    assert isinstance(caught.value.orig, sqlite3.OperationalError)
    assert "statekeeper_tags" in str(caught.value)


# -- schema, migrations, prefixes ------------------------------------------------------


@pytest.mark.asyncio
async def test_newer_schema_is_a_format_error(db: Path) -> None:
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}") as first:
        await first.save("job", 1)
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("UPDATE statekeeper_meta SET value = '99' WHERE name = 'schema_version'")
    raw.close()
    with pytest.raises(StoreFormatError, match="schema version 99"):
        await SqlCheckpointStore.from_url(f"sqlite:///{db}").open()


@pytest.mark.asyncio
async def test_foreign_table_with_our_name_is_not_adopted(db: Path) -> None:
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("CREATE TABLE statekeeper_checkpoints (x TEXT)")
    raw.close()
    with pytest.raises(StoreFormatError, match="table_prefix"):
        await SqlCheckpointStore.from_url(f"sqlite:///{db}").open()
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}", table_prefix="mine_") as other:
        assert (await other.save("job", 1)).sequence == 1


@pytest.mark.asyncio
async def test_migrations_run_once_each_in_order_under_concurrent_opens(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}") as v1:
        kept = await v1.save("job", {"n": 1})
    applied: list[int] = []

    def add_index(tables: Tables, ddl: Any) -> None:
        import sqlalchemy as sa

        applied.append(NEXT)
        ix = sa.Index(
            "statekeeper_test_v2", tables.checkpoints.c.expires_at, tables.checkpoints.c.seq
        )
        ddl(sa.schema.CreateIndex(ix, if_not_exists=True))
        tables.checkpoints.indexes.discard(ix)

    step = Migration(NEXT, "test: add an index", add_index)
    monkeypatch.setattr(migrations_module, "MIGRATIONS", (*MIGRATIONS, step))
    stores = [SqlCheckpointStore.from_url(f"sqlite:///{db}") for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        assert applied == [NEXT]
        assert {(await s.info()).format_version for s in stores} == {NEXT}
        assert (await stores[0].load(kept.id)).state == {"n": 1}
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    monkeypatch.setattr(migrations_module, "MIGRATIONS", MIGRATIONS)
    with pytest.raises(StoreFormatError, match="upgrade statekeeper"):
        await SqlCheckpointStore.from_url(f"sqlite:///{db}").open()


@pytest.mark.asyncio
async def test_two_prefixes_in_one_file_are_two_stores(db: Path) -> None:
    async with (
        SqlCheckpointStore.from_url(f"sqlite:///{db}", table_prefix="a_") as a,
        SqlCheckpointStore.from_url(f"sqlite:///{db}", table_prefix="b_") as b,
    ):
        assert a.store_id != b.store_id
        await a.save("job", "in a")
        cp = await b.save("job", "in b")
        assert cp.sequence == 1  # each store has its own counter
        assert [c.state for c in (await a.list("job")).items] == ["in a"]
        assert (await b.get_latest("job")).state == "in b"  # type: ignore[union-attr]
        page = await a.list("job")
        assert page.next_cursor is None
        with pytest.raises(statekeeper.errors.CheckpointNotFound):
            await a.load(cp.id)


@pytest.mark.asyncio
async def test_tag_filters_use_the_tag_indexes(store: SqlCheckpointStore, db: Path) -> None:
    st, compiler = store._st, store._compiler
    raw = sqlite3.connect(db)

    def plan(stmt: Any) -> list[str]:
        sql, binds = compiler(stmt)
        return [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, [d for _, d in binds])]

    try:
        for has_stream, index in [(True, "tags_stream"), (False, "tags_global")]:
            steps = plan(st.scan(has_stream, "desc", True, 2))
            assert any(f"USING INDEX statekeeper_{index}" in step for step in steps), steps
            assert not any(step.startswith("SCAN") for step in steps), steps
        (step,) = plan(st.latest)
        assert "USING INDEX statekeeper_checkpoints_stream_seq (stream=?)" in step
    finally:
        raw.close()


@pytest.mark.asyncio
async def test_purge_gives_the_space_back(db: Path) -> None:
    clock = FakeClock()  # expiry by the store's clock: exact, no wait
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}", clock=clock) as store:
        for i in range(50):
            await store.save("job", {"pad": "x" * 20_000, "i": i}, ttl=1)
        clock.advance(2)
        assert await store.purge_expired() == 50
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
        assert raw.execute("PRAGMA freelist_count").fetchone()[0] == 0
    finally:
        raw.close()


# -- create=False and read_only ----------------------------------------------------------


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.asyncio
@pytest.mark.parametrize("options", [{"create": False}, {"read_only": True}])
async def test_a_missing_file_is_store_not_found_and_nothing_is_created(
    tmp_path: Path, options: dict[str, bool]
) -> None:
    db = tmp_path / "mistyped.db"
    with pytest.raises(StoreNotFound, match=r"mistyped\.db"):
        await SqlCheckpointStore.from_url(f"sqlite:///{db}", **options).open()
    assert _files(tmp_path) == {}
    with pytest.raises(StoreNotFound):
        await SqlCheckpointStore.from_url(f"sqlite:///{tmp_path}/no/such/dir.db", **options).open()
    assert _files(tmp_path) == {}


@pytest.mark.asyncio
@pytest.mark.parametrize("options", [{"create": False}, {"read_only": True}])
async def test_a_database_without_the_store_is_store_not_found_and_left_alone(
    db: Path, options: dict[str, bool]
) -> None:
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("CREATE TABLE theirs (x)")
    raw.close()
    before = _files(db.parent)
    with pytest.raises(StoreNotFound, match="no meta table"):
        await SqlCheckpointStore.from_url(f"sqlite:///{db}", **options).open()
    assert _files(db.parent) == before  # no table, no WAL switch, no -wal file


@pytest.mark.asyncio
async def test_create_false_opens_an_existing_store_for_writing(db: Path) -> None:
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}") as first:
        cp = await first.save("job", 1)
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}", create=False) as again:
        assert await again.get_latest("job") == cp
        assert (await again.save("job", 2)).sequence == 2


@pytest.mark.asyncio
async def test_read_only_reads_and_writes_nothing(db: Path) -> None:
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}") as first:
        cp = await first.save("job", {"n": 1}, tags={"k": "v"})
    # A rollback-journal database: a read-only open must not switch it to WAL.
    raw = sqlite3.connect(db, isolation_level=None)
    assert raw.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    raw.close()
    before = _files(db.parent)
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}", read_only=True) as ro:
        assert await ro.get_latest("job") == cp
        assert (await ro.list("job", tags={"k": "v"})).items == [cp]
        assert (await ro.verify()).ok
        for write in (
            ro.save("job", 2),
            ro.update(cp.id, 3),
            ro.delete(cp.id),
            ro.purge_expired(),
            ro.repair(),
        ):
            with pytest.raises(ReadOnlyStore):
                await write
        # Below the public methods too: the connections themselves refuse to write.
        with pytest.raises(BackendError, match=r"readonly|read-only|query_only"):
            await ro._guard("writing", ro._read(lambda s: s.run(ro._st.set_hwm, {"new_hwm": 99})))
    assert _files(db.parent) == before


@pytest.mark.asyncio
async def test_read_only_never_migrates_an_older_schema(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}") as v1:
        await v1.save("job", 1)
    before = _files(db.parent)
    applied: list[int] = []
    step = Migration(NEXT, "test: a step", lambda tables, ddl: applied.append(NEXT))
    monkeypatch.setattr(migrations_module, "MIGRATIONS", (*MIGRATIONS, step))
    with pytest.raises(StoreFormatError, match="without read_only"):
        await SqlCheckpointStore.from_url(f"sqlite:///{db}", read_only=True).open()
    assert applied == []
    after = _files(db.parent)
    assert after["store.db"] == before["store.db"]
    # What SQLite itself adds to read a WAL database (docs/sql-backend.md): an
    # empty -wal and the -shm index, nothing else, and nothing in the database.
    assert set(after) <= {"store.db", "store.db-wal", "store.db-shm"}
    assert after.get("store.db-wal", b"") == b""


# -- processes: contention, crashes, fork ----------------------------------------------


def test_four_processes_saving_at_once_never_see_locked(tmp_path: Path, db: Path) -> None:
    url = f"sqlite:///{db}"
    # Fresh file: the four also race to create the schema.
    events = finish_children(start_children(url, n=4, saves=200, options={"durability": "fast"}))
    errors = [e for child in events for e in child if "error" in e]
    assert errors == []
    assert len({e["opened"] for child in events for e in child if "opened" in e}) == 1
    seqs = [[e["seq"] for e in child if "seq" in e] for child in events]
    assert all(s == sorted(s) and len(s) == 200 for s in seqs)
    assert sorted(x for s in seqs for x in s) == list(range(1, 801))  # unique, no gaps

    async def check() -> None:
        async with SqlCheckpointStore.from_url(url) as store:
            listed, cursor = [], None
            while True:
                page = await store.list("shared", order="asc", limit=500, after=cursor)
                listed += [cp.sequence for cp in page.items]
                if (cursor := page.next_cursor) is None:
                    break
            assert listed == list(range(1, 801))

    asyncio.run(check())


def _integrity(db: Path) -> str:
    raw = sqlite3.connect(db)
    try:
        return str(raw.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        raw.close()


def test_sigkill_mid_transaction_loses_no_acknowledged_save(tmp_path: Path, db: Path) -> None:
    url = f"sqlite:///{db}"
    acked: dict[str, int] = {}
    rng = random.Random(4)
    for _ in range(3):
        # Large states make each transaction long, so the kill lands inside one.
        (child,) = start_children(url, n=1, saves=10_000, pad=300_000)
        events = child.events()
        got = 0
        while got < 5 + rng.randrange(10):
            event = next(events)
            if "seq" in event:
                acked[event["id"]] = event["seq"]
                got += 1
        time.sleep(rng.random() * 0.02)
        child.kill()
        # Saves acknowledged between the last event read and the kill count too.
        for event in events:
            if "seq" in event:
                acked[event["id"]] = event["seq"]
        assert child.wait() == -signal.SIGKILL
        assert _integrity(db) == "ok"

    async def check() -> None:
        async with SqlCheckpointStore.from_url(url) as store:
            for cp_id, seq in acked.items():
                assert (await store.load(cp_id)).sequence == seq
            info = await store.info()
            assert info.high_water_mark is not None
            assert info.high_water_mark >= max(acked.values())
            assert (await store.save("shared", 1)).sequence > info.high_water_mark

    asyncio.run(check())


def test_a_forked_child_gets_its_own_connections(db: Path) -> None:
    loop = asyncio.new_event_loop()
    store = SqlCheckpointStore.from_url(f"sqlite:///{db}")
    try:
        loop.run_until_complete(store.open())
        parent_cp = loop.run_until_complete(store.save("job", "parent"))
        # the parent's point-read connection exists too: the child must not use it
        assert loop.run_until_complete(store.get_latest("job")) is not None
        pid = os.fork()
        if pid == 0:  # the child: use the inherited store, then leave at once
            code = 1
            try:
                child_loop = asyncio.new_event_loop()
                cp = child_loop.run_until_complete(store.save("job", "child"))
                latest = child_loop.run_until_complete(store.get_latest("job"))
                code = 0 if latest is not None and latest.id == cp.id else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's threads and connections were left alone and still work.
        latest = loop.run_until_complete(store.get_latest("job"))
        assert latest is not None and latest.state == "child"
        assert latest.sequence == parent_cp.sequence + 1
        loop.run_until_complete(store.save("job", "parent again"))
    finally:
        loop.run_until_complete(store.close())
        loop.close()
    assert _integrity(db) == "ok"


@pytest.fixture(autouse=True)
def _no_stray_threads() -> Iterator[None]:
    import threading

    before = {t.ident for t in threading.enumerate()}
    yield
    # Closed stores leave no worker thread behind.
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        stray = [
            t
            for t in threading.enumerate()
            if t.ident not in before and t.name.startswith("statekeeper-sqlite")
        ]
        if not stray:
            return
        time.sleep(0.01)
    raise AssertionError(f"worker threads left running: {stray}")


def _count_reader_hops(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    runtime = store._runtime
    hops: list[object] = []
    read = runtime.read

    async def counted(fn: Any) -> Any:
        hops.append(fn)
        return await read(fn)

    monkeypatch.setattr(runtime, "read", counted)
    return hops


async def _walk_pages(store: Any, hops: list[object], limit: int, per_page: int) -> None:
    """List 25 checkpoints page by page both ways (and filtered): each page costs
    ``per_page`` reader hops (its scan and the probe for its other cursor share one)."""
    for order in ("asc", "desc"):
        first = await store.list("s", limit=limit, order=order)
        second = await store.list("s", limit=limit, order=order, after=first.next_cursor)
        third = await store.list("s", limit=limit, order=order, after=second.next_cursor)
        again = await store.list("s", limit=limit, order=order, before=third.prev_cursor)
        odd = await store.list("s", limit=limit // 2, order=order, tags={"odd": "1"})
        odd2 = await store.list(
            "s", limit=limit // 2, order=order, tags={"odd": "1"}, after=odd.next_cursor
        )
        assert len(hops) == 6 * per_page, (order, len(hops))
        hops.clear()
        states = [cp.state["i"] for p in (first, second, third) for cp in p.items]
        assert states == (list(range(25)) if order == "asc" else list(range(24, -1, -1)))
        assert second.prev_cursor is not None and second.next_cursor is not None
        assert third.prev_cursor is not None and third.next_cursor is None
        assert again.items == second.items and again.prev_cursor and again.next_cursor
        assert [cp.state["i"] % 2 for cp in odd.items + odd2.items] == [1] * 10
        assert odd2.prev_cursor is not None and odd2.has_more


@pytest.mark.asyncio
async def test_a_listed_page_of_up_to_100_takes_no_hop_and_a_larger_one_takes_one(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of up to 100 items is read on the loop's thread, as get_latest is; the
    page scan of a larger limit and the probe that decides its other cursor share one
    reader hop."""
    for i in range(25):
        await store.save("s", {"i": i}, tags={"odd": str(i % 2)})
    hops = _count_reader_hops(store, monkeypatch)
    await _walk_pages(store, hops, limit=10, per_page=0)
    assert len((await store.list("s", limit=100)).items) == 25 and hops == []
    # 100 items ask for 101 rows; 101 items ask for 102, over the inline bound
    assert len((await store.list("s", limit=101)).items) == 25 and len(hops) == 1


@pytest.mark.asyncio
async def test_load_many_of_up_to_100_ids_takes_no_hop(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a page: up to 100 ids are read on the loop's thread, more take the hop;
    missing and deleted ids are left out either way."""
    saved = [await store.save("s", {"i": i}) for i in range(120)]
    assert await store.delete(saved[3].id)
    hops = _count_reader_hops(store, monkeypatch)
    ids = [cp.id for cp in saved[:100]]
    got = await store.load_many([*ids[:99], "no-such-id"])
    assert hops == []
    assert sorted(got) == sorted(i for i in ids[:99] if i != saved[3].id)
    assert got[saved[7].id].state == {"i": 7}
    many = await store.load_many([cp.id for cp in saved])
    assert len(hops) == 1 and len(many) == 119


@pytest.mark.asyncio
async def test_a_page_past_many_expired_rows_is_read_by_a_reader_thread(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page that SQLite must walk thousands of expired (not yet purged) rows for
    would keep the loop for milliseconds: past its budget of operations SQLite
    interrupts it on the loop's connection, and it runs on a reader thread
    instead, with the same answer. Ordinary pages stay on the loop."""
    clock = FakeClock()
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}", clock=clock) as store:
        await _page_past_expired_rows(store, clock, monkeypatch)


async def _page_past_expired_rows(
    store: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statekeeper import NewCheckpoint

    first = await store.save("s", {"i": "first"})
    for start in range(0, 6000, 1000):
        await store.save_many(
            [NewCheckpoint(stream="s", state={"i": i}, ttl=60) for i in range(start, start + 1000)]
        )
    clock.advance(61)  # expired by the store's clock, and still there
    live = [await store.save("s", {"i": f"live {n}"}) for n in range(3)]
    hops = _count_reader_hops(store, monkeypatch)
    page = await store.list("s", limit=5)
    want = [cp.id for cp in reversed(live)] + [first.id]
    assert [cp.id for cp in page.items] == want and len(hops) == 1
    hops.clear()
    assert (await store.get_latest("s")).id == live[-1].id  # type: ignore[union-attr]
    # two items and the row that says there is more: no expired row to walk past
    page = await store.list("s", limit=2)
    assert [cp.id for cp in page.items] == want[:2] and page.has_more
    assert hops == []


@pytest.mark.asyncio
async def test_inline_reads_false_sends_pages_to_the_reader_threads(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}?inline_reads=false") as store:
        for i in range(25):
            await store.save("s", {"i": i}, tags={"odd": str(i % 2)})
        hops = _count_reader_hops(store, monkeypatch)
        await _walk_pages(store, hops, limit=10, per_page=1)


# -- point reads on the event loop's thread -------------------------------------------------


@pytest.mark.asyncio
async def test_get_latest_and_load_run_on_the_loop_thread_and_see_every_commit(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = _count_reader_hops(store, monkeypatch)
    first = await store.save("job", {"n": 1})
    assert (await store.get_latest("job")).id == first.id
    # a save committed on the writer thread is seen by the loop's own connection at once
    for n in range(2, 6):
        cp = await store.save("job", {"n": n})
        latest = await store.get_latest("job")
        assert (latest.id, latest.state) == (cp.id, {"n": n})
        assert (await store.load(first.id)).state == {"n": 1}
    assert await store.delete(cp.id)
    assert (await store.get_latest("job")).state == {"n": 4}
    with pytest.raises(statekeeper.errors.CheckpointNotFound):
        await store.load(cp.id)
    assert hops == []  # none of them went to a reader thread
    # from another thread (a second event loop), reads take the reader threads
    other = await asyncio.to_thread(asyncio.run, store.get_latest("job"))
    assert other.state == {"n": 4} and len(hops) == 1


@pytest.mark.asyncio
async def test_inline_reads_false_sends_point_reads_to_the_reader_threads(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}?inline_reads=false") as store:
        assert store.options.inline_reads is False
        hops = _count_reader_hops(store, monkeypatch)
        cp = await store.save("job", {"n": 1})
        assert (await store.get_latest("job")).id == cp.id
        assert (await store.load(cp.id)).state == {"n": 1}
        assert len(hops) == 2


@pytest.mark.asyncio
async def test_inline_and_reader_thread_reads_give_the_same_answers(db: Path) -> None:
    """The differential test of the one read body: the same reads, inline on and off,
    over one file (pages both ways, filters, misses, load_many, an expired checkpoint)."""
    url = f"sqlite:///{db}"
    clock = FakeClock()  # one clock for every store here: the expiry is exact
    async with SqlCheckpointStore.from_url(url, clock=clock) as store:
        ids = []
        for i in range(45):
            cp = await store.save(
                f"s{i % 3}", {"i": i}, tags={"odd": str(i % 2)}, metadata={"i": i}
            )
            ids.append(cp.id)
        await store.save("s0", {"gone": True}, ttl=1)
        clock.advance(2)

    async def answers(store: Any) -> list[Any]:
        out: list[Any] = []
        for stream in ("s0", "s1", "s2", "missing"):
            latest = await store.get_latest(stream)
            out.append(None if latest is None else (latest.id, latest.state))
        for cid in (ids[0], ids[-1], "no-such-id"):
            got = await store.load_many([cid])
            out.append(sorted(got))
        out.append((await store.load(ids[7])).state)
        for order in ("asc", "desc"):
            for tags in ({}, {"odd": "1"}):
                cursor = None
                while True:
                    page = await store.list("s0", limit=4, order=order, tags=tags, after=cursor)
                    out.append([cp.id for cp in page.items])
                    out.append((page.next_cursor is None, page.prev_cursor is None))
                    if page.next_cursor is None:
                        break
                    cursor = page.next_cursor
        out.append([cp.id for cp in (await store.list(None, limit=50)).items])
        return out

    async with SqlCheckpointStore.from_url(url, inline_reads=True, clock=clock) as inline:
        here = await answers(inline)
    async with SqlCheckpointStore.from_url(url, inline_reads=False, clock=clock) as threads:
        there = await answers(threads)
    assert here == there


async def _latest_id(store: Any) -> str:
    return str((await store.get_latest("job")).id)


async def _listed_id(store: Any) -> str:
    page = await store.list("job", limit=20)
    assert len(page.items) == 1 and page.next_cursor is None
    return str(page.items[0].id)


@pytest.mark.asyncio
@pytest.mark.parametrize("read", [_latest_id, _listed_id], ids=["get_latest", "a page"])
async def test_a_point_read_that_would_wait_goes_to_a_reader_and_the_loop_runs_on(
    db: Path, monkeypatch: pytest.MonkeyPatch, read: Callable[[Any], Awaitable[str]]
) -> None:
    """A read-only store of a file in rollback-journal mode, while another connection
    holds it exclusively: the loop's connection is told busy at once, the read (a
    get_latest, or a page and its probe) runs again and waits on a reader thread
    (busy_timeout), and the event loop keeps running meanwhile."""
    async with SqlCheckpointStore.from_url(f"sqlite:///{db}") as writable:
        cp = await writable.save("job", {"n": 1})
    plain = sqlite3.connect(db, isolation_level=None)
    plain.execute("PRAGMA journal_mode = DELETE")
    plain.close()
    async with SqlCheckpointStore.from_url(
        f"sqlite:///{db}", read_only=True, busy_timeout=5
    ) as store:
        hops = _count_reader_hops(store, monkeypatch)
        assert await read(store) == cp.id  # the loop's connection exists
        assert hops == []
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        loop = asyncio.get_running_loop()
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        loop.call_later(0.3, blocker.execute, "ROLLBACK")
        try:
            started = loop.time()
            got = await read(store)
            waited = loop.time() - started
        finally:
            ticker.cancel()
            blocker.close()
        assert got == cp.id
        assert waited >= 0.25 and ticks >= 10, (waited, ticks)
        assert len(hops) == 1
        assert (await store.load(cp.id)).state == {"n": 1}  # inline again
        assert len(hops) == 1


@pytest.mark.asyncio
async def test_after_close_the_database_file_alone_holds_every_save(
    db: Path, tmp_path: Path
) -> None:
    """close() checkpoints the WAL into the file and removes it, however many reader
    threads ran: a copy of the .db file alone has everything (regression: closing
    all connections at once left the saves in the -wal file in about 1 close in 6)."""
    wal = db.with_name(db.name + "-wal")
    for i in range(40):
        async with SqlCheckpointStore.from_url(f"sqlite:///{db}") as store:
            await store.save("job", {"i": i})
            await store.get_latest("job")  # the point-read connection
            # two reader threads: a page over 100 items is read there
            await asyncio.gather(store.list("job", limit=200), store.list("job", limit=200))
        assert _wal_bytes(wal) == 0, f"close {i} left the WAL"
        assert _saved_in_a_copy(db, tmp_path / f"copy{i}.db") == i + 1


def test_a_store_collected_unclosed_ends_its_threads_and_leaves_the_file_whole(
    db: Path, tmp_path: Path
) -> None:
    """Regression: a store dropped without close() left its writer and reader threads
    waiting forever, each holding its connection, and the saves in the -wal file.
    Its finalizer now closes them as close() does: the readers first, the writer
    last (so the WAL is checkpointed into the file)."""
    import gc
    import threading

    wal = db.with_name(db.name + "-wal")

    async def use_and_drop(n: int) -> None:
        store = SqlCheckpointStore.from_url(f"sqlite:///{db}")
        await store.open()
        for i in range(n):
            await store.save("job", {"i": i})
        await store.get_latest("job")  # the point-read connection
        await asyncio.gather(store.list("job", limit=200), store.list("job", limit=200))
        del store  # never closed

    for round_ in range(5):
        asyncio.run(use_and_drop(3))
        gc.collect()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            left = [t for t in threading.enumerate() if t.name.startswith("statekeeper-sqlite")]
            if not left and _wal_bytes(wal) == 0:
                break
            time.sleep(0.01)
        assert not left, f"round {round_}: threads left running: {left}"
        assert _wal_bytes(wal) == 0, f"round {round_}: the saves stayed in the WAL"
        assert _saved_in_a_copy(db, tmp_path / f"copy{round_}.db") == 3 * (round_ + 1)


def _wal_bytes(wal: Path) -> int:
    return wal.stat().st_size if wal.exists() else 0


def _saved_in_a_copy(db: Path, copy: Path) -> int:
    """Checkpoints in a copy of the database file alone (no -wal, no -shm)."""
    copy.write_bytes(db.read_bytes())
    raw = sqlite3.connect(copy)
    try:
        return int(raw.execute("SELECT count(*) FROM statekeeper_checkpoints").fetchone()[0])
    finally:
        raw.close()


def test_sqlite_needs_no_server_driver(tmp_path: Path) -> None:
    # The quick start installs no server extra: a SQLite store must open, save and
    # read with asyncpg and aiomysql missing (regression: the PostgreSQL lean path
    # imported asyncpg with the SQL backend, so `statekeeper demo` failed).
    code = f"""
import asyncio, sys
sys.modules["asyncpg"] = None
sys.modules["aiomysql"] = None
import statekeeper as sk

async def main():
    async with sk.open_store("sqlite:///{tmp_path / "s.db"}") as store:
        await store.save("job", {{"step": 1}})
        print((await store.get_latest("job")).state)

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'step': 1}"


_OPEN_AND_READ = """
import asyncio, json, sys
import statekeeper as sk

async def main(url):
    async with sk.open_store(url) as store:
        saved = await store.save("s", {"n": 1})
        await store.get_latest("s")
        await store.load(saved.id)
        await store.list("s", limit=5)

asyncio.run(main(sys.argv[1]))
print(json.dumps(sorted(sys.modules)))
"""

#: What opening, writing and reading an SQLite store must not import (issue 25: the
#: command line's start-up paid for PostgreSQL's driver and runtime on every SQLite call).
_SERVER_ONLY = (
    "asyncpg",
    "aiomysql",
    "asyncmy",
    "pymysql",
    "sqlalchemy.ext.asyncio",
    "statekeeper.backends.sql.pg",
    "statekeeper.backends.sql.pg_listing",
    "statekeeper.backends.sql.server",
    "statekeeper.backends.sql.postgres",
    "statekeeper.backends.sql.mysql",
)


def test_an_sqlite_store_imports_no_server_code(db: Path) -> None:
    """Opening, saving and reading an SQLite store imports nothing of PostgreSQL's or
    MySQL's: neither their drivers nor statekeeper's server runtime."""
    out = subprocess.run(
        [sys.executable, "-c", _OPEN_AND_READ, f"sqlite:///{db}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    modules = json.loads(out.splitlines()[-1])
    assert "statekeeper.backends.sql.sqlite.runtime" in modules  # it did use the store
    loaded = sorted(m for m in modules if m.startswith(_SERVER_ONLY))
    assert not loaded, loaded


def test_the_sqlite_package_and_the_runtime_import_no_server_module() -> None:
    """What sqlite/ and _runtime/ themselves import (the SQL core's imports are the
    test above): none of PostgreSQL's, MySQL's or the server runtime's modules."""
    import ast

    import statekeeper

    root = Path(statekeeper.__file__).parent
    files = [
        *(root / "backends" / "sql" / "sqlite").glob("*.py"),
        *(root / "_runtime").glob("*.py"),
    ]
    assert len(files) >= 10
    forbidden = ("pg", "pg_listing", "server", "stores", "postgres", "mysql")
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                assert not {"asyncpg", "aiomysql", "asyncmy", "pymysql"} & set(parts), (path, name)
                assert parts[-1] not in forbidden, (path, name)
