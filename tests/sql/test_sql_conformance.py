"""The SQL backend runs the conformance kit on SQLite, PostgreSQL and MariaDB/MySQL.

The server suites use the real servers named by ``STATEKEEPER_TEST_POSTGRES_URL`` and
``STATEKEEPER_TEST_MYSQL_URL`` (see :func:`statekeeper.testing.service_url`), through
the fixtures of ``conftest.py``. Each run of this module uses its own random table
prefix per server; every test starts from a new, empty store under it, and the tables
are dropped at the end.

Each server runs the kit plaintext and encrypted (S16, ``encrypted_options``), the
state machine with fewer examples encrypted on the servers (the plaintext set already
runs their statements; sealing is above the backend); SQLite also runs it with sealed
tags and metadata (its tag rows and metadata filters then see empty fields).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sql_helpers import ServerStores
from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.testing import CheckpointStoreTests, StoreFactory, encrypted_options


class TestSqliteConformance(CheckpointStoreTests):
    option_sets = {
        "plain": {},
        "encrypted": encrypted_options(),
        "sealed-metadata": encrypted_options(metadata=True),
    }

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        url = f"sqlite:///{tmp_path / 'store.db'}"
        return lambda **options: SqlCheckpointStore.from_url(url, **options)


class TestPostgresConformance(CheckpointStoreTests):
    # The full state machine, as on SQLite: the lean path's statements (saves,
    # reads, pages) are PostgreSQL's own, not the code SQLite runs. Encrypted, the
    # same statements carry envelopes: 10 examples instead of 25.
    option_sets = {"plain": {}, "encrypted": encrypted_options()}
    option_set_examples = {"encrypted": 0.4}

    @pytest.fixture
    def store_factory(self, postgres_stores: ServerStores) -> Iterator[StoreFactory]:
        yield from postgres_stores.factory()


class TestMysqlConformance(CheckpointStoreTests):
    # Each example opens engines and runs ~30 steps of round trips; MySQL runs the
    # SQL core's operations, the same code as SQLite, so fewer examples cover the
    # dialect's part.
    state_machine_examples = 10
    option_sets = {"plain": {}, "encrypted": encrypted_options()}
    option_set_examples = {"encrypted": 0.5}

    @pytest.fixture
    def store_factory(self, mysql_stores: ServerStores) -> Iterator[StoreFactory]:
        yield from mysql_stores.factory()
