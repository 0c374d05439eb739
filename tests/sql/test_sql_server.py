"""The SQL backend on real PostgreSQL and MariaDB/MySQL servers.

Commit order (S10), several engines as several hosts, concurrent creation by several
processes, lock timeouts, driver errors, hostile tag values and store isolation.
Every test uses its own table prefix (or schema) and drops it afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import statekeeper
from sql_helpers import drop_store, finish_children, new_prefix, run_async_in_thread, start_children
from statekeeper.backends.sql import (
    MysqlCheckpointStore,
    PostgresCheckpointStore,
    SqlCheckpointStore,
)
from statekeeper.backends.sql import migrations as migrations_module
from statekeeper.backends.sql.migrations import MIGRATIONS, Migration
from statekeeper.backends.sql.postgres.sequences import stream_lock
from statekeeper.backends.sql.schema import SCHEMA_VERSION
from statekeeper.backends.sql.server import server_url
from statekeeper.errors import (
    BackendError,
    PreconditionFailed,
    ReadOnlyStore,
    StoreFormatError,
    StoreNotFound,
    StoreTimeout,
)
from statekeeper.testing import service_url

SERVICES = ["postgres", "mysql"]

#: The version of a test migration one step past this code's schema.
NEXT = SCHEMA_VERSION + 1


class Server:
    """One test's store location on a server: URL, prefix, and raw SQL access."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.url = service_url(service)
        self.prefix = new_prefix()
        self.engines: list[AsyncEngine] = []

    def store(self, **options: Any) -> SqlCheckpointStore:
        return SqlCheckpointStore.from_url(self.url, **{"table_prefix": self.prefix, **options})

    def engine(self) -> AsyncEngine:
        engine = create_async_engine(self.url, pool_size=2)
        self.engines.append(engine)
        return engine

    async def execute(self, *statements: str) -> None:
        async with self.engine().begin() as conn:
            for statement in statements:
                await conn.execute(sa.text(statement))

    async def dispose(self) -> None:
        for engine in self.engines:
            await engine.dispose()

    async def our_tables(self) -> list[str]:
        """Tables of this test's prefix in the default schema."""
        async with self.engine().connect() as conn:
            names = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
        return sorted(n for n in names if n.startswith(self.prefix))


@pytest.fixture(params=SERVICES)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    located = Server(request.param)
    yield located
    drop_store(located.url, located.prefix)


@pytest_asyncio.fixture
async def engines_closed(server: Server) -> AsyncIterator[Server]:
    yield server
    await server.dispose()


@pytest.fixture
def pg() -> Iterator[Server]:
    located = Server("postgres")
    yield located
    drop_store(located.url, located.prefix)


@pytest.mark.parametrize(
    ("url", "cls", "sa_driver"),
    [
        ("postgresql://u:pw@db.example:5432/app", PostgresCheckpointStore, "postgresql+asyncpg"),
        ("postgres://u:pw@db.example/app", PostgresCheckpointStore, "postgresql+asyncpg"),
        ("postgresql+asyncpg://u@db.example/app", PostgresCheckpointStore, "postgresql+asyncpg"),
        ("mysql://u:pw@db.example:3306/app", MysqlCheckpointStore, "mysql+aiomysql"),
        ("mariadb://u:pw@db.example/app", MysqlCheckpointStore, "mysql+aiomysql"),
    ],
)
def test_server_urls_pick_the_async_drivers(url: str, cls: type, sa_driver: str) -> None:
    store = statekeeper.open_store(url, busy_timeout=2)  # nothing connects before open()
    assert type(store) is cls
    assert store.capabilities.cross_host
    assert "pw" not in store.describe() and "db.example" in store.describe()
    sa_url = server_url(store.url, store.dialect, store.driver)  # type: ignore[attr-defined]
    assert sa_url.drivername == sa_driver
    assert sa_url.password in (None, "pw")  # the driver does get the password


# -- S10: sequence order is commit order -----------------------------------------------


def _gated_insert_trigger(server: Server, table: str) -> list[str]:
    """DDL that makes every insert of stream 'slow' wait, inside its transaction, for
    the gate lock the test holds (:func:`_gate`)."""
    name = f"{server.prefix}slow"
    if server.service == "postgres":
        return [
            f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
            f"IF NEW.stream = 'slow' THEN PERFORM pg_advisory_xact_lock({_gate_key(server)}); "
            "END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER {name} BEFORE INSERT ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {name}()",
        ]
    gate = _gate_name(server)
    return [
        f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW "
        f"BEGIN IF NEW.stream = 'slow' THEN DO GET_LOCK('{gate}', 600); "
        f"DO RELEASE_LOCK('{gate}'); END IF; END"
    ]


def _gate_key(server: Server) -> int:
    """This test's PostgreSQL advisory lock key (its table prefix's, so tests running
    at once never share one)."""
    return int.from_bytes(hashlib.blake2b(server.prefix.encode(), digest_size=4).digest(), "big")


def _gate_name(server: Server) -> str:
    return f"{server.prefix}gate"


@contextlib.asynccontextmanager
async def _gate(server: Server) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Hold the gate lock on a connection of the test's own; yield its release (also
    run on the way out). A save held at the gate stays mid-transaction, its sequence
    taken, for as long as the test says: no sleep decides how long."""
    if server.service == "postgres":
        take = sa.text(f"SELECT pg_advisory_lock({_gate_key(server)})")
        give = sa.text(f"SELECT pg_advisory_unlock({_gate_key(server)})")
    else:
        take = sa.text(f"SELECT GET_LOCK('{_gate_name(server)}', 10)")
        give = sa.text(f"SELECT RELEASE_LOCK('{_gate_name(server)}')")
    async with server.engine().connect() as conn:
        await conn.execute(take)
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                await conn.execute(give)

        try:
            yield release
        finally:
            await release()


@pytest.mark.asyncio
async def test_a_reader_never_sees_a_sequence_before_a_lower_one_commits(
    engines_closed: Server,
) -> None:
    server = engines_closed
    writer, other_host, reader = server.store(), server.store(), server.store()
    async with writer, other_host, reader:
        first = await writer.save("warmup", 0)
        table = writer.tables.checkpoints.name
        await server.execute(*_gated_insert_trigger(server, table))
        try:
            async with _gate(server) as release:
                slow_task = asyncio.create_task(writer.save("slow", "slow"))
                # the slow save holds its sequence, mid-transaction: the server says so
                await _until_waiting_in_trigger(server, table)
                done: list[str] = []  # which save finished first: behaviour, not timing
                slow_task.add_done_callback(lambda _: done.append("slow"))
                fast_task = asyncio.create_task(other_host.save("fast", "fast"))
                fast_task.add_done_callback(lambda _: done.append("fast"))
                if server.service == "postgres":
                    # the fast save does not wait (sequences from transaction ids)
                    await asyncio.wait_for(asyncio.shield(fast_task), 60)
                # PostgreSQL: listings hide the fast save while the slow one is held
                # (the horizon), and one that waits listing_wait in vain raises,
                # retryable. MySQL: the fast save waits for the slow one's counter lock.
                snapshots: list[list[int]] = []
                refused = 0
                for _ in range(3):
                    try:
                        page = await reader.list(None, order="asc", limit=100)
                    except StoreTimeout as exc:
                        if not (exc.retryable and server.service == "postgres"):
                            raise
                        refused += 1
                    else:
                        snapshots.append([cp.sequence for cp in page.items])
                await release()
                slow, fast = await slow_task, await fast_task
            snapshots.append([cp.sequence for cp in (await reader.list(None, order="asc")).items])
        finally:
            await server.execute(*_drop_trigger(server, table))
    assert first.sequence < slow.sequence < fast.sequence
    if server.service == "postgres":
        # Streams do not wait on each other, but the lower sequence is never skipped.
        assert done == ["fast", "slow"]
    else:
        # The fast save had to wait for the slow one: it could not take a sequence
        # while the slow transaction held the counter row.
        assert fast.sequence == slow.sequence + 1 == first.sequence + 2
        assert done == ["slow", "fast"]
    # Every snapshot the reader took is gap-free: seeing n means seeing all below n.
    order = [first.sequence, slow.sequence, fast.sequence]
    for seen in snapshots:
        assert seen == order[: len(seen)], snapshots
    assert snapshots[-1] == order
    if server.service == "postgres":
        # once the fast save committed above the slow one, listings said they were
        # held back (retryable) instead of answering with a page that looked final
        assert refused == 3, snapshots
    else:
        assert snapshots[:3] == [[first.sequence]] * 3  # read while the slow save ran


async def _until_waiting_in_trigger(server: Server, table: str) -> None:
    """Poll the server until an insert into ``table`` waits at the gate in the trigger.

    The test waits on the server's word that the slow save is inside its transaction,
    never on a sleep it hopes is long enough; the bound only turns a hang into a
    failure.
    """
    if server.service == "postgres":
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND wait_event = 'advisory' AND query LIKE :pattern"
        )
        pattern = f"%{table}%"
    else:  # MariaDB shows the trigger's own statement, in this test's database
        sql = (
            "SELECT count(*) FROM information_schema.processlist "
            "WHERE state = 'User lock' AND db = DATABASE() AND info LIKE :pattern"
        )
        pattern = f"DO GET_LOCK('{_gate_name(server)}'%"
    async with server.engine().connect() as conn:
        for _ in range(1000):
            if await conn.scalar(sa.text(sql), {"pattern": pattern}):
                return
            await asyncio.sleep(0.01)
    raise AssertionError(f"no insert into {table} was seen waiting in the gated trigger")


def _drop_trigger(server: Server, table: str) -> list[str]:
    name = f"{server.prefix}slow"
    if server.service == "postgres":
        return [f"DROP TRIGGER IF EXISTS {name} ON {table}", f"DROP FUNCTION IF EXISTS {name}()"]
    return [f"DROP TRIGGER IF EXISTS {name}"]


@pytest.mark.asyncio
async def test_two_hosts_write_and_read_one_store(pg: Server) -> None:
    host_a, host_b = pg.store(pool_size=3), pg.store(pool_size=3)
    async with host_a, host_b:
        assert host_a.store_id == host_b.store_id

        async def writer(store: SqlCheckpointStore, name: str) -> list[int]:
            return [(await store.save(f"job-{i % 3}", {name: i})).sequence for i in range(15)]

        results = await asyncio.gather(
            *(
                writer(store, f"{tag}{k}")
                for k in range(3)
                for tag, store in (("a", host_a), ("b", host_b))
            )
        )
        every = sorted(seq for seqs in results for seq in seqs)
        assert len(set(every)) == len(every) == 90  # unique, none lost
        assert all(seqs == sorted(seqs) for seqs in results)
        for stream in ("job-0", "job-1", "job-2"):
            latest_a, latest_b = await host_a.get_latest(stream), await host_b.get_latest(stream)
            assert latest_a is not None and latest_b is not None
            assert latest_a.id == latest_b.id
        listed_a = [cp.sequence for cp in (await host_a.list(None, order="asc", limit=100)).items]
        listed_b = [cp.sequence for cp in (await host_b.list(None, order="asc", limit=100)).items]
        assert listed_a == listed_b == every
        # Compare-and-set across hosts.
        cp = await host_a.save("cas", 1)
        await host_b.update(cp.id, 2, if_match=cp.etag)
        with pytest.raises(PreconditionFailed):
            await host_a.update(cp.id, 3, if_match=cp.etag)
        assert (await host_a.load(cp.id)).state == 2


@pytest.mark.parametrize("service", SERVICES)
def test_several_processes_create_a_fresh_store_at_once(service: str) -> None:
    url, prefix = service_url(service), new_prefix()
    try:
        events = finish_children(
            start_children(url, n=4, saves=10, options={"table_prefix": prefix})
        )
    finally:
        drop_store(url, prefix)
    assert [e for child in events for e in child if "error" in e] == []
    assert len({e["opened"] for child in events for e in child if "opened" in e}) == 1
    seqs = sorted(e["seq"] for child in events for e in child if "seq" in e)
    if service == "postgres":
        assert len(set(seqs)) == len(seqs) == 40  # from transaction ids: unique, not dense
    else:
        assert seqs == list(range(1, 41))


# -- errors ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_lock_held_too_long_is_a_store_timeout(engines_closed: Server) -> None:
    server = engines_closed
    timeout = 0.5 if server.service == "postgres" else 1  # MySQL counts whole seconds
    async with server.store(busy_timeout=timeout) as store:
        one = await store.save("job", 1)
        counter = store.tables.counter.name
        async with server.engine().connect() as blocker:
            if server.service == "postgres":
                # saves to one stream take its advisory lock (sql.postgres.sequences)
                keys = {"a": store._pst.store_lock, "b": stream_lock("job")}  # type: ignore[attr-defined]
                await blocker.execute(sa.text("SELECT pg_advisory_xact_lock(:a, :b)"), keys)
            else:
                await blocker.execute(sa.text(f"UPDATE {counter} SET hwm = hwm"))  # holds the row
            # the lock timeout, not a hang (the guard) and not another error (the
            # driver's lock-timeout error below)
            with pytest.raises(StoreTimeout) as caught:
                await asyncio.wait_for(store.save("job", 2), 60)
            await blocker.rollback()
        orig = caught.value.orig
        if server.service == "postgres":
            assert getattr(orig, "sqlstate", None) == "55P03"
        else:
            assert orig is not None and orig.args[0] == 1205
        three = await store.save("job", 3)
        if server.service == "postgres":
            assert three.sequence > one.sequence
        else:
            assert three.sequence == 2  # the timed-out save left no hole


@pytest.mark.parametrize("service", SERVICES)
def test_driver_errors_are_backend_errors_with_orig(service: str) -> None:
    url = service_url(service)
    wrong_db = url.rsplit("/", 1)[0] + "/statekeeper_no_such_db"
    with pytest.raises(BackendError) as caught:
        run_async_in_thread(lambda: SqlCheckpointStore.from_url(wrong_db).open())
    assert caught.value.orig is not None
    assert "statekeeper_no_such_db" in str(caught.value)


@pytest.mark.parametrize("service", SERVICES)
def test_passwords_never_appear_in_descriptions_or_errors(service: str) -> None:
    url = service_url(service)
    scheme, rest = url.split("://", 1)
    host_part = rest.split("@", 1)[-1].split("/", 1)[1]
    secret_url = f"{scheme}://someone:s3cr3t-pw@127.0.0.1:1/{host_part}"  # nothing listens
    store = SqlCheckpointStore.from_url(secret_url)
    assert "s3cr3t" not in store.describe()
    with pytest.raises(BackendError) as caught:
        run_async_in_thread(store.open)
    assert "s3cr3t" not in str(caught.value)
    assert caught.value.orig is not None


@pytest.mark.asyncio
async def test_newer_schema_is_a_format_error(engines_closed: Server) -> None:
    server = engines_closed
    async with server.store() as store:
        meta = store.tables.meta.name
    await server.execute(f"UPDATE {meta} SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(StoreFormatError, match="schema version 99"):
        await server.store().open()


# -- create=False and read_only ----------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("options", [{"create": False}, {"read_only": True}])
async def test_missing_tables_are_store_not_found_and_nothing_is_created(
    engines_closed: Server, options: dict[str, bool]
) -> None:
    server = engines_closed
    with pytest.raises(StoreNotFound, match=server.prefix):
        await server.store(**options).open()
    assert await server.our_tables() == []


@pytest.mark.asyncio
async def test_create_false_never_creates_a_postgres_schema(pg: Server) -> None:
    schema = f"s{pg.prefix}"
    with pytest.raises(StoreNotFound):
        await pg.store(schema=schema, create=False).open()
    engine = create_async_engine(pg.url)
    try:
        async with engine.connect() as conn:
            found = await conn.execute(
                sa.text("SELECT 1 FROM pg_namespace WHERE nspname = :n"), {"n": schema}
            )
            assert found.first() is None
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_read_only_reads_and_its_transactions_cannot_write(engines_closed: Server) -> None:
    server = engines_closed
    async with server.store() as first:
        cp = await first.save("job", {"n": 1}, tags={"k": "v"})
    async with server.store(read_only=True) as ro:
        assert await ro.get_latest("job") == cp
        assert (await ro.list("job", tags={"k": "v"})).items == [cp]
        assert (await ro.verify()).ok
        for write in (ro.save("job", 2), ro.delete(cp.id), ro.prune("job", keep_last=0)):
            with pytest.raises(ReadOnlyStore):
                await write
        # Below the public methods, the server itself refuses: read-only transactions.
        for run in (ro._read, ro._write):
            with pytest.raises(BackendError, match=r"(?i)read.only"):
                await ro._guard("writing", run(lambda s: s.run(ro._st.set_hwm, {"new_hwm": 9})))
    async with server.store(create=False) as again:
        hwm = (await again.info()).high_water_mark
        assert hwm is not None and hwm >= cp.sequence
        two = await again.save("job", 2)
        assert two.sequence == 2 if server.service == "mysql" else two.sequence > cp.sequence


@pytest.mark.asyncio
async def test_read_only_never_migrates_an_older_schema(
    engines_closed: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = engines_closed
    async with server.store() as v1:
        await v1.save("job", 1)
    applied: list[int] = []
    step = Migration(NEXT, "test: a step", lambda tables, ddl: applied.append(NEXT))
    monkeypatch.setattr(migrations_module, "MIGRATIONS", (*MIGRATIONS, step))
    with pytest.raises(StoreFormatError, match="without read_only"):
        await server.store(read_only=True).open()
    assert applied == []
    monkeypatch.setattr(migrations_module, "MIGRATIONS", MIGRATIONS)
    async with server.store(read_only=True) as ro:
        assert (await ro.info()).format_version == SCHEMA_VERSION


# -- hostile values and isolation ------------------------------------------------------

NASTY = [
    "it's",
    'say "hi"',
    "100%",
    "a_b",
    "%",
    "_",
    "\\",
    "A",
    "a",
    "a ",
    "é",
    "🙂",
    "x" * 1024,
    "y" + "x" * 1023,  # long values are indexed by hash; these differ in the first char
    "x" * 1023 + "y",  # ... and these only in the last, so the stream (first 512) is shared
]


@pytest.mark.asyncio
async def test_tag_values_and_stream_names_are_matched_exactly(server: Server) -> None:
    async with server.store() as store:
        saved = {}
        for i, value in enumerate(NASTY):
            key = NASTY[(i + 1) % len(NASTY)][:128]
            saved[value] = (key, await store.save(value[:512], i, tags={key: value, "i": str(i)}))
        for value, (key, cp) in saved.items():
            page = await store.list(None, tags={key: value}, limit=100)
            assert [c.id for c in page.items] == [cp.id], (key, value)
            page = await store.list(value[:512], tags={key: value, "i": cp.tags["i"]})
            assert [c.id for c in page.items] == [cp.id], value
        for value in saved:
            latest = await store.get_latest(value[:512])
            newest = max(c.sequence for v, (_, c) in saved.items() if v[:512] == value[:512])
            assert latest is not None and latest.sequence == newest
        assert sorted(await store.list_streams()) == sorted({v[:512] for v in NASTY})
        assert (await store.list(None, tags={"i": "%"})).items == []


@pytest.mark.asyncio
async def test_two_prefixes_in_one_database_are_two_stores(server: Server) -> None:
    other_prefix = new_prefix()
    try:
        async with server.store() as a, server.store(table_prefix=other_prefix) as b:
            assert a.store_id != b.store_id
            await a.save("job", "in a")
            cp = await b.save("job", "in b")
            assert cp.sequence == 1 or server.service == "postgres"
            assert [c.state for c in (await a.list("job")).items] == ["in a"]
            assert await a.list_streams() == await b.list_streams() == ["job"]
            assert await a.delete_stream("job") == 1
            assert (await b.get_latest("job")) is not None
    finally:
        drop_store(server.url, other_prefix)


@pytest.mark.asyncio
async def test_a_postgres_schema_isolates_stores(pg: Server) -> None:
    schema = f"s{pg.prefix}"
    try:
        async with pg.store(schema=schema) as inside, pg.store() as outside:
            assert inside.tables.checkpoints.schema == schema
            assert inside.store_id != outside.store_id
            await inside.save("job", "inside")
            assert await outside.list_streams() == []
            assert "schema" not in outside.describe()
            assert schema in inside.describe()
    finally:
        engine = create_async_engine(pg.url)
        async with engine.begin() as conn:
            await conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        await engine.dispose()
