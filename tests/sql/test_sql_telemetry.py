"""Telemetry (SPEC S18) on PostgreSQL and MySQL: the shared scenario on the real
servers, and the server's address and database on every span."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from sql_helpers import ServerStores
from statekeeper.backends.sql import SqlCheckpointStore
from telemetry_helpers import Recorder, scenario


@pytest.fixture(params=["postgres", "mysql"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, ServerStores]]:
    stores: ServerStores = request.getfixturevalue(f"{request.param}_stores")
    for _ in stores.factory():  # wipes the tables after the test
        yield request.param, stores


@pytest.mark.asyncio
async def test_spans_events_and_metrics_on_a_server(server: tuple[str, ServerStores]) -> None:
    name, stores = server
    rec = Recorder()
    store = SqlCheckpointStore.from_url(
        stores.url, table_prefix=stores.prefix, telemetry=rec.options()
    )
    async with store:
        system = "postgresql" if name == "postgres" else store.family
        await scenario(store, rec, system)
    where = urlsplit(stores.url)
    for span in rec.spans():
        attrs = span.attributes or {}
        assert attrs["server.address"] == where.hostname
        assert attrs["server.port"] == where.port
        assert attrs["db.namespace"] == where.path.strip("/")
        assert attrs["statekeeper.execution"] == "inline"  # no worker threads here


@pytest.mark.asyncio
async def test_pool_connections_by_state(server: tuple[str, ServerStores]) -> None:
    name, stores = server
    rec = Recorder()
    store = SqlCheckpointStore.from_url(
        stores.url, table_prefix=stores.prefix, telemetry=rec.options()
    )
    async with store:
        for i in range(3):
            await store.save("s", i)
        await store.get_latest("s")
        points = rec.points("db.client.connection.count")
        pending = rec.points("db.client.connection.pending_requests")
    pools = {p.attributes["db.client.connection.pool.name"] for p in points}
    assert pools == ({"sqlalchemy", "asyncpg"} if name == "postgres" else {"sqlalchemy"})
    for point in points:
        assert point.attributes["db.system.name"] in ("postgresql", "mysql", "mariadb")
    by_state = {
        (
            p.attributes["db.client.connection.pool.name"],
            p.attributes["db.client.connection.state"],
        ): (p.value)
        for p in points
    }
    for pool in pools:  # quiet: every connection opened is back, idle
        assert by_state[(pool, "used")] == 0
        assert by_state[(pool, "idle")] >= 1
    # the lean pool counts its waiters; SQLAlchemy's does not say
    assert [p.value for p in pending] == ([0] if name == "postgres" else [])


@pytest.mark.asyncio
async def test_a_mariadb_url_is_named_mariadb(mysql_stores: ServerStores) -> None:
    rec = Recorder()
    url = "mariadb" + mysql_stores.url[len("mysql") :]
    for _ in mysql_stores.factory():
        store = SqlCheckpointStore.from_url(
            url, table_prefix=mysql_stores.prefix, telemetry=rec.options()
        )
        async with store:
            await store.save("s", 1)
    assert [(s.attributes or {})["db.system.name"] for s in rec.spans("save")] == ["mariadb"]
