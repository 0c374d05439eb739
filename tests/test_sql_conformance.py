"""The SQL backend runs the conformance kit on SQLite, PostgreSQL and MariaDB/MySQL.

The server suites use the real servers named by ``STATEKEEPER_TEST_POSTGRES_URL`` and
``STATEKEEPER_TEST_MYSQL_URL`` (see :func:`statekeeper.testing.service_url`); each test
gets its own random table prefix and drops its tables afterwards.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.testing import CheckpointStoreTests, StoreFactory, service_url


def drop_store(url: str, prefix: str) -> None:
    """Drop the tables of the store ``prefix`` at ``url`` (from sync teardown code).

    Runs on its own thread and event loop, so that it never touches the event loop
    that pytest-asyncio manages for the tests.
    """
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(SqlCheckpointStore(url, table_prefix=prefix).drop_tables())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def server_factory(service: str) -> Iterator[StoreFactory]:
    url = service_url(service)
    prefix = f"t{secrets.token_hex(4)}_"
    yield lambda **options: SqlCheckpointStore(url, table_prefix=prefix, **options)
    drop_store(url, prefix)


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
