"""Group commit on the file backend (S15): saves from concurrent tasks that queue
while one is in flight share one lock hold and one fsync group, each with its own
outcome.

Grouping is made deterministic with a gate: the first save (the one in flight)
waits in the worker thread until every other save has queued behind it; the
engine's ``insert_group`` is wrapped to record each group it commits.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fault_io import FaultHookIO
from file_helpers import parts_of

from statekeeper._runtime.inline import WORKER, Budget, WouldBlock
from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file.io import OsFileIO
from statekeeper.errors import (
    BackendError,
    CheckpointEncodeError,
    CheckpointNotFound,
    PreconditionFailed,
    StoreClosed,
)
from statekeeper.models import Checkpoint


class Gate:
    """Hold the first one-record save in the worker thread until released, and
    record the ids of every group the engine commits."""

    def __init__(self, store: FileCheckpointStore) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.groups: list[list[str]] = []
        self.on_group: Callable[[], None] | None = None
        #: Called once the group's insert returned (before its callers hear of it).
        self.after_group: Callable[[], None] | None = None
        parts = parts_of(store)
        insert, insert_group = parts.engine.writes.insert, parts.batches.insert_group

        def gated_insert(record: Any, budget: Budget = WORKER) -> Any:
            if budget.inline:
                # A lone durability="fast" save would run on the loop's thread without
                # the hop, past the gate: send every save through the worker, as under
                # load.
                raise WouldBlock
            if not self.entered.is_set():
                self.entered.set()
                assert self.release.wait(30), "the gate was never released"
            return insert(record)

        def recorded_group(records: list[Any]) -> Any:
            self.groups.append([r.id for r in records])
            if self.on_group is not None:
                self.on_group()
            try:
                return insert_group(records)
            finally:
                if self.after_group is not None:
                    self.after_group()

        parts.engine.writes.insert = gated_insert  # type: ignore[method-assign]
        parts.batches.insert_group = recorded_group  # type: ignore[method-assign]


async def queued_behind_one(
    store: FileCheckpointStore, gate: Gate, calls: list[Callable[[], Awaitable[Any]]]
) -> tuple[list[asyncio.Task[Any]], asyncio.Task[Checkpoint]]:
    """Start one save and hold it in flight; start ``calls`` (which queue behind
    it). Returns the queued tasks and the first save's, none of them awaited."""
    first = asyncio.create_task(store.save("first", {"n": 0}, id="first"))
    assert await asyncio.to_thread(gate.entered.wait, 30)
    tasks = [asyncio.create_task(call()) for call in calls]
    for _ in range(3):
        await asyncio.sleep(0)  # every task runs up to its place in the queue
    return tasks, first


async def behind_one_in_flight(
    store: FileCheckpointStore, gate: Gate, calls: list[Callable[[], Awaitable[Any]]]
) -> tuple[list[asyncio.Task[Any]], Checkpoint]:
    """:func:`queued_behind_one`, then release the first save. Returns the queued
    tasks (not awaited) and the first save."""
    tasks, first = await queued_behind_one(store, gate, calls)
    return tasks, await _release(gate, first)


async def _release(gate: Gate, first: asyncio.Task[Checkpoint]) -> Checkpoint:
    gate.release.set()
    return await first


def saving(
    store: FileCheckpointStore, stream: str, cid: str, state: Any = None
) -> Callable[[], Awaitable[Checkpoint]]:
    return lambda: store.save(stream, {"id": cid} if state is None else state, id=cid)


@pytest.mark.asyncio
async def test_saves_that_queue_behind_one_in_flight_commit_as_one_group(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        gate = Gate(store)
        ids = [f"g{i}" for i in range(12)]
        tasks, first = await behind_one_in_flight(
            store, gate, [saving(store, f"s{i}", cid) for i, cid in enumerate(ids)]
        )
        saved = await asyncio.gather(*tasks)
        assert gate.groups == [ids], "the queued saves were not committed as one group"
        assert [cp.id for cp in saved] == ids
        # consecutive sequences after the save that was in flight, in the order queued
        assert [cp.sequence for cp in saved] == list(
            range(first.sequence + 1, first.sequence + 1 + len(ids))
        )
        for i, cp in enumerate(saved):
            latest = await store.get_latest(f"s{i}")
            assert latest is not None and latest.id == cp.id and latest.state == {"id": cp.id}
            assert latest.sequence == cp.sequence and latest.etag == cp.etag
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_a_lone_save_is_not_grouped(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        gate = Gate(store)
        gate.entered.set()  # no gating: every save goes straight through
        for i in range(5):
            await store.save("s", {"i": i})
        assert gate.groups == []


@pytest.mark.asyncio
async def test_a_failing_save_in_a_group_fails_alone(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        await store.save("old", {"x": 1}, id="taken")
        # a record over it fails its own save only
        parts_of(store).engine.files.max_record_bytes = 4096
        gate = Gate(store)
        calls = [
            saving(store, "a", "ok-1"),
            saving(store, "b", "taken"),  # live id
            saving(store, "c", "ok-2"),
            saving(store, "d", "ok-2"),  # the id an earlier save of the group took
            saving(store, "e", "big", {"blob": "x" * 10_000}),  # oversized record
            saving(store, "f", "ok-3"),
        ]
        tasks, first = await behind_one_in_flight(store, gate, calls)
        out = await asyncio.gather(*tasks, return_exceptions=True)
        assert len(gate.groups) == 1
        assert isinstance(out[1], PreconditionFailed)
        assert isinstance(out[3], PreconditionFailed)
        assert isinstance(out[4], CheckpointEncodeError)
        ok = [out[0], out[2], out[5]]
        assert all(isinstance(cp, Checkpoint) for cp in ok), out
        # the failed ones took no sequence: the others are consecutive
        assert [cp.sequence for cp in ok if isinstance(cp, Checkpoint)] == [
            first.sequence + 1,
            first.sequence + 2,
            first.sequence + 3,
        ]
        assert (await store.load("taken")).stream == "old"
        assert (await store.load("ok-2")).stream == "c"
        with pytest.raises(CheckpointNotFound):
            await store.load("big")
        assert await store.get_latest("d") is None
        assert await store.get_latest("e") is None
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_a_group_reuses_an_expired_id(tmp_path: Path) -> None:
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    async with FileCheckpointStore(tmp_path / "s", clock=lambda: now[0]) as store:
        await store.save("old", {"x": 1}, id="reused", ttl=1)
        now[0] += timedelta(seconds=10)  # it has expired
        gate = Gate(store)
        tasks, _ = await behind_one_in_flight(
            store, gate, [saving(store, "new", "reused"), saving(store, "other", "x")]
        )
        saved = await asyncio.gather(*tasks)
        assert gate.groups == [["reused", "x"]]
        assert (await store.load("reused")).stream == "new"
        assert saved[0].id == "reused"
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_saves_are_acknowledged_in_sequence_order(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        gate = Gate(store)
        acked: list[int] = []

        def call(i: int) -> Callable[[], Awaitable[None]]:
            async def save() -> None:
                cp = await store.save(f"s{i % 3}", {"i": i})
                acked.append(cp.sequence)

            return save

        tasks, first = await behind_one_in_flight(store, gate, [call(i) for i in range(20)])
        await asyncio.gather(*tasks)
        assert acked == list(range(first.sequence + 1, first.sequence + 21))
        # and the order holds in every read: newest last, by sequence
        page = await store.list(None, order="asc", limit=100)
        assert [cp.sequence for cp in page.items] == [first.sequence, *acked]
        assert [cp.state["i"] for cp in page.items[1:]] == list(range(20))


@pytest.mark.asyncio
async def test_a_save_cancelled_while_queued_writes_nothing(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        gate = Gate(store)
        calls = [saving(store, f"s{i}", f"c{i}") for i in range(4)]
        tasks, first = await queued_behind_one(store, gate, calls)
        tasks[1].cancel()
        await _release(gate, first)
        out = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(out[1], asyncio.CancelledError)
        assert gate.groups == [["c0", "c2", "c3"]]
        with pytest.raises(CheckpointNotFound):
            await store.load("c1")
        assert await store.get_latest("s1") is None
        # the queue still works afterwards, alone and grouped
        assert (await store.save("s1", {"again": True}, id="c1")).id == "c1"
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_a_group_whose_every_waiter_was_cancelled_commits_nothing(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        gate = Gate(store)
        calls = [saving(store, f"s{i}", f"c{i}") for i in range(3)]
        tasks, first = await queued_behind_one(store, gate, calls)
        for task in tasks:
            task.cancel()
        await _release(gate, first)
        await asyncio.gather(*tasks, return_exceptions=True)
        assert gate.groups == []
        page = await store.list(None, limit=100)
        assert [cp.stream for cp in page.items] == ["first"]
        assert (await store.save("later", {})).stream == "later"


class FaultIO(FaultHookIO):
    """The real file system, failing the k-th mutating call (counted from
    :meth:`arm`) with EIO once; ``counted`` says how many there were."""

    FAULTED = frozenset({"write", "pwrite", "fsync", "fdatasync", "syncfs", "rename", "open"})

    def __init__(self) -> None:
        self.k: int | None = None
        self.counted = 0
        self.fired: str | None = None
        self.counting = True

    def arm(self, k: int | None) -> None:
        self.k, self.counted, self.fired, self.counting = k, 0, None, True

    def stop(self) -> None:
        """Disarmed, and counting no more (the writer's upkeep after the group, such
        as the next save's spare temp file, is not the group's)."""
        self.k, self.counting = None, False

    def _fault(self, op: str) -> None:
        if not self.counting:
            return
        self.counted += 1
        if self.k is not None and self.counted == self.k:
            self.k, self.fired = None, op
            self.counted = -(1 << 30)  # stop counting
            raise OSError(errno.EIO, os.strerror(errno.EIO), op)


def _temps_with_bytes(root: Path) -> list[str]:
    """Temp files holding bytes (an empty one is the writer's spare: file/spares.py)."""
    return [p.name for p in root.rglob("*.tmp") if p.stat().st_size]


async def _group_under_fault(
    root: Path, batch_sync: str, k: int | None
) -> tuple[FaultIO, list[Any]]:
    io = FaultIO()
    async with FileCheckpointStore(root, io=io, batch_sync=batch_sync) as store:
        for i in range(3):
            await store.save(f"s{i}", {"before": i}, id=f"before-{i}")
        gate = Gate(store)
        gate.on_group = lambda: io.arm(k)
        gate.after_group = io.stop
        ids = [f"g{i}" for i in range(6)]
        tasks, _ = await behind_one_in_flight(
            store, gate, [saving(store, f"s{i % 3}", cid) for i, cid in enumerate(ids)]
        )
        out = await asyncio.gather(*tasks, return_exceptions=True)
        io.k = None  # disarmed; ``counted`` keeps the mutating calls of the group
        if k is not None and io.fired is not None:
            assert all(isinstance(one, BackendError) for one in out), (io.fired, out)
            assert all(
                isinstance(one.orig, OSError) for one in out if isinstance(one, BackendError)
            )
            for cid in ids:
                with pytest.raises(CheckpointNotFound):
                    await store.load(cid)
            for i in range(3):
                latest = await store.get_latest(f"s{i}")
                assert latest is not None and latest.id == f"before-{i}", (io.fired, latest)
            page = await store.list(None, limit=100)
            assert not page.skipped, (io.fired, page.skipped)
            assert sorted(cp.id for cp in page.items) == sorted(
                ["first", "before-0", "before-1", "before-2"]
            )
            report = await store.verify()
            assert report.ok, (io.fired, report.problems)
            # usable at once, alone and in a group
            again = await store.save("s0", {"after": True}, id="g0")
            assert (await store.get_latest("s0")) == again
        leftovers = _temps_with_bytes(root)
        assert not leftovers, (io.fired, leftovers)
    return io, out


@pytest.mark.asyncio
@pytest.mark.parametrize("batch_sync", ["syncfs", "fsync"])
async def test_an_io_error_anywhere_in_a_group_fails_every_save_of_it(
    batch_sync: str, tmp_path: Path
) -> None:
    io, out = await _group_under_fault(tmp_path / "dry", batch_sync, None)
    assert all(isinstance(one, Checkpoint) for one in out)
    calls = io.counted
    assert calls > 6
    fired = set()
    for k in range(1, calls + 1):
        io, _ = await _group_under_fault(tmp_path / f"k{k}", batch_sync, k)
        assert io.fired is not None
        fired.add(io.fired)
    assert {"open", "rename"} <= fired
    assert ("syncfs" if batch_sync == "syncfs" else "fsync") in fired


class PausingIO(OsFileIO):
    """The real file system; once armed, the first rename waits until released, so
    a group is held in flight with its temp files written and nothing renamed."""

    def __init__(self) -> None:
        self.armed = False
        self.paused = threading.Event()
        self.go_on = threading.Event()

    def rename(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        if self.armed:
            self.armed = False
            self.paused.set()
            assert self.go_on.wait(30)
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


@pytest.mark.asyncio
async def test_readers_see_nothing_of_a_group_in_flight(tmp_path: Path) -> None:
    """While a group's records sit in temp files, under the journal, a reader sees
    none of them, and reports none of its temp files as stray; verify agrees."""
    io = PausingIO()
    async with FileCheckpointStore(tmp_path / "s", io=io) as store:
        before = await store.save("s0", {"before": True})
        gate = Gate(store)
        gate.on_group = lambda: setattr(io, "armed", True)
        first = asyncio.create_task(store.save("first", {"n": 0}, id="first"))
        assert await asyncio.to_thread(gate.entered.wait, 30)
        tasks = [asyncio.create_task(saving(store, f"s{i % 2}", f"g{i}")()) for i in range(4)]
        for _ in range(3):
            await asyncio.sleep(0)
        gate.release.set()
        await first
        assert await asyncio.to_thread(io.paused.wait, 30)
        try:
            page = await store.list(None, order="asc", limit=100)
            assert not page.skipped, page.skipped
            assert [cp.id for cp in page.items] == [before.id, "first"]
            assert await store.get_latest("s0") == before
            assert await store.get_latest("s1") is None
            with pytest.raises(CheckpointNotFound):
                await store.load("g0")
            temps = [n for _, _, names in os.walk(tmp_path) for n in names if n.endswith(".tmp")]
            assert len(temps) == 4, temps
            # verify cannot tell a write in flight from a crashed one (it takes no
            # lock): it names the journal, and nothing else (no stray temp file)
            report = await store.verify()
            assert [p.kind for p in report.problems] == ["state"], report.problems
        finally:
            io.go_on.set()
        saved = await asyncio.gather(*tasks)
        page = await store.list(None, order="asc", limit=100)
        assert not page.skipped
        assert [cp.id for cp in page.items] == [before.id, "first", *(cp.id for cp in saved)]
        assert (await store.verify()).ok


def test_threads_through_the_blocking_facade_are_grouped(tmp_path: Path) -> None:
    """Threads share the facade's one event loop, so their saves group too."""
    from statekeeper.sync import SyncCheckpointStore

    store = FileCheckpointStore(tmp_path / "s")
    gate = Gate(store)
    with SyncCheckpointStore(store) as sync:
        first = threading.Thread(target=sync.save, args=("first", {"n": 0}))
        first.start()
        assert gate.entered.wait(30)
        results: dict[int, Checkpoint] = {}

        def save(i: int) -> None:
            results[i] = sync.save(f"t{i}", {"i": i}, id=f"t{i}")

        threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        # each thread's save reaches the writer's queue behind the one in flight
        deadline = 30.0
        while store._saves.pending < 7 and deadline > 0:  # 6 queued, 1 in flight
            threading.Event().wait(0.01)
            deadline -= 0.01
        gate.release.set()
        for thread in (first, *threads):
            thread.join(30)
        assert len(gate.groups) == 1 and sorted(gate.groups[0]) == [f"t{i}" for i in range(6)]
        assert sorted(results) == list(range(6))
        for i, cp in results.items():
            assert sync.load(f"t{i}").sequence == cp.sequence
        assert sync.verify().ok


_GROUPING_CHILD = """
import asyncio, json, sys
from statekeeper.backends.file import FileCheckpointStore

async def main(root, tag):
    acked = []
    async with FileCheckpointStore(root) as store:
        async def one(i):
            for j in range(6):
                cid = "%s-%d-%d" % (tag, i, j)
                cp = await store.save("s%d" % (i % 3), {"i": i, "j": j}, id=cid)
                acked.append((cp.id, cp.sequence))
        await asyncio.gather(*(one(i) for i in range(12)))
    print(json.dumps(acked))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_groups_of_several_processes_share_one_sequence(tmp_path: Path) -> None:
    """Processes each committing groups of concurrent saves to the same streams:
    every acknowledged save is there once, sequences are unique, each stream's
    latest is its highest acknowledged sequence, and verify is clean."""
    import json
    import subprocess
    import sys

    root = tmp_path / "s"
    asyncio.run(_create(root))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _GROUPING_CHILD, str(root), tag], stdout=subprocess.PIPE
        )
        for tag in ("p", "q", "r")
    ]
    acked: dict[str, int] = {}
    for child in children:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        acked.update(json.loads(out))
    assert len(acked) == 3 * 12 * 6
    assert len(set(acked.values())) == len(acked), "a sequence was handed out twice"
    asyncio.run(_check_processes(root, acked))


async def _create(root: Path) -> None:
    async with FileCheckpointStore(root):
        pass


async def _check_processes(root: Path, acked: dict[str, int]) -> None:
    async with FileCheckpointStore(root) as store:
        listed: dict[str, int] = {}
        cursor = None
        while True:
            page = await store.list(None, order="asc", limit=100, after=cursor)
            assert not page.skipped
            listed.update((cp.id, cp.sequence) for cp in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
        assert listed == acked
        for k in range(3):
            latest = await store.get_latest(f"s{k}")
            want = max(seq for cid, seq in acked.items() if int(cid.split("-")[1]) % 3 == k)
            assert latest is not None and latest.sequence == want
        report = await store.verify()
        assert report.ok, report.problems


@pytest.mark.asyncio
async def test_a_group_across_two_buckets_keeps_both_directories_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group whose sequences cross a bucket boundary holds both bucket
    directories to the end; the writer's small cache of bucket descriptors must
    not close one under it (regression: with one cached descriptor, the second
    bucket evicted and closed the first while its renames were still to come)."""
    import statekeeper as sk
    from statekeeper.backends.file import fdcache

    monkeypatch.setattr(fdcache, "_BUCKETS_KEPT", 1)
    async with FileCheckpointStore(tmp_path / "s", durability="fast") as store:
        await store.save_many([sk.NewCheckpoint(stream="fill", state={}) for _ in range(996)])
        gate = Gate(store)
        tasks, first = await behind_one_in_flight(
            store, gate, [saving(store, f"s{i}", f"g{i}") for i in range(6)]
        )
        assert first.sequence == 997
        saved = await asyncio.gather(*tasks)
        assert gate.groups == [[f"g{i}" for i in range(6)]]
        assert [cp.sequence for cp in saved] == list(range(998, 1004))
        for i in range(6):
            latest = await store.get_latest(f"s{i}")
            assert latest is not None and latest.id == f"g{i}"
        assert (tmp_path / "s" / "records" / "00000000000000001").is_dir()
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_close_while_saves_wait(tmp_path: Path) -> None:
    """The store closes while saves are queued behind one in flight: the one in
    flight returns; each queued one either returns (and is there after a reopen)
    or raises StoreClosed and wrote nothing; the store reopens clean."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        gate = Gate(store)
        ids = [f"w{i}" for i in range(5)]
        tasks, first = await queued_behind_one(
            store, gate, [saving(store, f"s{i}", cid) for i, cid in enumerate(ids)]
        )
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0)
        gate.release.set()
        await closing
        lead = await first
        out = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(one, Checkpoint | StoreClosed) for one in out), out
    async with FileCheckpointStore(tmp_path / "s") as again:
        assert (await again.load("first")).sequence == lead.sequence
        for cid, one in zip(ids, out, strict=True):
            if isinstance(one, Checkpoint):
                assert (await again.load(cid)).sequence == one.sequence
            else:
                with pytest.raises(CheckpointNotFound):
                    await again.load(cid)
        assert (await again.verify()).ok


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_saves_and_groups_on_a_writer_of_its_own(tmp_path: Path) -> None:
    """The parent's writer thread does not exist in a forked child: the child's
    saves, alone and concurrent, start a writer of its own and all return."""
    store = FileCheckpointStore(tmp_path / "s")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(store.open())
        loop.run_until_complete(store.save("parent", {"n": 0}))  # the writer runs
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                child = asyncio.new_event_loop()

                async def in_child() -> int:
                    await store.save("child", {"alone": True})
                    saved = await asyncio.gather(*(store.save("child", {"i": i}) for i in range(8)))
                    return len(saved)

                code = 0 if child.run_until_complete(asyncio.wait_for(in_child(), 20)) == 8 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # the parent's writer still serves the parent
        loop.run_until_complete(store.save("parent", {"n": 1}))
        page = loop.run_until_complete(store.list("child", limit=100))
        assert len(page.items) == 9
        assert loop.run_until_complete(store.verify()).ok
    finally:
        loop.run_until_complete(store.close())
        loop.close()
