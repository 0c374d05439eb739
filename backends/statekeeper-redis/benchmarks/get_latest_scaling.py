"""Targets of issue 8 on a real Redis: ``get_latest`` at 100k checkpoints in a stream
costs at most 2x its cost at 1k, and save / get_latest each take at most 3 round trips.

    uv run python backends/statekeeper-redis/benchmarks/get_latest_scaling.py \\
        [--url redis://127.0.0.1:6379/0] [--calls 2000]

Two streams of one store hold 1,000 and 100,000 checkpoints. Another store instance
fills them with ``save_many`` of 1,000 checkpoints per call (100k one-by-one saves
would take minutes); everything goes through the public API. Measurements of
the two streams alternate in rounds, so that load from other processes on the
machine hits both alike; the figure is the median wall time of one call.

Round trips are counted with Redis ``MONITOR``: the commands the server received
from a client (not from inside a script) that name this run's key prefix, while
each operation ran: a save right after another writer saved (its guess of the next
sequence is stale, so it pays one retry), a steady-state save, and a get_latest.
Everything the script created is deleted at the end (SCAN + UNLINK of its prefix).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import time
from typing import Any

import redis.asyncio as aioredis
from statekeeper_redis import RedisCheckpointStore

from statekeeper import NewCheckpoint


async def bulk_fill(url: str, prefix: str, stream: str, count: int) -> None:
    """Append ``count`` checkpoints to ``stream`` through another store instance (as
    another writer would), 1000 per ``save_many`` (one script call each)."""
    async with RedisCheckpointStore(url, key_prefix=prefix, allow_unsafe_durability=True) as w:
        for start in range(0, count, 1000):
            await w.save_many(
                [
                    NewCheckpoint(
                        stream=stream, state={"step": i, "pad": "x" * 200}, tags={"bench": "1"}
                    )
                    for i in range(start, min(start + 1000, count))
                ]
            )


async def median_latency(store: RedisCheckpointStore, stream: str, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await store.get_latest(stream)
        out.append(time.perf_counter() - t0)
    return out


async def count_round_trips(store: RedisCheckpointStore, url: str) -> dict[str, list[str]]:
    """The client commands naming our prefix that MONITOR saw during each operation."""
    monitor_client = aioredis.Redis.from_url(url)
    seen: dict[str, list[str]] = {}
    try:
        async with monitor_client.monitor() as monitor:
            marker = f"sk-bench-marker-{secrets.token_hex(4)}"

            async def collect() -> list[dict[str, Any]]:
                events = []
                while True:
                    event = await monitor.next_command()
                    if marker + "-end" in event["command"]:
                        return events
                    events.append(event)

            operations = {
                # the bulk fill wrote behind this store's back, like another writer
                "save_after_another_writer": lambda: store.save("s1k", {"step": "first"}),
                "save": lambda: store.save("s1k", {"step": "measured"}),
                "get_latest": lambda: store.get_latest("s1k"),
            }
            for name, operation in operations.items():
                task = asyncio.create_task(collect())
                await asyncio.sleep(0.2)  # let MONITOR start streaming
                await operation()
                await store.client.echo(marker + "-end")
                events = await asyncio.wait_for(task, 30)
                seen[name] = [
                    e["command"].split(" ")[0]
                    for e in events
                    if e.get("client_type") != "lua" and store.key_prefix in e["command"]
                ]
    finally:
        await monitor_client.aclose()
    return seen


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--calls", type=int, default=2000, help="get_latest calls per stream")
    args = parser.parse_args()
    prefix = f"sk-bench-{secrets.token_hex(4)}"
    store = RedisCheckpointStore(args.url, key_prefix=prefix, allow_unsafe_durability=True)
    try:
        async with store:
            t0 = time.perf_counter()
            await bulk_fill(args.url, prefix, "s1k", 1_000)
            await bulk_fill(args.url, prefix, "s100k", 100_000)
            fill_s = time.perf_counter() - t0
            small: list[float] = []
            large: list[float] = []
            rounds = 10
            for _ in range(rounds):  # alternate, so machine load hits both alike
                small += await median_latency(store, "s1k", args.calls // rounds)
                large += await median_latency(store, "s100k", args.calls // rounds)
            trips = await count_round_trips(store, args.url)
    finally:
        cleanup = aioredis.Redis.from_url(args.url)
        keys = [key async for key in cleanup.scan_iter(match="{" + prefix + "}:*", count=1000)]
        for i in range(0, len(keys), 500):
            await cleanup.unlink(*keys[i : i + 500])
        await cleanup.aclose()
    m_small, m_large = statistics.median(small), statistics.median(large)
    result = {
        "get_latest_median_us_1k": round(m_small * 1e6, 1),
        "get_latest_median_us_100k": round(m_large * 1e6, 1),
        "ratio_100k_over_1k": round(m_large / m_small, 3),
        "target_ratio_max": 2.0,
        "round_trips": {name: len(cmds) for name, cmds in trips.items()},
        "round_trip_commands": trips,
        "target_round_trips_max": 3,
        "fill_seconds": round(fill_s, 1),
        "calls_per_stream": len(small),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
