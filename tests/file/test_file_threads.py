"""One store's descriptors are shared by its threads (the event loop's, for inline
reads, and up to four workers'): a directory listing through a shared descriptor
must not share its read position with another thread's listing. The store-level
case is the kit's concurrent-sweeps test, which failed about every other run."""

from __future__ import annotations

import os
import threading
from pathlib import Path

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
