"""Concurrency on one Redis store: writer processes, compare-and-set races, histories.

S10: sequences are unique and in commit order (a reader that sees sequence n sees
every committed sequence below it), no acknowledged save is lost, and
``update(if_match=...)`` is a true compare-and-set, across processes. S13:
``save_many`` is one script, so its items take consecutive sequences that no
concurrent save interleaves, and no reader sees part of it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from statekeeper_redis import RedisCheckpointStore

from statekeeper import Checkpoint, NewCheckpoint
from statekeeper.errors import PreconditionFailed
from statekeeper.testing.history import History, check_history
from statekeeper.testing.invariants import WriteLog, check_invariants
from statekeeper.testing.workloads import COUNTER_ID, COUNTER_STREAM

WORKER = str(Path(__file__).with_name("redis_worker.py"))
WRITERS = 4
#: Rounds for redis_worker that no test reaches: it runs until told to stop (or until
#: its stdin closes, if the test dies).
_UNTIL_STOPPED = 10**7
#: Rounds of actors the history test runs at most (one is enough on an idle machine).
_HISTORY_ROUNDS = 10

Maker = Callable[..., RedisCheckpointStore]


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if line.strip() != b"ready":
        _, err = await proc.communicate()
        raise AssertionError(f"worker {args} did not start: {line!r} {err.decode()[-2000:]}")
    return proc


async def _start(procs: list[asyncio.subprocess.Process], line: bytes = b"go\n") -> None:
    """Send each worker a line: the first starts it, a second stops redis_worker early."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(line)
        await proc.stdin.drain()


async def _result(proc: asyncio.subprocess.Process) -> Any:
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])


def _acked(log: Path) -> int:
    """The writes acknowledged in the write log so far (a torn last line is skipped)."""
    return sum(1 for op in WriteLog.read(log).ops if op.acked)


async def _until(done: Callable[[], bool], what: str) -> None:
    """Poll ``done`` until it holds; fail after 120 s (a hang, not slowness)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while not done():
        assert loop.time() < deadline, f"{what} within 120 s"
        await asyncio.sleep(0.02)


async def _workers(url: str, prefix: str, count: int) -> list[asyncio.subprocess.Process]:
    return list(
        await asyncio.gather(
            *(_spawn(WORKER, url, prefix, f"w{i}", str(count)) for i in range(WRITERS))
        )
    )


@pytest.mark.asyncio
async def test_writer_processes_commit_in_sequence_order_and_lose_no_cas_update(
    make_store: Maker, redis_url: str, key_prefix: str
) -> None:
    """4 processes, each alternating a save to one shared stream and a compare-and-set
    increment of one shared counter (one set of processes for both checks, because
    starting a process is the slow part).

    The workers run until told to stop, and they are told once the counter says that
    an increment lost a race and every worker has made ``rounds`` saves: so the race
    is real and the history long however the machine schedules the processes."""
    rounds = 50
    async with make_store() as reader:
        await reader.save("counters", {"n": 0}, id="counter")
        procs = await _workers(redis_url, key_prefix, _UNTIL_STOPPED)
        await _start(procs)
        snapshots = 0
        stopped = False
        # While the writers run, every page must show a gap-free run of sequences
        # (the counter holds sequence 1, the saves start at 2; nothing is deleted):
        # seeing n without some committed m < n would mean sequence order differs
        # from commit order.
        while any(proc.returncode is None for proc in procs):
            page = await reader.list("shared", order="asc", limit=1000, include_state=False)
            seqs = [cp.sequence for cp in page.items]
            assert seqs == list(range(2, len(seqs) + 2)), f"gap in {seqs}"
            snapshots += 1
            saves = {f"w{i}": 0 for i in range(WRITERS)}
            for cp in page.items:
                saves[cp.tags["by"]] += 1  # redis_worker tags each save with its name
            raced = (await reader.load("counter")).state.get("raced", False)
            if not stopped and raced and min(saves.values()) >= rounds:
                await _start(procs, b"stop\n")
                stopped = True
            await asyncio.sleep(0.02)
        results = [await _result(proc) for proc in procs]
        assert stopped, "the workers stopped before they were told to"
        all_seqs = [seq for result in results for seq in result["seqs"]]
        total = len(all_seqs)
        assert total >= WRITERS * rounds
        assert sorted(all_seqs) == list(range(2, total + 2)), "sequences not unique and dense"
        for result in results:
            assert result["seqs"] == sorted(result["seqs"]), "one writer's saves out of order"
        listed: list[Checkpoint] = []
        page = await reader.list("shared", order="asc", limit=1000)
        listed += page.items
        while page.next_cursor is not None:
            page = await reader.list("shared", order="asc", limit=1000, after=page.next_cursor)
            listed += page.items
        assert [cp.sequence for cp in listed] == list(range(2, total + 2))
        by_writer: dict[str, list[int]] = {}
        for cp in listed:
            by_writer.setdefault(cp.state["by"], []).append(cp.state["i"])
        made = {f"w{i}": len(result["seqs"]) for i, result in enumerate(results)}
        assert by_writer == {name: list(range(n)) for name, n in made.items()}
        latest = await reader.get_latest("shared")
        assert latest is not None and latest.sequence == total + 1
        # compare-and-set: every increment counted once, none lost, and the race was real
        counter = await reader.load("counter")
        assert counter.state["n"] == total
        assert counter.sequence == 1
        assert snapshots > 0
    assert sum(result["conflicts"] for result in results) > 0, "the increments never raced"


@pytest.mark.asyncio
async def test_compare_and_set_has_one_winner_per_round(make_store: Maker) -> None:
    racers, rounds = 8, 15
    stores = [make_store() for _ in range(4)]
    for store in stores:
        await store.open()
    try:
        cp = await stores[0].save("cas", {"round": 0}, id="contended")
        for r in range(1, rounds + 1):
            etag = cp.etag
            gate = asyncio.Event()

            async def race(i: int, r: int = r, etag: str = etag, gate: asyncio.Event = gate) -> Any:
                await gate.wait()
                try:
                    return await stores[i % len(stores)].update(
                        "contended", {"round": r, "by": i}, if_match=etag
                    )
                except PreconditionFailed as exc:
                    return exc

            tasks = [asyncio.create_task(race(i)) for i in range(racers)]
            await asyncio.sleep(0)
            gate.set()
            outcomes = await asyncio.gather(*tasks)
            winners = [o for o in outcomes if not isinstance(o, PreconditionFailed)]
            assert len(winners) == 1, f"round {r}: {len(winners)} winners"
            cp = winners[0]
            now = await stores[1].load("contended")
            assert (now.etag, now.state) == (cp.etag, cp.state)
            assert now.sequence == 1
    finally:
        for store in stores:
            await store.close()


@pytest.mark.asyncio
async def test_concurrent_history_of_writer_and_reader_processes_is_consistent(
    make_store: Maker, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """The kit's history checker over 4 writer processes and a reader process (stale reads,
    phantoms, lost CAS updates, page walks, commit-order sequences)."""
    url = f"{redis_url}?key_prefix={key_prefix}&allow_unsafe_durability=true"
    async with make_store() as store:
        await store.save(COUNTER_STREAM, {"n": 0}, id=COUNTER_ID)
        paths: list[Path] = []
        # The actors run for 2 seconds; on a machine too loaded for that to make enough
        # saves and updates, another round of actors (new names, so new ids) adds to the
        # same history, until it is big enough: the checks never depend on speed.
        for r in range(_HISTORY_ROUNDS):
            roles = [("writer", i + 10 * r) for i in range(WRITERS)] + [("reader", r)]
            round_paths = [tmp_path / f"{role}{i}.jsonl" for role, i in roles]
            procs = list(
                await asyncio.gather(
                    *(
                        _spawn(
                            "-m",
                            "statekeeper.testing.workloads",
                            "actor",
                            "--url",
                            url,
                            "--role",
                            role,
                            "--index",
                            str(i),
                            "--history",
                            str(path),
                            "--duration",
                            "2",
                            "--seed",
                            str(7 + r),
                        )
                        for (role, i), path in zip(roles, round_paths, strict=True)
                    )
                )
            )
            await _start(procs)
            for proc in procs:
                _, err = await asyncio.wait_for(proc.communicate(), 120)
                assert proc.returncode == 0, err.decode()[-2000:]
            paths += round_paths
            history = History.read(*paths)
            if len(history.of("save")) > 20 and len(history.of("update")) > 5:
                break
        report = await check_history(store, history)
    assert report.ok
    assert len(history.of("save")) > 20 and len(history.of("update")) > 5, (
        f"{_HISTORY_ROUNDS} rounds of actors made {len(history.of('save'))} saves and "
        f"{len(history.of('update'))} updates"
    )


@pytest.mark.asyncio
async def test_killed_writer_process_leaves_every_acknowledged_write(
    make_store: Maker, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """SIGKILL of the client mid-workload: each write is one script, so nothing is torn
    and everything acknowledged is there (the kit's D/A/R/L/S invariants)."""
    url = f"{redis_url}?key_prefix={key_prefix}&allow_unsafe_durability=true"
    log = tmp_path / "writer.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "statekeeper.testing.workloads", "writer", "--url", url,
        "--log", str(log), "--seed", "3", "--prefix", "k",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
    # killed once it has acknowledged more than 10 writes, however slowly it runs (the
    # writer saves until killed, so it is mid-workload then); 120 s is only a hang guard
    await _until(lambda: _acked(log) > 10, "the writer acknowledged no 11 writes")
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    write_log = WriteLog.read(log)
    async with make_store() as store:
        report = await check_invariants(store, write_log)
    assert report.acked > 10


# -- save_many (one script: atomic, consecutive sequences) ------------------------------------


@pytest.mark.asyncio
async def test_save_many_never_interleaves_with_saves_of_writer_processes(
    make_store: Maker, redis_url: str, key_prefix: str
) -> None:
    """Batches from this process race the single saves (and CAS updates) of 4 writer
    processes on their own connections: no single save takes a sequence inside a
    batch, and each batch is contiguous in the global order."""
    # The writers save until told to stop, and they are told only once a single save is
    # known to have landed after the first batch and another batch has been made since:
    # so some single save lies between two batches however the machine schedules the
    # processes (CI twice saw every single save finish before the first batch when the
    # writers ran a fixed number of rounds).
    width = 25
    async with make_store() as store:
        await store.save("counters", {"n": 0}, id="counter")
        procs = await _workers(redis_url, key_prefix, _UNTIL_STOPPED)
        await _start(procs)
        batches: list[list[Checkpoint]] = []
        landed_after_first = 0
        # 120 s: a guard against writers that never save, not a bound on their speed
        deadline = asyncio.get_running_loop().time() + 120
        while asyncio.get_running_loop().time() < deadline and any(
            proc.returncode is None for proc in procs
        ):
            # at most 20 batches until a single save is seen after the first: then
            # only look, however long the writers take to get there
            if landed_after_first or len(batches) < 20:
                items = [
                    NewCheckpoint(stream=f"b{i % 3}", state={"batch": len(batches), "i": i})
                    for i in range(width)
                ]
                batches.append(await store.save_many(items))
            if landed_after_first and len(batches) > max(landed_after_first, 20):
                break
            latest = await store.get_latest("shared")
            if not landed_after_first and latest and latest.sequence > batches[0][-1].sequence:
                landed_after_first = len(batches)
            await asyncio.sleep(0.001)
        await _start(procs, b"stop\n")
        results = [await _result(proc) for proc in procs]
        singles = sorted(seq for result in results for seq in result["seqs"])
        assert landed_after_first, "no single save landed after the first batch"
        assert len(singles) < WRITERS * _UNTIL_STOPPED, "the writers ran out of rounds"
        ranges = []
        for saved in batches:
            seqs = [cp.sequence for cp in saved]
            assert seqs == list(range(seqs[0], seqs[0] + width)), f"batch took {seqs}"
            ranges.append((seqs[0], seqs[-1]))
            inside = [s for s in singles if seqs[0] <= s <= seqs[-1]]
            assert not inside, f"saves took {inside} in the middle of a batch {seqs}"
        # the race was real: some single save landed between two batches
        between = [
            s for (_, lo), (hi, _) in itertools.pairwise(ranges) for s in singles if lo < s < hi
        ]
        assert between, f"no save between batches {ranges[0]}..{ranges[-1]}: {singles}"
        page = await store.list(None, order="asc", limit=1000, include_state=False)
        listed = [cp.id for cp in page.items]
        while page.next_cursor is not None:
            page = await store.list(
                None, order="asc", limit=1000, include_state=False, after=page.next_cursor
            )
            listed += [cp.id for cp in page.items]
        # the counter, the single saves and the raced batches
        assert len(listed) == 1 + len(singles) + width * len(batches)
        for saved in batches:
            start = listed.index(saved[0].id)
            assert listed[start : start + width] == [cp.id for cp in saved]


@pytest.mark.asyncio
async def test_a_reader_on_another_connection_never_sees_part_of_a_batch(
    make_store: Maker,
) -> None:
    """Only batches of ``width`` are written, so every count a reader takes (index
    entries, record keys by listing, the high-water mark) is a multiple of it."""
    width, rounds = 20, 40
    async with make_store() as writer, make_store() as reader:
        done = asyncio.Event()
        counts: set[int] = set()
        looks = 0  # the reader's finished rounds of reads
        looked = asyncio.Condition()

        async def write() -> None:
            try:
                for k in range(rounds):
                    await writer.save_many(
                        [
                            NewCheckpoint(stream=f"s{i % 4}", state={"k": k, "i": i})
                            for i in range(width)
                        ]
                    )
                    if k % 10 == 9:
                        # every 10 batches, wait for a round of reads begun after this
                        # one, so the reader sees several states however the two
                        # connections are scheduled (the other reads race the batches)
                        seen = looks
                        async with looked:
                            await looked.wait_for(lambda seen=seen: looks >= seen + 2)
            finally:
                done.set()

        async def read() -> None:
            while not done.is_set():
                indexed = await reader.client.zcard(reader.key_prefix + "all")
                hwm = int(await reader.client.hget(reader.key_prefix + "meta", "hwm") or 0)
                page = await reader.list(None, limit=1000, include_state=False)
                for n in (indexed, hwm, len(page.items)):
                    assert n % width == 0, f"a reader counted {n}: a batch is half visible"
                counts.add(len(page.items))
                got = await reader.load_many([cp.id for cp in page.items[:width]])
                assert len(got) == min(width, len(page.items))
                nonlocal looks
                async with looked:
                    looks += 1
                    looked.notify_all()
                await asyncio.sleep(0)

        await asyncio.gather(write(), read())
    assert len(counts) > 2, f"the reader saw too few states of the store: {sorted(counts)}"
