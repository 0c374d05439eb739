"""``save_many`` on the file backend is all or nothing after a crash at any point.

Two kinds of crash:

- SIGKILL at sampled file-changing system calls of a child process that opens a
  store and runs two batches (``strace -e inject=<call>:signal=KILL:when=K``, as
  ``test_crash_points.py`` does for ``save``), for both durabilities;
- a power cut at every mutating call of a batch, over :class:`PowerLossIO` (the
  directory as a reboot finds it: only what was fsynced), for both group syncs
  (one ``syncfs``, modelled below, or one ``fsync`` per record file).

After each, the store is reopened (and then repaired) and must hold every item of
a batch or none, every item of a batch whose ``save_many`` returned, and nothing
of a batch in ``list``, ``get_latest`` or ``load_many`` unless all of it is there.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections import Counter
from pathlib import Path

import pytest
from fileio_faults import PowerCut, PowerLossIO, RebootedIO
from harness import STRACE, crash_points, kill_file_store_sweep, run_python_traced
from reliability_support import FIGURES, list_everything, reopen_file_store

import statekeeper as sk
from statekeeper.backends.file import FileCheckpointStore

pytestmark = pytest.mark.reliability

SEED = 13
BUDGET = 14  # crash points per durability in a normal run (--long: all of them)
STREAMS = ("a", "b", "c")
WIDTH = 5  # items per batch, across STREAMS


def batch_items(tag: str) -> list[sk.NewCheckpoint]:
    return [
        sk.NewCheckpoint(
            stream=STREAMS[i % len(STREAMS)], state={"batch": tag, "i": i}, id=f"{tag}-{i}"
        )
        for i in range(WIDTH)
    ]


async def check_batches(store: FileCheckpointStore, acked: set[str], tried: list[str]) -> None:
    """Each batch in ``tried`` is there whole or not at all; those in ``acked`` are
    there; and no read shows part of one."""
    listed = [cp.id for cp in await list_everything(store)]
    for tag in tried:
        want = [f"{tag}-{i}" for i in range(WIDTH)]
        present = [cid for cid in want if cid in listed]
        loaded = await store.load_many(want)
        assert sorted(loaded) == sorted(present), "load_many and list disagree"
        assert present in ([], want), f"batch {tag} is half there: {present}"
        if tag in acked:
            assert present == want, f"batch {tag} was acknowledged but is gone"
        if present:
            seqs = [loaded[cid].sequence for cid in want]
            assert seqs == list(range(seqs[0], seqs[0] + WIDTH)), f"batch {tag}: {seqs}"
    latest = {s: await store.get_latest(s) for s in STREAMS}
    newest_batch = next(
        (t for t in reversed(tried) if f"{t}-0" in listed), None
    )  # the newest batch that is there decides every stream's latest
    for s, cp in latest.items():
        if newest_batch is None:
            assert cp is None, f"stream {s} has {cp} though no batch is there"
        else:
            assert cp is not None and cp.state["batch"] == newest_batch, (s, cp)


async def reopen_and_check(
    root: Path, acked: set[str], tried: list[str], io: object | None = None
) -> None:
    await reopen_file_store(root, io, lambda store: check_batches(store, acked, tried))


# -- SIGKILL at system calls -------------------------------------------------------------

CHILD = """
import asyncio, sys
import statekeeper as sk
from statekeeper.backends.file import FileCheckpointStore
sys.path.insert(0, {here!r})
from test_batch_crash_file import batch_items

async def main() -> None:
    async with FileCheckpointStore({root!r}, durability={durability!r}) as store:
        for tag in ("one", "two"):
            await store.save_many(batch_items(tag))
            print("acked", tag, flush=True)

asyncio.run(main())
"""


def run_child(
    root: Path, durability: str, inject: tuple[str, int] | None
) -> tuple[int, set[str], Counter[str]]:
    """Run the child under strace; return its exit status, the batches it
    acknowledged, and (without ``inject``) its mutating calls per name."""
    code = CHILD.format(here=str(Path(__file__).parent), root=str(root), durability=durability)
    return run_python_traced(code, root.parent / f"{root.name}.trace", inject)


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (.ci/run installs it)")
@pytest.mark.parametrize("durability", ["full", "fast"])
def test_save_many_survives_sigkill_at_any_call(
    durability: str, tmp_path: Path, long_run: bool
) -> None:
    _, acked, calls = run_child(tmp_path / "baseline", durability, None)
    assert acked == {"one", "two"}
    points = crash_points(calls, budget=None if long_run else BUDGET, seed=SEED)
    kills = kill_file_store_sweep(
        tmp_path,
        points,
        lambda root, inject: run_child(root, durability, inject),
        lambda root, acked: reopen_and_check(root, acked, ["one", "two"]),
    )
    FIGURES[f"save_many crash points: killed and checked (file, {durability})"] += kills


# -- power cuts ----------------------------------------------------------------------------


class SyncfsPowerLossIO(PowerLossIO):
    """:class:`PowerLossIO` with ``syncfs`` modelled: everything under the root, data
    and directory entries, becomes durable (the whole file system is written back).
    The base class would inherit the real ``syncfs`` and not know of it."""

    def syncfs(self, fd: int) -> None:
        self._step()
        with self.lock:
            for dirpath, dirnames, filenames in os.walk(self.root):
                rel = os.path.relpath(dirpath, self.root)
                rel = "" if rel == "." else rel
                entries: dict[str, tuple[str, int]] = dict.fromkeys(dirnames, ("dir", 0))
                for name in filenames:
                    path = os.path.join(dirpath, name)
                    st = os.lstat(path)
                    if stat.S_ISREG(st.st_mode):
                        ident = self._ident(st)
                        entries[name] = ("file", ident)
                        self._durable_data[ident] = Path(path).read_bytes()
                self._durable_dirs[rel] = entries
            self._last_write = None


def make_io(root: Path, batch_sync: str, cut_at: int | None = None) -> PowerLossIO:
    cls = SyncfsPowerLossIO if batch_sync == "syncfs" else PowerLossIO
    return cls(str(root), cut_at=cut_at)


async def run_until_cut(root: Path, io: PowerLossIO, batch_sync: str) -> tuple[set[str], int, int]:
    """Save a single checkpoint and two batches; returns the batches acknowledged
    and the mutating calls made before and after the second batch."""
    acked: set[str] = set()
    before = after = 0
    try:
        async with FileCheckpointStore(root, io=io, batch_sync=batch_sync) as store:
            await store.save_many(batch_items("one"))
            acked.add("one")
            before = io.calls
            await store.save_many(batch_items("two"))
            acked.add("two")
            after = io.calls
            await store.save("other", {"after": True})
    except PowerCut:
        pass
    return acked, before, after


@pytest.mark.parametrize("batch_sync", ["syncfs", "fsync"])
def test_save_many_survives_a_power_cut_at_any_call(batch_sync: str, tmp_path: Path) -> None:
    dry = make_io(tmp_path / "dry", batch_sync)
    acked, before, after = asyncio.run(run_until_cut(tmp_path / "dry", dry, batch_sync))
    assert acked == {"one", "two"} and after > before
    cuts = 0
    # every call of the second batch, and the first call after it
    for cut_at in range(before + 1, after + 2):
        root = tmp_path / f"cut{cut_at}"
        io = make_io(root, batch_sync, cut_at)
        acked, _, _ = asyncio.run(run_until_cut(root, io, batch_sync))
        assert io.dead, f"no power cut at call {cut_at}"
        io.materialize()
        cuts += 1
        try:
            asyncio.run(reopen_and_check(root, acked, ["one", "two"], RebootedIO(f"boot-{cut_at}")))
        except AssertionError as exc:
            raise AssertionError(
                f"after a power cut at call {cut_at} (acked {acked}): {exc}"
            ) from exc
    FIGURES[f"save_many power cuts: checked (file, {batch_sync})"] += cuts


def test_a_batch_cut_before_its_group_sync_acknowledges_nothing(tmp_path: Path) -> None:
    """The cut lands on the group sync itself: save_many never returned, and after
    the reboot no item of the batch is anywhere, in any read."""
    root = tmp_path / "store"
    dry = make_io(tmp_path / "dry", "syncfs")
    asyncio.run(run_until_cut(tmp_path / "dry", dry, "syncfs"))

    class CountSyncfs(SyncfsPowerLossIO):
        at: list[int] = []

        def syncfs(self, fd: int) -> None:
            self.at.append(self.calls + 1)
            super().syncfs(fd)

    counting = CountSyncfs(str(tmp_path / "count"))
    asyncio.run(run_until_cut(tmp_path / "count", counting, "syncfs"))
    second = CountSyncfs.at[1]  # the group sync of batch "two"
    io = SyncfsPowerLossIO(str(root), cut_at=second)
    acked, _, _ = asyncio.run(run_until_cut(root, io, "syncfs"))
    assert acked == {"one"}
    io.materialize()
    asyncio.run(reopen_and_check(root, acked, ["one", "two"], RebootedIO("after")))
    leftovers = [p.name for p in root.rglob("*.ckpt") if p.name.split(".")[1].startswith("two-")]
    assert not leftovers, f"record files of the cut batch survived: {leftovers}"


def test_the_power_cut_sweep_catches_a_batch_without_its_group_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant: the record files' fsyncs do nothing (what leaving out the group sync
    amounts to). The sweep must find an acknowledged batch lost or torn."""

    def mutant(root: Path, batch_sync: str, cut_at: int | None = None) -> PowerLossIO:
        return PowerLossIO(str(root), cut_at=cut_at, drop_file_fsync=True)

    monkeypatch.setitem(globals(), "make_io", mutant)
    with pytest.raises(AssertionError, match=r"acknowledged|damaged|half"):
        test_save_many_survives_a_power_cut_at_any_call("fsync", tmp_path)
    FIGURES["mutants caught"] += 1
