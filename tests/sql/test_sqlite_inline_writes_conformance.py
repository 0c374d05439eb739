"""The conformance kit on SQLite with ``durability="fast"``: single-record writes run
inline on the event loop's thread (``SqliteRuntime.point_write``), batches and
bulk deletes on the writer thread. ``tests/test_sql_conformance.py`` runs the kit
at the default ``durability="full"``, where every write goes to the writer thread;
both paths run the same write bodies, and this holds the inline path to the whole
contract too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.backends.sql.sqlite import SqliteOptions
from statekeeper.testing import CheckpointStoreTests, StoreFactory


class TestSqliteInlineWritesConformance(CheckpointStoreTests):
    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        url = f"sqlite:///{tmp_path / 'store.db'}"

        def make(**options: Any) -> SqlCheckpointStore:
            options.setdefault("durability", "fast")
            store = SqlCheckpointStore.from_url(url, **options)
            assert isinstance(store.options, SqliteOptions)
            assert store.options.inline_writes is True
            return store

        return make
