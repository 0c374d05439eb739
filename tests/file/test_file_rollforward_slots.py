"""The roll forward of a committed ``save_many`` indexes every record of the batch,
also one whose slot falls below a stream index's tail.

The situation: a writer crashes after the batch's commit (journal ``batched
lo..hi``, every record file durable) and before any stream index has it; the
state lags behind the directory (a torn write of ``state`` falls back to the
other copy, as ``Recovery.resolve_batch`` allows for), so a later save lands in
the same stream's index first, and the committed journal comes back after it.
Both state moves are written here with ``write_state`` (as another writer's
write would land): no single crash of ``save_many`` reaches this, since it makes
the cleared journal durable. The next writer rolls the batch forward while that
stream's index already ends above the batch. At 88487cc the roll forward
appended only the slots above the index's tail and dropped the rest: the
checkpoints stayed on disk and ``load`` found them, but ``list`` silently left
them out and ``verify`` reported the stream index as not listing them.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import ClassVar

import pytest
from fault_io import FaultHookIO
from file_helpers import read_state, write_state

import statekeeper as sk
from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file import layout as fmt
from statekeeper.errors import BackendError


class CrashAtIndexIO(FaultHookIO):
    """The real file system until, once armed, the first write into a stream index:
    from there every mutating call fails (the process is gone; what it wrote
    before stays, as after a SIGKILL)."""

    FAULTED: ClassVar[frozenset[str]] = frozenset(
        {
            "write",
            "pwrite",
            "fsync",
            "fdatasync",
            "syncfs",
            "rename",
            "ftruncate",
            "unlink",
            "mkdir",
            "open",
        }
    )

    def __init__(self) -> None:
        self.armed = False
        self.dead = False
        self._fd: int | None = None

    def _fault(self, op: str) -> None:
        if not self.dead and self.armed and op in {"write", "pwrite"} and self._fd is not None:
            path = os.readlink(f"/proc/self/fd/{self._fd}")
            self.dead = f"/{fmt.STREAMS_DIR}/" in path
        if self.dead:
            raise OSError(errno.EIO, f"crashed before {op}")

    def write(self, fd: int, data: bytes) -> int:
        self._fd = fd
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._fd = fd
        return super().pwrite(fd, data, offset)


async def every_checkpoint(store: FileCheckpointStore, stream: str) -> list[str]:
    """Every id ``list`` gives for ``stream``, oldest first, page by page, each page
    complete."""
    ids: list[str] = []
    after: str | None = None
    while True:
        page = await store.list(stream, order="asc", limit=2, after=after, include_state=False)
        assert not page.skipped, page.skipped
        ids += [cp.id for cp in page.items]
        if page.next_cursor is None:
            return ids
        after = page.next_cursor


@pytest.mark.asyncio
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
async def test_a_rolled_forward_batch_fills_a_slot_below_an_index_tail(tmp_path: Path) -> None:
    root = tmp_path / "s"
    io = CrashAtIndexIO()
    async with FileCheckpointStore(root, create=True) as store:
        first = await store.save("a", {"n": 0}, id="a-0")
    batch = [
        sk.NewCheckpoint(stream="a", state={"n": 1}, id="a-1"),
        sk.NewCheckpoint(stream="b", state={"n": 2}, id="b-2"),
        sk.NewCheckpoint(stream="a", state={"n": 3}, id="a-3"),
    ]
    store = FileCheckpointStore(root, io=io)
    await store.open()
    try:
        io.armed = True
        with pytest.raises(BackendError):
            await store.save_many(batch)
    finally:
        with contextlib.suppress(BackendError):
            await store.close()  # still crashed: closing writes nothing
    crashed = read_state(root)
    assert crashed is not None and crashed.journal is not None
    assert crashed.journal.op == fmt.BATCH_COMMITTED, crashed.journal
    lo, hi = crashed.journal.lo, crashed.journal.hi
    assert hi - lo + 1 == len(batch)

    # The state lags: the journal is gone, so the next save is indexed first ...
    write_state(root, crashed.next(journal=None))
    async with FileCheckpointStore(root) as store:
        later = await store.save("a", {"n": 4}, id="a-4")
        # The situation is reached: stream a's index ends above the batch without it.
        assert await every_checkpoint(store, "a") == [first.id, later.id]
    assert later.sequence == hi + 1
    # ... and then the committed batch's journal comes back.
    now = read_state(root)
    assert now is not None
    write_state(root, now.next(journal=fmt.Journal(fmt.BATCH_COMMITTED, "", lo=lo, hi=hi)))

    async with FileCheckpointStore(root) as store:
        assert await every_checkpoint(store, "a") == [first.id, "a-1", "a-3", later.id]
        assert await every_checkpoint(store, "b") == ["b-2"]
        loaded = await store.load_many(["a-1", "b-2", "a-3"])
        assert [loaded[cid].sequence for cid in ("a-1", "b-2", "a-3")] == list(range(lo, hi + 1))
        latest = await store.get_latest("a")
        assert latest is not None and latest.id == later.id
        latest_b = await store.get_latest("b")
        assert latest_b is not None and latest_b.id == "b-2"
        report = await store.verify()
        assert report.ok, report.problems
        assert report.records == 5
