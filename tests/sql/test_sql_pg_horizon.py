"""PostgreSQL: what holds back a listing of every stream, and what it says when held.

A listing of every stream (``list(None, ...)``) shows only sequences below a
horizon (``statekeeper.backends.sql.postgres``). Only this store's saves still in flight
may hold it back: a transaction of another application, however long, never does.
When the store's own saves hold it for longer than ``listing_wait``, the listing
raises a retryable :class:`StoreTimeout`; it never returns a short page that looks
complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from sql_helpers import ServerStores
from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.errors import StoreTimeout
from statekeeper.models import Page

pytestmark = pytest.mark.asyncio

#: The first key of the advisory locks held-up saves wait on (see `Stall`).
STALL_KEY = 7_310_421


@pytest.fixture
def factory(postgres_stores: ServerStores) -> Iterator[Any]:
    yield from postgres_stores.factory()


def _dsn(stores: ServerStores) -> str:
    return stores.url.replace("postgresql+asyncpg://", "postgresql://")


@pytest_asyncio.fixture
async def blocker(postgres_stores: ServerStores) -> AsyncIterator[asyncpg.Connection]:
    """Another application on the same cluster, in a transaction that holds an xid
    (it wrote to a table of its own) and stays open: ``idle in transaction``."""
    con = await asyncpg.connect(_dsn(postgres_stores))
    tr = con.transaction()
    await tr.start()
    await con.execute("CREATE TEMP TABLE other_app(x int)")
    await con.execute("INSERT INTO other_app VALUES (1)")
    try:
        yield con
    finally:
        await tr.rollback()
        await con.close()


async def walk(store: SqlCheckpointStore, limit: int, order: Any = "asc", **kw: Any) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = await store.list(None, limit=limit, order=order, after=cursor, **kw)
        ids += [c.id for c in page.items]
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


async def test_another_applications_transaction_never_holds_back_a_listing(
    factory: Any, blocker: asyncpg.Connection
) -> None:
    """The issue's case: six committed saves, a foreign transaction with an xid open
    all along; every listing of every stream shows all six, filtered or not, in
    either order, in one page or walked with cursors."""
    async with factory() as store:
        saved = [
            await store.save(f"thread-{i % 3}", {"i": i}, tags={"k": "v"}, metadata={"m": 1})
            for i in range(6)
        ]
        ids = [c.id for c in saved]
        for kw in ({}, {"tags": {"k": "v"}}, {"metadata": {"m": 1}}):
            page = await store.list(None, limit=100, order="asc", **kw)
            assert [c.id for c in page.items] == ids, kw
            assert not page.has_more and page.next_cursor is None
            newest = await store.list(None, limit=100, order="desc", **kw)
            assert [c.id for c in newest.items] == ids[::-1], kw
            assert await walk(store, 4, **kw) == ids
            assert await walk(store, 1, order="desc", **kw) == ids[::-1]
        # and past a cursor, with saves landing behind it meanwhile
        top = await store.list(None, limit=3, order="asc")
        more = [await store.save("thread-9", {"late": i}) for i in range(2)]
        rest = await store.list(None, limit=100, order="asc", after=top.next_cursor)
        assert [c.id for c in rest.items] == ids[3:] + [c.id for c in more]


# -- this store's own saves in flight --------------------------------------------------


def _stall_trigger(table: str, name: str) -> list[str]:
    """DDL that makes every insert of stream ``slow<n>`` wait for the advisory lock
    ``(STALL_KEY, n)`` inside its transaction: a save in flight, holding its
    transaction id, for as long as the test holds that lock."""
    return [
        f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
        "IF NEW.stream LIKE 'slow%' THEN "
        f"PERFORM pg_advisory_xact_lock({STALL_KEY}, substr(NEW.stream, 5)::int); END IF; "
        "RETURN NEW; END $$ LANGUAGE plpgsql",
        f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()",
    ]


class Stall:
    """Holds a save of stream ``slow<n>`` mid-transaction until :meth:`release`."""

    def __init__(self, con: asyncpg.Connection, n: int) -> None:
        self.con, self.n = con, n
        self.stream = f"slow{n}"
        self.tr = con.transaction()

    async def hold(self) -> None:
        await self.tr.start()
        lock = "SELECT pg_advisory_xact_lock($1::int4, $2::int4)"
        await self.con.execute(lock, STALL_KEY, self.n)

    async def waiting(self) -> None:
        """Until a save waits on this stall (so it holds its transaction id)."""
        while True:
            got = await self.con.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND objsubid = 2 AND classid = $1::int4::oid AND objid = $2::int4::oid",
                STALL_KEY,
                self.n,
            )
            if got:
                return
            await asyncio.sleep(0.01)

    async def save(self, store: SqlCheckpointStore, state: Any) -> asyncio.Task[Any]:
        """Start a save of this stall's stream; return once it is held in flight."""
        await self.hold()
        task = asyncio.create_task(store.save(self.stream, state))
        await self.waiting()
        return task

    async def release(self) -> None:
        await self.tr.rollback()


@pytest_asyncio.fixture
async def stalls(factory: Any, postgres_stores: ServerStores) -> AsyncIterator[list[Stall]]:
    """Two stalls, for streams ``slow1`` and ``slow2``."""
    async with factory() as store:  # creates the tables
        table = store.tables.checkpoints.name
    name = f"{postgres_stores.prefix}stall"
    admin = await asyncpg.connect(_dsn(postgres_stores))
    holders = [await asyncpg.connect(_dsn(postgres_stores)) for _ in range(2)]
    for ddl in _stall_trigger(table, name):
        await admin.execute(ddl)
    try:
        yield [Stall(con, n) for n, con in enumerate(holders, 1)]
    finally:
        for con in holders:
            await con.close()
        await admin.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        await admin.execute(f"DROP FUNCTION IF EXISTS {name}()")
        await admin.close()


async def test_a_save_in_flight_past_listing_wait_is_a_retryable_error_not_a_short_page(
    factory: Any, stalls: list[Stall]
) -> None:
    """A save of this store that holds the horizon for longer than ``listing_wait``
    makes a listing of every stream raise a retryable StoreTimeout that says so,
    in either order and past a cursor: it never answers with the page below the
    horizon as if that were all. Once the save ends, the listing has everything."""
    async with factory(listing_wait=0.05) as store:
        first, second = await store.save("a", 0), await store.save("a", 1)
        top = await store.list(None, limit=1, order="asc")
        stall = stalls[0]
        slow = await stall.save(store, "held mid-transaction")
        later = [await store.save("b", i) for i in range(3)]  # above the slow one
        for kw in ({"order": "asc"}, {"order": "desc"}):
            with pytest.raises(StoreTimeout, match="listing_wait") as caught:
                await store.list(None, limit=10, **kw)
            assert caught.value.retryable
        with pytest.raises(StoreTimeout):
            await store.list(None, limit=10, order="asc", after=top.next_cursor)
        with pytest.raises(StoreTimeout):
            await store.list(None, limit=10, order="asc", tags={"nope": "x"})
        # a listing of one stream, get_latest and load are not held back
        assert [c.id for c in (await store.list("b", order="asc")).items] == [c.id for c in later]
        assert await store.get_latest("b") == later[-1]
        # a page full below the horizon needs nothing above it: answered
        page = await store.list(None, limit=1, order="asc")
        assert [c.id for c in page.items] == [first.id] and page.next_cursor is not None
        await stall.release()
        held = await asyncio.wait_for(slow, 10)
        everything = [first.id, second.id, held.id, *(c.id for c in later)]
        assert await walk(store, 2) == everything
        assert [c.id for c in (await store.list(None, limit=10, order="desc")).items] == (
            everything[::-1]
        )


async def test_a_listing_waits_for_a_save_that_ends_within_listing_wait(
    factory: Any, stalls: list[Stall]
) -> None:
    """A listing that finds rows hidden by a save in flight waits for that save, and
    then shows it and everything above it."""
    async with factory(listing_wait=30) as store:
        stall = stalls[0]
        slow = await stall.save(store, 1)
        fast = await store.save("fast", 2)
        listing = asyncio.create_task(store.list(None, order="asc"))
        await asyncio.sleep(0.2)
        assert not listing.done(), "the listing did not wait for the save in flight"
        await stall.release()
        page: Page = await asyncio.wait_for(listing, 10)
        held = await slow
        assert [c.id for c in page.items] == [held.id, fast.id]
        assert not page.has_more


async def test_a_blocker_and_a_save_in_flight_together(
    factory: Any, stalls: list[Stall], blocker: asyncpg.Connection
) -> None:
    """The foreign transaction (older than everything) is ignored; the save in
    flight is still waited for."""
    async with factory(listing_wait=30) as store:
        a = await store.save("a", 0)
        stall = stalls[0]
        slow = await stall.save(store, 1)
        b = await store.save("b", 2)
        listing = asyncio.create_task(store.list(None, order="desc"))
        await asyncio.sleep(0.2)
        assert not listing.done()
        await stall.release()
        page = await asyncio.wait_for(listing, 10)
        assert [c.id for c in page.items] == [b.id, (await slow).id, a.id]


async def test_a_listing_waits_only_for_rows_hidden_when_it_began(
    factory: Any, stalls: list[Stall]
) -> None:
    """Rows committed after a listing of every stream began (hidden by another save
    still in flight) do not keep it waiting: it returns once the horizon passes the
    rows it found hidden, so steady saves cannot hold it to ``listing_wait``."""
    one, two = stalls
    async with factory(listing_wait=30) as store:
        slow1 = await one.save(store, "in flight first")
        a = await store.save("a", "hidden while the first save runs")
        slow2 = await two.save(store, "in flight second")
        listing = asyncio.create_task(store.list(None, order="desc"))
        await asyncio.sleep(0.3)
        b = await store.save("b", "hidden by the second save")
        assert not listing.done()
        await one.release()
        page = await asyncio.wait_for(listing, 10)  # not the 30 s of listing_wait
        first = await slow1
        assert [c.id for c in page.items] == [a.id, first.id]
        await two.release()
        second = await slow2
        assert [c.id for c in (await store.list(None)).items] == [b.id, second.id, a.id, first.id]
