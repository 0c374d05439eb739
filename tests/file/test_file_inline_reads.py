"""``get_latest`` and ``load`` of the file backend run on the event loop's thread
when they are the cheap indexed read (``inline_reads``, on by default), and take the
worker hop wherever the read would do more: there they give exactly the answers,
and raise exactly the errors, of the hop path (``inline_reads=False``). Also the
page scans' search of a stream index (``StreamIndex.locate``)."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from bisect import bisect_left, bisect_right
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from file_helpers import a_journal_in_flight, count_hops, parts_of, read_state

import statekeeper as sk
from statekeeper._core.query import ScanQuery
from statekeeper._runtime.inline import Budget, WouldBlock
from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file import layout as fmt
from statekeeper.backends.file.indexes import StreamIndex, write_index
from statekeeper.backends.file.io import OsFileIO
from statekeeper.backends.file.reader import INLINE_RECORD_BYTES
from statekeeper.errors import (
    BackendError,
    CheckpointDecodeError,
    CheckpointNotFound,
    StatekeeperError,
)
from statekeeper.models import Checkpoint

pytestmark = pytest.mark.asyncio


def record_file(root: Path, cp: Checkpoint) -> Path:
    return root / "records" / f"{cp.sequence // 1000:017d}" / f"{cp.sequence:020d}.{cp.id}.ckpt"


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x55
    path.write_bytes(bytes(data))


async def outcome(call: Callable[[], Awaitable[Any]]) -> tuple[str, Any]:
    """What a read gave: its checkpoint (id, sequence, state), ``None``, or its error
    (type and message)."""
    try:
        got = await call()
    except StatekeeperError as exc:
        return ("raised", (type(exc).__name__, str(exc)))
    if got is None:
        return ("none", None)
    return ("checkpoint", (got.id, got.sequence, got.state))


async def one_hop(
    hops: list[str], what: str, call: Callable[[], Awaitable[Any]]
) -> tuple[str, Any]:
    """``call`` runs in the worker, in one hop (``what``), after its inline run
    blocked; what it gave. (That the worker's answer is the one the inline run
    would give where it answers is ``test_file_inline_differential.py``'s.)"""
    before = len(hops)
    got = await outcome(call)
    assert hops[before:] == [what], hops[before:]
    return got


def latest_of(store: FileCheckpointStore, stream: str) -> Callable[[], Awaitable[Any]]:
    return lambda: store.get_latest(stream)


def load_of(store: FileCheckpointStore, cid: str) -> Callable[[], Awaitable[Any]]:
    return lambda: store.load(cid)


def inline(store: FileCheckpointStore, read: Callable[..., Any], *args: Any) -> Any:
    """``read(*args, now)``, an engine read, run inline right here: its answer, or
    :data:`BLOCKS` where it would block."""
    with parts_of(store).engine.files.active():
        try:
            return read(*args, store.now(), Budget(inline=True))
        except WouldBlock:
            return BLOCKS


BLOCKS = "blocks"


async def test_get_latest_and_load_take_no_hop_and_see_every_commit(tmp_path: Path) -> None:
    async with (
        FileCheckpointStore(tmp_path / "s") as store,
        FileCheckpointStore(tmp_path / "s", durability="fast") as other,
    ):
        first = await store.save("job", {"n": 0})
        assert (await store.get_latest("job")).id == first.id  # type: ignore[union-attr]
        hops = count_hops(store)
        for n in range(1, 4):
            cp = await store.save("job", {"n": n})
            latest = await store.get_latest("job")
            assert latest is not None and (latest.id, latest.state) == (cp.id, {"n": n})
            assert (await store.load(first.id)).state == {"n": 0}
        # another writer (as another process would be): its commits are seen at once
        theirs = await other.save("job", {"n": "theirs"})
        assert (await store.get_latest("job")).id == theirs.id  # type: ignore[union-attr]
        assert (await store.load(theirs.id)).state == {"n": "theirs"}
        updated = await other.update(theirs.id, {"n": "updated"})
        assert (await store.load(theirs.id)).etag == updated.etag
        assert (await store.get_latest("job")).state == {"n": "updated"}  # type: ignore[union-attr]
        batch = await other.save_many([sk.NewCheckpoint(stream="job", state=i) for i in range(3)])
        assert (await store.get_latest("job")).id == batch[-1].id  # type: ignore[union-attr]
        assert (await store.load(batch[0].id)).state == 0
        assert await other.delete(batch[-1].id)
        assert (await store.get_latest("job")).id == batch[-2].id  # type: ignore[union-attr]
        with pytest.raises(CheckpointNotFound):
            await store.load(batch[-1].id)
        with pytest.raises(CheckpointNotFound):
            await store.load("never-saved")
        assert await store.load(first.id, include_state=False)
        assert hops == ["save", "save", "save"]  # the reads took none


async def test_inline_reads_false_hops_for_every_read(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s", inline_reads=False) as store:
        assert store.options.inline_reads is False
        cp = await store.save("job", {"n": 1})
        hops = count_hops(store)
        assert (await store.get_latest("job")).id == cp.id  # type: ignore[union-attr]
        assert (await store.load(cp.id)).state == {"n": 1}
        assert hops == ["get_latest", "load"]
    url = sk.open_store(f"file://{tmp_path}/s?inline_reads=false")
    assert url.options.inline_reads is False  # type: ignore[attr-defined]


async def test_a_stream_without_checkpoints(tmp_path: Path) -> None:
    """``None`` needs to know that no index is missing: the first time the worker
    lists ``streams/``; after that one ``fstat`` on the loop tells."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        await store.save("job", {})
        hops = count_hops(store)
        assert await store.get_latest("nothing") is None
        assert await store.get_latest("nothing") is None
        assert hops == ["get_latest"]
        await store.save("new", {})  # a new index file: streams/ changed
        hops.clear()
        assert await store.get_latest("nothing") is None
        assert await store.get_latest("nothing") is None
        assert hops == ["get_latest"]


async def test_a_damaged_index_falls_back_to_the_records(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(5)]
        hops = count_hops(store)
        (tmp_path / "s" / "streams" / "job.idx").write_bytes(b"\0" * 5000)
        assert inline(store, parts_of(store).reader.latest, "job") == BLOCKS
        got = await one_hop(hops, "get_latest", lambda: store.get_latest("job"))
        assert got == ("checkpoint", (saved[-1].id, saved[-1].sequence, {"i": 4}))
        (tmp_path / "s" / "ids.idx").write_bytes(b"junk")
        assert inline(store, parts_of(store).reader.get, saved[1].id) == BLOCKS
        got = await one_hop(hops, "load", lambda: store.load(saved[1].id))
        assert got == ("checkpoint", (saved[1].id, saved[1].sequence, {"i": 1}))


async def test_a_corrupt_newest_slot_falls_back(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(5)]
        hops = count_hops(store)
        flip(tmp_path / "s" / "streams" / "job.idx", -10)  # the newest slot's checksum
        got = await one_hop(hops, "get_latest", lambda: store.get_latest("job"))
        assert got[1][0] == saved[-1].id


async def test_a_missing_index_falls_back_to_the_records(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(3)]
        await store.save("other", {})
        assert await store.get_latest("nothing") is None  # streams/ seen whole
        hops = count_hops(store)
        (tmp_path / "s" / "streams" / "job.idx").unlink()
        assert inline(store, parts_of(store).reader.latest, "job") == BLOCKS
        got = await one_hop(hops, "get_latest", lambda: store.get_latest("job"))
        assert got[1][0] == saved[-1].id  # never None: the records still have it


@pytest.mark.parametrize("how", ["torn", "unreadable"])
async def test_a_torn_or_unreadable_state_falls_back(tmp_path: Path, how: str) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(3)]
        hops = count_hops(store)
        state = tmp_path / "s" / "state"
        data = bytearray(state.read_bytes())
        current = read_state(store.path)
        assert current is not None
        other_copy = 2048 * (1 - current.gen % 2)  # the copy the last write did not touch
        for at in [0, 2048] if how == "unreadable" else [other_copy]:
            data[at + 100 : at + 110] = b"#" * 10
        state.write_bytes(bytes(data))
        read = read_state(store.path)
        assert read is None if how == "unreadable" else read is not None and read.torn
        assert inline(store, parts_of(store).reader.latest, "job") == BLOCKS
        assert inline(store, parts_of(store).reader.get, saved[0].id) == BLOCKS
        got = await one_hop(hops, "get_latest", lambda: store.get_latest("job"))
        assert got[1][0] == saved[-1].id
        got = await one_hop(hops, "load", lambda: store.load(saved[0].id))
        assert got[1][0] == saved[0].id


class FailingUnlink(OsFileIO):
    """Fails the next unlink of a record file, once (a delete that dies half-way)."""

    armed = False

    def unlink(self, name: str, *, dir_fd: int) -> None:
        if self.armed and name.endswith(".ckpt"):
            self.armed = False
            raise OSError(errno.EIO, os.strerror(errno.EIO), name)
        super().unlink(name, dir_fd=dir_fd)


async def test_a_crashed_writers_journal_is_finished_in_the_worker(tmp_path: Path) -> None:
    io = FailingUnlink()
    async with FileCheckpointStore(tmp_path / "s", io=io) as store:
        saved = [await store.save("job", {"i": i}) for i in range(3)]
        io.armed = True
        with pytest.raises(BackendError):
            await store.delete(saved[-1].id)
        state = read_state(store.path)
        assert state is not None and state.journal is not None and state.journal.op == "delete"
        assert inline(store, parts_of(store).reader.latest, "job") == BLOCKS
        assert inline(store, parts_of(store).reader.get, saved[0].id) == BLOCKS
        hops = count_hops(store)
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == saved[-2].id
        assert hops == ["get_latest"]
        # the worker finished the delete (heal), so the next reads are inline again
        state = read_state(store.path)
        assert state is not None and state.journal is None
        assert not record_file(tmp_path / "s", saved[-1]).exists()
        assert (await store.get_latest("job")).id == saved[-2].id  # type: ignore[union-attr]
        with pytest.raises(CheckpointNotFound):
            await store.load(saved[-1].id)
        assert hops == ["get_latest"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
async def test_a_damaged_newest_record_raises_as_the_hop_does(tmp_path: Path, damage: str) -> None:
    """Never an older checkpoint: the same CheckpointDecodeError, from the worker."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(3)]
        hops = count_hops(store)
        path = record_file(tmp_path / "s", saved[-1])
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[:40])
        elif damage == "flip":
            flip(path, -2)
        else:
            path.unlink()
        assert inline(store, parts_of(store).reader.latest, "job") == BLOCKS
        assert inline(store, parts_of(store).reader.get, saved[-1].id) == BLOCKS
        got = await one_hop(hops, "get_latest", lambda: store.get_latest("job"))
        assert got[0] == "raised" and got[1][0] == "CheckpointDecodeError"
        with pytest.raises(CheckpointDecodeError) as caught:
            await store.get_latest("job")
        assert caught.value.id == saved[-1].id
        got = await one_hop(hops, "load", lambda: store.load(saved[-1].id))
        assert got[0] == "raised" and got[1][0] == "CheckpointDecodeError"
        # the older ones still load inline
        before = len(hops)
        assert (await store.load(saved[0].id)).state == {"i": 0}
        assert hops[before:] == []


async def test_an_orphan_newer_than_the_answer_raises_as_the_hop_does(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        other = await store.save("other", {"n": 1})
        job = [await store.save("job", {"n": i}) for i in range(3)]
        await store.delete(job[0].id)  # the journal no longer names the last save
    record_file(tmp_path / "s", job[-1]).write_bytes(b"\0" * 300)
    (tmp_path / "s" / "streams" / "job.idx").unlink()
    async with FileCheckpointStore(tmp_path / "s") as store:
        state = read_state(store.path)
        assert state is not None and state.orphan == (job[-1].sequence, job[-1].id)
        hops = count_hops(store)
        for stream in ("other", "job", "never-used"):
            assert inline(store, parts_of(store).reader.latest, stream) == BLOCKS
            got = await one_hop(hops, "get_latest", latest_of(store, stream))
            assert got[0] == "raised" and "drop-damaged" in got[1][1]
        newer = await store.save("other", {"n": 2})
        before = len(hops)
        assert (await store.get_latest("other")).id == newer.id  # type: ignore[union-attr]
        assert (await store.load(other.id)).state == {"n": 1}
        assert hops[before:] == []  # newer than the orphan: inline again


async def test_a_record_gone_under_the_read_is_left_to_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the loop's read meets a record that is not there (a concurrent writer
    may be in the way), it reports nothing itself: the worker looks again."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        cp = await store.save("job", {"n": 1})
        files = parts_of(store).engine.files
        real = files.load_record
        vanish: list[bool] = []

        def flaky(*args: Any) -> Any:
            if vanish:  # only the first look (the loop's) misses it
                vanish.clear()
                return None
            return real(*args)

        monkeypatch.setattr(files, "load_record", flaky)
        hops = count_hops(store)
        vanish.append(True)
        assert (await store.get_latest("job")).id == cp.id  # type: ignore[union-attr]
        vanish.append(True)
        assert (await store.load(cp.id)).id == cp.id
        assert hops == ["get_latest", "load"]


async def test_a_tail_of_expired_checkpoints_is_walked_in_the_worker(tmp_path: Path) -> None:
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    async with FileCheckpointStore(tmp_path / "s", clock=lambda: now[0]) as store:
        keep = await store.save("job", {"n": "keep"})
        short = [await store.save("job", {"n": i}, ttl=timedelta(seconds=1)) for i in range(3)]
        hops = count_hops(store)
        assert (await store.get_latest("job")).id == short[-1].id  # type: ignore[union-attr]
        now[0] += timedelta(seconds=10)
        assert (await store.get_latest("job")).id == keep.id  # type: ignore[union-attr]
        with pytest.raises(CheckpointNotFound):
            await store.load(short[0].id)
        assert hops == []  # a few expired slots: still inline
        now[0] -= timedelta(seconds=10)
        more = [await store.save("job", {"n": i}, ttl=timedelta(seconds=1)) for i in range(20)]
        now[0] += timedelta(seconds=10)
        hops.clear()
        got = await one_hop(hops, "get_latest", lambda: store.get_latest("job"))
        assert got[1][0] == keep.id and more


class FailingRecordOpen(OsFileIO):
    """Fails every open of a record file with EIO while armed."""

    armed = False

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        if self.armed and name.endswith(".ckpt"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), name)
        return super().open(name, flags, mode, dir_fd=dir_fd)


async def test_os_errors_give_the_hops_backend_errors(tmp_path: Path) -> None:
    """A record file the OS fails to open is left to the worker, which raises the
    BackendError it always raised."""
    io = FailingRecordOpen()
    async with FileCheckpointStore(tmp_path / "s", io=io) as store:
        cp = await store.save("job", {"n": 1})
        hops = count_hops(store)
        io.armed = True
        calls = [("get_latest", latest_of(store, "job")), ("load", load_of(store, cp.id))]
        for what, call in calls:
            got = await one_hop(hops, what, call)
            assert got[0] == "raised" and got[1][0] == BackendError.__name__
            assert "Input/output error (EIO)" in got[1][1]
        io.armed = False
        hops.clear()
        assert (await store.load(cp.id)).state == {"n": 1}
        assert hops == []


async def test_a_large_record_is_read_in_the_worker(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        big = await store.save("job", {"pad": "x" * (INLINE_RECORD_BYTES + 1)})
        small = await store.save("other", {"n": 1})
        hops = count_hops(store)
        got = await one_hop(hops, "get_latest", latest_of(store, "job"))
        assert got[1][0] == big.id
        got = await one_hop(hops, "load", load_of(store, big.id))
        assert got[1][0] == big.id
        before = len(hops)
        assert (await store.get_latest("other")).id == small.id  # type: ignore[union-attr]
        assert hops[before:] == []


async def test_a_batch_in_flight_sends_reads_to_the_worker(tmp_path: Path) -> None:
    """A journal that hides a batch (or that heal may finish) is not the cheap path."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        cp = await store.save("job", {"n": 1})
        parts = parts_of(store)
        for op in ("batch", "batched", "delete", "update"):
            with (
                a_journal_in_flight(store, tmp_path / "s", op, cp.sequence),
                parts.engine.files.active(),
            ):
                assert inline(store, parts.reader.latest, "job") == BLOCKS
                assert inline(store, parts.reader.get, cp.id) == BLOCKS
        hops = count_hops(store)
        assert (await store.get_latest("job")).id == cp.id  # type: ignore[union-attr]
        assert hops == []


async def test_reads_from_a_second_event_loop_thread(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        cp = await store.save("job", {"n": 1})
        hops = count_hops(store)
        latest = await asyncio.to_thread(asyncio.run, store.get_latest("job"))
        assert latest is not None and latest.id == cp.id
        assert hops == []


# -- page scans: the index search ------------------------------------------------------------


def _spread(kind: str, n: int, rng: random.Random) -> list[int]:
    seqs, seq = [], 0
    for _ in range(n):
        if kind == "dense":
            seq += 1
        elif kind == "interleaved":
            seq += rng.randint(1, 5)
        else:  # bursts: mostly consecutive, now and then a long gap
            seq += 1 if rng.random() < 0.9 else rng.randint(100, 100_000)
        seqs.append(seq)
    return seqs


class CountingIO(OsFileIO):
    preads = 0

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self.preads += 1
        return super().pread(fd, size, offset)


@pytest.mark.parametrize("kind", ["dense", "interleaved", "bursts"])
async def test_locate_finds_what_bisect_finds_in_fewer_reads(tmp_path: Path, kind: str) -> None:
    """StreamIndex.locate (the indexes' search) answers exactly as bisect, for
    every sequence around and between the slots, and in a few reads when the
    sequences are about evenly spread."""
    rng = random.Random(kind)
    io = CountingIO()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for n in (0, 1, 2, 15, 16, 17, 33, 100, 1000, 5000):
            seqs = _spread(kind, n, rng)
            slots = [fmt.Slot(seq, f"id{seq}") for seq in seqs]
            write_index(io, fd, "x.idx", "x", slots, "store", durable=False)
            idx = StreamIndex.open(io, fd, "x.idx", "store")
            assert idx is not None
            top = seqs[-1] if seqs else 3
            targets = {0, 1, top - 1, top, top + 1, *(rng.randint(0, top + 2) for _ in range(40))}
            targets |= {seqs[i] + d for i in range(0, n, max(1, n // 20)) for d in (-1, 0, 1)}
            reads = []
            with idx:
                for seq in sorted(targets):
                    for right in (False, True):
                        before = io.preads
                        found = idx.locate(seq, right=right)
                        reads.append(io.preads - before)
                        bisect = bisect_right if right else bisect_left
                        assert found == bisect(seqs, seq)
            if n >= 1000 and kind != "bursts":
                assert max(reads) <= 6, reads
    finally:
        os.close(fd)


class CountingOpens(OsFileIO):
    def __init__(self) -> None:
        self.opened: list[str] = []

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        self.opened.append(name)
        return super().open(name, flags, mode, dir_fd=dir_fd)


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_a_page_and_its_probe_share_one_index_and_state_read(
    tmp_path: Path, order: str
) -> None:
    """The hop of a page scans the page and its probe through one open stream index,
    with the answers two separate scans give (also past a damaged index)."""
    io = CountingOpens()
    async with FileCheckpointStore(tmp_path / "s", io=io) as store:
        saved = [await store.save("job", {"i": i}, tags={"k": str(i % 2)}) for i in range(30)]
        parts = parts_of(store)
        engine, now = parts.engine, store.now()
        for bound in (None, saved[0].sequence, saved[13].sequence, saved[-1].sequence + 1):
            for tags in ({}, {"k": "1"}):
                query = ScanQuery("job", order, bound, 6, tags, now)  # type: ignore[arg-type]

                def probe_of(page: list[Any], query: ScanQuery = query) -> ScanQuery:
                    edge = page[0].sequence if page else (query.bound or 0)
                    back = "desc" if query.order == "asc" else "asc"
                    return replace(query, order=back, bound=edge, limit=1)  # type: ignore[arg-type]

                with engine.files.active():
                    want, _ = parts.pages.scan_page(query, None)
                    io.opened.clear()
                    page, probed = parts.pages.scan_page(query, probe_of)
                    assert io.opened.count("job.idx") == 1
                    assert (page, probed) == (want, parts.pages.scan_page(probe_of(want), None)[0])
        index = tmp_path / "s" / "streams" / "job.idx"
        index.unlink()  # replaced by junk: a new file, whose header is not a store's
        index.write_bytes(b"\0" * 5000)
        query = ScanQuery("job", order, saved[13].sequence, 6, {}, now)  # type: ignore[arg-type]
        with engine.files.active():
            page, probed = parts.pages.scan_page(query, lambda p: replace(query, limit=1))
            assert page == parts.pages.scan_page(query, None)[0] and len(page) == 6
            assert probed == parts.pages.scan_page(replace(query, limit=1), None)[0]


async def test_a_thread_holding_the_write_lock_takes_the_hop(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        cp = await store.save("job", {"n": 1})
        parts = parts_of(store)
        with parts.engine.files.active(), parts.engine.lock.held() as got:
            assert got
            assert inline(store, parts.reader.latest, "job") == BLOCKS
            assert inline(store, parts.reader.get, cp.id) == BLOCKS
        assert inline(store, parts.reader.latest, "job").id == cp.id


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_a_page_past_an_index_overwritten_in_place_asks_the_records(
    tmp_path: Path, order: str
) -> None:
    """An index zeroed in place while the store is open (its verified header is
    cached by inode) sends a search past its end: the edge slot is checked, so the
    page comes from the records instead of being empty."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(10)]
        pivot = saved[3] if order == "asc" else saved[6]
        cursor = await store.cursor_at(pivot.id, order=order)  # type: ignore[arg-type]
        want = await store.list("job", order=order, after=cursor)  # type: ignore[arg-type]
        index = tmp_path / "s" / "streams" / "job.idx"
        # in place (the same inode); zeros look like sequences below any bound, 0xff
        # like sequences above: either way the search passes every slot unread
        fill = b"\0" if order == "asc" else b"\xff"
        index.write_bytes(fill * index.stat().st_size)
        got = await store.list("job", order=order, after=cursor)  # type: ignore[arg-type]
        assert [cp.id for cp in got.items] == [cp.id for cp in want.items]
        assert len(got.items) == 6


# -- the descriptors the point reads keep -----------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
async def test_kept_descriptors_are_bounded_and_closed_with_the_store(tmp_path: Path) -> None:
    before = _open_fds()
    store = FileCheckpointStore(tmp_path / "s")
    await store.open()
    saved = [await store.save(f"s{i}", {"i": i}) for i in range(40)]
    opened = _open_fds()
    hops = count_hops(store)
    for cp in saved:
        assert (await store.get_latest(cp.stream)).id == cp.id  # type: ignore[union-attr]
        assert (await store.load(cp.id)).id == cp.id
    assert hops == []
    # at most 32 indexes, 4 buckets and the id table stay open (this thread's)
    assert _open_fds() - opened <= 32 + 4 + 1
    await store.close()
    assert _open_fds() == before


async def test_files_replaced_under_kept_descriptors_are_opened_afresh(tmp_path: Path) -> None:
    """repair() replaces every index and the id table by rename; the kept
    descriptors see that (one lstat each) and read the new files."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(3)]
        assert (await store.get_latest("job")).id == saved[-1].id  # type: ignore[union-attr]
        assert (await store.load(saved[0].id)).id == saved[0].id
        kept = parts_of(store).engine.fdcache.mine()
        old_index, old_ids = kept.indexes["job.idx"].identity, kept.ids[0].identity  # type: ignore[index]
        await store.repair()
        newer = await store.save("job", {"i": 3})
        hops = count_hops(store)
        assert (await store.get_latest("job")).id == newer.id  # type: ignore[union-attr]
        assert (await store.load(newer.id)).id == newer.id
        assert hops == []
        assert kept.indexes["job.idx"].identity != old_index
        assert kept.ids is not None and kept.ids[0].identity != old_ids


async def test_an_id_table_header_damaged_under_a_kept_descriptor(tmp_path: Path) -> None:
    """The kept id table's header is compared with the one verified at its open at
    every use, so damage in place is seen as by a fresh open: the worker answers."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(3)]
        assert (await store.load(saved[1].id)).id == saved[1].id  # the table is kept
        ids = tmp_path / "s" / "ids.idx"
        data = bytearray(ids.read_bytes())
        data[10] ^= 0x55  # in the header, in place
        ids.write_bytes(bytes(data))
        hops = count_hops(store)
        assert inline(store, parts_of(store).reader.get, saved[1].id) == BLOCKS
        got = await one_hop(hops, "load", load_of(store, saved[1].id))
        assert got[1][0] == saved[1].id
