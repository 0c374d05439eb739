"""CI: ``statekeeper copy`` from SQLite to PostgreSQL to MariaDB and back to a file
store, in real subprocesses, on the servers of ``STATEKEEPER_TEST_POSTGRES_URL``
and ``STATEKEEPER_TEST_MYSQL_URL`` (skipped without them, failed when
``STATEKEEPER_REQUIRE_SERVICES`` is set). Each server store gets its own table
prefix through the URL's query and is dropped afterwards. At the end the ids,
streams, states, order and every header field are those of the first store."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

import statekeeper
from cli_helpers import assert_copied, everything, run_cli, seed
from sql_helpers import drop_store, new_prefix
from statekeeper import BaseCheckpointStore
from statekeeper.testing import service_url


@pytest.fixture
def server_urls() -> Iterator[tuple[str, str]]:
    """A PostgreSQL and a MariaDB store URL, each with a fresh table prefix."""
    made: list[tuple[str, str]] = []
    urls = []
    for service in ("postgres", "mysql"):
        base, prefix = service_url(service), new_prefix()
        made.append((base, prefix))
        urls.append(f"{base}{'&' if '?' in base else '?'}table_prefix={prefix}")
    try:
        yield urls[0], urls[1]
    finally:
        for base, prefix in made:
            drop_store(base, prefix)


def test_copy_sqlite_to_postgresql_to_mariadb_to_file(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    postgres, mariadb = server_urls
    first, last = f"sqlite:///{tmp_path / 'first.db'}", f"file://{tmp_path / 'last'}"

    async def fill(store: BaseCheckpointStore) -> None:
        await seed(store)
        await store.update("users-2", {"name": "user2", "renamed": True})
        await store.save("users", {"name": "temp"}, ttl=3600, id="users-temp")
        await store.delete("orders-2")

    async def main() -> None:
        async with statekeeper.open_store(first) as store:
            await fill(store)

    asyncio.run(main())
    original = everything(first)
    assert len(original) == 8

    chain = [first, postgres, mariadb, last]
    for source, target in itertools.pairwise(chain):
        doc = run_cli("copy", source, target, "--json", cwd=tmp_path).json()
        assert (doc["seen"], doc["copied"], doc["problems"]) == (8, 8, []), (source, target)

    for url in chain[1:]:
        got = everything(url)
        assert_copied(original, got, url)
        assert [cp.sequence for cp in got] == sorted(cp.sequence for cp in got)
        assert sorted({cp.stream for cp in got}) == ["odd name/with:colon", "orders", "users"]
