"""One store's descriptors are shared by its threads (the event loop's, for inline
reads, and up to four workers'): a directory listing through a shared descriptor
must not share its read position with another thread's listing (the kit's
concurrent-sweeps test failed about every other run on it)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file.io import OsFileIO


def test_listing_one_directory_descriptor_from_two_threads_sees_each_name_once(
    tmp_path: Path,
) -> None:
    # os.listdir(fd) reads through a dup of fd, which shares its offset: two threads
    # listing one descriptor at once got each other's names twice, or none.
    names = {f"{n:05d}" for n in range(200)}
    for name in names:
        (tmp_path / name).mkdir()
    io = OsFileIO()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    wrong: list[int] = []

    def lister() -> None:
        for _ in range(200):
            got = io.listdir(fd)
            if len(got) != len(names) or set(got) != names:
                wrong.append(len(got))

    try:
        threads = [threading.Thread(target=lister) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        os.close(fd)
    assert wrong == [], f"listings of {len(names)} names had {sorted(set(wrong))} names"


@pytest.mark.asyncio
async def test_first_listings_of_every_stream_at_once_each_see_every_checkpoint(
    tmp_path: Path,
) -> None:
    # A store opened empty lists the bucket directories at its first listing of
    # every stream after its first saves; four such listings at once ran on four
    # threads through the one records descriptor, and came back empty or doubled.
    for round in range(20):
        store = FileCheckpointStore(tmp_path / f"store{round}", durability="fast")
        async with store:
            for n in range(30):  # one by one: save_many would list the buckets
                await store.save(f"s{n % 3}", n)

            pages = await asyncio.gather(*(_sequences(store) for _ in range(4)))
            assert pages == [list(range(30, 0, -1))] * 4, f"round {round}"


async def _sequences(store: FileCheckpointStore) -> list[int | None]:
    page = await store.list(None, limit=100, include_state=False)
    return [cp.sequence for cp in page.items]
