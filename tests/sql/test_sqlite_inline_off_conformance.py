"""The conformance kit and its state machine on SQLite with ``inline_reads=False``:
every read on the reader threads (``tests/test_sql_conformance.py`` runs them with
inline reads on, the default). Both paths run the same read bodies; this holds the
worker path to the whole contract too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.backends.sql.sqlite import SqliteOptions
from statekeeper.testing import CheckpointStoreTests, StoreFactory


class TestSqliteInlineReadsOffConformance(CheckpointStoreTests):
    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        url = f"sqlite:///{tmp_path / 'store.db'}"

        def make(**options: Any) -> SqlCheckpointStore:
            options.setdefault("inline_reads", False)
            store = SqlCheckpointStore.from_url(url, **options)
            assert isinstance(store.options, SqliteOptions)
            assert store.options.inline_reads is False
            return store

        return make
