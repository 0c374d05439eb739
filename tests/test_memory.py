"""The in-memory backend runs the conformance kit (SPEC S1-S8, S11)."""

from __future__ import annotations

import pytest

from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.testing import CheckpointStoreTests, StoreFactory


class TestMemoryConformance(CheckpointStoreTests):
    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        storage = MemoryStorage()
        return lambda **options: MemoryCheckpointStore(storage=storage, **options)
