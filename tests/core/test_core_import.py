"""import_checkpoint keeps the source's identity and judges liveness by this store's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from statekeeper.backends.memory import MemoryCheckpointStore
from statekeeper.errors import PreconditionFailed

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.asyncio
async def test_import_keeps_id_timestamps_etag_parent_tags_metadata() -> None:
    async with MemoryCheckpointStore() as src, MemoryCheckpointStore() as dst:
        parent = await src.save("s", {"n": 1}, id="p-1")
        cp = await src.save("s", {"n": 2}, parent_id="p-1", tags={"k": "v"}, metadata={"m": [1]})
        await dst.import_checkpoint(parent, parent.state)
        copied = await dst.import_checkpoint(cp, cp.state)
        loaded = await dst.load(cp.id)
        for field in ("id", "stream", "created_at", "updated_at", "etag", "parent_id", "tags"):
            assert getattr(loaded, field) == getattr(cp, field)
        assert loaded.metadata == {"m": [1]} and loaded.state == {"n": 2}
        assert copied.sequence == loaded.sequence
        with pytest.raises(PreconditionFailed):
            await dst.import_checkpoint(cp, cp.state)


@pytest.mark.asyncio
async def test_import_over_an_expired_id_uses_the_stores_clock_not_the_records() -> None:
    now = [T0]
    async with MemoryCheckpointStore(clock=lambda: now[0]) as store:
        await store.save("s", {"n": 1}, id="x", ttl=10)
        old = await store.load("x")
        now[0] = T0 + timedelta(seconds=20)  # "x" has expired here
        # the imported record was created at T0, when "x" was still live; what counts is now
        imported = await store.import_checkpoint(old.model_copy(update={"expires_at": None}), 2)
        assert (await store.load("x")).state == 2
        assert imported.sequence > old.sequence
