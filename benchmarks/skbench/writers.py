"""Four writer processes saving to one stream of one store at the same time.

Each child opens its own handle on the store (its own connection, its own file
descriptors), waits at a barrier so that they all start together, then saves its
share. Throughput is all saves over the wall time from the first start to the
last finish. Afterwards the parent counts the stream: a store that lost a save or
raised "database is locked" shows it here rather than looking fast.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from .adapters.base import MAIN_STREAM, WRITERS_STREAM, Adapter, WriterSpec


@dataclass
class WriterResult:
    processes: int
    saves_each: int
    saved: int = 0
    errors: int = 0
    first_error: str | None = None
    wall: float = 0.0
    median_latency: float = 0.0
    counted: int | None = None
    problem: str | None = None
    latencies: list[float] = field(default_factory=list, repr=False)

    @property
    def throughput(self) -> float:
        return self.saved / self.wall if self.wall > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "processes": self.processes,
            "saves_each": self.saves_each,
            "saved": self.saved,
            "errors": self.errors,
            "first_error": self.first_error,
            "wall_s": self.wall,
            "throughput_per_s": self.throughput,
            "median_latency_s": self.median_latency,
            "counted": self.counted,
            "problem": self.problem,
        }


def _build(spec: WriterSpec) -> Adapter:
    module_name, _, attr = spec.factory.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    adapter: Adapter = factory(**spec.params)
    return adapter


async def _child(spec: WriterSpec, worker: int, saves: int, barrier: Any) -> dict[str, Any]:
    adapter = _build(spec)
    await adapter.attach()
    mode = adapter.default_mode().label
    latencies: list[float] = []
    errors = 0
    first_error = None
    try:
        barrier.wait(timeout=120)
        start = time.perf_counter()
        for k in range(saves):
            t0 = time.perf_counter()
            try:
                await adapter.save(WRITERS_STREAM, worker * 1_000_000 + k, mode)
            except Exception as exc:  # counted and reported, the run goes on
                errors += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"
                continue
            latencies.append(time.perf_counter() - t0)
        end = time.perf_counter()
    finally:
        await adapter.detach()
    return {
        "start": start,
        "end": end,
        "latencies": latencies,
        "errors": errors,
        "first_error": first_error,
    }


async def _bulk_child(
    spec: WriterSpec, state: dict[str, Any], items: list[tuple[str, int]]
) -> dict[str, Any]:
    adapter = _build(spec)
    adapter.import_state(state)
    await adapter.attach(adapter.populate_label())
    started = time.perf_counter()
    try:
        await adapter.populate(iter(items))
    finally:
        await adapter.detach()
    return {
        "ids": adapter.ids,
        "noise": adapter.noise,
        "state": adapter.export_state(),
        "seconds": time.perf_counter() - started,
    }


def _bulk_entry(
    spec: WriterSpec, state: dict[str, Any], items: list[tuple[str, int]], queue: Any
) -> None:
    try:
        queue.put(asyncio.run(_bulk_child(spec, state, items)))
    except BaseException as exc:
        queue.put({"fatal": f"{type(exc).__name__}: {exc}"})
        raise


class BulkLoad:
    """Populate one store from child processes while the parent does other work.

    Only the untimed bulk load runs this way: each store gets its own process (or
    ``adapter.bulk_processes`` of them, each with a slice of the plan), so the stores
    fill side by side on both cores instead of one after another.
    """

    def __init__(self, adapter: Adapter, items: list[tuple[str, int]]) -> None:
        spec = adapter.writer_spec()
        assert spec is not None, "only stores shared across processes load in a child"
        self.adapter = adapter
        self.items = len(items)
        ctx = mp.get_context("spawn")
        self.queue = ctx.Queue()
        count = max(1, adapter.bulk_processes)
        state = adapter.export_state()
        self.processes = [
            ctx.Process(target=_bulk_entry, args=(spec, state, items[w::count], self.queue))
            for w in range(count)
        ]
        for process in self.processes:
            process.start()

    def finish(self) -> float:
        """Wait for the children; fold their ids and state into the adapter; return
        the seconds the slowest one took."""
        reports = [self.queue.get(timeout=7200) for _ in self.processes]
        for process in self.processes:
            process.join(timeout=60)
        for report in reports:
            if "fatal" in report:
                raise RuntimeError(f"bulk load of {self.adapter.name} failed: {report['fatal']}")
        for report in reports:
            for ident in report["ids"]:
                self.adapter.track(MAIN_STREAM, ident)
            self.adapter.noise += report["noise"]
            self.adapter.import_state(report["state"])
        return max(float(report["seconds"]) for report in reports)


def _child_entry(spec: WriterSpec, worker: int, saves: int, barrier: Any, queue: Any) -> None:
    try:
        queue.put(asyncio.run(_child(spec, worker, saves, barrier)))
    except BaseException as exc:
        queue.put({"fatal": f"{type(exc).__name__}: {exc}"})
        raise


def run_writers(adapter: Adapter, processes: int, saves_each: int) -> WriterResult:
    """Run the workload against ``adapter``'s store; blocks until the children finish.

    ``perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for every process, so
    the children's start and end stamps can be compared.
    """
    result = WriterResult(processes, saves_each)
    spec = adapter.writer_spec()
    if spec is None:
        result.problem = "not shared across processes"
        return result
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes)
    queue = ctx.Queue()
    children = [
        ctx.Process(target=_child_entry, args=(spec, w, saves_each, barrier, queue))
        for w in range(processes)
    ]
    for child in children:
        child.start()
    reports = [queue.get(timeout=900) for _ in children]
    for child in children:
        child.join(timeout=60)
    fatal = [r["fatal"] for r in reports if "fatal" in r]
    if fatal:
        result.problem = fatal[0]
        return result
    result.wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    for report in reports:
        result.latencies.extend(report["latencies"])
        result.errors += report["errors"]
        result.first_error = result.first_error or report["first_error"]
    result.saved = len(result.latencies)
    if result.latencies:
        result.median_latency = statistics.median(result.latencies)
    return result
