"""The file backend across real processes: writers killed with SIGKILL at random
points, and four processes saving to one stream at once."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.models import Checkpoint

pytestmark = pytest.mark.reliability

# A writer that prints one JSON line per acknowledged operation, flushed before the
# next one starts: a printed line is a promise the store must keep.
WRITER = """
import asyncio, json, sys
from statekeeper.backends.file import FileCheckpointStore

async def main(path, durability, start):
    async with FileCheckpointStore(path, durability=durability) as store:
        i, last = start, None
        while True:
            if last is not None and i % 5 == 0:
                print(json.dumps(["try-update", last, None, i]), flush=True)
                await store.update(last, {"i": i, "updated": True})
                print(json.dumps(["update", last, None, i]), flush=True)
            else:
                cp = await store.save("job", {"i": i})
                last = cp.id
                print(json.dumps(["save", cp.id, cp.sequence, i]), flush=True)
            i += 1

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""

WORKER = """
import asyncio, json, sys
from statekeeper.backends.file import FileCheckpointStore

async def main(path, proc, count):
    # fast: this is about the lock and the sequence, not about fsync
    async with FileCheckpointStore(path, lock_timeout=60, durability="fast") as store:
        for i in range(count):
            # Mostly one stream, sometimes others: a writer must notice that another
            # process appended to a stream it has not touched for a while.
            stream = "shared" if i % 4 else f"side-{(i // 4) % 3}"
            cp = await store.save(stream, {"p": proc, "i": i})
            print(json.dumps([cp.id, cp.sequence, i, stream]), flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_after_some_acks(root: Path, durability: str, start: int, rng: random.Random) -> list[Any]:
    proc = _spawn(WRITER, str(root), durability, str(start))
    assert proc.stdout is not None
    wanted = rng.randrange(1, 40)
    acks: list[Any] = []
    deadline = time.monotonic() + 60
    while len(acks) < wanted and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acks.append(json.loads(line))
    time.sleep(rng.uniform(0, 0.01))  # land the kill anywhere in the next operation
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # Through the same buffered reader as readline(): lines it has read ahead are in
    # its buffer, not in the pipe (communicate() would read the pipe and miss them).
    out = proc.stdout.read()
    err = proc.stderr.read() if proc.stderr is not None else ""
    proc.stdout.close()
    if proc.stderr is not None:
        proc.stderr.close()
    acks += [json.loads(line) for line in out.splitlines() if line.endswith("]")]
    assert acks, f"the writer acknowledged nothing: {err[-2000:]}"
    return acks


@pytest.mark.asyncio
async def test_writers_killed_at_random_points_lose_no_acknowledged_save(tmp_path: Path) -> None:
    rng = random.Random(1234)
    root = tmp_path / "store"
    expected: dict[str, int] = {}  # id -> the last acknowledged "i" of its state
    doubt: dict[str, set[int]] = {}  # id -> updates begun but never acknowledged
    order: list[str] = []  # acknowledged saves in acknowledgement order
    sequences: dict[str, int] = {}
    start = 0
    for round_ in range(8):
        acks = await asyncio.to_thread(
            _kill_after_some_acks, root, ("fast", "full")[round_ % 2], start, rng
        )
        for kind, cid, seq, i in acks:
            if kind == "try-update":
                doubt.setdefault(cid, set()).add(i)
                continue
            expected[cid] = i
            doubt.pop(cid, None)
            if kind == "save":
                order.append(cid)
                sequences[cid] = seq
            start = i + 1
        start += 1  # the killed operation may have used the next number
        async with FileCheckpointStore(root) as store:
            for cid, i in expected.items():
                got = await store.load(cid)
                allowed = {i, *doubt.get(cid, ())}
                assert got.state["i"] in allowed, f"round {round_}: {cid} lost its update"
            latest = await store.get_latest("job")
            assert latest is not None
            assert latest.id == order[-1] or latest.sequence > sequences[order[-1]]
            page = await store.list(None, limit=1000, order="asc")
            assert page.skipped == []
            listed = [cp.id for cp in page.items]
            assert [c for c in listed if c in sequences] == order, "sequence order != ack order"
    seqs = [sequences[c] for c in order]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.mark.asyncio
async def test_four_processes_share_one_stream(tmp_path: Path) -> None:
    root = tmp_path / "store"
    async with FileCheckpointStore(root):
        pass  # created once, so the workers race on saves, not on creation
    count = 200
    procs = [_spawn(WORKER, str(root), str(p), str(count)) for p in range(4)]
    results = await asyncio.to_thread(lambda: [p.communicate(timeout=240) for p in procs])
    acks: list[tuple[str, int, int, int, str]] = []
    for p, (proc, (out, err)) in enumerate(zip(procs, results, strict=True)):
        assert proc.returncode == 0, err[-2000:]
        mine = [json.loads(line) for line in out.splitlines()]
        assert len(mine) == count
        seqs = [seq for _, seq, _, _ in mine]
        assert seqs == sorted(seqs), f"process {p}: its own saves are out of order"
        acks += [(cid, seq, p, i, stream) for cid, seq, i, stream in mine]
    assert len({a[1] for a in acks}) == 4 * count, "a sequence was given twice"
    acks.sort(key=lambda a: a[1])
    async with FileCheckpointStore(root) as store:
        for stream in sorted({a[4] for a in acks}):
            expected = [a for a in acks if a[4] == stream]
            listed: list[Checkpoint] = []
            cursor = None
            while True:
                page = await store.list(stream, order="asc", limit=300, after=cursor)
                assert page.skipped == []
                listed += page.items
                if not page.has_more:
                    break
                cursor = page.next_cursor
            assert [(cp.id, cp.sequence) for cp in listed] == [(a[0], a[1]) for a in expected]
            assert [cp.state for cp in listed] == [{"p": a[2], "i": a[3]} for a in expected]
            latest = await store.get_latest(stream)
            assert latest is not None and latest.id == expected[-1][0]
        everything = await store.list(None, order="asc", limit=1000)
        assert [cp.id for cp in everything.items] == [a[0] for a in acks]
        info = await store.info()
        assert info.checkpoints == 4 * count and info.high_water_mark == acks[-1][1]
    assert not [n for n in os.listdir(root / "records") if n.endswith(".tmp")]
