"""A child process of the concurrency tests.

``python redis_worker.py URL KEY_PREFIX NAME COUNT``: opens the store, prints
``ready``, waits for a line on stdin (so that all workers start together), then
runs COUNT rounds (fewer if a second line, ``stop``, arrives first) of

- one save of ``{"by": NAME, "i": round}`` to the stream ``shared``, and
- one compare-and-set increment of checkpoint ``counter`` (load, then
  ``update(if_match=etag)``, retried on ``PreconditionFailed``), which also writes
  ``"raced": True`` into the counter once this worker has lost a race (so that a
  reader can tell, while the workers run, that the increments really raced),

and prints one JSON line: ``{"seqs": [sequences in the order the saves returned],
"conflicts": increments that lost the race and were retried}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading

from statekeeper_redis import RedisCheckpointStore

from statekeeper.errors import PreconditionFailed


async def _increment(store: RedisCheckpointStore, name: str, raced: bool) -> int:
    conflicts = 0
    while True:
        cp = await store.load("counter")
        state = {"n": cp.state["n"] + 1, "by": name}
        if raced or conflicts or cp.state.get("raced"):
            state["raced"] = True
        try:
            await store.update("counter", state, if_match=cp.etag)
        except PreconditionFailed:
            conflicts += 1
        else:
            return conflicts


async def main(url: str, prefix: str, name: str, count: int) -> None:
    store = RedisCheckpointStore(url, key_prefix=prefix, allow_unsafe_durability=True)
    seqs: list[int] = []
    conflicts = 0
    async with store:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        # a second line (or the end of stdin) stops the rounds early; a daemon thread
        # reads it, so that a worker that runs all its rounds exits without one
        stop = threading.Event()
        threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
        for i in range(count):
            if stop.is_set():
                break
            cp = await store.save("shared", {"by": name, "i": i}, tags={"by": name})
            seqs.append(cp.sequence)
            conflicts += await _increment(store, name, conflicts > 0)
    print(json.dumps({"seqs": seqs, "conflicts": conflicts}), flush=True)


if __name__ == "__main__":
    url, prefix, name, count = sys.argv[1:5]
    asyncio.run(main(url, prefix, name, int(count)))
