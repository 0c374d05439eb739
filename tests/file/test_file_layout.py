"""The file backend's URLs, options, on-disk format and cost model.

Costs are checked structurally, not by the clock: a counting I/O layer shows that
``get_latest`` touches the same files whatever the size of the stream or the
store, and that a page reads only its own records.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import threading
import zlib
from collections import Counter
from pathlib import Path

import pytest

import statekeeper as sk
from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file import layout as fmt
from statekeeper.backends.file.io import OsFileIO
from statekeeper.errors import (
    InvalidOptions,
    InvalidURL,
    StoreFormatError,
    StoreTimeout,
)

# -- URLs and options -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_absolute_and_relative_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = sk.open_store(f"file://{tmp_path}/abs?durability=fast&lock_timeout=2.5")
    assert isinstance(absolute, FileCheckpointStore)
    assert absolute.path == str(tmp_path / "abs")
    assert absolute.options.durability == "fast"
    assert absolute.options.lock_timeout == 2.5  # type: ignore[attr-defined]
    assert sk.open_store(f"file://localhost{tmp_path}/abs").path == str(tmp_path / "abs")  # type: ignore[attr-defined]
    monkeypatch.chdir(tmp_path)
    relative = sk.open_store("file:rel/dir")
    assert relative.path == str(tmp_path / "rel" / "dir")  # type: ignore[attr-defined]
    async with relative:
        await relative.save("s", 1)
    assert (tmp_path / "rel" / "dir" / "statekeeper.json").is_file()
    assert relative.describe() == f"file://{tmp_path / 'rel' / 'dir'}"


@pytest.mark.parametrize("url", ["file://otherhost/dir", "file:///", "file:", "file://"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(InvalidURL):
        sk.open_store(url)


def test_unknown_and_invalid_options_are_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptions, match="lock_timeout"):
        FileCheckpointStore(tmp_path, lock_tiemout=1)
    with pytest.raises(InvalidOptions):
        FileCheckpointStore(tmp_path, lock_timeout=0)
    with pytest.raises(InvalidOptions):
        sk.open_store(f"file://{tmp_path}?durability=sometimes")


# -- format ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_directory_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "holiday.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(StoreFormatError, match="not a statekeeper file store"):
        await FileCheckpointStore(tmp_path).open()
    assert await asyncio.to_thread(os.listdir, tmp_path) == ["holiday.jpg"]


@pytest.mark.asyncio
async def test_a_newer_format_is_refused_with_advice(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as store:
        await store.save("s", 1)
        info = await store.info()
    assert info.format_version == fmt.FORMAT_VERSION
    meta = tmp_path / "statekeeper.json"
    doc = json.loads(await asyncio.to_thread(meta.read_text))
    assert doc["format"] == "statekeeper-file-store" and len(bytes.fromhex(doc["cursor_key"])) == 32
    doc["version"] = fmt.FORMAT_VERSION + 1
    await asyncio.to_thread(meta.write_text, json.dumps(doc))
    with pytest.raises(StoreFormatError, match="upgrade"):
        await FileCheckpointStore(tmp_path).open()
    await asyncio.to_thread(meta.write_text, "{not json")
    with pytest.raises(StoreFormatError):
        await FileCheckpointStore(tmp_path).open()


@pytest.mark.asyncio
async def test_store_identity_and_sequence_survive_reopen(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as store:
        first = await store.save("s", 1)
        await store.delete(first.id)
        store_id = store.store_id
    async with FileCheckpointStore(tmp_path) as store:
        assert store.store_id == store_id
        assert (await store.save("s", 2)).sequence == first.sequence + 1


@pytest.mark.asyncio
async def test_a_torn_copy_of_the_state_file_is_survived(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as store:
        for i in range(3):
            last = await store.save("s", i)
    state = tmp_path / "state"
    data = bytearray(state.read_bytes())
    newest = max(range(2), key=lambda i: int(data[i * 2048 : i * 2048 + 20]))
    data[newest * 2048 + 100 : newest * 2048 + 120] = b"\x00" * 20  # a torn write
    state.write_bytes(bytes(data))
    async with FileCheckpointStore(tmp_path) as store:
        assert (await store.save("s", 9)).sequence > last.sequence
        assert [cp.state for cp in (await store.list("s", order="asc")).items] == [0, 1, 2, 9]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "doc",
    [
        b'"a string"',
        b"42",
        b"[1, 2]",
        b"null",
        b'{"hwm": 1, "synced": 0, "boot": 7, "ids_used": 1, "journal": null}',
    ],
)
async def test_a_checksummed_state_copy_that_is_no_object_is_unreadable_not_a_crash(
    tmp_path: Path, doc: bytes
) -> None:
    # The newest copy passes its CRC but its JSON is no object, or its boot id no
    # string: it was read as a state anyway, and open failed with a bare
    # AttributeError ('str' object has no attribute 'pop', 'int' ... 'isascii').
    async with FileCheckpointStore(tmp_path) as store:
        last = await store.save("s", {"a": 1})
    body = (b"%020d " % 99 + doc).ljust(fmt.STATE_COPY - 9, b" ")
    data = bytearray((tmp_path / "state").read_bytes())
    data[fmt.STATE_COPY : 2 * fmt.STATE_COPY] = body + b"%08x\n" % zlib.crc32(body)
    (tmp_path / "state").write_bytes(bytes(data))
    assert fmt.State.from_bytes((tmp_path / "state").read_bytes()) is None
    async with FileCheckpointStore(tmp_path) as store:  # rebuilt from the records
        got = await store.get_latest("s")
        assert got is not None and (got.id, got.state) == (last.id, {"a": 1})
        assert (await store.save("s", 2)).sequence > last.sequence


@pytest.mark.asyncio
async def test_the_id_table_grows_under_every_kind_of_save(tmp_path: Path) -> None:
    # It is rebuilt twice as large once an insert would fill it past half: crossed
    # here by single saves, by saves committed as a group, and inside one save_many.
    ids_file = tmp_path / fmt.IDS_NAME

    def capacity() -> int:
        return (ids_file.stat().st_size - fmt.IDS_HEADER_SIZE) // fmt.IDS_SLOT.size

    async def save_many(count: int) -> list[sk.Checkpoint]:
        out: list[sk.Checkpoint] = []
        while len(out) < count:  # save_many takes at most 1,000
            part = min(1000, count - len(out))
            out += await store.save_many(
                [sk.NewCheckpoint(stream=f"s{n % 7}", state=n) for n in range(part)]
            )
        return out

    async with FileCheckpointStore(tmp_path, durability="fast") as store:
        start = capacity()
        saved = await save_many(start // 2 - 20)
        assert capacity() == start
        saved += [await store.save("one", n) for n in range(40)]
        assert capacity() == 2 * start
        saved += await save_many(start - 60 - len(saved))
        saved += await asyncio.gather(*(store.save(f"g{n % 3}", n) for n in range(120)))
        assert capacity() == 4 * start
        saved += await save_many(2 * start - len(saved) - 500)
        saved += await store.save_many(
            [sk.NewCheckpoint(stream="last", state=n) for n in range(1000)]
        )
        assert capacity() == 8 * start
        assert (await store.verify()).ok
    async with FileCheckpointStore(tmp_path) as store:
        seqs: list[int | None] = []
        for at in range(0, len(saved), 1000):
            part = [cp.id for cp in saved[at : at + 1000]]
            seqs += [cp.sequence for cp in (await store.load_many(part)).values()]
        assert sorted(seqs) == list(range(1, len(saved) + 1))  # type: ignore[type-var]


def test_stream_file_names_are_safe_distinct_and_reversible() -> None:
    names = [
        "..", ".", "/", "a/b", "/abs", "A", "a", "%41", "~", "-", "_", "a.b", ".hidden",
        "x" * 160, "x" * 161, "x" * 512, "流" * 512, "ünï", "\t", "a%2Fb", "CON",
    ]  # fmt: skip
    files = [fmt.stream_file_name(n) for n in names]
    assert len({f.casefold() for f in files}) == len(names), "must stay distinct on macOS too"
    for name, file in zip(names, files, strict=True):
        assert "/" not in file and "\x00" not in file and not file.startswith(".")
        assert len(file.encode()) <= 170
        back = fmt.stream_from_file_name(file)
        assert back == name or (back is None and "~" in file)


def test_record_and_temp_names_round_trip() -> None:
    for seq, cid in [(1, ".."), (10**19, "a:b-c_d.e"), (999, "x" * 200)]:
        name = fmt.record_name(seq, cid)
        assert "/" not in name and len(name) <= 255
        assert fmt.parse_record_name(name) == (seq, cid)
        assert fmt.parse_temp_name(fmt.temp_name(seq)) == seq
    assert fmt.parse_record_name("00000000000000000001..ckpt") is None
    assert fmt.parse_record_name("1.abc.ckpt") is None


# -- cost model -----------------------------------------------------------------------------


class CountingIO(OsFileIO):
    """Counts the files opened (by kind) and the bytes read."""

    def __init__(self) -> None:
        self.opens: Counter[str] = Counter()
        self.read_bytes = 0
        self.listed = 0

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        kind = (
            "record"
            if name.endswith(".ckpt")
            else "index"
            if name.endswith(".idx")
            else "dir"
            if flags & os.O_DIRECTORY
            else name
        )
        self.opens[kind] += 1
        return super().open(name, flags, mode, dir_fd=dir_fd)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        data = super().pread(fd, size, offset)
        self.read_bytes += len(data)
        return data

    def listdir(self, dir_fd: int) -> list[str]:
        names = super().listdir(dir_fd)
        self.listed += len(names)
        return names

    def reset(self) -> None:
        self.opens.clear()
        self.read_bytes = self.listed = 0


async def _costs(tmp_path: Path, size: int) -> tuple[Counter[str], int, int, Counter[str]]:
    io = CountingIO()
    async with FileCheckpointStore(tmp_path / f"s{size}", io=io, durability="fast") as store:
        for i in range(size):
            await store.save("other", {"i": i})
            await store.save("job", {"i": i})
        io.reset()
        latest = await store.get_latest("job")
        assert latest is not None and latest.state == {"i": size - 1}
        latest_opens, latest_bytes, latest_listed = Counter(io.opens), io.read_bytes, io.listed
        io.reset()
        middle = await store.list("job", limit=5)
        page = await store.list("job", limit=20, after=middle.next_cursor)
        assert len(page.items) == 20
        return latest_opens, latest_bytes, latest_listed, Counter(io.opens)


@pytest.mark.asyncio
async def test_get_latest_and_a_page_cost_the_same_at_any_size(tmp_path: Path) -> None:
    small = await _costs(tmp_path, 40)
    large = await _costs(tmp_path, 600)  # 1200 records: more than one bucket
    opens, read, listed, _ = large
    assert opens == small[0], "get_latest opened more files in a larger store"
    assert opens["record"] == 1, "get_latest decodes only the winner"
    # Only the winner's own size may differ (its state has more digits).
    assert abs(read - small[1]) < 16 and listed == small[2] == 0, "get_latest scanned"
    page_opens = large[3]
    assert page_opens == small[3]
    # The base class asks for limit + 1 (is there more?) and one record the other
    # way (is there a previous page?): two pages of 5 and 20 read 5+1 + 20+1+1.
    assert page_opens["record"] == 28, "a page reads only its own records"


@pytest.mark.asyncio
async def test_a_global_page_lists_one_bucket_not_the_store(tmp_path: Path) -> None:
    io = CountingIO()
    async with FileCheckpointStore(tmp_path, io=io, durability="fast") as store:
        for i in range(1300):
            await store.save(f"s{i % 7}", i)
        first = await store.list(None, order="asc", limit=1000)
        io.reset()
        page = await store.list(None, order="asc", limit=20, after=first.next_cursor)
        assert [cp.state for cp in page.items] == list(range(1000, 1020))
        assert io.opens["record"] == 20 + 2
        assert io.listed < 1100, "a page lists the buckets it needs, not every record"


# -- locking and concurrency ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_lock_timeout_raises_store_timeout(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path, lock_timeout=0.2) as store:
        await store.save("s", 1)
        holder = os.open(tmp_path / "lock", os.O_RDWR)
        try:
            fcntl.flock(holder, fcntl.LOCK_EX)  # another process's writer, as far as flock knows
            with pytest.raises(StoreTimeout, match="lock_timeout"):
                await store.save("s", 2)
            latest = await store.get_latest("s")  # readers take no lock
            assert latest is not None and latest.state == 1
        finally:
            os.close(holder)
        assert (await store.save("s", 3)).state == 3


@pytest.mark.asyncio
async def test_get_latest_is_never_older_than_a_save_that_returned(tmp_path: Path) -> None:
    """A writer saves (and prunes, which rewrites the index) while readers in another
    store instance call get_latest: each answer is at least the last save that had
    returned before the call began."""
    acked = -1
    done = threading.Event()
    failures: list[str] = []

    async def writer() -> None:
        nonlocal acked
        async with FileCheckpointStore(tmp_path, durability="fast") as store:
            for i in range(300):
                await store.save("job", {"i": i})
                acked = i
                if i % 40 == 39:
                    await store.prune("job", keep_last=3)
        done.set()

    async def reader() -> None:
        async with FileCheckpointStore(tmp_path) as store:
            while not done.is_set():
                floor = acked
                latest = await store.get_latest("job")
                got = -1 if latest is None else latest.state["i"]
                if got < floor:
                    failures.append(f"get_latest returned {got} after {floor} was acknowledged")
                await asyncio.sleep(0)

    await FileCheckpointStore(tmp_path).open()
    await asyncio.gather(writer(), reader(), reader())
    assert failures == []


# -- recovery -------------------------------------------------------------------------------


class Rebooted(OsFileIO):
    def boot_id(self) -> str | None:
        return "a-different-boot"


@pytest.mark.asyncio
async def test_restart_recovery_reindexes_records_above_the_sync_mark(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path, sync_interval=1000) as store:
        saved = [await store.save(f"s{i % 2}", {"i": i}) for i in range(12)]
    # A power cut lost every index write since the last sync mark.
    (tmp_path / "streams" / "s0.idx").unlink()
    (tmp_path / "ids.idx").unlink()
    async with FileCheckpointStore(tmp_path, io=Rebooted()) as store:
        for cp in saved:
            assert (await store.load(cp.id)).state == cp.state
        latest = await store.get_latest("s0")
        assert latest is not None and latest.id == saved[-2].id
        assert [cp.id for cp in (await store.list("s0", order="asc")).items] == [
            cp.id for cp in saved[::2]
        ]


@pytest.mark.asyncio
async def test_repair_rebuilds_both_indexes_from_the_records(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as store:
        saved = [await store.save(f"s{i % 3}", {"i": i}) for i in range(10)]
        await store.delete(saved[4].id)
    for index in (tmp_path / "streams").iterdir():
        index.write_bytes(b"damaged")
    (tmp_path / "ids.idx").write_bytes(b"damaged")
    async with FileCheckpointStore(tmp_path) as store:
        report = await store.repair()
        assert (report.records, report.rebuilt["stream_indexes"]) == (9, 3)
        assert report.damaged == report.dropped == []
        assert sorted(await store.list_streams()) == ["s0", "s1", "s2"]
        for cp in saved:
            if cp.id != saved[4].id:
                assert (await store.load(cp.id)).state == cp.state
        info = await store.info()
        assert (info.checkpoints, info.streams, info.high_water_mark) == (9, 3, 10)


@pytest.mark.asyncio
async def test_purge_expired_reclaims_the_files(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    async with FileCheckpointStore(tmp_path, clock=lambda: now[0]) as store:
        keep = await store.save("s", "keep")
        gone = [await store.save("s", i, ttl=10) for i in range(3)]
        await store.update(gone[0].id, "slid")  # slides its TTL from the new time
        now[0] += timedelta(seconds=11)
        assert [cp.id for cp in (await store.list("s")).items] == [keep.id]
        assert await store.purge_expired() == 3
    records = [p.name for p in (tmp_path / "records").rglob("*.ckpt")]
    assert records == [f"{keep.sequence:020d}.{keep.id}.ckpt"]


class Churning(OsFileIO):
    """Every record file looks just deleted and every stream index looks just
    replaced: what a reader would see if writers kept racing it."""

    def __init__(self) -> None:
        self.fresh = 0

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        if name.endswith(".ckpt"):
            raise FileNotFoundError(2, "gone", name)
        return super().open(name, flags, mode, dir_fd=dir_fd)

    def fstat(self, fd: int) -> os.stat_result:
        st = super().fstat(fd)
        if st.st_size >= 4096 and st.st_size % 256 == 0:  # a stream index
            self.fresh += 1
            return os.stat_result((st.st_mode, st.st_ino + self.fresh, *st[2:10]))
        return st


@pytest.mark.asyncio
async def test_get_latest_retries_a_bounded_number_of_times(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as store:
        await store.save("job", 1)
    io = Churning()
    async with FileCheckpointStore(tmp_path, io=io) as store:
        with pytest.raises(sk.errors.ConcurrentModificationError) as caught:
            await store.get_latest("job")
        assert caught.value.retryable
        assert 8 <= io.fresh <= 20


class Died(BaseException):
    """The writer process dies here (nothing in the store may catch this)."""


class DiesAtUnlink(OsFileIO):
    def unlink(self, name: str, *, dir_fd: int) -> None:
        if name.endswith(".ckpt"):
            raise Died
        super().unlink(name, dir_fd=dir_fd)


@pytest.mark.asyncio
async def test_a_reader_finishes_a_delete_whose_writer_died(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path) as reader:
        writer = FileCheckpointStore(tmp_path, io=DiesAtUnlink())
        await writer.open()
        keep = await writer.save("job", "keep")
        doomed = await writer.save("job", "doomed")
        with pytest.raises(Died):
            await writer.delete(doomed.id)
        # The writer is gone (its lock with it); its half-done delete is in the journal.
        pending = _journal(tmp_path)
        assert pending is not None and pending["op"] == "delete"
        page = await reader.list(None, order="asc")
        assert [cp.id for cp in page.items] == [keep.id]
        assert page.skipped == []
        assert _journal(tmp_path) is None, "the reader finished the delete"
        assert not list((tmp_path / "records").rglob(f"*.{doomed.id}.ckpt"))
        latest = await reader.get_latest("job")
        assert latest is not None and latest.id == keep.id
        await writer.close()


def _journal(root: Path) -> dict[str, object] | None:
    """The journal entry of the newest copy of ``state`` (see docs/file-backend.md)."""
    data = (root / "state").read_bytes()
    newest = max((data[:2048], data[2048:]), key=lambda copy: int(copy[:20]))
    journal = json.loads(newest[21:2039])["journal"]
    assert journal is None or isinstance(journal, dict)
    return journal


class _ReplaceIndexOnOpen(OsFileIO):
    """Renames a fresh copy over a stream index right after it is opened, ``times``
    times: what a concurrent writer's compaction does between a reader's open and fstat."""

    def __init__(self, times: int) -> None:
        self.times = times

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        fd = super().open(name, flags, mode, dir_fd=dir_fd)
        if self.times > 0 and name.endswith(".idx") and not flags & (os.O_WRONLY | os.O_RDWR):
            self.times -= 1
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            tmp = os.open(".swap.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
            os.write(tmp, data)
            os.close(tmp)
            os.rename(".swap.tmp", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return fd


@pytest.mark.asyncio
async def test_an_index_replaced_under_a_reader_is_retried_not_reported_as_damage(
    tmp_path: Path,
) -> None:
    async with FileCheckpointStore(tmp_path, durability="fast") as store:
        await store.save("job", {"step": 1})
        newest = await store.save("job", {"step": 2})
    io = _ReplaceIndexOnOpen(times=2)
    async with FileCheckpointStore(tmp_path, io=io, durability="fast") as store:
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == newest.id
        assert io.times == 0
    io = _ReplaceIndexOnOpen(times=1000)
    async with FileCheckpointStore(tmp_path, io=io, durability="fast") as store:
        with pytest.raises(sk.errors.ConcurrentModificationError):
            await store.get_latest("job")
