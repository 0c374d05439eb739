"""Group commit on the file backend (S15): a crash anywhere inside a group of
concurrent saves loses no save that returned, and recovery gives a consistent store.

A group is formed deterministically: one save is started, and once it is on the
writer thread ``WIDTH`` more; the first is held there until the others have
queued behind it, so it goes alone and they are committed together (a spy on
``insert_group`` checks it).

Two kinds of crash:

- a power cut at every mutating call from the start of the group to the first
  call after it, over :class:`PowerLossIO` (only what was fsynced survives), for
  both group syncs (one ``syncfs``, or one ``fsync`` per record file); named
  points: after the records' writes, before their sync; after it, before the
  directory's fsync; on the journal's write;
- SIGKILL at sampled file-changing system calls of a child process that saves in
  groups (``strace -e inject``), for both durabilities.

After each, the store is reopened (as after a reboot) and then repaired, and must
hold every save that returned, show no damaged or stray file, give each stream's
newest save as its latest, and pass ``verify``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fileio_faults import PowerCut, PowerLossIO, RebootedIO
from harness import STRACE, crash_points, kill_file_store_sweep, run_python_traced
from reliability_support import FIGURES, list_everything, reopen_file_store
from test_batch_crash_file import SyncfsPowerLossIO, make_io

from statekeeper.backends.file import FileCheckpointStore

pytestmark = pytest.mark.reliability

SEED = 15
BUDGET = 12  # SIGKILL points per durability in a normal run (--long: all of them)
WIDTH = 6  # saves in the group, each to its own stream


async def concurrent_saves(store: FileCheckpointStore, tag: str, acked: set[str]) -> None:
    """One save, and once it is on the writer thread ``WIDTH`` more: the ``WIDTH``
    form a group. ``acked`` gets each id whose save returned."""

    async def one(stream: str, cid: str) -> None:
        await store.save(stream, {"id": cid}, id=cid)
        acked.add(cid)

    entered = LEAD_IN[f"{tag}-lead"] = threading.Event()
    lead = asyncio.create_task(one(f"{tag}-lead", f"{tag}-lead"))
    assert await asyncio.to_thread(entered.wait, 30), "the lead save never started"
    await asyncio.gather(lead, *(one(f"g{i}", f"{tag}-{i}") for i in range(WIDTH)))


#: Set when a lead save (by id) has started on the writer thread (see spy_groups).
LEAD_IN: dict[str, threading.Event] = {}


def spy_groups(store: FileCheckpointStore) -> list[int]:
    """Record the size of every group; hold each lead save on the writer thread
    until the ``WIDTH`` saves started with it have queued behind it (so they form
    one group however the threads interleave)."""
    sizes: list[int] = []
    parts = store._parts  # its engine and the parts over it
    insert, insert_group = parts.engine.writes.insert, parts.batches.insert_group

    def gated(record: Any, *rest: Any) -> Any:
        if record.id in LEAD_IN:
            LEAD_IN[record.id].set()
            waited = 0
            while store._saves.pending < WIDTH + 1:  # the lead's own save, and WIDTH
                assert waited < 30_000, "the saves never queued behind the lead"
                time.sleep(0.001)
                waited += 1
        return insert(record, *rest)

    def spied(records: list[Any]) -> Any:
        sizes.append(len(records))
        return insert_group(records)

    parts.engine.writes.insert = gated  # type: ignore[method-assign]
    parts.batches.insert_group = spied  # type: ignore[method-assign]
    return sizes


async def run_until_cut(
    root: Path, io: PowerLossIO, batch_sync: str
) -> tuple[set[str], int, int, list[int]]:
    """Two rounds of concurrent saves; returns the ids acknowledged, the mutating
    calls made before and after the second round, and the group sizes."""
    acked: set[str] = set()
    before = after = 0
    sizes: list[int] = []
    try:
        async with FileCheckpointStore(root, io=io, batch_sync=batch_sync) as store:
            sizes = spy_groups(store)
            await concurrent_saves(store, "one", acked)
            before = io.calls
            await concurrent_saves(store, "two", acked)
            after = io.calls
            await store.save("other", {"after": True})
    except PowerCut:
        pass
    return acked, before, after, sizes


async def check_store(store: FileCheckpointStore, acked: set[str]) -> None:
    listed = await list_everything(store)
    seqs = [cp.sequence for cp in listed]
    assert seqs == sorted(set(seqs)), f"listing out of order: {seqs}"
    ids = {cp.id for cp in listed}
    lost = acked - ids
    assert not lost, f"acknowledged saves are gone: {sorted(lost)}"
    for cp in listed:
        assert cp.state == {"id": cp.id} or cp.id.startswith("other") or cp.stream == "other"
    for tag in ("one", "two"):
        for i in range(WIDTH):
            cid = f"{tag}-{i}"
            latest = await store.get_latest(f"g{i}")
            newer = f"two-{i}" if f"two-{i}" in ids else None
            want = newer or (f"one-{i}" if f"one-{i}" in ids else None)
            assert (latest.id if latest is not None else None) == want, (cid, latest)
    loaded = await store.load_many(sorted(ids))
    assert sorted(loaded) == sorted(ids)


async def reopen_and_check(root: Path, acked: set[str], io: object | None = None) -> None:
    await reopen_file_store(root, io, lambda store: check_store(store, acked))


def cut_and_check(tmp_path: Path, batch_sync: str, cut_at: int) -> set[str]:
    root = tmp_path / f"cut{cut_at}"
    io = make_io(root, batch_sync, cut_at)
    acked, _, _, _ = asyncio.run(run_until_cut(root, io, batch_sync))
    assert io.dead, f"no power cut at call {cut_at}"
    io.materialize()
    try:
        asyncio.run(reopen_and_check(root, acked, RebootedIO(f"boot-{cut_at}")))
    except AssertionError as exc:
        raise AssertionError(f"after a power cut at call {cut_at} (acked {acked}): {exc}") from exc
    return acked


@pytest.mark.parametrize("batch_sync", ["syncfs", "fsync"])
def test_a_group_survives_a_power_cut_at_any_call(batch_sync: str, tmp_path: Path) -> None:
    dry = make_io(tmp_path / "dry", batch_sync)
    acked, before, after, sizes = asyncio.run(run_until_cut(tmp_path / "dry", dry, batch_sync))
    assert sizes == [WIDTH, WIDTH], f"the saves were not grouped: {sizes}"
    assert len(acked) == 2 * (WIDTH + 1) and after > before
    cuts = 0
    for cut_at in range(before + 1, after + 2):
        cut_and_check(tmp_path, batch_sync, cut_at)
        cuts += 1
    FIGURES[f"group commit power cuts: checked (file, {batch_sync})"] += cuts


class Recording:
    """Mixin: the 1-based number of every mutating call, by what it did."""

    marks: list[tuple[int, str, str]]

    def _mark(self, what: str, name: str) -> None:
        self.marks.append((self.calls + 1, what, name))  # type: ignore[attr-defined]


class RecordingSyncfsIO(Recording, SyncfsPowerLossIO):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.marks = []

    def syncfs(self, fd: int) -> None:
        self._mark("syncfs", "")
        super().syncfs(fd)

    def fsync(self, fd: int) -> None:
        self._mark("fsync", self._fds.get(fd, ("", "", 0))[1])
        super().fsync(fd)

    def rename(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        self._mark("rename", dst)
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._mark("pwrite", self._fds.get(fd, ("", "", 0))[1])
        return super().pwrite(fd, data, offset)


def named_points(tmp_path: Path) -> dict[str, int]:
    """The call numbers of the second group's named crash points (syncfs mode)."""
    io = RecordingSyncfsIO(str(tmp_path / "named"))
    _, before, after, _ = asyncio.run(run_until_cut(tmp_path / "named", io, "syncfs"))
    marks = [m for m in io.marks if before < m[0] <= after]
    syncfs = [n for n, what, _ in marks if what == "syncfs"]
    assert len(syncfs) == 1, marks
    renames = [
        n
        for n, what, name in marks
        if what == "rename" and name.endswith(".ckpt") and n > syncfs[0]
    ]
    assert len(renames) == WIDTH, marks
    dir_fsync = [n for n, what, name in marks if what == "fsync" and n > renames[-1]]
    journal = [n for n, what, name in marks if what == "pwrite" and name.endswith("state")]
    return {
        "after the writes, before their sync": syncfs[0],
        "after the sync, before the renames": renames[0],
        "after the renames, before the directory fsync": dir_fsync[0],
        "on the journal write that opens the group": [n for n in journal if n < syncfs[0]][-1],
        "on the journal write that closes the group": next(n for n in journal if n > dir_fsync[0]),
    }


def test_named_crash_points_inside_a_group(tmp_path: Path) -> None:
    """Before the group's directory fsync returns, no save of the group is
    acknowledged; after the power cut none of it is lost that was, and the store
    is consistent (the sweep above covers every call; these name the points)."""
    points = named_points(tmp_path)
    for what, cut_at in points.items():
        try:
            acked = cut_and_check(tmp_path / what.replace(" ", "-"), "syncfs", cut_at)
        except AssertionError as exc:
            raise AssertionError(f"{what}: {exc}") from exc
        group = {f"two-{i}" for i in range(WIDTH)}
        if "closes" not in what:
            assert not acked & group, f"{what}: acknowledged {sorted(acked & group)}"


def test_the_sweep_catches_a_group_without_its_directory_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant: the record directories' fsyncs do nothing. The sweep must find an
    acknowledged save of a group lost."""

    def mutant(root: Path, batch_sync: str, cut_at: int | None = None) -> PowerLossIO:
        return PowerLossIO(str(root), cut_at=cut_at, drop_dir_fsync=True)

    monkeypatch.setitem(globals(), "make_io", mutant)
    with pytest.raises(AssertionError, match=r"acknowledged saves are gone"):
        test_a_group_survives_a_power_cut_at_any_call("fsync", tmp_path)
    FIGURES["mutants caught"] += 1


# -- SIGKILL at system calls -------------------------------------------------------------

CHILD = """
import asyncio
from statekeeper.backends.file import FileCheckpointStore

async def main() -> None:
    async with FileCheckpointStore({root!r}, durability={durability!r}) as store:
        async def one(stream, cid):
            await store.save(stream, {{"id": cid}}, id=cid)
            print("acked", cid, flush=True)
        for tag in ("one", "two"):
            await asyncio.gather(
                one(tag + "-lead", tag + "-lead"),
                *(one("g%d" % i, "%s-%d" % (tag, i)) for i in range({width})),
            )

asyncio.run(main())
"""


def run_child(
    root: Path, durability: str, inject: tuple[str, int] | None
) -> tuple[int, set[str], Counter[str]]:
    code = CHILD.format(root=str(root), durability=durability, width=WIDTH)
    return run_python_traced(code, root.parent / f"{root.name}.trace", inject)


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (.ci/run installs it)")
@pytest.mark.parametrize("durability", ["full", "fast"])
def test_groups_survive_sigkill_at_any_call(
    durability: str, tmp_path: Path, long_run: bool
) -> None:
    _, acked, calls = run_child(tmp_path / "baseline", durability, None)
    assert len(acked) == 2 * (WIDTH + 1)
    points = crash_points(calls, budget=None if long_run else BUDGET, seed=SEED)
    kills = kill_file_store_sweep(
        tmp_path,
        points,
        lambda root, inject: run_child(root, durability, inject),
        lambda root, acked: reopen_and_check(root, acked),
    )
    FIGURES[f"group commit crash points: killed and checked (file, {durability})"] += kills


def test_no_temp_file_outlives_recovery(tmp_path: Path) -> None:
    """A power cut between the group's sync and its renames leaves durable temp
    files (syncfs wrote them back); the reopen removes them."""
    points = named_points(tmp_path)
    cut_at = points["after the sync, before the renames"]
    root = tmp_path / "store"
    io = make_io(root, "syncfs", cut_at)
    asyncio.run(run_until_cut(root, io, "syncfs"))
    io.materialize()
    temps = [n for _, _, names in os.walk(root) for n in names if n.endswith(".tmp")]
    assert temps, "the model lost the synced temp files"
    asyncio.run(reopen_and_check(root, set(), RebootedIO("after")))
    temps = [n for _, _, names in os.walk(root) for n in names if n.endswith(".tmp")]
    assert not temps, temps


def test_a_reboot_removes_temp_files_above_the_sync_mark(tmp_path: Path) -> None:
    """Where the temp files of a cut group reach the disk but the journal does not
    (``fsync`` of each temp file commits its name on most file systems; the state
    is not flushed), the restart recovery finds no journal naming them: it removes
    every temp file above the sync mark, so no listing reports them."""
    root = tmp_path / "store"

    async def seed() -> None:
        async with FileCheckpointStore(root) as store:
            await store.save("s", {"id": "kept"}, id="kept")

    asyncio.run(seed())
    bucket = root / "records" / "00000000000000000"
    for seq in (2, 3):
        (bucket / f".{seq:020d}.1a2b00000001.tmp").write_bytes(b"SK1 half a record")
    asyncio.run(reopen_and_check(root, {"kept"}, RebootedIO("rebooted")))
    assert not [n for n in os.listdir(bucket) if n.endswith(".tmp")]


def test_a_reboot_reads_a_torn_dirty_list(tmp_path: Path) -> None:
    """A power cut that tears the last append to ``dirty`` leaves zeros where its
    bytes were lost; the restart recovery reads the names around them."""
    root = tmp_path / "store"

    async def seed() -> None:
        async with FileCheckpointStore(root, sync_interval=1000) as store:
            for i in range(3):
                await store.save(f"s{i}", {"id": f"c{i}"}, id=f"c{i}")

    asyncio.run(seed())
    dirty = root / "dirty"
    names = dirty.read_bytes()
    assert names.count(b".idx\n") == 3, names
    dirty.write_bytes(b"\x00" * 5 + names + b"\x00" * 7 + b"s1.i")
    asyncio.run(reopen_and_check(root, {"c0", "c1", "c2"}, RebootedIO("rebooted")))
