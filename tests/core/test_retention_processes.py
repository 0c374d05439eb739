"""Retention sweeps (SPEC S17) across real processes, on the file store and SQLite:
several processes sweep one store at once while another saves into it, and the file
store gives its empty bucket directories back.

What must hold: no sweep fails; the reports' counts add up to exactly the
checkpoints that went (none counted twice); every save a writer had acknowledged is
still there; and in every stream what is left of the original checkpoints is its
newest ones (a stream never loses its newest while older ones stay)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import statekeeper as sk

URLS = {
    "file": lambda d: f"file://{d / 'store'}",
    "sqlite": lambda d: f"sqlite:///{d / 'store.db'}",
}

SWEEPER = """
import asyncio, json, sys
import statekeeper as sk

async def main(url, options):
    async with sk.open_store(url, **json.loads(options)) as store:
        print("ready", flush=True)
        sys.stdin.readline()  # all start together
        report = await store.sweep(policy=sk.Retention(keep_last=10, idle=3600))
        print(json.dumps(report.model_dump(mode="json")), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

WRITER = """
import asyncio, json, sys
import statekeeper as sk

async def main(url, options):
    async with sk.open_store(url, **json.loads(options)) as store:
        print("ready", flush=True)
        sys.stdin.readline()  # all start together
        for i in range(40):
            cp = await store.save(f"old-{i % 10}", {"fresh": i})
            print(json.dumps(cp.id), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


READER = """
import asyncio, json, sys
import statekeeper as sk

async def main(url, options):
    async with sk.open_store(url, **json.loads(options)) as store:
        print("ready", flush=True)
        sys.stdin.readline()  # all start together
        seen = []
        for _ in range(60):
            for i in range(10):
                latest = await store.get_latest(f"old-{i}")
                seen.append([f"old-{i}", None if latest is None else latest.id])
        print(json.dumps(seen), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

#: How long a process waits for another's write lock.
WAIT = {"file": {"lock_timeout": 60}, "sqlite": {"busy_timeout": 60}}


def _spawn(script: str, url: str, backend: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, url, json.dumps(WAIT[backend])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def _build(url: str) -> dict[str, list[str]]:
    """Ten idle streams of 50 saved two hours ago, ten live ones of 50 saved now;
    their ids, oldest first."""
    old = datetime.now(UTC) - timedelta(hours=2)
    made: dict[str, list[str]] = {}
    async with sk.open_store(url, durability="fast", clock=lambda: old) as store:
        saved = await store.save_many(
            [sk.NewCheckpoint(stream=f"old-{n % 10}", state=n) for n in range(500)]
        )
    async with sk.open_store(url, durability="fast") as store:
        saved += await store.save_many(
            [sk.NewCheckpoint(stream=f"live-{n % 10}", state=n) for n in range(500)]
        )
    for cp in saved:
        made.setdefault(cp.stream, []).append(cp.id)
    return made


@pytest.mark.parametrize("backend", sorted(URLS))
def test_processes_sweep_one_store_at_once_while_another_saves(
    backend: str, tmp_path: Path
) -> None:
    url = URLS[backend](tmp_path)
    made = asyncio.run(_build(url))
    procs = [_spawn(WRITER, url, backend), _spawn(READER, url, backend)]
    procs += [_spawn(SWEEPER, url, backend) for _ in range(3)]

    async def sweep_here() -> sk.SweepReport:
        async with sk.open_store(url, **WAIT[backend]) as store:
            return await store.sweep(policy=sk.Retention(keep_last=10, idle=3600))

    for proc in procs:  # every process has its store open: start them at once
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    reports = [asyncio.run(sweep_here()).model_dump(mode="json")]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outputs.append(out)
    written = [json.loads(line) for line in outputs[0].splitlines()]
    seen = json.loads(outputs[1])
    reports += [json.loads(out) for out in outputs[2:]]
    assert len(written) == 40

    async def check() -> dict[str, Any]:
        async with sk.open_store(url) as store:
            live = {
                s: [cp.id for cp in (await store.list(s, order="asc", limit=1000)).items]
                for s in await store.list_streams()
            }
            assert (await store.verify()).ok
        return live

    live = asyncio.run(check())
    everything = {cid for ids in live.values() for cid in ids}
    assert set(written) <= everything, "a sweep removed a save acknowledged meanwhile"
    # while the sweeps ran, get_latest of an idle stream was its newest original, a
    # newer save of the writer, or None: never an older original
    for stream, got in seen:
        assert got is None or got == made[stream][-1] or got in written, (
            f"get_latest({stream!r}) returned an older checkpoint during a sweep"
        )
    gone = sum(len([c for c in ids if c not in everything]) for ids in made.values())
    assert sum(r["checkpoints_removed"] for r in reports) == gone
    for stream, ids in made.items():
        left = [cid for cid in ids if cid in everything]
        assert left == ids[len(ids) - len(left) :], f"{stream} kept older ones, not its newest"
        if stream.startswith("live"):
            assert len(left) == 10  # keep_last: its newest ten, never fewer


def test_a_sweep_removes_the_file_stores_empty_buckets(tmp_path: Path) -> None:
    url = URLS["file"](tmp_path)

    async def run() -> tuple[int, sk.SweepReport, int, bool]:
        async with sk.open_store(url, durability="fast") as store:
            for start in range(0, 4000, 1000):
                await store.save_many(
                    [
                        sk.NewCheckpoint(stream=f"s{n % 4}", state=n)
                        for n in range(start, start + 1000)
                    ]
                )
        buckets = len(os.listdir(tmp_path / "store" / "records"))
        async with sk.open_store(url) as store:
            report = await store.sweep(policy=sk.Retention(keep_last=1))
            latest = await store.get_latest("s3")
            assert latest is not None and latest.state == 3999
            await store.save("s0", "after")  # the high-water bucket is still usable
            ok = (await store.verify()).ok
        return buckets, report, len(os.listdir(tmp_path / "store" / "records")), ok

    before, report, after, ok = asyncio.run(run())
    assert report.checkpoints_removed == 4000 - 4
    assert (before, after, ok) == (5, 2, True)  # sequences 1-4000: buckets 0-2 went
