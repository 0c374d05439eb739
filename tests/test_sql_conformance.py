"""The SQL backend runs the conformance kit on SQLite, PostgreSQL and MariaDB/MySQL.

The server suites use the real servers named by ``STATEKEEPER_TEST_POSTGRES_URL`` and
``STATEKEEPER_TEST_MYSQL_URL`` (see :func:`statekeeper.testing.service_url`); each test
gets its own random table prefix and drops its tables afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sql_helpers import server_factory
from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.testing import CheckpointStoreTests, StoreFactory


class TestSqliteConformance(CheckpointStoreTests):
    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        url = f"sqlite:///{tmp_path / 'store.db'}"
        return lambda **options: SqlCheckpointStore(url, **options)


class TestPostgresConformance(CheckpointStoreTests):
    # Each example opens engines and runs ~30 steps of round trips; the operations
    # are the same code as on SQLite, so fewer examples cover the dialect's part.
    state_machine_examples = 10

    @pytest.fixture
    def store_factory(self) -> Iterator[StoreFactory]:
        yield from server_factory("postgres")


class TestMysqlConformance(CheckpointStoreTests):
    state_machine_examples = 10

    @pytest.fixture
    def store_factory(self) -> Iterator[StoreFactory]:
        yield from server_factory("mysql")
