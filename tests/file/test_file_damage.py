"""Damage to a file store (SPEC S3a): records are the truth, and an acknowledged
checkpoint is never forgotten by a reopen, a rebuild or a repair.

The first tests replay what issue 11 saw at ``dd0e1c9``; the sweep below damages
every piece of derived metadata in every way, with and without damaged records,
and checks S3/S3a and ``verify`` before and after ``repair()``, then that only
``repair(drop_damaged=True)`` makes a damaged checkpoint go away.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file import layout as fmt
from statekeeper.backends.file.io import OsFileIO
from statekeeper.errors import (
    CheckpointDecodeError,
    CheckpointNotFound,
    ReadOnlyStore,
    StatekeeperError,
    StoreNotFound,
)
from statekeeper.models import Checkpoint

# -- helpers --------------------------------------------------------------------------------


def record_file(root: Path, cp: Checkpoint) -> Path:
    return root / "records" / f"{cp.sequence // 1000:017d}" / f"{cp.sequence:020d}.{cp.id}.ckpt"


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def zero_fill(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


def flip(path: Path, at: int | None = None) -> None:
    """Flip one byte: the middle one, or ``at`` (negative counts from the end)."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at % len(data)
    data[i] ^= 0x55
    path.write_bytes(bytes(data))


def delete(path: Path) -> None:
    path.unlink()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncate": truncate,
    "zero-fill": zero_fill,
    "flip": flip,
    "delete": delete,
}


async def fill(root: Path, n: int = 5, stream: str = "job") -> list[Checkpoint]:
    async with FileCheckpointStore(root) as store:
        return [await store.save(stream, {"step": i}) for i in range(1, n + 1)]


async def assert_named(store: FileCheckpointStore, stream: str, cp: Checkpoint) -> None:
    """get_latest and load raise naming ``cp``; list reports it in skipped."""
    with pytest.raises(CheckpointDecodeError) as caught:
        await store.get_latest(stream)
    assert caught.value.id == cp.id, caught.value
    with pytest.raises(CheckpointDecodeError) as loading:
        await store.load(cp.id)
    assert loading.value.id == cp.id
    page = await store.list(None, limit=1000)
    assert cp.id in {s.id for s in page.skipped}
    assert cp.id not in {c.id for c in page.items}


# -- issue 11, as seen at dd0e1c9 -----------------------------------------------------------


@pytest.mark.asyncio
async def test_newest_record_index_and_state_each_truncated(tmp_path: Path) -> None:
    """(a) The seed case: verify must not say ok, info must not say 0, repair must
    not forget sequence 5, and get_latest must raise naming it."""
    saved = await fill(tmp_path)
    truncate(record_file(tmp_path, saved[-1]))
    truncate(tmp_path / "streams" / "job.idx")
    truncate(tmp_path / "state")
    async with FileCheckpointStore(tmp_path, read_only=True) as store:
        report = await store.verify()
        assert not report.ok
        assert saved[-1].id in {p.id for p in report.problems}
        info = await store.info()
        assert (info.checkpoints, info.high_water_mark) == (5, 5)
        await assert_named(store, "job", saved[-1])
    async with FileCheckpointStore(tmp_path) as store:
        await assert_named(store, "job", saved[-1])
        repaired = await store.repair()
        assert [p.id for p in repaired.damaged] == [saved[-1].id]
        await assert_named(store, "job", saved[-1])
        page = await store.list("job", order="asc")
        assert [c.sequence for c in page.items] == [1, 2, 3, 4]
        assert [s.sequence for s in page.skipped] == [5]
        assert not (await store.verify()).ok
        cp = await store.save("job", {"step": 6})
        assert cp.sequence == 6


@pytest.mark.asyncio
@pytest.mark.parametrize("which", [-1, 2], ids=["newest", "middle"])
async def test_a_damaged_record_survives_repair(tmp_path: Path, which: int) -> None:
    """(b) Any damaged record is still reported after repair(), not forgotten."""
    saved = await fill(tmp_path)
    flip(record_file(tmp_path, saved[which]))
    async with FileCheckpointStore(tmp_path) as store:
        await store.repair()
        with pytest.raises(CheckpointDecodeError):
            await store.load(saved[which].id)
        page = await store.list("job")
        assert [s.id for s in page.skipped] == [saved[which].id]
        if which == -1:
            await assert_named(store, "job", saved[-1])
        report = await store.repair(drop_damaged=True)
        assert [p.id for p in report.dropped] == [saved[which].id]
        with pytest.raises(CheckpointNotFound):
            await store.load(saved[which].id)
        latest = await store.get_latest("job")
        expected = saved[-2] if which == -1 else saved[-1]
        assert latest is not None and latest.id == expected.id
        assert (await store.verify()).ok


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["zero-fill", "delete"])
async def test_both_state_copies_lost(tmp_path: Path, how: str) -> None:
    """(c) With state unreadable, a reopen keeps damaged records and takes the
    high-water mark from the record files: no sequence is reused."""
    saved = await fill(tmp_path)
    flip(record_file(tmp_path, saved[-1]))
    DAMAGE[how](tmp_path / "state")
    async with FileCheckpointStore(tmp_path) as store:
        await assert_named(store, "job", saved[-1])
        assert (await store.info()).high_water_mark == 5
        cp = await store.save("job", {"step": 6})
        assert cp.sequence == 6


@pytest.mark.asyncio
async def test_the_high_water_mark_counts_deleted_sequences_after_state_loss(
    tmp_path: Path,
) -> None:
    """(c) Sequences are never reused, even of a deleted newest checkpoint, when
    the id table still remembers them."""
    saved = await fill(tmp_path)
    async with FileCheckpointStore(tmp_path) as store:
        await store.delete(saved[-1].id)
    zero_fill(tmp_path / "state")
    async with FileCheckpointStore(tmp_path) as store:
        cp = await store.save("job", {"step": 6})
        assert cp.sequence == 6


@pytest.mark.asyncio
async def test_a_deleted_stream_index_is_detected(tmp_path: Path) -> None:
    """(d) The records say the stream exists: never None, never an empty list."""
    saved = await fill(tmp_path)
    delete(tmp_path / "streams" / "job.idx")
    async with FileCheckpointStore(tmp_path, read_only=True) as store:
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == saved[-1].id
        assert [c.id for c in (await store.list("job")).items] == [c.id for c in saved[::-1]]
        assert await store.list_streams() == ["job"]
        assert not (await store.verify()).ok
    async with FileCheckpointStore(tmp_path) as store:
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == saved[-1].id
        assert [c.id for c in (await store.list("job")).items] == [c.id for c in saved[::-1]]
        assert (await store.verify()).ok


@pytest.mark.asyncio
@pytest.mark.parametrize("index", ["zero-fill", "delete"])
@pytest.mark.parametrize("ids", ["truncate", "delete"])
async def test_stream_index_and_id_table_both_damaged(tmp_path: Path, index: str, ids: str) -> None:
    """(e) load() of intact checkpoints works without a repair."""
    saved = await fill(tmp_path)
    DAMAGE[index](tmp_path / "streams" / "job.idx")
    DAMAGE[ids](tmp_path / "ids.idx")
    for read_only in (True, False):
        async with FileCheckpointStore(tmp_path, read_only=read_only) as store:
            for cp in saved:
                assert (await store.load(cp.id)).state == cp.state
            latest = await store.get_latest("job")
            assert latest is not None and latest.id == saved[-1].id


# -- create=False and read_only=True --------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("options", [{"create": False}, {"read_only": True}])
async def test_a_missing_store_is_not_created(tmp_path: Path, options: dict[str, bool]) -> None:
    missing = tmp_path / "bakcup"
    with pytest.raises(StoreNotFound, match="bakcup"):
        await FileCheckpointStore(missing, **options).open()
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(StoreNotFound):
        await FileCheckpointStore(empty, **options).open()
    assert list(empty.iterdir()) == []


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns, digest)
    return out


@pytest.mark.asyncio
async def test_read_only_writes_nothing(tmp_path: Path) -> None:
    saved = await fill(tmp_path)
    os.unlink(tmp_path / "lock")
    before = snapshot(tmp_path)
    async with FileCheckpointStore(tmp_path, read_only=True) as store:
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == saved[-1].id
        assert (await store.verify()).ok
        with pytest.raises(ReadOnlyStore):
            await store.save("job", {})
        with pytest.raises(ReadOnlyStore):
            await store.repair()
    assert snapshot(tmp_path) == before


@pytest.mark.asyncio
async def test_a_read_only_open_leaves_a_crashed_journal_alone(tmp_path: Path) -> None:
    saved = await fill(tmp_path)
    async with FileCheckpointStore(tmp_path) as store:
        await store.delete(saved[0].id)
    before = snapshot(tmp_path)
    async with FileCheckpointStore(tmp_path, read_only=True) as store:
        assert (await store.load(saved[1].id)).id == saved[1].id
        with pytest.raises(CheckpointNotFound):
            await store.load(saved[0].id)
    assert snapshot(tmp_path) == before


# -- the sweep ------------------------------------------------------------------------------

TARGETS = {"state": "state", "stream index": "streams/job.idx", "id table": "ids.idx"}
RECORDS = {"none": (), "newest": (-1,), "middle": (2,), "newest+middle": (-1, 2)}


async def fill_two_streams(root: Path) -> list[Checkpoint]:
    """job: sequences 1-3 and 5-7; other: 4. The middle record is job's seq 3."""
    async with FileCheckpointStore(root) as store:
        saved = [await store.save("job", {"step": i}) for i in range(3)]
        saved.append(await store.save("other", {"step": 0}))
        saved += [await store.save("job", {"step": i}) for i in range(3, 6)]
    return saved


async def latest_or_error(
    store: FileCheckpointStore, stream: str
) -> Checkpoint | CheckpointDecodeError | None:
    try:
        return await store.get_latest(stream)
    except CheckpointDecodeError as exc:
        return exc


async def assert_s3(store: FileCheckpointStore, saved: list[Checkpoint], damaged: set[str]) -> None:
    """S3 and S3a: get_latest is the newest acknowledged checkpoint or raises naming
    a damaged one that may be newer (never older, never None); every intact
    checkpoint loads; damaged ones raise and are listed in skipped."""
    for stream in ("job", "other"):
        newest = max((cp for cp in saved if cp.stream == stream), key=lambda cp: cp.sequence)
        got = await latest_or_error(store, stream)
        if isinstance(got, CheckpointDecodeError):
            named = next(cp for cp in saved if cp.id == got.id)
            # The newest itself, or a damaged record that may be newer (an orphan).
            assert named.id in damaged and named.sequence >= newest.sequence, got
        else:
            assert newest.id not in damaged, f"get_latest({stream!r}) hid damaged {newest.id}"
            assert got is not None and got.id == newest.id, (stream, got)
    for cp in saved:
        if cp.id in damaged:
            with pytest.raises(CheckpointDecodeError):
                await store.load(cp.id)
        else:
            assert (await store.load(cp.id)).state == cp.state
    page = await store.list(None, limit=1000)
    assert {s.id for s in page.skipped} == damaged
    assert {c.id for c in page.items} == {cp.id for cp in saved} - damaged
    listed = await store.list("job", limit=1000)
    assert {s.id for s in listed.skipped} == damaged  # every damaged record is job's
    assert {c.id for c in listed.items} == {
        cp.id for cp in saved if cp.stream == "job" and cp.id not in damaged
    }


@pytest.mark.asyncio
@pytest.mark.parametrize("records", list(RECORDS))
@pytest.mark.parametrize("how", list(DAMAGE))
@pytest.mark.parametrize("target", list(TARGETS))
async def test_damage_sweep(tmp_path: Path, target: str, how: str, records: str) -> None:
    saved = await fill_two_streams(tmp_path)
    job = [cp for cp in saved if cp.stream == "job"]
    hit = [job[i] for i in RECORDS[records]]
    for cp in hit:
        (truncate if cp is job[-1] else flip)(record_file(tmp_path, cp))
    DAMAGE[how](tmp_path / TARGETS[target])
    damaged = {cp.id for cp in hit}

    # A read-only open answers right from the records, reports, and writes nothing.
    before = snapshot(tmp_path)
    async with FileCheckpointStore(tmp_path, read_only=True) as store:
        await assert_s3(store, saved, damaged)
        report = await store.verify()
        assert not report.ok
        assert damaged <= {p.id for p in report.problems if p.kind == "damaged-record"}
        assert (await store.info()).high_water_mark == 7
    assert snapshot(tmp_path) == before

    async with FileCheckpointStore(tmp_path) as store:
        await assert_s3(store, saved, damaged)
        if damaged:
            assert not (await store.verify()).ok
        repaired = await store.repair()
        assert {p.id for p in repaired.damaged} == damaged
        assert repaired.dropped == []
        await assert_s3(store, saved, damaged)
        assert (await store.verify()).ok is not damaged

    async with FileCheckpointStore(tmp_path) as store:
        await assert_s3(store, saved, damaged)
        dropped = await store.repair(drop_damaged=True)
        assert {p.id for p in dropped.dropped} == damaged
        survivors = [cp for cp in saved if cp.id not in damaged]
        await assert_s3(store, survivors, set())
        for cp in hit:
            with pytest.raises(CheckpointNotFound):
                await store.load(cp.id)
        assert (await store.verify()).ok
        assert (await store.save("job", {"step": 7})).sequence == 8


# -- paths the sweep does not reach ---------------------------------------------------------


def id_slot_offset(root: Path, cid: str) -> int:
    """The byte offset of ``cid``'s slot in ids.idx (16 bytes: key, sequence)."""
    data = (root / "ids.idx").read_bytes()
    capacity = (len(data) - 4096) // 16
    key = fmt.id_key(cid)
    pos = key & (capacity - 1)
    while struct.unpack_from("<QQ", data, 4096 + pos * 16)[0] != key:
        pos = (pos + 1) % capacity
    return 4096 + pos * 16


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("field", "at", "mask"),
    [("key-low", 0, 0x55), ("key-high", 3, 0x55), ("sequence", 8, 0x40), ("tombstone", 15, 0x80)],
)
async def test_a_damaged_id_table_slot_is_never_not_found(
    tmp_path: Path, field: str, at: int, mask: int
) -> None:
    """Id-table slots carry no checksum: a flipped bit in one is caught by the
    probe's checks and the record files, and load() asks the records."""
    saved = await fill(tmp_path)
    path = tmp_path / "ids.idx"
    data = bytearray(path.read_bytes())
    data[id_slot_offset(tmp_path, saved[2].id) + at] ^= mask
    path.write_bytes(bytes(data))
    for read_only in (True, False):
        async with FileCheckpointStore(tmp_path, read_only=read_only) as store:
            for cp in saved:
                assert (await store.load(cp.id)).state == cp.state, field
            with pytest.raises(CheckpointNotFound):
                await store.load("never-saved")
            assert not (await store.verify()).ok
    async with FileCheckpointStore(tmp_path) as store:
        await store.repair()
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_a_damaged_record_of_unknown_stream(tmp_path: Path) -> None:
    """An orphan: its stream index and the journal are gone and its bytes are
    zeros. get_latest of every stream whose newest is older raises naming it, with
    advice; dropping it (by repair or by id) lifts that."""
    async with FileCheckpointStore(tmp_path) as store:
        other = await store.save("other", {"n": 1})
        job = [await store.save("job", {"n": i}) for i in range(3)]
        await store.delete(job[0].id)  # the journal no longer names the last save
    zero_fill(record_file(tmp_path, job[-1]))
    delete(tmp_path / "streams" / "job.idx")
    async with FileCheckpointStore(tmp_path) as store:
        for stream in ("job", "other", "never-used"):
            with pytest.raises(CheckpointDecodeError, match="drop-damaged") as caught:
                await store.get_latest(stream)
            assert caught.value.id == job[-1].id
        with pytest.raises(CheckpointDecodeError):
            await store.load(job[-1].id)
        assert job[-1].id in {s.id for s in (await store.list(None)).skipped}
        report = await store.repair()
        assert [p.id for p in report.damaged] == [job[-1].id]
        with pytest.raises(CheckpointDecodeError):
            await store.get_latest("other")
        newer = await store.save("other", {"n": 2})
        latest = await store.get_latest("other")
        assert latest is not None and latest.id == newer.id
        with pytest.raises(CheckpointDecodeError):
            await store.get_latest("job")
        assert await store.delete(job[-1].id)
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == job[1].id
        assert (await store.verify()).ok
    assert other.sequence == 1


@pytest.mark.asyncio
async def test_verify_reports_foreign_files(tmp_path: Path) -> None:
    saved = await fill(tmp_path)
    bucket = record_file(tmp_path, saved[0]).parent
    (bucket / "junk.txt").write_text("planted")
    os.mkfifo(bucket / f"{9:020d}.fifo.ckpt")
    (tmp_path / "streams" / "notes.txt").write_text("planted")
    (tmp_path / "extra").write_text("planted")
    async with FileCheckpointStore(tmp_path, read_only=True) as store:
        report = await store.verify()
    foreign = {Path(p.location).name for p in report.problems if p.kind == "foreign"}
    assert {"junk.txt", f"{9:020d}.fifo.ckpt", "notes.txt", "extra"} <= foreign
    assert not report.ok


@pytest.mark.asyncio
async def test_an_index_damaged_while_the_store_is_open(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as store:
        saved = [await store.save("job", {"step": i}) for i in range(5)]
        flip(tmp_path / "streams" / "job.idx", -10)  # the newest slot's checksum
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == saved[-1].id
        page = await store.list("job", order="asc")
        assert [c.id for c in page.items] == [c.id for c in saved]
        assert await store.list_streams() == ["job"]
        assert (await store.info()).checkpoints == 5
        assert not (await store.verify()).ok
        await store.repair()
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_read_only_open_of_a_save_that_crashed_before_its_index(tmp_path: Path) -> None:
    """The record got its final name, the index entry did not (the writer died):
    a writable open would index it; a read-only one reads it from the records."""
    saved = await fill(tmp_path)
    index = tmp_path / "streams" / "job.idx"
    index.write_bytes(index.read_bytes()[:-256])
    before = snapshot(tmp_path)
    async with FileCheckpointStore(tmp_path, read_only=True) as store:
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == saved[-1].id
    assert snapshot(tmp_path) == before
    async with FileCheckpointStore(tmp_path) as store:
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == saved[-1].id
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_an_index_deleted_while_the_store_is_open(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as store:
        saved = [await store.save("job", {"step": i}) for i in range(3)]
        await store.save("other", {})
        assert await store.get_latest("never-used") is None
        delete(tmp_path / "streams" / "job.idx")
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == saved[-1].id
        assert [c.id for c in (await store.list("job")).items] == [c.id for c in saved[::-1]]
        assert await store.list_streams() == ["job", "other"]
        assert (await store.info()).checkpoints == 4
        assert not (await store.verify()).ok
        await store.repair()
        assert (await store.verify()).ok


class Rebooted(OsFileIO):
    def boot_id(self) -> str | None:
        return "a-different-boot"


@pytest.mark.asyncio
async def test_read_only_open_after_a_restart_lost_index_writes(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path, sync_interval=1000) as store:
        saved = [await store.save("job", {"step": i}) for i in range(4)]
        # the last save is another stream's, so the journal's save is indexed and
        # only the restart check can tell that job's index lost its tail
        await store.save("other", 0)
    index = tmp_path / "streams" / "job.idx"
    index.write_bytes(index.read_bytes()[: -2 * 256])  # a power cut lost two appends
    before = snapshot(tmp_path)
    async with FileCheckpointStore(tmp_path, read_only=True, io=Rebooted()) as store:
        assert "machine restart" in str((await store.info()).extra.get("degraded"))
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == saved[-1].id
        assert [c.id for c in (await store.list("job")).items] == [c.id for c in saved[::-1]]
    assert snapshot(tmp_path) == before


_ = StatekeeperError
