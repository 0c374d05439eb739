"""The file backend's batches and issue-13 additions, beyond the kit: a batch in
flight is invisible to readers, a failed batch leaves nothing, save_many costs one
fsync group, delete_many across streams is one journaled operation that a crash
leaves finishable, list_streams(prefix=) matches real stream names (not escaped
file names), update edits, and raw states stored verbatim. Crashes and power cuts
are in ``tests/reliability/test_batch_crash_file.py``."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

import pytest

import statekeeper as sk
from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file.io import OsFileIO
from statekeeper.errors import BackendError, PreconditionFailed


def items(tag: str, n: int = 5, streams: int = 3) -> list[sk.NewCheckpoint]:
    return [
        sk.NewCheckpoint(stream=f"s{i % streams}", state={"tag": tag, "i": i}, id=f"{tag}-{i}")
        for i in range(n)
    ]


class GateIO(OsFileIO):
    """Blocks the creation of one file until released (a writer caught mid-batch)."""

    def __init__(self, name_part: str) -> None:
        self.name_part = name_part
        self.reached = threading.Event()
        self.release = threading.Event()

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        if flags & os.O_CREAT and self.name_part in name:
            self.reached.set()
            assert self.release.wait(30)
        return super().open(name, flags, mode, dir_fd=dir_fd)


class CountIO(OsFileIO):
    def __init__(self) -> None:
        self.syncs = 0

    def fsync(self, fd: int) -> None:
        self.syncs += 1
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1
        super().fdatasync(fd)

    def syncfs(self, fd: int) -> None:
        self.syncs += 1
        super().syncfs(fd)


class FailIO(OsFileIO):
    """Fails the k-th call of ``op`` (counted from ``arm``) with EIO."""

    def __init__(self) -> None:
        self.op = ""
        self.k = 0

    def arm(self, op: str, k: int) -> None:
        self.op, self.k = op, k

    def _fail(self, op: str) -> None:
        if op == self.op:
            self.k -= 1
            if self.k == 0:
                self.op = ""
                raise OSError(errno.EIO, f"injected EIO in {op}")

    def write(self, fd: int, data: bytes) -> int:
        self._fail("write")
        return super().write(fd, data)

    def unlink(self, name: str, *, dir_fd: int) -> None:
        self._fail("unlink")
        super().unlink(name, dir_fd=dir_fd)

    def fdatasync(self, fd: int) -> None:
        self._fail("fdatasync")
        super().fdatasync(fd)


def record_files(root: Path, pattern: str = "*.ckpt") -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.glob(f"records/*/{pattern}")}


async def everything(store: FileCheckpointStore) -> list[str]:
    page = await store.list(None, order="asc", limit=1000)
    assert not page.skipped, page.skipped
    return [cp.id for cp in page.items]


@pytest.mark.asyncio
@pytest.mark.parametrize("durability", ["full", "fast"])
async def test_a_batch_in_flight_is_invisible_to_readers(tmp_path: Path, durability: str) -> None:
    """The writer is held while creating the third record file of a batch: its
    first two files exist under their final names, yet no read shows any item."""
    gate = GateIO(".two-2.ckpt")
    async with (
        FileCheckpointStore(tmp_path, io=gate, durability=durability) as writer,
        FileCheckpointStore(tmp_path) as reader,
    ):
        one = await writer.save_many(items("one"))
        task = asyncio.create_task(writer.save_many(items("two")))
        assert await asyncio.to_thread(gate.reached.wait, 30)
        assert len(record_files(tmp_path, "*.two-*.ckpt")) == 2
        try:
            assert await everything(reader) == [cp.id for cp in one]
            assert await reader.load_many([f"two-{i}" for i in range(5)]) == {}
            for i in range(3):
                latest = await reader.get_latest(f"s{i}")
                assert latest is not None and latest.state["tag"] == "one"
            assert (await reader.list("s0", limit=10)).items[0].id == "one-3"
            assert (await reader.info()).checkpoints == 5
        finally:
            gate.release.set()
        two = await task
        assert await everything(reader) == [cp.id for cp in one + two]
        assert (await reader.verify()).ok


@pytest.mark.asyncio
@pytest.mark.parametrize(("op", "k"), [("write", 3), ("fdatasync", 2), ("fdatasync", 3)])
async def test_a_failed_batch_leaves_nothing(tmp_path: Path, op: str, k: int) -> None:
    """EIO while the record files are written, at the commit, or at the last write
    of state: save_many fails, and nothing of it is left, now or after reopening."""
    io = FailIO()
    async with FileCheckpointStore(tmp_path, io=io, batch_sync="fsync") as store:
        one = await store.save_many(items("one"))
        io.arm(op, k)
        with pytest.raises(BackendError):
            await store.save_many(items("two"))
        assert await everything(store) == [cp.id for cp in one]
        again = await store.save_many(items("two"))  # the ids are free again
        assert again[0].sequence > one[-1].sequence + 5, "sequences were reused"
        assert (await store.verify()).ok
    async with FileCheckpointStore(tmp_path) as store:
        assert await everything(store) == [cp.id for cp in one + again]


@pytest.mark.asyncio
async def test_a_live_id_fails_the_batch_before_anything_is_written(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as store:
        await store.save("s0", {}, id="two-4")
        before = record_files(tmp_path)
        with pytest.raises(PreconditionFailed):
            await store.save_many(items("two"))
        assert record_files(tmp_path) == before


@pytest.mark.asyncio
@pytest.mark.parametrize("batch_sync", ["syncfs", "fsync"])
async def test_save_many_is_one_fsync_group(tmp_path: Path, batch_sync: str) -> None:
    io = CountIO()
    async with FileCheckpointStore(tmp_path, io=io, batch_sync=batch_sync) as store:
        for i in range(7):  # creating a stream's index is made durable once
            await store.save(f"s{i}", {})
        io.syncs = 0
        await store.save_many(items("many", 100, streams=7))
        if batch_sync == "syncfs":
            # the intent, the group, the commit, the end of the journal
            assert io.syncs == 4
        else:
            assert io.syncs == 100 + 4


@pytest.mark.asyncio
async def test_delete_many_across_streams_is_one_operation_a_crash_leaves_finishable(
    tmp_path: Path,
) -> None:
    """The unlinks fail midway: the journal names every stream index involved, so
    the next writer finishes the deletion in all of them."""
    io = FailIO()
    async with FileCheckpointStore(tmp_path, io=io) as store:
        saved = await store.save_many(items("x", 9, streams=3))
        keep = await store.save("s0", {"keep": True})
        io.arm("unlink", 4)
        with pytest.raises(BackendError):
            await store.delete_many([cp.id for cp in saved[:6]])
    async with FileCheckpointStore(tmp_path) as store:
        assert await everything(store) == [cp.id for cp in saved[6:]] + [keep.id]
        assert (await store.verify()).ok
        assert await store.delete_many([cp.id for cp in saved] + ["nope"]) == 3


@pytest.mark.asyncio
@pytest.mark.parametrize("read_only", [False, True])
async def test_list_streams_prefix_matches_stream_names_not_file_names(
    tmp_path: Path, read_only: bool
) -> None:
    long_a, long_b = "x" * 300 + "a", "x" * 300 + "b"
    names = ["Job/1", "job/2", ".hidden", "%41", "A", "é/1", long_a, long_b, "x"]
    async with FileCheckpointStore(tmp_path) as store:
        await store.save_many([sk.NewCheckpoint(stream=n, state={}) for n in names])
    if read_only:  # a missing index sends the read-only store to the records
        next((tmp_path / "streams").glob("job*.idx")).unlink()
    async with FileCheckpointStore(tmp_path, read_only=read_only) as store:
        cases = {
            "J": ["Job/1"],
            "job": ["job/2"],
            ".": [".hidden"],
            "%": ["%41"],
            "%4": ["%41"],
            "A": ["A"],
            "é": ["é/1"],
            "x" * 250: [long_a, long_b],
            long_a: [long_a],
            "x": ["x", long_a, long_b],
            "": sorted(names),
        }
        for prefix, want in cases.items():
            assert await store.list_streams(prefix=prefix) == sorted(want), prefix


@pytest.mark.asyncio
async def test_update_edits_are_what_reads_and_filters_see(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as store:
        parent = await store.save("job", {"n": 0})
        cp = await store.save("job", {"n": 1}, tags={"kind": "a"}, metadata={"m": 1})
        new = await store.update(
            cp.id,
            {"n": 2},
            if_match=cp.etag,
            tags={"kind": "b"},
            metadata={"m": True},
            parent_id=parent.id,
        )
        assert (new.sequence, new.created_at) == (cp.sequence, cp.created_at)
    async with FileCheckpointStore(tmp_path) as store:
        got = await store.load(cp.id)
        assert (got.tags, got.metadata, got.parent_id) == ({"kind": "b"}, {"m": True}, parent.id)
        assert [c.id for c in (await store.list("job", tags={"kind": "b"})).items] == [cp.id]
        assert (await store.list("job", tags={"kind": "a"})).items == []
        assert (await store.list("job", metadata={"m": 1})).items == []
        assert [c.id for c in (await store.list(None, metadata={"m": True})).items] == [cp.id]
        latest = await store.get_latest("job")
        assert latest is not None and latest.state == {"n": 2}
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_raw_states_are_stored_verbatim(tmp_path: Path) -> None:
    blob = bytes(range(256)) + b"\x00not json\xff"
    async with FileCheckpointStore(tmp_path, codec="raw") as store:
        one = await store.save("job", blob)
        many = await store.save_many([sk.NewCheckpoint(stream="job", state=blob[::-1])])
        upd = await store.update(one.id, blob * 2)
    files = {name.split(".")[1]: data for name, data in record_files(tmp_path).items()}
    assert files[one.id].endswith(blob * 2) and files[many[0].id].endswith(blob[::-1])
    assert b'"codec":"raw"' in files[one.id]
    async with FileCheckpointStore(tmp_path) as store:  # a JSON store reads them too
        assert (await store.load(upd.id)).state == blob * 2
        assert (await store.load(many[0].id)).state == blob[::-1]
