"""SPEC S13 on SQLite: ``save_many`` is all or nothing when the process dies mid-batch.

A forked child saves three batches with ``save_many`` (five checkpoints each, over
two streams, with tags and metadata) and reports each batch once it returned. It
runs under ``strace -e inject=<syscall>:signal=KILL:when=K``, so it is killed as it
enters the K-th file-changing system call (the crash points of ``harness.py``,
sampled the same way; ``--long`` takes every one). After each kill the store is
reopened as a restarted application would, and:

- every batch is wholly there or wholly absent, and every reported batch is there;
- a batch that is there has consecutive sequences in the order given, above the
  checkpoint saved before it, and its states, tags and metadata as saved;
- tag and metadata filters find exactly the batches that are there (their index
  rows committed with them), and ``verify()`` finds nothing wrong.

The child is this file's own workload (the shared ``crashpoint`` workload has no
batches); the tracing follows ``harness.run_traced``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import warnings
from collections import Counter
from pathlib import Path

import pytest
from harness import STRACE, child_exit, count_calls, crash_points, strace_attached
from reliability_support import FIGURES

import statekeeper as sk

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.skipif(STRACE is None, reason="strace is not installed (.ci/run installs it)"),
]

SEED = 13
BUDGET = 20  # crash points in a normal run (--long: all of them)
BATCHES = 3
SIZE = 5


def _items(batch: int) -> list[sk.NewCheckpoint]:
    return [
        sk.NewCheckpoint(
            stream=f"s{i % 2}",
            state={"batch": batch, "i": i, "pad": "x" * (500 * i)},
            id=f"b{batch}-{i}",
            tags={"batch": str(batch)},
            metadata={"batch": batch, "i": i},
        )
        for i in range(SIZE)
    ]


def _child(url: str, acks: int) -> None:  # pragma: no cover - runs in the child
    async def job() -> None:
        async with sk.open_store(url) as store:
            for batch in range(BATCHES):
                await store.save_many(_items(batch))
                os.write(acks, b"%d\n" % batch)

    child_exit(job)


def _run_traced(
    url: str, workdir: Path, inject: tuple[str, int] | None
) -> tuple[int, set[int], Counter[str]]:
    """Run the child under strace; its exit code, the batches it reported, and (without
    ``inject``) the most calls of each mutating syscall that one thread made."""
    assert STRACE is not None
    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns about forking with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read)
        _child(url, write)
    os.close(write)
    os.waitpid(pid, os.WUNTRACED)
    trace = workdir / "trace.txt"
    with strace_attached(pid, trace, inject):
        with os.fdopen(read, "rb") as pipe:
            acked = {int(x) for x in pipe.read().split()}
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), acked, count_calls(trace)


async def _prepare(url: str) -> int:
    async with sk.open_store(url) as store:
        return (await store.save("s0", {"before": True}, id="before")).sequence


async def _check(url: str, floor: int, acked: set[int]) -> set[int]:
    """The invariants after a crash; returns the batches that are there."""
    present: set[int] = set()
    async with sk.open_store(url) as store:
        assert (await store.load("before")).sequence == floor
        last = floor
        for batch in range(BATCHES):
            items = _items(batch)
            got = await store.load_many([item.id for item in items if item.id])
            assert len(got) in (0, SIZE), f"batch {batch} is half there: {sorted(got)}"
            by_tag = await store.list(None, tags={"batch": str(batch)}, limit=100, order="asc")
            by_meta = await store.list(None, metadata={"batch": batch}, limit=100, order="asc")
            if not got:
                assert batch not in acked, f"batch {batch} was acknowledged, then lost"
                assert by_tag.items == by_meta.items == []
                continue
            present.add(batch)
            seqs = [got[item.id].sequence for item in items if item.id]
            assert seqs == list(range(seqs[0], seqs[0] + SIZE)), seqs
            assert seqs[0] > last, (seqs, last)
            last = seqs[-1]
            for item in items:
                cp = got[item.id or ""]
                assert (cp.stream, cp.state, cp.tags, cp.metadata) == (
                    item.stream,
                    item.state,
                    item.tags,
                    item.metadata,
                )
            assert [c.sequence for c in by_tag.items] == seqs
            assert [c.sequence for c in by_meta.items] == seqs
        page = await store.list(None, limit=100)
        assert len(page.items) == 1 + SIZE * len(present) and page.skipped == []
        report = await store.verify()
        assert report.ok, report.problems
        # the store still works: the next batch goes above everything
        cps = await store.save_many([sk.NewCheckpoint(stream="s0", state="after")])
        assert cps[0].sequence > last
    return present


def test_save_many_is_all_or_nothing_at_every_crash_point_sqlite(
    tmp_path: Path, long_run: bool
) -> None:
    def fresh(n: int) -> tuple[str, int]:
        url = f"sqlite:///{tmp_path / f'store{n}.db'}"
        return url, asyncio.run(_prepare(url))

    url, floor = fresh(0)
    code, acked, calls = _run_traced(url, tmp_path, None)
    assert code == 0 and acked == set(range(BATCHES)), (code, acked)
    assert asyncio.run(_check(url, floor, acked)) == set(range(BATCHES))
    points = crash_points(calls, budget=None if long_run else BUDGET, seed=SEED)
    kills = 0
    outcomes: Counter[int] = Counter()
    for n, (name, k) in enumerate(points, start=1):
        url, floor = fresh(n)
        code, acked, _ = _run_traced(url, tmp_path, (name, k))
        kills += code == -signal.SIGKILL
        try:
            present = asyncio.run(_check(url, floor, acked))
        except AssertionError as exc:
            raise AssertionError(f"after SIGKILL at {name} #{k}: {exc}") from exc
        outcomes[len(present)] += 1
    FIGURES["crash points: killed and checked (sqlite save_many)"] += kills
    FIGURES["crash points: SIGKILLs survived (all backends)"] += kills
    assert kills >= len(points) // 2, (kills, points)
    # the sample must land inside batches, not only before or after them all
    assert len(outcomes) >= 2, outcomes
