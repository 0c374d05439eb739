"""Items 3 and 4 on the file backend, through its I/O seam (``FileCheckpointStore(io=)``).

- **Simulated power loss.** The writer workload runs over :class:`PowerLossIO`;
  the power is cut at a seeded random system call, the directory is rewritten
  as a reboot would find it (unsynced data and directory entries gone, the last
  unsynced write torn), and D, A, R, L and S are checked on the reopened store.
  Two mutants, a backend whose file fsyncs do nothing and one whose directory
  fsyncs do nothing, must fail this test.
- **I/O errors.** The k-th write, fsync, rename, ... of a save, an update or a
  delete fails with EIO, ENOSPC or EDQUOT, once or persistently, or a write is
  short. The store must raise a typed error and never acknowledge after a failed
  call, leave no temp file, keep every older checkpoint, and work again once the
  fault clears.
"""

from __future__ import annotations

import asyncio
import errno
import random
from pathlib import Path

import pytest
from fileio_faults import FAULTABLE, FaultyIO, PowerCut, PowerLossIO, RebootedIO
from reliability_support import FIGURES, backend_available

from statekeeper import BaseCheckpointStore
from statekeeper.errors import CheckpointNotFound, StatekeeperError
from statekeeper.models import Checkpoint
from statekeeper.testing.invariants import (
    InvariantViolation,
    LoggedStore,
    LogWriter,
    Report,
    WriteLog,
    check_invariants,
)
from statekeeper.testing.workloads import writer_loop

pytestmark = pytest.mark.reliability


@pytest.fixture(autouse=True)
def _file_backend() -> None:
    backend_available("file")


def _store(root: Path, io: object, **options: object):  # type: ignore[no-untyped-def]
    from statekeeper.backends.file import FileCheckpointStore

    return FileCheckpointStore(root, io=io, **options)  # type: ignore[arg-type]


# -- power loss -------------------------------------------------------------------------


def power_loss_rounds(
    root: Path, workdir: Path, *, rounds: int, seed: int, ops: int = 25, **mutant: bool
) -> tuple[int, Report]:
    """Run ``rounds`` of the writer workload, each ended by a power cut; check after each."""
    log_path = workdir / "power.log"
    floor = 0
    report = Report()
    cuts = 0
    for r in range(rounds):
        rng = random.Random(seed * 1000 + r)
        io = PowerLossIO(root=str(root), cut_at=rng.randint(1, ops * 10), **mutant)
        log = LogWriter(log_path, writer=f"p{r}")

        async def work(
            io: PowerLossIO = io, log: LogWriter = log, r: int = r, rng: random.Random = rng
        ) -> None:
            try:
                async with _store(root, io) as store:
                    await writer_loop(LoggedStore(store, log), rng, prefix=f"p{r}", ops=ops)
            except PowerCut:
                pass

        asyncio.run(work())
        log.close()
        cuts += 1
        io.cut()
        io.materialize()

        async def check(r: int = r, floor: int = floor) -> Report:
            store = _store(root, RebootedIO(f"boot-{seed}-{r}"))
            try:
                await store.open()
            except Exception as exc:  # typed or not, a store that cannot open has lost data
                log = WriteLog.read(log_path)
                lost = Report(ops=len(log.ops), acked=sum(op.acked for op in log.ops))
                lost.add("D", f"the store does not open after the power cut: {exc}")
                raise InvariantViolation(lost) from exc
            try:
                return await check_invariants(store, WriteLog.read(log_path), floor=floor)
            finally:
                await store.close()

        try:
            report = asyncio.run(check())
        except InvariantViolation as exc:
            raise AssertionError(f"after power cut #{r + 1} (at call {io.cut_at}):\n{exc}") from exc
        floor = max(floor, report.probe_sequence or 0)
    return cuts, report


def test_power_loss_keeps_invariants(tmp_path: Path, long_run: bool) -> None:
    cuts, report = power_loss_rounds(
        tmp_path / "store", tmp_path, rounds=60 if long_run else 15, seed=11
    )
    FIGURES["power loss: cuts survived (file)"] += cuts
    FIGURES["power loss: acknowledged writes verified"] += report.acked
    assert report.acked > 0


@pytest.mark.parametrize("mutant", ["drop_file_fsync", "drop_dir_fsync"])
def test_power_loss_catches_missing_fsync(tmp_path: Path, mutant: str) -> None:
    """Deleting either fsync from the backend makes the power-loss test fail."""
    with pytest.raises(AssertionError, match=r"\[D\]"):
        power_loss_rounds(tmp_path / "store", tmp_path, rounds=12, seed=11, **{mutant: True})
    FIGURES["mutants caught"] += 1


# -- I/O errors -----------------------------------------------------------------------------

ERRORS = [errno.EIO, errno.ENOSPC, errno.EDQUOT, None]  # None: a short write
OPS = ("save", "update", "delete")


def _temp_files(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        # an empty .tmp is the writer's spare (file/spares.py): it holds nothing
        if p.name.endswith(".undo") or (p.name.endswith(".tmp") and p.stat().st_size)
    )


async def _prepare(op: str, logged: LoggedStore, n: int) -> Checkpoint | None:
    """The checkpoint an update or a delete will act on (saved before the fault is armed)."""
    if op == "save":
        return None
    return await logged.save("targets", {"n": n}, id=f"t{n}")


async def _do(op: str, logged: LoggedStore, n: int, target: Checkpoint | None) -> None:
    if op == "save":
        await logged.save("faults", {"n": n, "pad": "z" * 300}, id=f"f{n}")
    elif op == "update":
        assert target is not None
        await logged.update(target.id, {"n": n, "updated": True}, if_match=target.etag)
    else:
        assert target is not None
        await logged.delete(target.id, if_match=target.etag)


async def _still_consistent(
    store: BaseCheckpointStore, target: Checkpoint, op: str, acked: bool
) -> None:
    """The target of a faulted update or delete is in its old or (if acknowledged)
    new state, never damaged, and get_latest agrees with list."""
    try:
        now = await store.load(target.id)
    except CheckpointNotFound:
        assert op == "delete", f"{target.id} vanished after a failed {op}"
        return
    if acked:
        assert op != "delete", f"acknowledged delete of {target.id} did not happen"
        assert now.etag != target.etag, f"acknowledged update of {target.id} is missing"
    else:
        assert now.etag == target.etag or op == "update", f"{target.id} changed unexpectedly"
    latest = await store.get_latest(target.stream)
    page = await store.list(target.stream, limit=1)
    assert latest is not None and page.items and latest.id == page.items[0].id


def test_io_errors_never_acknowledge_and_leave_the_store_intact(
    tmp_path: Path, long_run: bool
) -> None:
    root = tmp_path / "store"
    log_path = tmp_path / "faults.log"
    io = FaultyIO()
    rng = random.Random(5)
    problems: list[str] = []
    injected = 0

    async def run() -> None:
        nonlocal injected
        writer = LogWriter(log_path)
        counter = iter(range(1, 1_000_000))
        async with _store(root, io) as store:
            logged = LoggedStore(store, writer)
            for i in range(5):
                await logged.save("base", {"i": i}, id=f"base{i}")
            # a dry run counts the calls each kind of operation makes
            counts: dict[str, dict[str, int]] = {}
            for op in OPS:
                n = next(counter)
                target = await _prepare(op, logged, n)
                io.arm(FAULTABLE, 0, None, persistent=False)
                await _do(op, logged, n, target)
                counts[op] = dict(io.counts)
                io.disarm()
            scenarios = [
                (op, call, k, err, persistent)
                for op in OPS
                for call, total in sorted(counts[op].items())
                for k in range(1, total + 1)
                for err in ERRORS
                if err is not None or call in ("write", "pwrite")
                for persistent in (False, True)
                if not (persistent and err is None)
            ]
            if not long_run:
                scenarios = rng.sample(scenarios, min(len(scenarios), 80))
            for done, (op, call, k, err, persistent) in enumerate(scenarios):
                what = f"{op} with {call} #{k} -> {errno.errorcode.get(err or 0, 'short')}"
                what += " (persistent)" if persistent else ""
                n = next(counter)
                target = await _prepare(op, logged, n)
                io.arm({call}, k, err, persistent=persistent)
                acked = False
                try:
                    await _do(op, logged, n, target)
                    acked = True
                except StatekeeperError:
                    pass
                except Exception as exc:
                    problems.append(f"{what}: untyped {type(exc).__name__}: {exc}")
                fired = list(io.fired)
                injected += len(fired)
                if fired and err is not None and acked:
                    problems.append(f"{what}: acknowledged although {fired[0]} failed")
                if persistent and fired:
                    try:
                        await logged.save("faults", {"n": n, "again": 1}, id=f"g{n}")
                        if len(io.fired) > len(fired):
                            problems.append(f"{what}: a second save acknowledged under the fault")
                    except StatekeeperError:
                        pass
                io.disarm()
                leftovers = _temp_files(root)
                if leftovers:
                    problems.append(f"{what}: temp files left behind: {leftovers}")
                # the full check costs O(store), so it runs every few scenarios (every
                # one with --long); the checkpoint under fault is looked at every time
                try:
                    if done % 8 == 7 or long_run:
                        await check_invariants(store, WriteLog.read(log_path), probe_stream=None)
                    elif target is not None:
                        await _still_consistent(store, target, op, acked)
                except AssertionError as exc:
                    problems.append(f"{what}: {exc}")
                try:
                    await logged.save("after", {"n": n}, id=f"a{n}")
                except StatekeeperError as exc:
                    problems.append(f"{what}: the store is unusable after the fault: {exc!r}")
                if len(problems) > 10:
                    break
        writer.close()
        # and everything is still there for a fresh process
        async with _store(root, RebootedIO("same-machine-new-process")) as store:
            await check_invariants(store, WriteLog.read(log_path))

    asyncio.run(run())
    FIGURES["I/O errors: faults injected (file)"] += injected
    assert not problems, "\n".join(problems)
    assert injected > 0
