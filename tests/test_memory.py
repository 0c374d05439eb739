"""The in-memory backend runs the conformance kit (SPEC S1-S8, S11)."""

from __future__ import annotations

import pytest

from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.errors import CheckpointEncodeError
from statekeeper.testing import CheckpointStoreTests, StoreFactory


class TestMemoryConformance(CheckpointStoreTests):
    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        storage = MemoryStorage()
        return lambda **options: MemoryCheckpointStore(storage=storage, **options)


@pytest.mark.asyncio
async def test_non_mapping_metadata_is_refused_with_encode_error() -> None:
    """Regression: ``dict(metadata)`` ran before validation, so a string or a number
    raised a bare ValueError/TypeError and a list of pairs was silently accepted."""
    async with MemoryCheckpointStore() as store:
        for metadata in ("ab", 5, [("a", 1)], [1, 2]):
            with pytest.raises(CheckpointEncodeError):
                await store.save("job", {}, metadata=metadata)  # type: ignore[arg-type]
        assert await store.list_streams() == []
