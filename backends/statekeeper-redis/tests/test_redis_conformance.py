"""The conformance kit, state machine included, on the Redis backend: plaintext,
encrypted (SPEC S16), and encrypted with sealed tags and metadata
(``encrypt_metadata=True``)."""

from __future__ import annotations

from typing import Any

import pytest

from statekeeper.testing import CheckpointStoreTests, StoreFactory, encrypted_options


class TestRedisConformance(CheckpointStoreTests):
    option_sets = {
        "plain": {},
        "encrypted": encrypted_options(),
        "sealed-metadata": encrypted_options(metadata=True),
    }

    @pytest.fixture
    def store_factory(self, make_store: Any) -> StoreFactory:
        return make_store  # type: ignore[no-any-return]
