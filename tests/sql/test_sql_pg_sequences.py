"""PostgreSQL sequences from transaction ids, and the listing horizon (issue 16).

See ``statekeeper.backends.sql.postgres``: a save takes ``(xid + seq_base) * 1024`` under
its stream's advisory lock; listings of every stream show only sequences below the
oldest transaction id of this store's saves still in flight. These tests hold
locks and transactions open on a second connection to show what that costs and what
it keeps; ``test_sql_pg_horizon.py`` shows what holds the horizon back, and what a
listing says when it is held.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

import statekeeper as sk
from sql_helpers import ServerStores
from statekeeper.backends.sql import PostgresCheckpointStore, SqlCheckpointStore
from statekeeper.backends.sql.postgres import runtime as pg_runtime
from statekeeper.backends.sql.postgres import sequences, statements
from statekeeper.errors import BackendError, InvalidOptions, StoreTimeout

WAIT = 0.2  # listing_wait of these stores


@pytest.fixture
def factory(postgres_stores: ServerStores) -> Iterator[Any]:
    yield from postgres_stores.factory()


@pytest_asyncio.fixture
async def other(postgres_stores: ServerStores) -> AsyncIterator[asyncpg.Connection]:
    """A second connection to the server, outside any store."""
    dsn = postgres_stores.url.replace("postgresql+asyncpg://", "postgresql://")
    con = await asyncpg.connect(dsn)
    yield con
    await con.close()


async def _until_advisory_waiters(
    conn: asyncpg.Connection, keys: tuple[int, int], count: int
) -> None:
    """Poll ``pg_locks`` until ``count`` sessions wait for the advisory lock ``keys``.

    A test waits on the server's own word that a save is blocked (or no longer is),
    never on a sleep it hopes is long enough; the bound only turns a hang into a
    failure. The lock's two int4 keys are its ``classid`` and ``objid`` (as
    unsigned), ``objsubid`` 2, in this database: other tests' locks do not count.
    """
    sql = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND objsubid = 2 AND classid = $1::oid AND objid = $2::oid"
    )
    args = [k & 0xFFFFFFFF for k in keys]
    for _ in range(1000):
        if await conn.fetchval(sql, *args) == count:
            return
        await asyncio.sleep(0.01)
    got = await conn.fetchval(sql, *args)
    raise AssertionError(f"never {count} waiter(s) for advisory lock {keys}: {got}")


def _pg(store: SqlCheckpointStore) -> PostgresCheckpointStore:
    assert isinstance(store, PostgresCheckpointStore)
    return store


@pytest.mark.asyncio
async def test_saves_to_other_streams_never_wait_for_a_stream_lock(
    factory: Any, other: asyncpg.Connection
) -> None:
    """No store-wide lock: a held stream lock stops that stream's saves only, and the
    save that waited gets a sequence above everything committed meanwhile."""
    async with factory() as store:
        await store.save("a", 0)
        keys = (_pg(store)._pst.store_lock, sequences.stream_lock("a"))
        held = other.transaction()
        await held.start()
        try:
            await other.fetch("SELECT pg_advisory_xact_lock($1::int4, $2::int4)", *keys)
            waiting = asyncio.create_task(store.save("a", 1))
            b = [await asyncio.wait_for(store.save("b", i), 5) for i in range(3)]
            # the server's word that the save waits for its stream's lock
            await _until_advisory_waiters(other, keys, 1)
            assert not waiting.done(), "a save did not take its stream's lock"
        finally:
            await held.rollback()
        a1 = await asyncio.wait_for(waiting, 5)
        assert a1.sequence > max(c.sequence for c in b)


@pytest.mark.asyncio
async def test_a_store_restored_into_a_cluster_with_lower_ids_raises_its_base(
    factory: Any, other: asyncpg.Connection
) -> None:
    async with factory() as store:
        cp = await store.save("s", "restored")
        table, meta = store.tables.checkpoints.name, store.tables.meta.name
    # As if restored from a cluster whose transaction ids are far ahead of ours.
    nxt = await other.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
    huge = (nxt + 10**9) * statements.SEQ_SLOTS + 5
    await other.execute(f"UPDATE {table} SET seq = $1 WHERE id = $2", huge, cp.id)
    async with factory(read_only=True) as ro:
        report = await ro.verify()
        assert [p.location for p in report.problems] == [f"{meta}[name=seq_base]"]
        assert "too low" in report.problems[0].reason
        # reads still see it, listings included (the horizon uses the base it needs)
        assert [c.sequence for c in (await ro.list("s")).items] == [huge]
    async with factory() as store:  # a writable open raises the base
        after = await store.save("s", "after")
        assert after.sequence > huge
        assert [c.id for c in (await store.list("s", order="asc")).items] == [cp.id, after.id]
        assert (await store.verify()).ok
        info = await store.info()
        assert info.high_water_mark is not None and info.high_water_mark >= after.sequence


@pytest.mark.asyncio
async def test_a_lost_base_row_is_reported_and_rebuilt(
    factory: Any, other: asyncpg.Connection
) -> None:
    async with factory() as store:
        cp = await store.save("s", 1)
        meta = store.tables.meta.name
    await other.execute(f"DELETE FROM {meta} WHERE name = 'seq_base'")
    async with factory(read_only=True) as ro:
        (problem,) = (await ro.verify()).problems
        assert "missing" in problem.reason and problem.kind == "state"
        assert await ro.get_latest("s") == cp
    async with factory() as store:
        assert (await store.verify()).ok
        assert (await store.save("s", 2)).sequence > cp.sequence
    await other.execute(f"UPDATE {meta} SET value = 'x' WHERE name = 'seq_base'")
    async with factory() as store:
        assert (await store.verify()).ok  # rewritten on open
        report = await store.repair()
        assert report.damaged == []


@pytest.mark.parametrize("url", ["sqlite:///x.db", "mysql+aiomysql://u@localhost/db"])
def test_listing_wait_is_an_option_of_postgresql_only(url: str) -> None:
    with pytest.raises(InvalidOptions, match="listing_wait"):
        SqlCheckpointStore.from_url(url, listing_wait=1)
    store = SqlCheckpointStore.from_url("postgresql://u@localhost/db?listing_wait=0.5")
    assert store.options.listing_wait == 0.5


@pytest.mark.asyncio
async def test_no_free_connection_in_time_is_a_store_timeout(
    factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_runtime, "ACQUIRE_TIMEOUT", 0.2)
    async with factory(pool_size=1) as store:
        cp = await store.save("s", 1)
        async with _pg(store)._pg().connection():  # the only connection, held
            with pytest.raises(StoreTimeout, match="pool_size"):
                await store.get_latest("s")
        assert await store.get_latest("s") == cp


async def _walk_every_stream(store: SqlCheckpointStore, stop: asyncio.Event) -> list[int]:
    """Page forward through every stream with cursors while others save, until
    ``stop`` and nothing new: the sequences seen, in the order seen. At the end of
    the data the walk keeps its last cursor and asks again for what came since."""
    seen: list[int] = []
    cursor: str | None = None
    idle = 0
    while idle < 3:
        stopping = stop.is_set()
        try:
            page = await store.list(None, order="asc", limit=7, after=cursor, include_state=False)
        except StoreTimeout:
            continue  # held back past listing_wait by saves in flight: retryable, so retry
        fresh = [c.sequence for c in page.items if not seen or c.sequence > seen[-1]]
        seen += fresh
        if page.next_cursor is not None:
            cursor = page.next_cursor
        idle = idle + 1 if stopping and not fresh and page.next_cursor is None else 0
        await asyncio.sleep(0)
    return seen


@pytest.mark.asyncio
async def test_a_cursor_walk_over_every_stream_misses_nothing_while_streams_are_saved(
    factory: Any,
) -> None:
    """Eight stores (eight connection pools, as eight hosts) save to their own streams
    while a reader pages every stream forward with cursors: the walk sees every
    checkpoint exactly once, in sequence order, although saves to different streams
    commit in any order (the horizon)."""
    writers = [factory(pool_size=1) for _ in range(8)]
    reader = factory(listing_wait=0.5)
    halt = asyncio.Event()  # the writers' signal
    stop = asyncio.Event()  # the walk's: set once every save has returned
    saved = [0] * len(writers)
    enough = asyncio.Event()  # every writer has saved its share: a count, not a time

    async def write(store: SqlCheckpointStore, name: str, n: int) -> None:
        while not halt.is_set():
            await store.save(name, {"n": 1})
            saved[n] += 1
            if min(saved) >= 40:
                enough.set()

    for store in [*writers, reader]:
        await store.open()
    try:
        tasks = [asyncio.create_task(write(s, f"w{i}", i)) for i, s in enumerate(writers)]
        walk = asyncio.create_task(_walk_every_stream(reader, stop))
        await asyncio.wait_for(enough.wait(), 120)  # the bound only turns a hang into a failure
        halt.set()
        await asyncio.gather(*tasks)
        # Only now may the walk end on finding nothing new: a save still in flight
        # when the writers were told to halt commits later, and a walk that ended
        # before it did would not have passed it, only stopped short of it (this
        # test once failed so under load, with the last save of each writer).
        stop.set()
        seen = await asyncio.wait_for(walk, 60)
        final, cursor = [], None
        while True:
            page = await reader.list(None, order="asc", limit=1000, after=cursor)
            final += [c.sequence for c in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert len(final) >= 40 * len(writers)
        missed = sorted(set(final) - set(seen))
        passed = [seq for seq in missed if seen and seq < seen[-1]]
        assert not passed, f"the walk passed {len(passed)} checkpoint(s) that committed later"
        assert not missed, f"the walk stopped short of {missed} (above its last, {seen[-1]})"
        assert seen == final
    finally:
        for store in [*writers, reader]:
            await store.close()


@pytest.mark.asyncio
async def test_a_middle_page_of_one_stream_is_one_round_trip(
    factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page and the probe that decides its prev_cursor (after=) or next_cursor
    (before=) share one statement; the cursors are those of two separate scans."""
    async with factory() as store:
        cps = await store.save_many([sk.NewCheckpoint(stream="s", state=i) for i in range(9)])
        await store.save("other", "not in s")
        rt = _pg(store)._pg()
        calls: list[str] = []
        fetch = rt.fetch

        async def counted(sql: str, *args: Any) -> Any:
            calls.append(sql)
            return await fetch(sql, *args)

        monkeypatch.setattr(rt, "fetch", counted)
        for order in ("asc", "desc"):
            first = await store.list("s", order=order, limit=3)
            calls.clear()
            middle = await store.list("s", order=order, limit=3, after=first.next_cursor)
            assert len(calls) == 1, calls
            ids = [c.id for c in cps] if order == "asc" else [c.id for c in reversed(cps)]
            assert [c.id for c in middle.items] == ids[3:6]
            back = await store.list("s", order=order, limit=3, before=middle.prev_cursor)
            assert [c.id for c in back.items] == ids[:3] and back.prev_cursor is None
            calls.clear()
            again = await store.list("s", order=order, limit=3, before=middle.next_cursor)
            assert len(calls) == 1, calls
            assert [c.id for c in again.items] == ids[2:5]  # the 3 before ids[5]
            assert again.next_cursor is not None and again.prev_cursor is not None
            last = await store.list("s", order=order, limit=3, after=middle.next_cursor)
            assert [c.id for c in last.items] == ids[6:] and last.next_cursor is None


@pytest.mark.asyncio
async def test_a_cancelled_call_never_leaves_its_connection_to_the_next(
    factory: Any, other: asyncpg.Connection
) -> None:
    """A save cancelled while it waits for its stream's lock takes its connection
    down with it (the session ends, so the save never lands); the next call gets a
    fresh connection instead of one still busy with the old statement. Many tasks
    share a pool of two."""
    async with factory(pool_size=1) as store:
        first = await store.save("s", "first")
        keys = (_pg(store)._pst.store_lock, sequences.stream_lock("s"))
        held = other.transaction()
        await held.start()
        try:
            await other.fetch("SELECT pg_advisory_xact_lock($1::int4, $2::int4)", *keys)
            waiting = asyncio.create_task(store.save("s", "cancelled"))
            await _until_advisory_waiters(other, keys, 1)  # the save waits for the lock held
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # its session ended: nobody waits for the lock, so nothing can land once
            # the lock is released
            await _until_advisory_waiters(other, keys, 0)
            latest = await asyncio.wait_for(store.get_latest("s"), 5)
            assert latest == first
        finally:
            await held.rollback()
        assert [c.state for c in (await store.list("s")).items] == ["first"]
    async with factory(pool_size=2) as store:
        saved = await asyncio.gather(*(store.save(f"t{i % 4}", i) for i in range(40)))
        assert len({c.sequence for c in saved}) == 40
        got = await asyncio.gather(*(store.get_latest(f"t{i}") for i in range(4)))
        assert all(g is not None for g in got)


@pytest.mark.asyncio
async def test_a_server_older_than_postgresql_13_is_refused_on_open(
    factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = asyncpg.types.ServerVersion(12, 9, 0, "final", 0)
    monkeypatch.setattr(asyncpg.Connection, "get_server_version", lambda self: old)
    with pytest.raises(BackendError, match="PostgreSQL 13 or later"):
        await factory().open()


@pytest.mark.asyncio
async def test_a_save_seen_mid_commit_in_the_lock_table_still_holds_the_horizon(
    other: asyncpg.Connection,
) -> None:
    """The state ``pg_locks`` shows while a save commits: its backend has left the
    snapshot's running list for new snapshots but not yet released its locks, and
    the read copies ``virtualtransaction`` from the backend's live local id, which
    the commit resets, so the save's id lock and its stream lock may show two
    different virtual transactions in one read (``3/17`` and ``3/0``). The horizon
    must still count the save (same ``pid``): a snapshot that saw it running cannot
    see its rows, and a page past them would pass them for good. A cursor walk of
    every stream under eight writers did, about once in 40 runs."""
    lock = 7
    horizon = statements._in_flight_horizon("0", str(lock))
    sql = f"""
WITH sn AS (SELECT '105:110:105'::pg_snapshot AS s),
lk (locktype, classid, objsubid, transactionid, virtualtransaction, pid, mode, granted) AS (
  VALUES ('transactionid', NULL::oid, NULL::int2, '105'::xid, '3/17', 4242, 'ExclusiveLock', true),
         ('advisory', {lock}::oid, 2::int2, NULL::xid, '3/0', 4242, 'ExclusiveLock', true))
SELECT {horizon} FROM sn"""
    assert await other.fetchval(sql) == 105 * statements.SEQ_SLOTS
