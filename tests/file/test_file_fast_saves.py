"""A lone ``durability="fast"`` save of the file backend runs on the event loop's
thread, without the worker hop, and takes the hop (and waits there) wherever it
would have to wait or sync: a lock held by another process, a due sync mark, a
crashed writer's journal. ``durability="full"`` saves always take the hop."""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

import pytest
from file_helpers import count_hops, read_state

from statekeeper.backends.file import FileCheckpointStore

pytestmark = pytest.mark.asyncio


async def test_a_lone_fast_save_takes_no_hop_and_is_read_back(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s", durability="fast") as store:
        await store.save("warm", {})
        hops = count_hops(store)
        saved = [await store.save("s", {"i": i}, metadata={"i": i}) for i in range(5)]
        assert hops == []
        assert [cp.sequence for cp in saved] == list(range(2, 7))
        latest = await store.get_latest("s")
        assert latest is not None and latest.id == saved[-1].id and latest.state == {"i": 4}
        assert [cp.id for cp in (await store.list("s", limit=10, order="asc")).items] == [
            cp.id for cp in saved
        ]
        assert (await store.verify()).ok
    async with FileCheckpointStore(tmp_path / "s") as again:
        assert (await again.get_latest("s")).id == saved[-1].id  # type: ignore[union-attr]


async def test_a_full_save_always_takes_the_hop(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s", durability="full") as store:
        hops = count_hops(store)
        await store.save("s", {})
        await store.save("s", {})
        assert hops == ["save", "save"]


async def test_a_fast_save_waits_in_the_worker_for_a_lock_held_elsewhere(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s", durability="fast") as store:
        await store.save("s", {"n": 0})
        hops = count_hops(store)
        fd = os.open(tmp_path / "s" / "lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # as another process's writer would
            task = asyncio.create_task(store.save("s", {"n": 1}))
            for _ in range(100):  # the inline attempt meets the lock: the hop is under way
                if hops:
                    break
                await asyncio.sleep(0)
            await asyncio.sleep(0.05)  # (it cannot finish while the lock is held)
            assert not task.done(), "the save did not wait for the lock"
            assert hops == ["save"]
            fcntl.flock(fd, fcntl.LOCK_UN)
            cp = await asyncio.wait_for(task, 10)
        finally:
            os.close(fd)
        assert (await store.get_latest("s")).id == cp.id  # type: ignore[union-attr]


async def test_fast_saves_still_move_the_sync_mark_in_the_worker(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s", durability="fast", sync_interval=3) as store:
        hops = count_hops(store)
        for i in range(7):
            await store.save("s", {"i": i})
        # the saves that reach the mark (3 and 6) flush the indexes: in the worker
        assert hops == ["save", "save"]
        state = read_state(store.path)
        assert state is not None and state.synced == 6


async def test_a_fast_save_after_another_process_wrote_sees_its_saves(tmp_path: Path) -> None:
    async with (
        FileCheckpointStore(tmp_path / "s", durability="fast") as a,
        FileCheckpointStore(tmp_path / "s", durability="fast") as b,
    ):
        first = await a.save("s", {"n": 1})
        second = await b.save("s", {"n": 2})
        third = await a.save("s", {"n": 3})
        assert [first.sequence, second.sequence, third.sequence] == [1, 2, 3]
        assert [cp.id for cp in (await a.list("s", limit=10, order="asc")).items] == [
            first.id,
            second.id,
            third.id,
        ]
        assert (await b.get_latest("s")).id == third.id  # type: ignore[union-attr]
