"""PostgreSQL: the concurrent history (16 writers, 4 cursor readers, see
``test_histories.py``) while another application holds a transaction id open part
of the time, and two more readers page through every stream with cursors.

A transaction of another application must never hold back a listing of every
stream (the store's horizon comes from its own saves in flight only), so no page
of those walks may end short of a checkpoint acknowledged before it was read. A
listing that this store's own saves hold too long raises a retryable error; it is
recorded as failed and the walk starts over.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest
from reliability_support import FIGURES, Backend
from test_histories import run_history

from statekeeper.errors import StatekeeperError
from statekeeper.testing.history import History, HistoryRecorder, RecordingStore, check_history

pytestmark = pytest.mark.reliability

#: Seconds the other application's transaction stays open, then closed, in turn.
OPEN, CLOSED = 0.6, 0.3


async def _other_application(dsn: str, stop: threading.Event, holding: threading.Event) -> int:
    """Open a transaction with an xid, leave it idle, end it; again until ``stop``, and
    at least twice however slowly this thread runs. Sets ``holding`` once it first
    holds one. Returns how many times it held one open."""
    con = await asyncpg.connect(dsn)
    held = 0
    try:
        await con.execute("CREATE TEMP TABLE other_app(x int)")
        while not (stop.is_set() and held >= 2):
            tr = con.transaction()
            await tr.start()
            await con.execute("INSERT INTO other_app VALUES (1)")
            held += 1
            holding.set()
            await asyncio.sleep(OPEN)
            await tr.rollback()
            await asyncio.sleep(CLOSED)
    finally:
        await con.close()
    return held


async def _every_stream_reader(store: RecordingStore, seed: int, stop: threading.Event) -> int:
    """Walk every stream until ``stop``, and until one walk got through (a walk held back
    by saves in flight is retried; once the writers stop, none is)."""
    rng = random.Random(seed)
    walks = 0
    while not (stop.is_set() and walks >= 1):
        order = "asc" if rng.random() < 0.5 else "desc"
        try:
            # stream None: every stream (recording.walk passes it on to list())
            await store.walk(None, order=order, limit=rng.randint(2, 7), max_pages=12)  # type: ignore[arg-type]
            walks += 1
        except StatekeeperError:
            pass  # recorded as failed; held back by saves in flight, retryable
        await asyncio.sleep(0)
    return walks


def test_history_with_another_applications_transaction_open_part_of_the_time(
    backend_factory: Callable[..., Backend], tmp_path: Path, long_run: bool
) -> None:
    backend = backend_factory("postgres")
    dsn = backend.url.split("?", 1)[0].replace("postgresql+asyncpg://", "postgresql://")
    every = tmp_path / "every"
    every.mkdir()
    stop, holding = threading.Event(), threading.Event()
    side: list[tuple[int, list[int]]] = []

    async def alongside() -> None:
        recorders = [HistoryRecorder(every / f"every{i}.jsonl", f"every{i}") for i in range(2)]
        async with backend.opened() as raw:
            readers = [
                _every_stream_reader(RecordingStore(raw, rec), i, stop)
                for i, rec in enumerate(recorders)
            ]
            held, *walks = await asyncio.gather(_other_application(dsn, stop, holding), *readers)
        for rec in recorders:
            rec.close()
        side.append((held, walks))

    thread = threading.Thread(target=lambda: asyncio.run(alongside()))
    thread.start()
    try:
        # the history starts once the other application holds its transaction, so the
        # two overlap however slowly the thread starts (120 s: only a hang guard)
        for _ in range(1200):
            if holding.wait(0.1) or not thread.is_alive():
                break
        assert holding.is_set(), "the other application never opened its transaction"
        run_history(backend, tmp_path, duration=20.0 if long_run else 4.0)
    finally:
        stop.set()
        thread.join()
    # the side thread ran until these held, so they fail only if it died
    ((held, walks),) = side
    assert held >= 2, "the other application's transaction was hardly ever open"
    assert all(walks), f"a reader of every stream never finished a walk: {walks}"
    history = History.read(
        *sorted((tmp_path / "history").glob("*.jsonl")), *sorted(every.glob("*.jsonl"))
    )

    async def check() -> None:
        async with backend.opened() as store:
            report = await check_history(store, history)
        every_pages = [e for e in history.of("page") if e.args["stream"] is None]
        answered = sum(1 for e in every_pages if e.ok)
        assert answered, "no page of every stream was read"
        assert report.pages >= answered
        FIGURES["histories under a foreign transaction: pages of every stream checked"] += answered
        FIGURES["histories under a foreign transaction: pages held back (retryable)"] += (
            len(every_pages) - answered
        )

    asyncio.run(check())
