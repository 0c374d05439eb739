"""Untrusted files in a file store (S11): planted FIFOs, symlinks out of the store,
hard links, junk, truncated records, stray temp files, oversized files and
symlinked directories. Listing reports each in ``page.skipped``, nothing is
followed, nothing blocks, and ``get_latest`` raises where the newest is broken."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TypeVar

import pytest
import pytest_asyncio

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.errors import CheckpointDecodeError
from statekeeper.models import Checkpoint, Page

T = TypeVar("T")

pytestmark = pytest.mark.reliability


async def quick(call: Awaitable[T]) -> T:
    """Every call here must return promptly: a FIFO must never block a reader."""
    return await asyncio.wait_for(call, timeout=20)


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[FileCheckpointStore]:
    async with FileCheckpointStore(tmp_path / "store") as opened:
        yield opened


def record_file(store: FileCheckpointStore, cp: Checkpoint) -> Path:
    bucket = f"{cp.sequence // 1000:017d}"
    return Path(store.path) / "records" / bucket / f"{cp.sequence:020d}.{cp.id}.ckpt"


async def everything(store: FileCheckpointStore) -> Page:
    return await quick(store.list(None, limit=1000, order="asc"))


def reasons(page: Page) -> dict[str | None, str]:
    return {s.id: s.reason for s in page.skipped}


async def assert_newest_is_named(store: FileCheckpointStore, newest: Checkpoint) -> None:
    with pytest.raises(CheckpointDecodeError) as caught:
        await quick(store.get_latest("job"))
    assert caught.value.id == newest.id
    assert caught.value.location and str(record_file(store, newest)) in caught.value.location
    with pytest.raises(CheckpointDecodeError):
        await quick(store.load(newest.id))
    page = await quick(store.list("job"))
    assert [s.id for s in page.skipped] == [newest.id]
    assert page.skipped[0].sequence == newest.sequence


@pytest.mark.asyncio
async def test_fifo_in_place_of_the_newest_record(store: FileCheckpointStore) -> None:
    older = await store.save("job", {"step": 0})
    newest = await store.save("job", {"step": 1})
    path = record_file(store, newest)
    path.unlink()
    os.mkfifo(path)
    await assert_newest_is_named(store, newest)
    assert "FIFO" in reasons(await everything(store))[newest.id]
    assert [cp.id for cp in (await everything(store)).items] == [older.id]


@pytest.mark.asyncio
async def test_symlink_out_of_the_store_is_never_followed(
    store: FileCheckpointStore, tmp_path: Path
) -> None:
    await store.save("job", {"step": 0})
    newest = await store.save("job", {"step": 1})
    path = record_file(store, newest)
    outside = tmp_path / "outside.ckpt"
    shutil.copy(path, outside)  # a perfectly valid record, but not inside the store
    path.unlink()
    path.symlink_to(outside)
    await assert_newest_is_named(store, newest)
    assert "symbolic link" in reasons(await everything(store))[newest.id]


@pytest.mark.asyncio
async def test_hard_linked_record_is_reported(store: FileCheckpointStore, tmp_path: Path) -> None:
    await store.save("job", {"step": 0})
    newest = await store.save("job", {"step": 1})
    os.link(record_file(store, newest), tmp_path / "second-name")
    await assert_newest_is_named(store, newest)
    assert "hard link" in reasons(await everything(store))[newest.id]


@pytest.mark.asyncio
async def test_truncated_record_is_an_error_never_older_data(store: FileCheckpointStore) -> None:
    await store.save("job", 1)
    newest = await store.save("job", 10)  # the state is b"10": a truncated one must not be 1
    path = record_file(store, newest)
    path.write_bytes(path.read_bytes()[:-1])
    await assert_newest_is_named(store, newest)
    assert "truncated" in reasons(await everything(store))[newest.id]


@pytest.mark.asyncio
async def test_oversized_file_is_refused_before_it_is_read(store: FileCheckpointStore) -> None:
    await store.save("job", {"step": 0})
    newest = await store.save("job", {"step": 1})
    with record_file(store, newest).open("r+b") as f:
        f.truncate(2 * store.options.max_bytes + (2 << 20))  # sparse: costs no disk
    await assert_newest_is_named(store, newest)
    assert "limit" in reasons(await everything(store))[newest.id]


@pytest.mark.asyncio
async def test_junk_and_stray_temp_files_are_reported_in_order(store: FileCheckpointStore) -> None:
    saved = [await store.save("job", {"step": i}) for i in range(3)]
    bucket = record_file(store, saved[0]).parent
    # What a crashed save leaves (its sequence is burned, so no record has it) and a
    # planted file that is no record at all.
    burned = await store.save("job", {"step": "lost"})
    await store.delete(burned.id)
    stray = f".{burned.sequence:020d}.0badc0de.tmp"
    (bucket / stray).write_bytes(b"half a record")
    (bucket / "notes.txt").write_text("hello")
    (bucket / "0123-starts-like-a-record").write_text("hello")
    later = await store.save("job", {"step": 3})
    page = await everything(store)
    assert [cp.id for cp in page.items] == [cp.id for cp in (*saved, later)]
    found = {s.location.rsplit("/", 1)[-1]: s for s in page.skipped}
    assert set(found) == {"notes.txt", "0123-starts-like-a-record", stray}
    assert "temporary" in found[stray].reason
    assert found[stray].sequence == burned.sequence
    # Strict reads of the stream are unaffected: neither file is in any index.
    latest = await quick(store.get_latest("job"))
    assert latest is not None and latest.id == later.id
    # Paging one by one visits every record once and reports each file once.
    for order in ("asc", "desc"):
        seen, skipped, cursor = [], [], None
        while True:
            page = await quick(store.list(None, limit=1, order=order, after=cursor))  # type: ignore[arg-type]
            seen += [cp.id for cp in page.items]
            skipped += [s.location for s in page.skipped]
            if not page.has_more:
                break
            cursor = page.next_cursor
        ids = [cp.id for cp in (*saved, later)]
        assert seen == (ids if order == "asc" else ids[::-1])
        assert len(skipped) == len(set(skipped)) == 3


@pytest.mark.asyncio
async def test_record_whose_name_disagrees_with_its_content(store: FileCheckpointStore) -> None:
    first = await store.save("job", {"step": 0})
    path = record_file(store, first)
    moved = path.with_name(f"{first.sequence + 5:020d}.{first.id}.ckpt")
    path.rename(moved)
    page = await everything(store)
    assert [s.sequence for s in page.skipped] == [first.sequence + 5]
    assert "sequence" in page.skipped[0].reason
    with pytest.raises(CheckpointDecodeError, match="missing"):
        await quick(store.get_latest("job"))


@pytest.mark.asyncio
async def test_symlinked_bucket_directory_is_not_followed(
    store: FileCheckpointStore, tmp_path: Path
) -> None:
    only = await store.save("job", {"step": 0})
    bucket = record_file(store, only).parent
    elsewhere = tmp_path / "elsewhere"
    bucket.rename(elsewhere)
    bucket.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CheckpointDecodeError) as caught:
        await quick(store.get_latest("job"))
    assert caught.value.id == only.id
    page = await everything(store)
    assert page.items == [] and len(page.skipped) == 1
    assert "not a directory" in page.skipped[0].reason


@pytest.mark.asyncio
async def test_planted_stream_index_is_never_an_empty_stream(
    store: FileCheckpointStore,
) -> None:
    """An index that is not ours is not read as "no checkpoints": the reads go to
    the records, verify reports it, and repair replaces it."""
    first = await store.save("job", {"step": 0})
    index = Path(store.path) / "streams" / "job.idx"
    index.write_bytes(b"not an index")
    latest = await quick(store.get_latest("job"))
    assert latest is not None and latest.id == first.id
    assert [c.id for c in (await quick(store.list("job"))).items] == [first.id]
    (Path(store.path) / "streams" / "junk.idx").symlink_to("/etc/passwd")
    assert await quick(store.list_streams()) == ["job"]
    report = await quick(store.verify())
    assert not report.ok
    assert {p.kind for p in report.problems} == {"index"}
    await store.repair()
    assert (await quick(store.verify())).ok
    assert not (Path(store.path) / "streams" / "junk.idx").is_symlink()
    latest = await quick(store.get_latest("job"))
    assert latest is not None and latest.state == {"step": 0}


@pytest.mark.asyncio
async def test_names_never_leave_the_store(tmp_path: Path) -> None:
    """Stream names and ids that look like paths stay names: every file the store
    writes is under its directory, and each name reads back its own data."""
    root = tmp_path / "inner" / "store"
    hostile = [
        "..",
        ".",
        "../../escape",
        "/etc/passwd",
        "a/b",
        "a\\b",
        "~",
        "%2E%2E",
        "CON",
        "Job",
        "job",
        "ünïcødé/流/🚀",
        "x" * 512,
        "流" * 512,
        " ",
        "\n",
    ]
    async with FileCheckpointStore(root) as store:
        for i, stream in enumerate(hostile):
            await store.save(stream, {"i": i})
        await store.save("ids", {"id": ".."}, id="..")
        await store.save("ids", {"id": "."}, id=".")
        await store.save("ids", {"id": "-rf"}, id="-rf")
        for i, stream in enumerate(hostile):
            latest = await store.get_latest(stream)
            assert latest is not None and latest.state == {"i": i}, stream
        assert sorted(await store.list_streams()) == sorted([*hostile, "ids"])
        assert (await store.load("..")).state == {"id": ".."}
    written = await asyncio.to_thread(lambda: list(tmp_path.rglob("*")))
    assert [p for p in written if root not in (p, *p.parents)] == [tmp_path / "inner"]
    for path in written:
        assert len(path.name.encode()) <= 255
        assert not path.is_symlink()
