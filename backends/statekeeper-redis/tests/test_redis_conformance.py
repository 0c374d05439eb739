"""The conformance kit, state machine included, on the Redis backend."""

from __future__ import annotations

from typing import Any

import pytest

from statekeeper.testing import CheckpointStoreTests, StoreFactory


class TestRedisConformance(CheckpointStoreTests):
    @pytest.fixture
    def store_factory(self, make_store: Any) -> StoreFactory:
        return make_store  # type: ignore[no-any-return]
