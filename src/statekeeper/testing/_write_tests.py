"""Kit tests for update (S6), delete (S7), prune and the store lifecycle."""

from __future__ import annotations

from typing import Any

import pytest

from .._core.store import BaseCheckpointStore
from ..errors import (
    CheckpointNotFound,
    PreconditionFailed,
    StoreClosed,
)
from ..models import NewCheckpoint
from ._base import FakeClock, KitBase, ids

asyncio_test = pytest.mark.asyncio(loop_scope="function")

__all__ = ["WriteTests"]


class WriteTests(KitBase):
    # -- S6: update -------------------------------------------------------------------

    @asyncio_test
    async def test_update_keeps_identity_and_changes_etag_and_updated_at(
        self, store: BaseCheckpointStore
    ) -> None:
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        cp = await store.save("job", {"v": 1}, tags={"k": "v"}, metadata={"m": 1})
        clock.advance(5)
        up = await store.update(cp.id, {"v": 2})
        assert (up.id, up.sequence, up.created_at, up.stream) == (
            cp.id,
            cp.sequence,
            cp.created_at,
            cp.stream,
        )
        assert (up.tags, up.metadata) == (cp.tags, cp.metadata)
        assert up.etag != cp.etag
        assert up.updated_at == clock.now > cp.updated_at
        loaded = await store.load(cp.id)
        assert loaded.header() == up.header()
        assert loaded.state == {"v": 2}

    @asyncio_test
    async def test_update_with_if_match_is_compare_and_set(
        self, store: BaseCheckpointStore
    ) -> None:
        cp = await store.save("job", {"v": 1})
        first = await store.update(cp.id, {"v": 2}, if_match=cp.etag)
        with pytest.raises(PreconditionFailed):
            await store.update(cp.id, {"v": "lost update"}, if_match=cp.etag)
        loaded = await store.load(cp.id)
        assert (loaded.state, loaded.etag) == ({"v": 2}, first.etag)
        second = await store.update(cp.id, {"v": 3}, if_match=first.etag)
        assert second.etag not in (cp.etag, first.etag)
        assert (await store.load(cp.id)).state == {"v": 3}

    @asyncio_test
    async def test_update_of_missing_or_deleted_raises_not_found(
        self, store: BaseCheckpointStore
    ) -> None:
        with pytest.raises(CheckpointNotFound):
            await store.update("never-existed", {})
        cp = await store.save("job", {})
        await store.delete(cp.id)
        with pytest.raises(CheckpointNotFound):
            await store.update(cp.id, {"v": 1})
        with pytest.raises(CheckpointNotFound):
            await store.update(cp.id, {"v": 1}, if_match=cp.etag)
        assert await store.list_streams() == []

    # -- S7: delete -------------------------------------------------------------------

    @asyncio_test
    async def test_delete_is_idempotent_and_returns_whether_removed(
        self, store: BaseCheckpointStore
    ) -> None:
        keep, doomed = await self.save_steps(store, "job", 2)
        assert await store.delete(doomed.id) is True
        assert await store.delete(doomed.id) is False
        assert await store.delete("never-existed") is False
        with pytest.raises(CheckpointNotFound):
            await store.load(doomed.id)
        assert ids(await store.list("job")) == [keep.id]
        latest = await store.get_latest("job")
        assert latest is not None
        assert latest.id == keep.id

    @asyncio_test
    async def test_delete_with_if_match(self, store: BaseCheckpointStore) -> None:
        cp = await store.save("job", {})
        updated = await store.update(cp.id, {"v": 1})
        with pytest.raises(PreconditionFailed):
            await store.delete(cp.id, if_match=cp.etag)
        assert (await store.load(cp.id)).etag == updated.etag
        assert await store.delete(cp.id, if_match=updated.etag) is True
        assert await store.delete(cp.id, if_match=updated.etag) is False

    @asyncio_test
    async def test_delete_stream_touches_no_other_stream(self, store: BaseCheckpointStore) -> None:
        neighbours = ("a/b", "ab", "a%", "a_", "A", "a ", "b")
        for name in neighbours:
            await store.save(name, {"name": name})
        await self.save_steps(store, "a", 3)
        assert await store.delete_stream("a") == 3
        assert await store.delete_stream("a") == 0
        assert await store.delete_stream("nothing-here") == 0
        assert await store.get_latest("a") is None
        assert await store.list_streams() == sorted(neighbours)
        for name in neighbours:
            latest = await store.get_latest(name)
            assert latest is not None
            assert latest.state == {"name": name}

    @asyncio_test
    async def test_prune_keeps_the_newest_and_touches_no_other_stream(
        self, store: BaseCheckpointStore
    ) -> None:
        other = await self.save_steps(store, "job/other", 3)
        saved = await self.save_steps(store, "job", 6)
        assert await store.prune("job", keep_last=10) == 0
        assert await store.prune("job", keep_last=2) == 4
        assert ids(await store.list("job", order="asc")) == ids(saved[-2:])
        assert await store.prune("job", keep_last=2) == 0
        assert await store.prune("job", keep_last=0) == 2
        assert await store.get_latest("job") is None
        assert await store.prune("nothing-here", keep_last=0) == 0
        assert ids(await store.list("job/other", order="asc")) == ids(other)
        assert await store.list_streams() == ["job/other"]

    @asyncio_test
    async def test_list_streams_is_sorted_and_omits_empty_streams(
        self, store: BaseCheckpointStore
    ) -> None:
        assert await store.list_streams() == []
        for name in ("b", "a", "c", "a"):
            await store.save(name, {})
        gone = await store.save("gone", {})
        assert await store.list_streams() == ["a", "b", "c", "gone"]
        await store.delete(gone.id)
        assert await store.list_streams() == ["a", "b", "c"]

    # -- lifecycle --------------------------------------------------------------------

    @asyncio_test
    async def test_open_and_close_are_idempotent(self, store: BaseCheckpointStore) -> None:
        cp = await store.save("job", {"v": 1})
        await store.open()
        assert (await store.load(cp.id)).state == {"v": 1}
        await store.close()
        await store.close()
        assert not store.is_open
        await store.open()
        assert (await store.load(cp.id)).state == {"v": 1}
        async with store:
            assert (await store.load(cp.id)).state == {"v": 1}
        assert not store.is_open

    @asyncio_test
    async def test_every_method_raises_store_closed_after_close(
        self, store: BaseCheckpointStore
    ) -> None:
        cp = await store.save("job", {})
        page = await store.list("job", limit=1)
        await store.close()
        await self._assert_all_closed(store, cp.id, cp.etag, page.prev_cursor)
        never_opened = self._kit_factory()
        await self._assert_all_closed(never_opened, cp.id, cp.etag, None)

    @staticmethod
    async def _assert_all_closed(
        store: BaseCheckpointStore, cid: str, etag: str, cursor: str | None
    ) -> None:
        calls: dict[str, Any] = {
            "save": lambda: store.save("job", {}),
            "get_latest": lambda: store.get_latest("job"),
            "load": lambda: store.load(cid),
            "list": lambda: store.list("job"),
            "list(after=)": lambda: store.list("job", after=cursor),
            "list(None)": lambda: store.list(None),
            "update": lambda: store.update(cid, {}, if_match=etag),
            "delete": lambda: store.delete(cid),
            "delete_stream": lambda: store.delete_stream("job"),
            "list_streams": lambda: store.list_streams(),
            "prune": lambda: store.prune("job", keep_last=0),
            "purge_expired": lambda: store.purge_expired(),
            "info": lambda: store.info(),
            "load(include_state=False)": lambda: store.load(cid, include_state=False),
            "load_many": lambda: store.load_many([cid]),
            "cursor_at": lambda: store.cursor_at(cid),
            "list(metadata=)": lambda: store.list("job", metadata={"m": 1}),
            "update(tags=)": lambda: store.update(cid, {}, tags={"k": "v"}),
            "save_many": lambda: store.save_many([NewCheckpoint(stream="job")]),
            "delete_many": lambda: store.delete_many([cid]),
            "list_streams(prefix=)": lambda: store.list_streams(prefix="j"),
        }
        for name, call in calls.items():
            try:
                await call()
            except StoreClosed:
                continue
            except Exception as exc:
                pytest.fail(f"{name} on a closed store raised {exc!r}, not StoreClosed")
            pytest.fail(f"{name} on a closed store did not raise StoreClosed")
        with pytest.raises(StoreClosed):
            _ = store.store_id
