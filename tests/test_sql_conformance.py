"""The SQL backend runs the conformance kit on SQLite, PostgreSQL and MariaDB/MySQL.

The server suites use the real servers named by ``STATEKEEPER_TEST_POSTGRES_URL`` and
``STATEKEEPER_TEST_MYSQL_URL`` (see :func:`statekeeper.testing.service_url`). Each run
of this module uses its own random table prefix per server; every test starts from a
new, empty store under it, and the tables are dropped at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sql_helpers import ServerStores
from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.testing import CheckpointStoreTests, StoreFactory


class TestSqliteConformance(CheckpointStoreTests):
    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        url = f"sqlite:///{tmp_path / 'store.db'}"
        return lambda **options: SqlCheckpointStore(url, **options)


@pytest.fixture(scope="module")
def postgres_stores() -> Iterator[ServerStores]:
    stores = ServerStores("postgres")
    yield stores
    stores.drop()


@pytest.fixture(scope="module")
def mysql_stores() -> Iterator[ServerStores]:
    stores = ServerStores("mysql")
    yield stores
    stores.drop()


class TestPostgresConformance(CheckpointStoreTests):
    # Each example opens engines and runs ~30 steps of round trips; the operations
    # are the same code as on SQLite, so fewer examples cover the dialect's part.
    state_machine_examples = 10

    @pytest.fixture
    def store_factory(self, postgres_stores: ServerStores) -> Iterator[StoreFactory]:
        yield from postgres_stores.factory()


class TestMysqlConformance(CheckpointStoreTests):
    state_machine_examples = 10

    @pytest.fixture
    def store_factory(self, mysql_stores: ServerStores) -> Iterator[StoreFactory]:
        yield from mysql_stores.factory()
