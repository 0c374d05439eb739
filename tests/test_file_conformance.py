"""The conformance kit against the file backend (a fresh directory per test)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.testing import CheckpointStoreTests


class TestFileConformance(CheckpointStoreTests):
    # Every step fsyncs; the fast class below runs the state machine at full size.
    state_machine_examples = 8

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> Callable[..., FileCheckpointStore]:
        return lambda **options: FileCheckpointStore(tmp_path / "store", **options)


class TestFileConformanceFast(CheckpointStoreTests):
    """The same contract with ``durability="fast"`` (no fsyncs)."""

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> Callable[..., FileCheckpointStore]:
        def make(**options: Any) -> FileCheckpointStore:
            options.setdefault("durability", "fast")
            return FileCheckpointStore(tmp_path / "store", **options)

        return make
