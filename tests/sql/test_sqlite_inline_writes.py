"""SQLite's inline writes (``SqliteRuntime.point_write``): under ``durability="fast"``
a save, update or delete of one checkpoint runs on the event loop's thread when the
writer thread is idle and the write lock is free, else on the writer thread, with
the same body (``workers.run_alone``) and the same outcome either way.

Each test counts the writer thread's commits: an inline write adds none.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from statekeeper._runtime.inline import Budget
from statekeeper.backends.sql import SqliteCheckpointStore
from statekeeper.backends.sql import sqlite as sqlite_module
from statekeeper.backends.sql.sqlite import runtime as runtime_module
from statekeeper.errors import CheckpointNotFound, PreconditionFailed

pytestmark = pytest.mark.asyncio


def _runtime(store: SqliteCheckpointStore) -> runtime_module.SqliteRuntime:
    runtime = store._runtime
    assert isinstance(runtime, sqlite_module.SqliteRuntime)
    return runtime


def _commits(store: SqliteCheckpointStore) -> int:
    return _runtime(store)._writer_worker().commits


async def _open(path: Path, **options: Any) -> SqliteCheckpointStore:
    store = SqliteCheckpointStore(f"sqlite:///{path / 'store.db'}", **options)
    await store.open()
    return store


@pytest_asyncio.fixture
async def fast(tmp_path: Path) -> AsyncIterator[SqliteCheckpointStore]:
    store = await _open(tmp_path, durability="fast")
    try:
        yield store
    finally:
        await store.close()


async def test_fast_saves_updates_and_deletes_run_inline_and_are_committed(
    fast: SqliteCheckpointStore, tmp_path: Path
) -> None:
    before = _commits(fast)
    saved = await fast.save("s", {"n": 1}, id="a")
    updated = await fast.update("a", {"n": 2}, if_match=saved.etag)
    second = await fast.save("s", {"n": 3}, id="b")
    assert await fast.delete("b", if_match=second.etag) is True
    assert _commits(fast) == before  # not one of them went to the writer thread

    # committed, not just visible to the connection that wrote: a new connection sees it
    raw = sqlite3.connect(tmp_path / "store.db")
    try:
        ids = [row[0] for row in raw.execute("SELECT id FROM statekeeper_checkpoints")]
    finally:
        raw.close()
    assert ids == ["a"]
    latest = await fast.get_latest("s")
    assert latest is not None and latest.state == {"n": 2} and latest.etag == updated.etag


async def test_an_inline_write_refused_raises_as_the_writer_would(
    fast: SqliteCheckpointStore,
) -> None:
    await fast.save("s", {"n": 1}, id="a")
    before = _commits(fast)
    with pytest.raises(PreconditionFailed):
        await fast.save("s", {"n": 2}, id="a")
    with pytest.raises(PreconditionFailed):
        await fast.update("a", {"n": 3}, if_match="not-the-etag")
    with pytest.raises(CheckpointNotFound):
        await fast.update("missing", {"n": 4})
    assert _commits(fast) == before  # refused inline, not tried again on the writer
    got = await fast.load("a")
    assert got.state == {"n": 1} and got.sequence == 1  # the refusals used no sequence
    assert (await fast.save("s", {"n": 5})).sequence == 2


async def test_a_write_lock_held_elsewhere_sends_the_write_to_the_writer_thread(
    fast: SqliteCheckpointStore, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's writer, as SQLite sees it
        before = _commits(fast)
        save = asyncio.ensure_future(fast.save("s", {"n": 1}))
        await asyncio.sleep(0.2)
        assert not save.done()  # waiting on the writer thread, not failed busy
        other.execute("ROLLBACK")
        saved = await save
    finally:
        other.close()
    assert _commits(fast) == before + 1
    assert (await fast.load(saved.id)).state == {"n": 1}


async def test_a_write_over_the_budget_is_rolled_back_and_run_on_the_writer(
    fast: SqliteCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = _runtime(fast)
    await fast.save("s", {"n": 0})  # the inline connection exists
    # interrupt after every SQLite operation: no write can finish inline
    monkeypatch.setattr(runtime_module, "_INLINE_STEP", 1)
    monkeypatch.setattr(runtime, "_write_budget", Budget(0, 1))
    before = _commits(fast)
    saved = await fast.save("s", {"n": 1}, id="x")
    assert _commits(fast) == before + 1
    page = await fast.list("s")
    # once: the interrupted inline try left nothing behind, not even a sequence
    assert [(c.id, c.sequence) for c in page.items] == [("x", 2), (page.items[1].id, 1)]
    assert saved.sequence == 2


async def test_writes_queued_on_the_writer_go_first(fast: SqliteCheckpointStore) -> None:
    """While the writer thread has calls, a new write queues behind them (and may
    group with them) instead of overtaking them on the event loop's thread."""
    runtime = _runtime(fast)
    writer = runtime._writer_worker()
    gate = threading.Event()
    held = asyncio.ensure_future(writer.call(lambda conn: gate.wait(10)))
    await asyncio.sleep(0)  # the held call is submitted: pending from here
    assert writer.pending == 1
    before = writer.commits
    save = asyncio.ensure_future(fast.save("s", {"n": 1}))
    await asyncio.sleep(0.05)
    assert not save.done()
    gate.set()
    await held
    await save
    assert writer.commits == before + 1


async def test_inline_commits_hand_wal_checkpoints_to_the_writer(
    fast: SqliteCheckpointStore, tmp_path: Path
) -> None:
    """The inline connection never checkpoints; the writer thread does, before every
    ``_CHECKPOINT_EVERY``-th inline commit, so the WAL stays about SQLite's own size
    (2,000 saves of ~1 KB without a checkpoint leave a WAL of ~48 MB, and one that
    runs beside the inline writes never lets SQLite start the WAL over)."""
    state = {"text": "x" * 1000}
    before = _commits(fast)
    for i in range(2000):
        await fast.save(f"s{i % 7}", state)
    await _runtime(fast)._writer_worker().call(lambda conn: None)  # after its queue
    # inline, but for a save whose BEGIN met a checkpoint's brief lock
    assert _commits(fast) - before < 20
    wal = tmp_path / "store.db-wal"
    assert wal.stat().st_size < 12 * 1024 * 1024


async def test_a_passive_checkpoint_runs_before_every_so_many_inline_commits(
    fast: SqliteCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[int] = []
    monkeypatch.setattr(runtime_module, "_CHECKPOINT_EVERY", 5)
    monkeypatch.setattr(runtime_module, "_passive_checkpoint", lambda conn: ran.append(os.getpid()))
    for i in range(12):
        await fast.save("s", {"n": i})
    await _runtime(fast)._writer_worker().call(lambda conn: None)
    assert len(ran) == 2


async def test_full_durability_and_inline_writes_off_always_use_the_writer(
    tmp_path: Path,
) -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("full", {"durability": "full"}),
        ("off", {"durability": "fast", "inline_writes": False}),
    ]
    for name, options in cases:
        directory = tmp_path / name
        directory.mkdir()
        store = await _open(directory, **options)
        try:
            before = _commits(store)
            saved = await store.save("s", {"n": 1})
            await store.update(saved.id, {"n": 2})
            await store.delete(saved.id)
            assert _commits(store) == before + 3, name
            assert _runtime(store)._inline_writer.held is None, name
        finally:
            await store.close()


async def test_a_large_state_is_written_on_the_writer_thread(
    fast: SqliteCheckpointStore,
) -> None:
    before = _commits(fast)
    await fast.save("s", b"x" * (64 * 1024 + 1))
    assert _commits(fast) == before + 1


async def test_close_leaves_every_inline_save_in_the_database_file(tmp_path: Path) -> None:
    store = await _open(tmp_path, durability="fast")
    ids = [(await store.save("s", {"n": i})).id for i in range(50)]
    await store.close()
    assert not (tmp_path / "store.db-wal").exists()  # checkpointed and removed
    raw = sqlite3.connect(tmp_path / "store.db")
    try:
        stored = [row[0] for row in raw.execute("SELECT id FROM statekeeper_checkpoints")]
    finally:
        raw.close()
    assert sorted(stored) == sorted(ids)
