"""The temp file of the next durable save, made ahead by the idle writer
(``backends/file/spares.py``): used by the save that gets its sequence, harmless
wherever it is left, and never in a listing or a verify report."""

from __future__ import annotations

from pathlib import Path

import pytest
from file_helpers import parts_of

from statekeeper.backends.file import FileCheckpointStore

pytestmark = pytest.mark.asyncio


def _temps(root: Path) -> list[Path]:
    return sorted(root.rglob("*.tmp"))


def _spare(root: Path) -> Path:
    temps = _temps(root)
    assert len(temps) == 1, temps
    assert temps[0].stat().st_size == 0
    return temps[0]


async def _idle(store: FileCheckpointStore) -> None:
    """Wait until the writer thread has done its upkeep after the last save."""
    saves = store._saves
    worker = saves._worker
    assert worker is not None
    await worker.run(lambda: None)


async def test_the_next_durable_save_writes_into_the_spare(tmp_path: Path) -> None:
    root = tmp_path / "s"
    async with FileCheckpointStore(root) as store:
        first = await store.save("s", {"n": 1})
        await _idle(store)
        spare = _spare(root)
        assert spare.name.startswith(f".{first.sequence + 1:020d}.")
        inode = spare.stat().st_ino
        second = await store.save("s", {"n": 2})
        record = next(
            p for p in root.rglob("*.ckpt") if p.name.startswith(f"{second.sequence:020d}")
        )
        assert record.stat().st_ino == inode  # the spare, renamed: no new file
        assert (await store.load(second.id)).state == {"n": 2}
        await _idle(store)
        assert _spare(root) != spare  # and the next one is ready
    assert _temps(root) == []  # close removes it


async def test_a_spare_is_in_no_listing_and_no_verify_report(tmp_path: Path) -> None:
    root = tmp_path / "s"
    async with FileCheckpointStore(root) as store:
        saved = [await store.save(f"s{i % 2}", {"i": i}) for i in range(3)]
        await _idle(store)
        _spare(root)
        page = await store.list(None, limit=10)
        assert page.skipped == []
        assert [cp.id for cp in page.items] == [cp.id for cp in reversed(saved)]
        report = await store.verify()
        assert report.ok, report.problems


async def test_a_spare_removed_from_under_the_store_is_not_used(tmp_path: Path) -> None:
    root = tmp_path / "s"
    async with FileCheckpointStore(root) as store:
        await store.save("s", {"n": 1})
        await _idle(store)
        _spare(root).unlink()  # as another process's repair would
        second = await store.save("s", {"n": 2})
        assert (await store.load(second.id)).state == {"n": 2}
        assert (await store.verify()).ok


async def test_a_spare_of_a_sequence_another_writer_took_is_dropped(tmp_path: Path) -> None:
    root = tmp_path / "s"
    async with FileCheckpointStore(root) as mine, FileCheckpointStore(root) as theirs:
        await mine.save("s", {"who": "mine"})
        await _idle(mine)
        stale = _spare(root)
        taken = await theirs.save("s", {"who": "theirs"})  # gets the spare's sequence
        await _idle(theirs)
        assert stale.name.startswith(f".{taken.sequence:020d}.")
        ours = await mine.save("s", {"who": "mine again"})
        assert ours.sequence == taken.sequence + 1
        assert not stale.exists()
        latest = await mine.get_latest("s")
        assert latest is not None and latest.state == {"who": "mine again"}
        assert (await mine.verify()).ok


async def test_an_empty_temp_left_by_a_crash_is_no_problem_and_repair_removes_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "s"
    async with FileCheckpointStore(root) as store:
        saved = await store.save("s", {"n": 1})
    bucket = next(root.rglob("*.ckpt")).parent
    left = bucket / f".{saved.sequence + 1:020d}.dead00000001.tmp"
    left.write_bytes(b"")  # a killed writer's spare
    async with FileCheckpointStore(root) as store:
        assert (await store.verify()).ok
        assert (await store.list(None)).skipped == []
        await store.repair()
        assert not left.exists()
        assert (await store.save("s", {"n": 2})).sequence == saved.sequence + 1


async def test_fast_durability_makes_no_spare(tmp_path: Path) -> None:
    root = tmp_path / "s"
    async with FileCheckpointStore(root, durability="fast") as store:
        for i in range(3):
            await store.save("s", {"n": i})
        engine = parts_of(store).engine
        with engine.files.active():
            engine.files.spares.make()  # what the idle writer would do after a durable save
        assert _temps(root) == []
