"""The save's id and etag come from tokens read ahead per thread (``_writes``).

They must stay what ``new_id()`` and ``new_etag()`` give (hex of the system's
randomness, 32 and 16 digits) and never repeat: not within a thread, not between
threads, and not between a process and a child it forks after reading ahead.
"""

from __future__ import annotations

import os
import re
import threading

import pytest

from statekeeper import open_store
from statekeeper._core import writes as _writes


def _take(n: int) -> list[str]:
    return [next(_writes._tokens.left, None) or _writes._refill_tokens() for _ in range(n)]


def test_tokens_are_48_hex_digits_and_never_repeat_in_a_thread() -> None:
    tokens = _take(5 * _writes._TOKENS_PER_READ + 3)
    assert all(re.fullmatch("[0-9a-f]{48}", t) for t in tokens)
    assert len(set(tokens)) == len(tokens)


def test_threads_never_share_a_token() -> None:
    results: list[list[str]] = []

    def work() -> None:
        results.append(_take(3 * _writes._TOKENS_PER_READ))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mine = _take(3 * _writes._TOKENS_PER_READ)
    every = [t for batch in results for t in batch] + mine
    assert len(results) == 4
    assert len(set(every)) == len(every)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_does_not_repeat_its_parents_tokens() -> None:
    _take(1)  # the parent holds tokens it has read ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the tokens it takes, then leave at once
        try:
            os.write(write, ",".join(_take(8)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read().split(",")
    os.waitpid(pid, 0)
    parent = _take(_writes._TOKENS_PER_READ)
    assert len(child) == 8
    assert not set(child) & set(parent)


@pytest.mark.asyncio
async def test_saves_get_distinct_ids_and_etags_of_the_usual_form() -> None:
    async with open_store("memory://") as store:
        saved = [await store.save("s", i) for i in range(2 * _writes._TOKENS_PER_READ + 1)]
    assert all(re.fullmatch("[0-9a-f]{32}", c.id) for c in saved)
    assert all(re.fullmatch("[0-9a-f]{16}", c.etag) for c in saved)
    assert len({c.id for c in saved}) == len({c.etag for c in saved}) == len(saved)
