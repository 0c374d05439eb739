"""SPEC S15 on SQLite: a group commit acknowledges nothing before its fsync.

A forked child runs several tasks that save concurrently, each to its own stream,
so the writer thread runs their saves in shared transactions (group commit), and
reports each save once it returned. As in ``test_batch_crash_sqlite.py``, it runs
under ``strace -e inject=<syscall>:signal=KILL:when=K`` and is killed as it enters
the K-th ``fdatasync`` (the crash between a group's WAL writes and their sync) or
another file-changing call (the crash points of ``harness.py``).

A SIGKILL alone keeps the page cache, so SQLite would find even the unsynced WAL
frames. Here the power cut is modelled on top (:func:`power_cut`): strace also
records every ``pwrite64`` to the WAL and every completed ``fdatasync`` of it, and
the WAL is cut back to what was synced (and, in a second variant, to a seeded torn
prefix of what was not), the shared-memory index is dropped, and the store is
reopened as after a reboot. Then:

- every acknowledged save is there, with its state, tags and metadata: a save
  returned only after the fsync of the COMMIT that made it durable;
- each task's saves that are there are a prefix of what it saved, in sequence
  order, and ``verify()`` finds nothing wrong;
- the store still works, and the next save goes above everything.

A control run with ``durability="fast"`` (no fsync at COMMIT) loses acknowledged
saves under the same model, so the model can tell.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import STRACE, child_exit, crash_points, most_per_name, strace_attached
from reliability_support import FIGURES

import statekeeper as sk

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.skipif(STRACE is None, reason="strace is not installed (.ci/run installs it)"),
]

SEED = 15
BUDGET = 16  # crash points besides every fdatasync in a normal run (--long: all of them)
TASKS = 8
SAVES = 4
_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\((.*))")
_FD_PATH = re.compile(r"^\d+<([^>]*)>")
_RETURN = re.compile(r"\)\s+=\s+(\S+)")  # strace pads "= N" with spaces
_PWRITE_ARGS = re.compile(r", (\d+), (\d+)(?:\)| <unfinished)")


def _id(task: int, j: int) -> str:
    return f"t{task}-{j}"


def _saved(task: int, j: int) -> tuple[object, dict[str, str], dict[str, int]]:
    return {"task": task, "j": j, "pad": "x" * (300 * j)}, {"task": str(task)}, {"j": j}


def _child(url: str, acks: int, stats: int, close: bool) -> None:  # pragma: no cover
    async def task(store: sk.CheckpointStore, i: int) -> None:
        for j in range(SAVES):
            state, tags, metadata = _saved(i, j)
            await store.save(f"s{i}", state, id=_id(i, j), tags=tags, metadata=metadata)
            os.write(acks, b"%d %d\n" % (i, j))

    async def job() -> None:
        async with sk.open_store(url) as store:
            await asyncio.gather(*(task(store, i) for i in range(TASKS)))
            writer = store._runtime._writer  # type: ignore[attr-defined]
            os.write(stats, b"%d %d\n" % (writer.commits, writer.operations))
            if not close:  # the power goes before the store is closed (and checkpointed)
                os._exit(0)

    child_exit(job)


@dataclass
class Run:
    code: int
    acked: set[tuple[int, int]]
    calls: Counter[str]  # the most calls of each mutating syscall one thread made
    wal_written: int = 0  # bytes of the WAL file written (as far as the page cache knows)
    wal_synced: int = 0  # ... of which a completed fdatasync made durable
    wal_headers: int = 0  # writes of the WAL header: more than one means the WAL was reset
    stats: tuple[int, int] = (0, 0)  # the writer's commits and operations (clean runs)


def _result(rest: str) -> int | None:
    """The return value at the end of a strace line (None: killed on entry, or ``?``)."""
    found = _RETURN.findall(rest)
    return int(found[-1]) if found and found[-1].lstrip("-").isdigit() else None


def _read_trace(trace: Path, db: str, run: Run) -> None:
    """The per-thread call counts, and the WAL's written and synced lengths."""
    wal = db + "-wal"
    per_thread: Counter[tuple[str, str]] = Counter()
    # pid -> an unfinished call: its name, its arguments, the WAL length when it began
    open_calls: dict[str, tuple[str, str, int]] = {}
    for text in trace.read_text(errors="replace").splitlines():
        m = _LINE.match(text)
        if m is None:
            continue
        pid = m[1]
        if m[2] is not None:  # "<... name resumed> rest"
            name, args, began = open_calls.pop(pid, (m[2], "", run.wal_written))
            rest = text[m.end() :]
        else:
            name, args, began = m[3], m[4], run.wal_written
            per_thread[(pid, name)] += 1
            if "<unfinished ...>" in args:
                open_calls[pid] = (name, args, began)
                continue
            rest = args
        done = _result(rest)
        path = _FD_PATH.match(args)
        if done is None or done < 0 or path is None:
            continue  # killed on entry, failed, or not a file: it changed nothing we model
        if name == "pwrite64" and (where := _PWRITE_ARGS.findall(args)):
            end = int(where[-1][1]) + done
            if path[1] == wal:
                run.wal_written = max(run.wal_written, end)
                run.wal_headers += where[-1][1] == "0"
        elif name in ("fdatasync", "fsync") and path[1] == wal:
            # a sync covers what was written before it began
            run.wal_synced = max(run.wal_synced, began)
    run.calls = most_per_name(per_thread)


def run_traced(
    url: str, db: str, workdir: Path, inject: tuple[str, int] | None, *, close: bool = True
) -> Run:
    """Run the child under strace (``-y``: file descriptors with their paths)."""
    assert STRACE is not None
    # What the WAL holds before the child starts was synced by the save that wrote it
    # (the closing store does not always checkpoint it away), so no cut goes below it.
    wal = Path(db + "-wal")
    before = wal.stat().st_size if wal.exists() else 0
    ack_read, ack_write = os.pipe()
    stats_read, stats_write = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns about forking with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(ack_read)
        os.close(stats_read)
        _child(url, ack_write, stats_write, close)
    os.close(ack_write)
    os.close(stats_write)
    os.waitpid(pid, os.WUNTRACED)
    trace = workdir / "trace.txt"
    with strace_attached(pid, trace, inject, options=["-y"]):
        with os.fdopen(ack_read, "rb") as pipe:
            acked = {(int(a), int(b)) for a, b in (x.split() for x in pipe.read().splitlines())}
        with os.fdopen(stats_read, "rb") as pipe:
            stats = pipe.read().split()
        _, status = os.waitpid(pid, 0)
    run = Run(os.waitstatus_to_exitcode(status), acked, Counter(), before, before)
    if stats:
        run.stats = (int(stats[0]), int(stats[1]))
    _read_trace(trace, db, run)
    return run


def power_cut(db: str, run: Run, keep: float) -> None:
    """Make the files what a reboot after a power cut could find: the WAL as far as
    it was synced plus the first ``keep`` of the unsynced rest (a torn tail), and no
    shared-memory index (SQLite rebuilds it from the WAL).

    Exact while the WAL only grew by appends, that is until SQLite resets it after
    a checkpoint (rewriting its header); the test checks that. A checkpoint itself
    only copies synced frames into the main file, so cutting it short loses nothing.
    """
    assert run.wal_headers <= 1, "the WAL was reset during the run; make the workload smaller"
    wal = Path(db + "-wal")
    if wal.exists():
        tail = run.wal_written - run.wal_synced
        size = run.wal_synced + int(tail * keep)
        with wal.open("r+b") as f:
            f.truncate(min(size, wal.stat().st_size))
    Path(db + "-shm").unlink(missing_ok=True)


async def _prepare(url: str) -> int:
    async with sk.open_store(url) as store:
        return (await store.save("before", {"before": True}, id="before")).sequence


async def _check(url: str, floor: int, acked: set[tuple[int, int]]) -> int:
    """The invariants after the power cut; returns how many saves are there."""
    present = 0
    async with sk.open_store(url) as store:
        assert (await store.load("before")).sequence == floor
        top = floor
        for i in range(TASKS):
            got = await store.load_many([_id(i, j) for j in range(SAVES)])
            there = sorted(int(cid.split("-")[1]) for cid in got)
            assert there == list(range(len(there))), f"task {i}: not a prefix: {there}"
            lost = {j for (t, j) in acked if t == i} - set(there)
            assert not lost, f"task {i}: saves {sorted(lost)} were acknowledged, then lost"
            page = await store.list(f"s{i}", limit=100, order="asc")
            assert [cp.id for cp in page.items] == [_id(i, j) for j in there]
            for j, cp in zip(there, page.items, strict=True):
                state, tags, metadata = _saved(i, j)
                assert (cp.state, cp.tags, cp.metadata) == (state, tags, metadata)
                assert cp.sequence > floor
                top = max(top, cp.sequence)
            present += len(there)
        everything = await store.list(None, limit=1000)
        assert len(everything.items) == present + 1 and everything.skipped == []
        seqs = [cp.sequence for cp in everything.items]
        assert len(set(seqs)) == len(seqs)
        report = await store.verify()
        assert report.ok, report.problems
        assert (await store.save("after", {"after": True})).sequence > top
    return present


def _fresh(tmp_path: Path, n: int, **options: str) -> tuple[str, str, int]:
    db = str(tmp_path / f"store{n}.db")
    query = "".join(f"&{k}={v}" for k, v in options.items()).replace("&", "?", 1)
    url = f"sqlite:///{db}{query}"
    return url, db, asyncio.run(_prepare(url))


def test_a_group_cut_before_its_fsync_acknowledged_nothing(tmp_path: Path, long_run: bool) -> None:
    url, db, floor = _fresh(tmp_path, 0)
    baseline = run_traced(url, db, tmp_path, None)
    assert baseline.code == 0 and len(baseline.acked) == TASKS * SAVES, baseline
    commits, operations = baseline.stats
    # saves shared commits, so the cuts below land inside groups of several saves
    assert operations == TASKS * SAVES and commits < operations, baseline.stats
    power_cut(db, baseline, keep=0.0)  # everything was acknowledged after its fsync
    assert asyncio.run(_check(url, floor, baseline.acked)) == TASKS * SAVES
    # every fdatasync (the cut between a group's writes and its sync), and a sample
    # of the other file-changing calls
    syncs = [("fdatasync", k) for k in range(1, baseline.calls["fdatasync"] + 1)]
    others = Counter({k: v for k, v in baseline.calls.items() if k != "fdatasync"})
    points = syncs + crash_points(others, budget=None if long_run else BUDGET, seed=SEED)
    rng = random.Random(SEED)
    kills, outcomes = 0, Counter[int]()
    for n, (name, k) in enumerate(points, start=1):
        for keep in (0.0, rng.random()):
            url, db, floor = _fresh(tmp_path, n * 2 + (keep > 0))
            run = run_traced(url, db, tmp_path, (name, k))
            kills += run.code == -signal.SIGKILL
            power_cut(db, run, keep)
            try:
                present = asyncio.run(_check(url, floor, run.acked))
            except AssertionError as exc:
                raise AssertionError(
                    f"after a power cut at {name} #{k} ({keep=:.2f}): {exc}"
                ) from exc
            outcomes[present] += 1
    FIGURES["crash points: killed and checked (sqlite group commit)"] += kills
    FIGURES["crash points: SIGKILLs survived (all backends)"] += kills
    # two runs per point; a late point may not be reached when a run's groups are bigger
    assert kills >= len(points), (kills, points)
    assert len(outcomes) >= 3, outcomes  # the cuts land between groups, not only at the ends


def test_the_power_cut_model_catches_acknowledgement_before_fsync(tmp_path: Path) -> None:
    """``durability="fast"`` (``synchronous=NORMAL``) acknowledges before any fsync: the
    same check must find acknowledged saves lost, or the model proves nothing."""
    url, db, floor = _fresh(tmp_path, 0, durability="fast")
    # "fast" syncs only the new WAL's header, until the checkpoint when the store
    # closes: the power goes before that
    run = run_traced(url, db, tmp_path, None, close=False)
    assert run.code == 0 and len(run.acked) == TASKS * SAVES, run
    assert run.wal_synced < run.wal_written, run
    power_cut(db, run, keep=0.0)
    with pytest.raises(AssertionError, match="acknowledged, then lost"):
        asyncio.run(_check(url, floor, run.acked))
    FIGURES["mutants caught"] += 1
