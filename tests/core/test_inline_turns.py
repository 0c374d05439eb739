"""A task whose every store call runs inline on the event loop's thread (the file
store's and SQLite's reads, their fast saves) still gives the loop a turn: without
one, a reader in a loop kept every other task waiting, a save whose worker had
finished included (a history of 4 reader and 4 writer tasks on one SQLite store got
4 saves through in 3 seconds)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from statekeeper import BaseCheckpointStore
from statekeeper._runtime.inline import TURN_EVERY
from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.sql import SqlCheckpointStore

CALLS = 20 * TURN_EVERY


@pytest_asyncio.fixture(params=["file", "sqlite"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BaseCheckpointStore]:
    if request.param == "file":
        made: BaseCheckpointStore = FileCheckpointStore(tmp_path / "store", durability="fast")
    else:
        made = SqlCheckpointStore.from_url(f"sqlite:///{tmp_path / 'store.db'}", durability="fast")
    async with made:
        yield made


async def _turns_given(calls: Callable[[], Awaitable[object]]) -> int:
    """How many times another task ran while ``calls`` ran."""
    ran = 0

    async def other() -> None:
        nonlocal ran
        while True:
            await asyncio.sleep(0)
            ran += 1

    task = asyncio.create_task(other())
    await asyncio.sleep(0)  # it has started
    before = ran
    try:
        await calls()
    finally:
        task.cancel()
    return ran - before


@pytest.mark.asyncio
async def test_reads_that_run_inline_give_the_loop_a_turn(store: BaseCheckpointStore) -> None:
    cp = await store.save("s", {"n": 1})

    async def reads() -> None:
        for n in range(CALLS):
            if n % 2:
                await store.get_latest("s")
            else:
                await store.load(cp.id)

    assert await _turns_given(reads) >= CALLS // TURN_EVERY - 1


@pytest.mark.asyncio
async def test_fast_saves_that_run_inline_give_the_loop_a_turn(store: BaseCheckpointStore) -> None:
    async def saves() -> None:
        for n in range(CALLS):
            await store.save("s", {"n": n})

    assert await _turns_given(saves) >= CALLS // TURN_EVERY - 1
