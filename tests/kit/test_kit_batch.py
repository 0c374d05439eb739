"""The kit's issue-13 tests on backends that declare less than the memory store.

A backend that keeps the base class's defaults for the batch primitives
(``_get_many``, ``_insert_many``, ``_delete_many``, ``_list_streams_prefixed``) and
declares neither ``atomic_batches`` nor ``raw_access`` must still pass the kit:
the defaults are correct, the atomicity tests skip with a reason, and the test
that a header needs no state plants its undecodable state through the allowlist
instead of the backdoor.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import ClassVar

import pytest

from statekeeper._core.primitives import StorePrimitives
from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.config import Capabilities
from statekeeper.models import CheckpointHeader
from statekeeper.record import NewRecord, StoredRecord
from statekeeper.testing import CheckpointStoreTests, StoreFactory


class DefaultBatchesMemory(MemoryCheckpointStore):
    """The memory store with the base class's default batch primitives, no backdoor
    and no atomic batches: what a backend written before issue 13 inherits."""

    capabilities: ClassVar[Capabilities] = dataclasses.replace(
        MemoryCheckpointStore.capabilities, raw_access=False, atomic_batches=False
    )

    async def _get_many(self, ids: list[str], now: datetime) -> dict[str, StoredRecord]:
        return await StorePrimitives._get_many(self, ids, now)

    async def _insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        return await StorePrimitives._insert_many(self, records)

    async def _delete_many(self, ids: list[str], now: datetime) -> int:
        return await StorePrimitives._delete_many(self, ids, now)


class TestDefaultBatchesConformance(CheckpointStoreTests):
    state_machine_examples = 10

    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        storage = MemoryStorage()
        return lambda **options: DefaultBatchesMemory(storage=storage, **options)
