"""The run: open every store, grow them through the sizes, measure each workload.

Stores grow in place: populated to 1k, measured, grown to 10k, measured, and so on,
each time with as many checkpoints again spread over ten other streams (the
noise). At each size every workload is measured for all stores in interleaved
rounds (see :mod:`skbench.timing`).

Time budgets keep the run bounded and are reported, never silent: before a size,
a store whose population or ``get_latest`` is projected (from the size before,
linearly) to exceed its budget is left out at that size and above; a workload
whose call is projected over the per-call budget is skipped at that size.
"""

from __future__ import annotations

import gc
import importlib
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .adapters.base import (
    MAIN_STREAM,
    NOISE_STREAMS,
    WRITERS_STREAM,
    Adapter,
    StoreUnavailable,
    open_adapter,
)
from .floors import Floors, dict_lookup_seconds
from .timing import Budget, Op, Stat, format_seconds, measure_interleaved
from .writers import BulkLoad, run_writers

READ_OPS = ("get_latest", "load", "first_page", "middle_page", "list_all")
BULK_MIN = 5_000  # below this a child process costs more than it saves
FLOOR = "floor: "  # op-dict key prefix: floors run in the same rounds as the stores
ADAPTER_MODULES = (
    "skbench.adapters.statekeeper_stores",
    "skbench.adapters.langgraph_peers",
    "skbench.adapters.maf_peers",
)


@dataclass
class Settings:
    sizes: list[int]
    noise_ratio: float
    op_budget: Budget
    list_budget: Budget
    save_budget: Budget
    call_cap: float  # seconds per call above which a workload is skipped at a size
    list_cap: float  # the same for listing a whole stream
    populate_cap: float  # seconds to populate one size above which a store is left out
    writer_processes: int
    writer_saves: int
    rss_pass: bool = True  # also measure peak RSS during a separate, untraced listing
    #: perf_counter() time by which the run should be done; a size whose population
    #: is projected to eat more than half of what is left is left out (with the reason)
    deadline: float | None = None
    only: list[str] = field(default_factory=list)


@dataclass
class Results:
    """Everything measured, JSON-able (the report and the plots read this)."""

    stores: dict[str, dict[str, Any]] = field(default_factory=dict)
    ops: dict[str, dict[str, dict[int, dict[str, Any]]]] = field(default_factory=dict)
    floors: dict[str, dict[int | str, dict[str, Any]]] = field(default_factory=dict)
    memory: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    writers: dict[str, dict[str, Any]] = field(default_factory=dict)
    round_trips: dict[str, Any] = field(default_factory=dict)
    record_bytes: int = 0
    populate: dict[str, dict[int, float]] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def record(self, op: str, row: str, size: int, value: list[float] | str) -> None:
        cell = self.ops.setdefault(op, {}).setdefault(row, {})
        if isinstance(value, str):
            cell[size] = {"error": value}
        elif value:
            cell[size] = {"stat": Stat.of(value).as_dict()}
        else:
            cell[size] = {"error": "no samples"}

    def skip(self, op: str, row: str, size: int, reason: str) -> None:
        self.ops.setdefault(op, {}).setdefault(row, {})[size] = {"skipped": reason}

    def record_floor(self, name: str, size: int, value: list[float] | str) -> None:
        cell = {"error": value} if isinstance(value, str) else {"stat": Stat.of(value).as_dict()}
        self.floors.setdefault(name, {})[size] = cell

    def floor_median(self, name: str, size: int) -> float | None:
        cells = self.floors.get(name, {})
        stat = (cells.get(size) or cells.get("all") or {}).get("stat")
        return float(stat["median"]) if stat else None

    def median(self, op: str, row: str, size: int) -> float | None:
        cell = self.ops.get(op, {}).get(row, {}).get(size, {})
        stat = cell.get("stat")
        return float(stat["median"]) if stat else None


def say(results: Results, message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)
    results.log.append(message)


def adapter_classes() -> list[type[Adapter]]:
    classes: list[type[Adapter]] = []
    for name in ADAPTER_MODULES:
        classes.extend(importlib.import_module(name).ALL)
    return classes


def _plan(adapter: Adapter, main: int, noise: int) -> Iterator[tuple[str, int]]:
    need_main = max(0, main - adapter.count)
    need_noise = max(0, noise - adapter.noise)
    for i in range(max(need_main, need_noise)):
        if i < need_main:
            adapter.steps += 1
            yield MAIN_STREAM, adapter.steps
        if i < need_noise:
            adapter.steps += 1
            yield NOISE_STREAMS[adapter.noise % len(NOISE_STREAMS)], adapter.steps


def _row(adapter: Adapter, mode: str) -> str:
    return adapter.name if len(adapter.save_modes()) == 1 else f"{adapter.name} ({mode})"


async def open_stores(settings: Settings, workdir: Path, results: Results) -> list[Adapter]:
    from importlib.metadata import PackageNotFoundError, version

    opened: list[Adapter] = []
    for cls in adapter_classes():
        if settings.only and not any(key in cls.name.lower() for key in settings.only):
            continue
        try:
            dist_version = version(cls.distribution)
        except PackageNotFoundError:
            dist_version = None
        info: dict[str, Any] = {
            "family": cls.family,
            "kind": cls.kind,
            "distribution": cls.distribution,
            "version": dist_version,
            "notes": dict(cls.notes),
        }
        results.stores[cls.name] = info
        adapter, problem = await open_adapter(cls, workdir, lambda text: say(results, text))
        if adapter is None:
            info["unavailable"] = problem
            continue
        info["modes"] = [vars(mode) for mode in adapter.save_modes()]
        info["describe"] = adapter.describe()
        info["cross_process"] = adapter.cross_process
        opened.append(adapter)
        say(results, f"opened {cls.name}")
    return opened


def record_floor_constants(results: Results, record_bytes: bytes) -> None:
    """The floors that need no interleaving: the record size and a dict lookup."""
    lookup = dict_lookup_seconds()  # best of 5 timeit repeats: a floor, not a spread
    results.floors["dict lookup"] = {"all": {"stat": Stat(lookup, lookup, lookup, n=5).as_dict()}}
    results.record_bytes = len(record_bytes)


async def run_writer_workload(settings: Settings, workdir: Path, results: Results) -> None:
    """4 processes on one stream of a fresh, empty store of each kind."""
    for cls in adapter_classes():
        if not cls.cross_process or cls.name not in results.stores:
            continue
        if results.stores[cls.name].get("unavailable"):
            continue
        adapter = cls()
        place = workdir / f"writers-{cls.__name__}"
        place.mkdir()
        try:
            await adapter.open(place)
        except (StoreUnavailable, ImportError) as exc:
            results.writers[cls.name] = {"problem": str(exc)}
            continue
        try:
            say(results, f"writers: {cls.name}")
            outcome = run_writers(adapter, settings.writer_processes, settings.writer_saves)
            if outcome.problem is None:
                outcome.counted = await adapter.count_stream(WRITERS_STREAM)
            results.writers[cls.name] = outcome.as_dict()
            say(
                results,
                f"  {outcome.throughput:.0f} saves/s, {outcome.errors} errors, "
                f"{outcome.counted} of {outcome.processes * outcome.saves_each} counted",
            )
        finally:
            await adapter.close()


async def run_sizes(
    settings: Settings, adapters: list[Adapter], floors: Floors, results: Results
) -> None:
    live = list(adapters)
    previous: int | None = None
    for size in settings.sizes:
        noise = int(size * settings.noise_ratio)
        live = [a for a in live if _fits(settings, a, size, noise, previous, results)]
        if not live:
            break
        await _populate(live, size, noise, results)
        await _measure_reads(settings, live, size, previous, floors, results)
        await _measure_memory(settings, live, size, results)
        await _measure_saves(settings, live, size, floors, results)
        previous = size


async def _populate(live: list[Adapter], size: int, noise: int, results: Results) -> None:
    """Bulk-load every store to ``size`` (+ noise): shared stores each in a child
    process, side by side, while the in-process stores fill here."""
    started = time.perf_counter()
    loads: list[tuple[Adapter, BulkLoad]] = []
    for adapter in live:
        items = list(_plan(adapter, size, noise))
        if adapter.writer_spec() is not None and len(items) >= BULK_MIN:
            loads.append((adapter, BulkLoad(adapter, items)))
            continue
        t0 = time.perf_counter()
        await adapter.populate(iter(items))
        _log_population(results, adapter, size, len(items), time.perf_counter() - t0)
    for adapter, load in loads:
        _log_population(results, adapter, size, load.items, load.finish())
    for adapter in live:
        await adapter.after_populate()
    say(results, f"N={size}: populated in {time.perf_counter() - started:.1f} s")


def _log_population(
    results: Results, adapter: Adapter, size: int, added: int, spent: float
) -> None:
    results.populate.setdefault(adapter.name, {})[size] = spent / max(added, 1)
    say(results, f"N={size}: {adapter.name} +{added} in {spent:.1f} s")


def _fits(
    settings: Settings,
    adapter: Adapter,
    size: int,
    noise: int,
    previous: int | None,
    results: Results,
) -> bool:
    if previous is None:
        return True
    scale = size / previous
    reasons = []
    per_save = results.populate.get(adapter.name, {}).get(previous)
    cap, what = settings.populate_cap, "population budget"
    if settings.deadline is not None:
        left = 0.5 * (settings.deadline - time.perf_counter())
        if left < cap:
            cap, what = max(left, 0.0), "share of the run's remaining time"
    if per_save is not None:
        projected = per_save * ((size - adapter.count) + (noise - adapter.noise))
        if projected > cap:
            reasons.append(
                f"populating to N={size} projected at {projected:.0f} s "
                f"({format_seconds(per_save)}/save), over the {cap:.0f} s {what}"
            )
    latest = results.median("get_latest", adapter.name, previous)
    if latest is not None and latest * scale > settings.call_cap:
        reasons.append(
            f"get_latest took {format_seconds(latest)} at N={previous}, projected "
            f"{format_seconds(latest * scale)} at N={size}, over the "
            f"{format_seconds(settings.call_cap)} per-call budget"
        )
    if not reasons:
        return True
    reason = "; ".join(reasons)
    say(results, f"leave out {adapter.name} from N={size}: {reason}")
    for op in (*READ_OPS, "save"):
        for mode in adapter.save_modes() if op == "save" else [None]:
            row = _row(adapter, mode.label) if mode else adapter.name
            results.skip(op, row, size, f"left out: {reason}")
    results.memory.setdefault(adapter.name, {})[size] = {"skipped": reason}
    return False


def _op_for(adapter: Adapter, op: str, token: Any) -> Op:
    if op == "get_latest":
        return lambda i: adapter.get_latest(MAIN_STREAM)
    if op == "load":
        ids = adapter.ids
        return lambda i: adapter.load(MAIN_STREAM, ids[(i * 7919 + 13) % len(ids)])
    if op == "first_page":
        return lambda i: adapter.first_page(MAIN_STREAM)
    if op == "middle_page":
        return lambda i: adapter.middle_page(MAIN_STREAM, token)
    if op == "list_all":
        return lambda i: adapter.list_all(MAIN_STREAM)
    raise ValueError(op)


async def _measure_reads(
    settings: Settings,
    live: list[Adapter],
    size: int,
    previous: int | None,
    floors: Floors,
    results: Results,
) -> None:
    tokens = {}
    for adapter in live:
        tokens[adapter.name] = await adapter.prepare_middle(MAIN_STREAM)
    for op in READ_OPS:
        budget = settings.list_budget if op == "list_all" else settings.op_budget
        ops: dict[str, Op] = {}
        cap = settings.list_cap if op == "list_all" else settings.call_cap
        for adapter in live:
            prior = results.median(op, adapter.name, previous) if previous else None
            if prior is not None and previous is not None and prior * size / previous > cap:
                projected = prior * size / previous
                results.skip(
                    op,
                    adapter.name,
                    size,
                    f"{format_seconds(prior)} at N={previous}, projected "
                    f"{format_seconds(projected)} per call, over the "
                    f"{format_seconds(cap)} per-call budget",
                )
                continue
            ops[adapter.name] = _op_for(adapter, op, tokens[adapter.name])
        say(results, f"N={size}: {op} x {len(ops)} stores")
        if op == "get_latest":
            ops.update({FLOOR + name: floor for name, floor in floors.read_ops.items()})
        # a whole listing warms its own caches; a warm-up call would only double its cost
        warmup = 0 if op == "list_all" else 1
        _store(results, op, size, await measure_interleaved(ops, budget, warmup=warmup))


def _rss_kib(field_name: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_rss_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


async def _measure_memory(
    settings: Settings, live: list[Adapter], size: int, results: Results
) -> None:
    """Peak memory of one full listing: Python heap (tracemalloc) and process RSS."""
    for adapter in live:
        cell = results.ops.get("list_all", {}).get(adapter.name, {}).get(size, {})
        if "stat" not in cell:
            reason = cell.get("skipped") or cell.get("error") or "list_all not measured"
            results.memory.setdefault(adapter.name, {})[size] = {"skipped": reason}
            continue
        rss_delta = None
        if settings.rss_pass:
            gc.collect()
            rss_ok = _reset_rss_peak()
            rss_before = _rss_kib("VmRSS")
            await adapter.list_all(MAIN_STREAM)
            hwm = _rss_kib("VmHWM")
            rss_delta = (hwm - rss_before) * 1024 if rss_ok and hwm and rss_before else None
        gc.collect()
        tracemalloc.start()
        try:
            await adapter.list_all(MAIN_STREAM)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        results.memory.setdefault(adapter.name, {})[size] = {
            "tracemalloc_peak": peak,
            "rss_peak_delta": rss_delta,
        }
    say(results, f"N={size}: peak memory while listing measured")


async def _measure_saves(
    settings: Settings, live: list[Adapter], size: int, floors: Floors, results: Results
) -> None:
    ops: dict[str, Op] = {}
    for adapter in live:
        for mode in adapter.save_modes():

            def op(i: int, adapter: Adapter = adapter, label: str = mode.label) -> Any:
                adapter.steps += 1
                return adapter.save(MAIN_STREAM, adapter.steps, label)

            ops[_row(adapter, mode.label)] = op
    say(results, f"N={size}: save x {len(ops)} rows, with the write floors")
    ops.update({FLOOR + name: floor for name, floor in floors.write_ops.items()})
    _store(results, "save", size, await measure_interleaved(ops, settings.save_budget))


def _store(results: Results, op: str, size: int, measured: dict[str, list[float] | str]) -> None:
    for row, value in measured.items():
        if row.startswith(FLOOR):
            results.record_floor(row[len(FLOOR) :], size, value)
        else:
            results.record(op, row, size, value)
        if isinstance(value, str):
            say(results, f"  {row}: ERROR {value}")


async def count_redis_round_trips(adapters: list[Adapter], results: Results) -> None:
    """Client-side count of network round trips per save and per get_latest.

    Every request redis.asyncio sends goes through ``send_packed_command`` once
    (a pipeline or a script call is one), so its call count is the round trips.
    """
    target = next((a for a in adapters if a.name == "statekeeper redis"), None)
    if target is None:
        return
    from redis.asyncio.connection import AbstractConnection

    original = AbstractConnection.send_packed_command
    calls = 0

    async def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await original(self, *args, **kwargs)

    AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        reps = 50
        for op in ("save", "get_latest"):
            calls = 0
            for _ in range(reps):
                if op == "save":
                    target.steps += 1
                    await target.save(MAIN_STREAM, target.steps, target.default_mode().label)
                else:
                    await target.get_latest(MAIN_STREAM)
            results.round_trips[op] = calls / reps
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
    say(results, f"redis round trips per call: {results.round_trips}")
