"""Retention sweeps (SPEC S17), measured: a sweep over ``size`` checkpoints in
``streams`` streams on SQLite, the file store and PostgreSQL, with saves running
beside it.

Per store, in one run:

1. *build*: ``streams`` streams of ``size // streams`` checkpoints each (~1 KB
   states), saved with ``save_many`` in batches of 1,000 through a
   ``durability="fast"`` handle, then closed (untimed);
2. *quiet*: ``saves`` saves into a side stream, one at a time, each timed, on
   the store as built (the store the sweep will run on, at the same size);
3. *sweep*: ``sweep(policy=Retention(keep_last=1))`` (removes 90% at 10 per
   stream), with a task saving into a side stream one at a time, each save timed,
   for as long as the sweep runs: the saves' p50/p99 against the quiet ones';
4. *space*: SQLite's file size (database plus WAL, after close) before the sweep,
   after it, and after ``compact()``; the file store's bytes on disk before and
   after.

Every store is opened by URL as a user would, with ``durability="full"`` (the
default) for the timed saves and the sweep.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .adapters.statekeeper_stores import POSTGRES_URL
from .payload import make_state
from .timing import _quantile

__all__ = ["RetentionResults", "RetentionSettings", "run"]


@dataclass(frozen=True)
class RetentionSettings:
    size: int = 100_000
    streams: int = 10_000
    saves: int = 300
    only: tuple[str, ...] = ()


@dataclass
class RetentionResults:
    meta: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    stores: dict[str, dict[str, Any]] = field(default_factory=dict)
    loads: list[str] = field(default_factory=list)  # load averages as each phase began
    log: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
        self.log.append(message)

    def phase(self, name: str) -> None:
        self.loads.append(f"{name}: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def _urls(workdir: Path) -> dict[str, str]:
    prefix = f"skret{secrets.token_hex(4)}_"
    return {
        "sqlite": f"sqlite:///{workdir / 'sweep.db'}",
        "file": f"file://{workdir / 'sweep-files'}",
        "postgresql": f"{POSTGRES_URL}?table_prefix={prefix}",
    }


def _disk_bytes(url: str, workdir: Path) -> int | None:
    """What the store takes on disk (SQLite: the database and its WAL; the file
    store: every file under its root); ``None`` for a server."""
    if url.startswith("sqlite"):
        base = workdir / "sweep.db"
        return sum(p.stat().st_size for p in (base, Path(f"{base}-wal")) if p.exists())
    if url.startswith("file"):
        root = workdir / "sweep-files"
        return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return None


def _summary(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50": statistics.median(ordered),
        "p99": _quantile(ordered, 0.99),
    }


async def _timed_saves(
    save: Callable[[int], Awaitable[Any]], until: Callable[[int], bool]
) -> list[float]:
    samples: list[float] = []
    n = 0
    while not until(n):
        started = time.perf_counter()
        await save(n)
        samples.append(time.perf_counter() - started)
        n += 1
    return samples


async def _one(
    name: str, url: str, settings: RetentionSettings, workdir: Path, out: RetentionResults
) -> None:
    import statekeeper as sk

    cell: dict[str, Any] = out.stores.setdefault(name, {})
    state = make_state(1)
    out.phase(f"{name} build")
    started = time.perf_counter()
    async with sk.open_store(url, durability="fast") as store:
        for start in range(0, settings.size, 1000):
            await store.save_many(
                [
                    sk.NewCheckpoint(stream=f"thread-{n % settings.streams:05d}", state=state)
                    for n in range(start, min(start + 1000, settings.size))
                ]
            )
    cell["build_s"] = time.perf_counter() - started
    cell["checkpoints"], cell["streams"] = settings.size, settings.streams
    cell["disk_before"] = _disk_bytes(url, workdir)
    out.say(f"{name}: built {settings.size:,} in {cell['build_s']:.0f} s")

    async with sk.open_store(url) as store:
        out.phase(f"{name} quiet")
        quiet = await _timed_saves(
            lambda n: store.save("probe-quiet", state), lambda n: n >= settings.saves
        )
        cell["quiet"] = _summary(quiet)
        await store.delete_stream("probe-quiet")  # the sweep then removes 90% exactly
        out.phase(f"{name} sweep")
        sweep = asyncio.ensure_future(store.sweep(policy=sk.Retention(keep_last=1)))
        during = await _timed_saves(
            lambda n: store.save("probe-during", state), lambda n: sweep.done()
        )
        report = await sweep
        cell["during"] = _summary(during) if during else {"n": 0}
        cell["sweep"] = report.model_dump(mode="json")
        cell["removed_per_s"] = report.checkpoints_removed / report.seconds
        out.say(f"{name}: {report}")
    cell["disk_after"] = _disk_bytes(url, workdir)
    if name == "sqlite":
        async with sk.open_store(url) as store:
            started = time.perf_counter()
            cell["compact_bytes"] = await store.compact()
            cell["compact_s"] = time.perf_counter() - started
        cell["disk_compacted"] = _disk_bytes(url, workdir)
    if name == "postgresql":
        await _drop_tables(url)


async def _drop_tables(url: str) -> None:
    """Remove the run's PostgreSQL tables (its random prefix)."""
    import asyncpg  # type: ignore[import-untyped]

    prefix = url.rsplit("table_prefix=", 1)[1]
    conn = await asyncpg.connect(POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        names = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE $1", prefix + "%"
        )
        for row in names:
            await conn.execute(f'DROP TABLE IF EXISTS "{row[0]}" CASCADE')
    finally:
        await conn.close()


async def run(settings: RetentionSettings, workdir: Path, out: RetentionResults) -> None:
    for name, url in _urls(workdir).items():
        if settings.only and not any(o in name for o in settings.only):
            continue
        try:
            await _one(name, url, settings, workdir, out)
        except Exception as exc:  # reported in the section, never fatal
            out.stores.setdefault(name, {})["error"] = f"{type(exc).__name__}: {exc}"
            out.say(f"{name}: {type(exc).__name__}: {exc}")
