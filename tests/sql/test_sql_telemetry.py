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
    store = SqlCheckpointStore(stores.url, table_prefix=stores.prefix, telemetry=rec.options())
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
