"""Issue 13's access paths, side by side in one run: positions, metadata filters, batches.

Every statekeeper store (memory, file, SQLite, and PostgreSQL when
``STATEKEEPER_TEST_POSTGRES_URL`` is set) gets one stream of ``size`` checkpoints
(~1 KB states, the same :func:`~skbench.payload.make_state` as the main run) plus
10% more over ten other streams, built with ``save_many`` in batches of
:data:`BUILD_BATCH` through the store's ``durability="fast"`` handle (the build is
untimed; measured writes use ``durability="full"``). One checkpoint in 100 of
every stream has ``metadata["source"] == "input"``, evenly spread; the rest say
``"loop"``.

Each ratio the issue targets is a pair of operations measured in the same
interleaved rounds, one call each (:func:`measure_round_robin`), so background
load on the shared machine falls on both sides alike. Before timing, every read
workload is checked once against the ids the build returned: a fast wrong answer
is reported as an error, not as a figure. The section a run writes is made by
:mod:`skbench.api_report`.
"""

from __future__ import annotations

import gc
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .adapters.base import open_adapter
from .adapters.statekeeper_stores import (
    FileStore,
    MemoryStore,
    PostgresStore,
    SqliteStore,
    StatekeeperAdapter,
)
from .payload import make_state
from .timing import Budget, Op, Stat, format_stat

MAIN = "api-main"
WRITES = "api-writes"
NOISE = tuple(f"api-noise-{i:02d}" for i in range(10))
PAGE = 20
BATCH = 100  # the load_many / save_many batch the targets name
#: Seeds the order of the ops in each round of :func:`measure_round_robin`.
ORDER_SEED = 15
BUILD_BATCH = 1000  # the largest save_many (MAX_BATCH)
MATCH = {"source": "input"}  # 1 checkpoint in 100
MATCH_EVERY = 100
ROTATE = 10  # cursor workloads walk over this many neighbouring ids

FIRST = "first page"
FILTERED = "filtered page"
LOADS = f"{BATCH} loads"
LOAD_MANY = f"load_many({BATCH})"
SAVE = "save"
SAVE_MANY = f"save_many({BATCH})"


def cursor_op(depth: int) -> str:
    return f"cursor_at + page @{_k(depth)}"


def _k(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 and n >= 1000 else str(n)


@dataclass
class ApiSettings:
    size: int
    noise: int
    depths: tuple[int, ...]
    read_budget: Budget
    load_budget: Budget
    write_budget: Budget
    only: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    """One ratio the issue names: ``numerator / denominator <= limit`` on ``stores``."""

    label: str
    numerator: str
    denominator: str
    limit: float | None  # None: reported, no target
    kinds: tuple[str, ...]  # store names the limit applies to; others are "no target"
    other_note: str = "no target"


def targets(depths: tuple[int, ...]) -> list[Target]:
    every = ("statekeeper memory", "statekeeper file", "statekeeper sqlite")
    every += ("statekeeper postgresql",)
    out = [
        Target(
            f"cursor_at + page of {PAGE} at depth {d:,}, against an unfiltered first page",
            cursor_op(d),
            FIRST,
            2.0,
            every,
        )
        for d in depths
    ]
    out.append(
        Target(
            f"page of {PAGE} filtered on metadata (1% match), against an unfiltered page",
            FILTERED,
            FIRST,
            3.0,
            ("statekeeper sqlite", "statekeeper postgresql"),
            "scans, no target",
        )
    )
    out.append(
        Target(
            f"save_many of {BATCH} at durability=full, against one save",
            SAVE_MANY,
            SAVE,
            5.0,
            ("statekeeper file", "statekeeper sqlite"),
        )
    )
    out.append(
        Target(f"load_many of {BATCH} ids, against {BATCH} loads", LOAD_MANY, LOADS, None, ())
    )
    return out


@dataclass
class ApiResults:
    meta: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    stores: dict[str, dict[str, Any]] = field(default_factory=dict)
    ops: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    loads: list[str] = field(default_factory=list)  # load averages as each phase began
    log: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
        self.log.append(message)

    def stat(self, store: str, op: str) -> Stat | None:
        cell = self.ops.get(store, {}).get(op, {})
        return Stat(**cell["stat"]) if "stat" in cell else None


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- the stores ------------------------------------------------------------------------


@dataclass
class Subject:
    """One store under test and what its build gave: ids in save order, the matches."""

    adapter: StatekeeperAdapter
    ids: list[str] = field(default_factory=list)
    matching: list[str] = field(default_factory=list)
    step: int = 0

    @property
    def name(self) -> str:
        return self.adapter.name

    @property
    def bulk(self) -> Any:
        return self.adapter.stores.get("fast", self.adapter.main)

    @property
    def full(self) -> Any:
        return self.adapter.main  # each store's default mode: "full" (memory: its only mode)


def adapter_classes(only: list[str]) -> list[type[StatekeeperAdapter]]:
    classes: list[type[StatekeeperAdapter]] = [MemoryStore, FileStore, SqliteStore]
    if os.environ.get("STATEKEEPER_TEST_POSTGRES_URL"):
        classes.append(PostgresStore)
    return [c for c in classes if not only or any(k in c.name.lower() for k in only)]


async def open_subjects(settings: ApiSettings, workdir: Path, results: ApiResults) -> list[Subject]:
    subjects = []
    if not os.environ.get("STATEKEEPER_TEST_POSTGRES_URL"):
        results.say("PostgreSQL left out: STATEKEEPER_TEST_POSTGRES_URL is not set")
    for cls in adapter_classes(settings.only):
        adapter, problem = await open_adapter(cls, workdir, results.say)
        if adapter is None:
            results.stores[cls.name] = {"unavailable": problem}
            continue
        caps = adapter.main.capabilities
        results.stores[cls.name] = {
            "backend": type(adapter.main).__name__,
            "atomic_batches": bool(getattr(caps, "atomic_batches", False)),
        }
        subjects.append(Subject(adapter))
        results.say(
            f"opened {cls.name} (atomic_batches={results.stores[cls.name]['atomic_batches']})"
        )
    return subjects


def _metadata(index: int, step: int) -> dict[str, Any]:
    return {"step": step, "source": "input" if index % MATCH_EVERY == 0 else "loop"}


def _plan(size: int, noise: int) -> list[tuple[str, int]]:
    """(stream, index within the stream) in save order: noise evenly among the main."""
    total = size + noise
    counts = dict.fromkeys((MAIN, *NOISE), 0)
    plan = []
    spread = 0
    for k in range(total):
        is_noise = (k + 1) * noise // total > k * noise // total
        stream = NOISE[spread % len(NOISE)] if is_noise else MAIN
        spread += is_noise
        plan.append((stream, counts[stream]))
        counts[stream] += 1
    return plan


async def build(subject: Subject, settings: ApiSettings, results: ApiResults) -> None:
    """Fill the store with ``save_many`` batches through its fast handle (untimed)."""
    from statekeeper import NewCheckpoint

    plan = _plan(settings.size, settings.noise)
    started = time.perf_counter()
    for start in range(0, len(plan), BUILD_BATCH):
        chunk = plan[start : start + BUILD_BATCH]
        items = []
        for stream, index in chunk:
            subject.step += 1
            items.append(
                NewCheckpoint(
                    stream=stream,
                    state=make_state(subject.step),
                    metadata=_metadata(index, subject.step),
                )
            )
        saved = await subject.bulk.save_many(items)
        for (stream, index), cp in zip(chunk, saved, strict=True):
            if stream == MAIN:
                subject.ids.append(cp.id)
                if index % MATCH_EVERY == 0:
                    subject.matching.append(cp.id)
    await subject.adapter.after_populate()
    spent = time.perf_counter() - started
    results.stores[subject.name]["build"] = {"checkpoints": len(plan), "seconds": spent}
    results.say(f"built {subject.name}: {len(plan):,} checkpoints in {spent:.1f} s")


# -- the workloads ---------------------------------------------------------------------


async def _check(subject: Subject, depths: tuple[int, ...]) -> dict[str, str]:
    """Each read workload once, against what the build returned; op -> problem."""
    store, ids = subject.full, subject.ids
    problems: dict[str, str] = {}
    page = await store.list(MAIN, limit=PAGE)
    if [c.id for c in page.items] != ids[::-1][:PAGE]:
        problems[FIRST] = "first page is not the newest 20"
    for depth in depths:
        at = len(ids) - depth
        cursor = await store.cursor_at(ids[at])
        got = [c.id for c in (await store.list(MAIN, limit=PAGE, after=cursor)).items]
        if got != ids[at - PAGE : at][::-1]:
            problems[cursor_op(depth)] = f"page after depth {depth} is not the 20 just older"
    got = [c.id for c in (await store.list(MAIN, limit=PAGE, metadata=MATCH)).items]
    if got != subject.matching[::-1][:PAGE]:
        problems[FILTERED] = "filtered page is not the newest 20 matches"
    wanted = ids[:: max(1, len(ids) // BATCH)][:BATCH]
    many = await store.load_many(wanted)
    if sorted(many) != sorted(wanted):
        problems[LOAD_MANY] = f"load_many returned {len(many)} of {len(wanted)} ids"
    return problems


def read_ops(subject: Subject, depths: tuple[int, ...]) -> dict[str, Op]:
    store, ids = subject.full, subject.ids

    async def first(i: int) -> int:
        return len((await store.list(MAIN, limit=PAGE)).items)

    def at_depth(depth: int) -> Op:
        async def op(i: int) -> int:
            cursor = await store.cursor_at(ids[len(ids) - depth - i % ROTATE])
            return len((await store.list(MAIN, limit=PAGE, after=cursor)).items)

        return op

    async def filtered(i: int) -> int:
        return len((await store.list(MAIN, limit=PAGE, metadata=MATCH)).items)

    ops: dict[str, Op] = {FIRST: first}
    ops.update({cursor_op(d): at_depth(d) for d in depths})
    ops[FILTERED] = filtered
    return ops


def load_ops(subject: Subject, reps: int) -> dict[str, Op]:
    store = subject.full
    rng = random.Random(13)
    sets = [rng.sample(subject.ids, BATCH) for _ in range(max(reps, 1) + 2)]

    async def loads(i: int) -> int:
        for ident in sets[i % len(sets)]:
            await store.load(ident)
        return BATCH

    async def load_many(i: int) -> int:
        return len(await store.load_many(sets[i % len(sets)]))

    return {LOADS: loads, LOAD_MANY: load_many}


def write_ops(subject: Subject, reps: int) -> dict[str, Op]:
    """Single saves and save_many batches into their own stream, inputs built beforehand
    (the call is timed, not the making of its arguments)."""
    from statekeeper import NewCheckpoint

    store = subject.full
    calls = reps + 2  # + the warm-up call

    def state(n: int) -> tuple[dict[str, Any], dict[str, Any]]:
        subject.step += 1
        return make_state(subject.step), _metadata(n, subject.step)

    singles = [state(n) for n in range(calls)]
    batches = []
    for b in range(calls):
        batch = []
        for n in range(BATCH):
            s, m = state(b * BATCH + n)
            batch.append(NewCheckpoint(stream=WRITES, state=s, metadata=m))
        batches.append(batch)

    async def save(i: int) -> Any:
        s, m = singles[i % calls]
        return await store.save(WRITES, s, metadata=m)

    async def save_many(i: int) -> Any:
        return await store.save_many(batches[i % calls])

    return {SAVE: save, SAVE_MANY: save_many}


async def measure_round_robin(
    ops: dict[str, Op], budget: Budget, *, warmup: int = 1
) -> dict[str, list[float] | str]:
    """:func:`skbench.timing.measure_interleaved` at its finest grain: one call of each
    op per round, so a burst of other work on the shared machine falls on both sides
    of a ratio, with the collector off while calls are timed.

    Why not the harness's own loop with one call per round: it runs ``gc.collect()``
    before each op's slice, and the first call after a collection is slower (~0.2 ms
    here, the interpreter's caches and free lists rebuilt), which at one call per slice
    would be added to every sample. The heap is frozen before this runs, and each
    phase runs a few thousand calls, so leaving cycles for the end costs little.
    ``budget.rounds`` is not used; ``reps``, ``seconds`` and ``min_reps`` are.

    Each round runs the ops in a new order (shuffled, seeded, so a run can be
    repeated): a call made right after another op's fsync pays for the file
    system's journal commit that the fsync started, and in a fixed order the same
    op would always be the one that pays (a save that followed a durable write
    measured up to 3x a save that followed a plain one, in the same run).
    """
    samples: dict[str, list[float]] = {name: [] for name in ops}
    spent = dict.fromkeys(ops, 0.0)
    errors: dict[str, str] = {}
    index = dict.fromkeys(ops, 0)

    def done(name: str) -> bool:
        taken = len(samples[name])
        return taken >= budget.reps or (spent[name] >= budget.seconds and taken >= budget.min_reps)

    gc.collect()
    gc.disable()
    try:
        for name, op in ops.items():
            for _ in range(warmup):
                try:
                    await op(index[name])
                except Exception as exc:  # a store that fails is reported, not fatal
                    errors[name] = f"{type(exc).__name__}: {exc}"
                    break
                index[name] += 1
        order = random.Random(ORDER_SEED)
        while active := [n for n in ops if n not in errors and not done(n)]:
            order.shuffle(active)
            for name in active:
                t0 = time.perf_counter_ns()
                try:
                    await ops[name](index[name])
                except Exception as exc:
                    errors[name] = f"{type(exc).__name__}: {exc}"
                    continue
                elapsed = (time.perf_counter_ns() - t0) / 1e9
                index[name] += 1
                samples[name].append(elapsed)
                spent[name] += elapsed
    finally:
        gc.enable()
        gc.collect()
    return {name: errors.get(name, samples[name]) for name in ops}


def _key(store: str, op: str) -> str:
    return f"{store}\t{op}"


async def measure(
    subjects: list[Subject],
    make: Callable[[Subject], dict[str, Op]],
    budget: Budget,
    results: ApiResults,
    phase: str,
    broken: dict[str, dict[str, str]],
) -> None:
    results.loads.append(f"{phase}: {_loadavg()}")
    ops: dict[str, Op] = {}
    for subject in subjects:
        for op, fn in make(subject).items():
            problem = broken.get(subject.name, {}).get(op)
            if problem:
                results.ops.setdefault(subject.name, {})[op] = {"error": f"wrong answer: {problem}"}
                continue
            ops[_key(subject.name, op)] = fn
    results.say(f"measure {phase}: {len(ops)} workloads, interleaved")
    measured = await measure_round_robin(ops, budget)
    for key, value in measured.items():
        store, op = key.split("\t")
        cell = results.ops.setdefault(store, {})
        if isinstance(value, str):
            cell[op] = {"error": value}
            results.say(f"  {store} {op}: ERROR {value}")
        elif value:
            cell[op] = {"stat": Stat.of(value).as_dict()}
            results.say(f"  {store} {op}: {format_stat(Stat.of(value))} (n={len(value)})")
        else:
            cell[op] = {"error": "no samples"}


async def run(settings: ApiSettings, workdir: Path, results: ApiResults) -> None:
    results.loads.append(f"start: {_loadavg()}")
    subjects = await open_subjects(settings, workdir, results)
    try:
        for subject in subjects:
            results.loads.append(f"build {subject.name}: {_loadavg()}")
            await build(subject, settings, results)
        broken = {}
        for subject in subjects:
            broken[subject.name] = await _check(subject, settings.depths)
            for op, problem in broken[subject.name].items():
                results.say(f"  {subject.name} {op}: WRONG ANSWER: {problem}")
        # 100k+ live records per in-process store make every collection slow; the
        # build's objects live for the whole run, so move them out of the collector's
        # way (for all stores alike) instead of letting pauses land in timed calls
        gc.collect()
        gc.freeze()
        depths = settings.depths
        await measure(
            subjects, lambda s: read_ops(s, depths), settings.read_budget, results, "pages", broken
        )
        reps = settings.load_budget.reps
        await measure(
            subjects, lambda s: load_ops(s, reps), settings.load_budget, results, "loads", broken
        )
        reps_w = settings.write_budget.reps
        await measure(
            subjects,
            lambda s: write_ops(s, reps_w),
            settings.write_budget,
            results,
            "saves",
            broken,
        )
    finally:
        for subject in subjects:
            try:
                await subject.adapter.close()
            except Exception as exc:  # cleanup must not hide the run's own error
                results.say(f"cleanup of {subject.name} failed: {exc}")
        results.loads.append(f"end: {_loadavg()}")
