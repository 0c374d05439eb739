"""statekeeper._runtime.threads.ThreadDoor: the file store's worker hop (a pool of
:class:`statekeeper._runtime.worker.Worker`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from statekeeper._runtime.threads import ThreadDoor


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name + "-")]


@contextlib.contextmanager
def _door(name: str, size: int = 4) -> Iterator[ThreadDoor]:
    """A door that is closed, and whose threads are gone, when the block ends."""
    door = ThreadDoor(name, size=size)
    try:
        yield door
    finally:
        door.close()
    _wait_gone(name)


def _wait_gone(name: str) -> None:
    deadline = time.monotonic() + 5
    while _threads(name) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _threads(name), _threads(name)


@pytest.mark.asyncio
async def test_runs_off_the_loop_thread_and_returns_results_and_errors() -> None:
    with _door("sk-test-door-a") as door:
        here = threading.get_ident()
        assert await door.run(threading.get_ident) != here
        assert await door.run(divmod, 7, 2) == (3, 1)
        with pytest.raises(ZeroDivisionError):
            await door.run(divmod, 1, 0)
        # an error does not stop the thread
        assert await door.run(lambda: "still here") == "still here"
        assert len(_threads("sk-test-door-a")) == 1  # one call at a time: one thread


@pytest.mark.asyncio
async def test_calls_run_concurrently_up_to_size_then_queue() -> None:
    gate = threading.Event()
    running: list[int] = []
    lock = threading.Lock()
    peak = 0

    def blocked(i: int) -> int:
        nonlocal peak
        with lock:
            running.append(i)
            peak = max(peak, len(running))
        gate.wait(5)
        with lock:
            running.remove(i)
        return i

    with _door("sk-test-door-b", size=3) as door:
        tasks = [asyncio.create_task(door.run(blocked, i)) for i in range(5)]
        deadline = time.monotonic() + 5
        while len(running) < 3 and time.monotonic() < deadline:  # noqa: ASYNC110 - threads
            await asyncio.sleep(0.01)
        assert len(running) == 3  # three threads, each busy; two calls wait their turn
        gate.set()
        assert await asyncio.gather(*tasks) == list(range(5))
        assert peak == 3
        assert len(_threads("sk-test-door-b")) == 3


@pytest.mark.asyncio
async def test_a_call_cancelled_before_it_starts_never_runs() -> None:
    gate = threading.Event()
    ran: list[str] = []
    with _door("sk-test-door-c", size=1) as door:
        first = asyncio.create_task(door.run(lambda: gate.wait(5) and ran.append("first")))
        await asyncio.sleep(0.05)  # the thread is busy with the first call
        second = asyncio.create_task(door.run(lambda: ran.append("second")))
        await asyncio.sleep(0.01)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        # a started call runs to its end, even if its caller gave up
        first.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await door.run(lambda: "after") == "after"
        assert ran == ["first"]


@pytest.mark.asyncio
async def test_close_lets_queued_calls_finish_and_the_door_opens_again() -> None:
    door = ThreadDoor("sk-test-door-d", size=1)
    task = asyncio.create_task(door.run(time.sleep, 0.05))
    await asyncio.sleep(0)
    door.close()
    await task  # queued before close: it ran
    _wait_gone("sk-test-door-d")
    try:
        assert await door.run(lambda: 5) == 5  # a store may be opened again
    finally:
        door.close()
    _wait_gone("sk-test-door-d")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_threads_of_its_own() -> None:
    door = ThreadDoor("sk-test-door-e")
    loop = asyncio.new_event_loop()
    try:
        parent = loop.run_until_complete(door.run(threading.get_ident))
        pid = os.fork()
        if pid == 0:  # the child: the parent's thread does not exist here
            code = 1
            try:
                child_loop = asyncio.new_event_loop()
                got = child_loop.run_until_complete(
                    asyncio.wait_for(door.run(lambda: os.getpid()), 5)
                )
                code = 0 if got == os.getpid() else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert loop.run_until_complete(door.run(threading.get_ident)) == parent
    finally:
        door.close()
        loop.close()
    _wait_gone("sk-test-door-e")


@pytest.mark.asyncio
async def test_a_file_store_dropped_unclosed_lets_its_threads_end(tmp_path: Path) -> None:
    import gc

    from statekeeper.backends.file import FileCheckpointStore

    def file_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("statekeeper-file-")]

    before = set(file_threads())
    store = FileCheckpointStore(tmp_path / "s")
    await store.open()
    await store.save("job", {"n": 1})
    assert set(file_threads()) - before
    del store  # never closed
    gc.collect()
    deadline = time.monotonic() + 5
    while set(file_threads()) - before and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    assert not set(file_threads()) - before
