"""SPEC S15 on SQLite: concurrent writes share one transaction and one COMMIT.

The writer thread takes every write queued behind the one it is running and runs
them in one ``BEGIN IMMEDIATE ... COMMIT``, each in its own savepoint
(:class:`statekeeper.backends.sql.sqlite.workers.SqliteWriter`, gathered by
:class:`statekeeper._runtime.group.GroupCommit`). These tests hold the writer
thread with a blocking job, queue writes behind it, and release it, so the group
is known without relying on timing; they count the writer's commits.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from statekeeper.backends.sql import SqliteCheckpointStore
from statekeeper.backends.sql import sqlite as sqlite_module
from statekeeper.backends.sql.dialects import Session
from statekeeper.backends.sql.sqlite import workers as workers_module
from statekeeper.errors import (
    BackendError,
    CheckpointEncodeError,
    CheckpointNotFound,
    PreconditionFailed,
)

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteCheckpointStore]:
    async with SqliteCheckpointStore(f"sqlite:///{tmp_path / 'store.db'}") as opened:
        await opened.save("warm", {"first": True})  # the writer thread exists from here
        yield opened


def _writer(store: SqliteCheckpointStore) -> workers_module.SqliteWriter:
    runtime = store._runtime
    assert isinstance(runtime, sqlite_module.SqliteRuntime)
    return runtime._writer_worker()


class Held:
    """The writer thread blocked in a plain job until :meth:`release`."""

    def __init__(self, store: SqliteCheckpointStore) -> None:
        self.writer = _writer(store)
        self._gate = threading.Event()
        self._job = asyncio.ensure_future(self.writer.call(lambda conn: self._gate.wait(10)))

    async def queued(self, n: int) -> None:
        """Wait until ``n`` writes are queued behind the held job."""
        for _ in range(500):
            if self.writer.pending >= n + 1:
                return
            await asyncio.sleep(0.002)
        raise AssertionError(f"only {self.writer.pending - 1} of {n} writes were queued")

    async def release(self) -> None:
        self._gate.set()
        assert await self._job is True


async def _group(
    store: SqliteCheckpointStore, calls: Sequence[Awaitable[Any]], *, refused: int = 0
) -> list[Any]:
    """Queue ``calls`` behind the held writer, in order, then release it (``refused``
    of them fail before they are queued)."""
    held = Held(store)
    await asyncio.sleep(0)
    tasks = [asyncio.ensure_future(call) for call in calls]
    await held.queued(len(tasks) - refused)
    await held.release()
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_queued_saves_share_one_commit_in_queue_order(
    store: SqliteCheckpointStore,
) -> None:
    writer = _writer(store)
    commits, ops = writer.commits, writer.operations
    results = await _group(store, [store.save(f"s{i}", {"i": i}) for i in range(20)])
    assert writer.commits - commits == 1
    assert writer.operations - ops == 20
    seqs = [cp.sequence for cp in results]
    assert seqs == list(range(seqs[0], seqs[0] + 20))  # the order they were queued in
    for i, cp in enumerate(results):
        assert (await store.get_latest(f"s{i}")) == cp
    page = await store.list(None, limit=100, order="asc")
    assert [c.sequence for c in page.items][1:] == seqs


async def test_a_lone_write_runs_without_a_savepoint(store: SqliteCheckpointStore) -> None:
    statements: list[str] = []
    await _writer(store).call(lambda conn: conn.set_trace_callback(statements.append))
    try:
        await store.save("s", {"alone": True})
        assert "SAVEPOINT" not in " ".join(statements)
        assert statements[0] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
        statements.clear()
        await _group(store, [store.save("s", {"i": i}) for i in range(3)])
        text = [s for s in statements if s.startswith(("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT"))]
        op = ["SAVEPOINT statekeeper_op", "RELEASE statekeeper_op"]
        assert text == ["BEGIN IMMEDIATE", *op, *op, *op, "COMMIT"]
    finally:
        await _writer(store).call(lambda conn: conn.set_trace_callback(None))


async def test_a_failing_write_fails_alone_and_uses_no_sequence(
    store: SqliteCheckpointStore,
) -> None:
    taken = await store.save("s", {"taken": True}, id="taken")
    writer = _writer(store)
    commits = writer.commits
    results = await _group(
        store,
        [
            store.save("a", {"a": 1}),
            store.save("b", {"b": 1}, id="taken"),  # a live id: PreconditionFailed
            store.update(taken.id, {"x": 1}, if_match="not-the-etag"),  # PreconditionFailed
            store.save("d", object()),  # never queued: refused before anything is written
            store.save("c", {"c": 1}),
        ],
        refused=1,
    )
    a, dup, cas, enc, c = results
    assert isinstance(dup, PreconditionFailed) and "already exists" in str(dup)
    assert isinstance(cas, PreconditionFailed) and "etag" in str(cas)
    assert isinstance(enc, CheckpointEncodeError)
    assert writer.commits - commits == 1
    # the failed save's counter bump was rolled back with its savepoint: no gap
    assert c.sequence == a.sequence + 1
    assert (await store.load("taken")).state == {"taken": True}
    assert await store.get_latest("b") is None
    assert (await store.get_latest("c")) == c
    assert await store.get_latest("d") is None


async def test_a_caller_cancelled_before_its_write_started_writes_nothing(
    store: SqliteCheckpointStore,
) -> None:
    held = Held(store)
    await asyncio.sleep(0)
    first = asyncio.ensure_future(store.save("s", {"n": 1}))
    gone = asyncio.ensure_future(store.save("s", {"n": 2}, id="gone"))
    last = asyncio.ensure_future(store.save("s", {"n": 3}))
    await held.queued(3)
    gone.cancel()
    await held.release()
    a, c = await first, await last
    with pytest.raises(asyncio.CancelledError):
        await gone
    with pytest.raises(CheckpointNotFound):
        await store.load("gone")
    assert c.sequence == a.sequence + 1
    page = await store.list("s", limit=10, order="asc")
    assert [cp.state for cp in page.items] == [{"n": 1}, {"n": 3}]


async def test_a_failed_commit_fails_every_write_of_the_group(
    store: SqliteCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = await store.save("s", {"before": True})
    real = workers_module._commit
    failures: list[sqlite3.Connection] = []

    def failing_commit(conn: sqlite3.Connection) -> None:
        if not failures:
            failures.append(conn)
            raise sqlite3.OperationalError("disk I/O error")
        real(conn)

    monkeypatch.setattr(workers_module, "_commit", failing_commit)
    results = await _group(store, [store.save(f"g{i}", {"i": i}) for i in range(5)])
    assert failures and all(isinstance(r, BackendError) for r in results), results
    assert all("disk I/O error" in str(r) for r in results)
    for i in range(5):
        assert await store.get_latest(f"g{i}") is None
    # nothing of the group is left in the writer's connection or in the counter
    after = await store.save("s", {"after": True})
    assert after.sequence == before.sequence + 1
    page = await store.list(None, limit=100)
    assert {cp.stream for cp in page.items} == {"warm", "s"}


async def test_writes_before_a_transaction_sqlite_dropped_fail_and_later_ones_run(
    store: SqliteCheckpointStore,
) -> None:
    """SQLite rolls the whole transaction back on some errors (I/O error, disk full):
    the writes that ran before in the group are gone, so their callers fail too."""
    runtime = store._runtime
    assert isinstance(runtime, sqlite_module.SqliteRuntime)

    def drops_the_transaction(s: Session) -> None:
        s.conn.execute("ROLLBACK")  # type: ignore[attr-defined]
        raise sqlite3.OperationalError("database or disk is full")

    writer = _writer(store)
    commits = writer.commits
    earlier, bad, later = await _group(
        store,
        [
            store.save("earlier", {"n": 1}),
            runtime.write(drops_the_transaction),
            store.save("later", {"n": 2}),
        ],
    )
    assert isinstance(bad, sqlite3.OperationalError)
    assert isinstance(earlier, BackendError) and "disk is full" in str(earlier)
    assert await store.get_latest("earlier") is None
    assert (await store.get_latest("later")) == later
    assert writer.commits - commits == 1  # the later write's own transaction


async def test_many_tasks_keep_per_stream_order_and_commit_order(
    store: SqliteCheckpointStore,
) -> None:
    async def saver(i: int) -> list[int]:
        return [(await store.save(f"t{i}", {"i": i, "j": j})).sequence for j in range(5)]

    writer = _writer(store)
    commits, ops = writer.commits, writer.operations
    per_task = await asyncio.gather(*(saver(i) for i in range(32)))
    assert writer.operations - ops == 160
    assert writer.commits - commits <= 160
    everything = sorted(seq for seqs in per_task for seq in seqs)
    assert everything == list(range(everything[0], everything[0] + 160))  # no gap, no repeat
    for i, seqs in enumerate(per_task):
        assert seqs == sorted(seqs)
        page = await store.list(f"t{i}", limit=10, order="asc")
        assert [cp.state["j"] for cp in page.items] == list(range(5))
        assert [cp.sequence for cp in page.items] == seqs


async def test_groups_are_bounded(
    store: SqliteCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(store)
    monkeypatch.setattr(writer.group_commit, "max_group", 4)
    commits = writer.commits
    results = await _group(store, [store.save(f"s{i}", {"i": i}) for i in range(10)])
    seqs = [cp.sequence for cp in results]
    assert seqs == list(range(seqs[0], seqs[0] + 10))
    assert writer.commits - commits == 3  # 4 + 4 + 2


async def test_writes_that_come_one_at_a_time_never_wait_for_company(
    store: SqliteCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_writer(store).group_commit, "gather_wait", 5.0)
    started = time.monotonic()
    for i in range(5):
        await store.save("s", {"i": i})
    assert time.monotonic() - started < 2.5  # not one wait of 5 s


async def test_the_writer_thread_survives_a_failure_of_its_own_machinery(
    store: SqliteCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever goes wrong while running a group, every caller gets an answer and
    the writer goes on serving writes (a dead writer thread would hang them all)."""

    def broken_undo(conn: sqlite3.Connection) -> bool:
        raise RuntimeError("the savepoint machinery broke")

    await store.save("taken", {}, id="taken")
    monkeypatch.setattr(workers_module, "_undo", broken_undo)
    # the second save fails (a live id), and rolling it back to its savepoint breaks
    calls = [store.save("a", {}), store.save("b", {}, id="taken"), store.save("c", {})]
    results = await asyncio.wait_for(_group(store, calls), timeout=10)
    assert [type(r) for r in results] == [RuntimeError] * 3, results
    monkeypatch.undo()
    later = await asyncio.wait_for(store.save("later", {"ok": True}), timeout=10)
    assert (await store.get_latest("later")) == later
    for stream in ("a", "b", "c"):
        assert await store.get_latest(stream) is None
