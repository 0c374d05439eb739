"""The features' costs: encryption at rest, telemetry, retention sweeps and the
command line's start-up.

- ``encryption/<op> <size>/<backend>-<plaintext|encrypted>``: ``save`` and
  ``get_latest`` of a 1 KB and a 100 KB state, a plaintext store beside one with
  ``encryption=Keyring(...)`` (memory, SQLite, file, PostgreSQL); and
  ``encryption/<seal|open> <size>/envelope``, the envelope alone on the encoded state.
- ``telemetry/<op>/<backend>-<off|on>``: ``save``, ``get_latest`` and ``list`` (a
  page of 20) with telemetry off (the default) and on, with the OpenTelemetry SDK and
  a span exporter that drops every span.
- ``retention/sweep/<backend>``: ``sweep(policy=Retention(keep_last=1))`` over a
  store of :func:`retention_size` checkpoints in a tenth as many streams, rebuilt
  (untimed) before each sweep; pyperf's value is one sweep.
- ``retention/save-<quiet|during-sweep>/<backend>``: one save into a side stream per
  pyperf value (so its percentiles are the saves'), on such a store as built, or
  while a sweep of it runs in the same event loop (a new store and sweep whenever
  the last sweep ends).
- ``retention/space/<backend>``, a count: its benchmarks
  ``retention/space-<before|swept|compacted>/<backend>`` are the bytes of every file
  of a SQLite or file store after closing it, as built, after the sweep, and after
  ``compact()``.
- ``startup/<help|latest>``: ``statekeeper --help`` and ``statekeeper latest`` on a
  10-checkpoint SQLite store, each a whole process, timed by pyperf's ``command``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .harness import Context, Op, Timer, Workload, checked
from .payload import _WORDS, make_state
from .subjects import POSTGRES_URL, reachable, server_name

BACKENDS = ("memory", "sqlite", "file", "postgresql")
TELEMETRY_BACKENDS = ("memory", "sqlite", "file")
TELEMETRY_OPS = ("save", "get_latest", "list")
SIZES = {"1KB": 1, "100KB": 100}
RETENTION_BACKENDS = ("sqlite", "file", "postgresql")
#: Saves per worker process in the saves-by-a-sweep workloads (one per value).
RETENTION_SAVES = 200


def retention_size(quick: bool) -> int:
    return 200 if quick else 20_000


def big_state(kb: int) -> dict[str, Any]:
    """The ~1 KB state, its messages repeated to about ``kb`` KB."""
    state = make_state(1)
    state["notes"] = [" ".join(_WORDS)] * (kb * 6 if kb > 1 else 0)
    return state


async def open_ours(ctx: Context, backend: str, place: Path | None = None, **options: Any) -> Any:
    """An opened store of ``backend`` in ``place`` (a new directory if ``None``;
    PostgreSQL: tables named after it), durability full unless ``options`` say."""
    import statekeeper

    place = place or ctx.place(f"{backend}-store")
    if backend == "postgresql":
        reachable(POSTGRES_URL)
        url = POSTGRES_URL
        options["table_prefix"] = server_name(place) + "_"
    else:
        url = {"memory": "memory://", "sqlite": f"sqlite:///{place}/s.db"}.get(
            backend, f"file://{place}/s"
        )
    if backend != "memory":
        options.setdefault("durability", "full")
    store = statekeeper.open_store(url, **options)
    await store.open()
    ctx.closers.append(store.close)
    return store


def _needs(backend: str) -> tuple[str, ...]:
    return ("asyncpg", "postgres") if backend == "postgresql" else ()


def _encryption(op: str, size: str, backend: str, variant: str) -> Workload:
    async def make(ctx: Context) -> Op:
        import statekeeper

        options: dict[str, Any] = {}
        if variant == "encrypted":
            key = statekeeper.Keyring({"bench-1": os.urandom(32)}, active="bench-1")
            options["encryption"] = key
        store = await open_ours(ctx, backend, **options)
        state = big_state(SIZES[size])
        await store.save("s", state)
        if op == "save":

            async def save() -> Any:
                return await store.save("s", state, metadata={"step": 1})

            return save

        async def latest() -> Any:
            return await store.get_latest("s")

        return await checked(latest, lambda cp: cp.state == state, op)

    name = f"encryption/{op} {size}/{backend}-{variant}"
    return Workload(name, make, needs=_needs(backend))


def _envelope(op: str, size: str) -> Workload:
    async def make(ctx: Context) -> Op:
        import statekeeper
        from statekeeper.encryption.envelope import Sealer

        codec = statekeeper.open_store("memory://").codec
        data = codec.encode(big_state(SIZES[size]))
        keys = statekeeper.Keyring({"bench-1": os.urandom(32)}, active="bench-1")
        sealer = Sealer(keys, "store-0123456789abcdef", metadata=False)
        ident, stream, meta = "0193f0c2a1b27c3d9e4f5a6b7c8d9e0f", "s", {"step": 1}
        sealed, envelope = sealer.seal(ident, stream, codec.name, data, {}, meta)

        async def seal() -> Any:
            return sealer.seal(ident, stream, codec.name, data, {}, meta)

        async def unseal() -> Any:
            return sealer.open(ident, stream, sealed, envelope).state

        if op == "seal":
            return seal
        return await checked(unseal, lambda got: got == data, op)

    return Workload(f"encryption/{op} {size}/envelope", make)


def _telemetry(op: str, backend: str, side: str) -> Workload:
    async def make(ctx: Context) -> Op:
        import statekeeper

        options: dict[str, Any] = {"durability": "fast"} if backend != "memory" else {}
        if side == "on":
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import (
                SimpleSpanProcessor,
                SpanExporter,
                SpanExportResult,
            )

            class Nothing(SpanExporter):
                def export(self, spans: Any) -> SpanExportResult:
                    return SpanExportResult.SUCCESS

            spans = TracerProvider()
            spans.add_span_processor(SimpleSpanProcessor(Nothing()))
            metrics = MeterProvider(metric_readers=[InMemoryMetricReader()])
            options["telemetry"] = statekeeper.Telemetry(
                tracer_provider=spans, meter_provider=metrics
            )
        store = await open_ours(ctx, backend, **options)
        state = make_state(1)
        for _ in range(40):
            await store.save("s", state)
        calls = {
            "save": lambda: store.save("s", state),
            "get_latest": lambda: store.get_latest("s"),
            "list": lambda: store.list("s", limit=20),
        }
        call = calls[op]

        async def timed() -> Any:
            return await call()

        return timed

    needs = ("opentelemetry.sdk",) if side == "on" else ()
    return Workload(f"telemetry/{op}/{backend}-{side}", make, needs=needs)


async def fill_streams(store: Any, size: int) -> None:
    """``size`` checkpoints of the ~1 KB state in ``size // 10`` streams, 10 each,
    saved with ``save_many`` 1,000 at a time (untimed)."""
    import statekeeper

    state = make_state(1)
    items = [
        statekeeper.NewCheckpoint(stream=f"s{i % (size // 10)}", state=state) for i in range(size)
    ]
    for at in range(0, size, 1000):
        await store.save_many(items[at : at + 1000])


def _retention(backend: str, size: int) -> Workload:
    async def timer(ctx: Context) -> Timer:
        import statekeeper

        async def sweeps(loops: int) -> float:
            spent = 0.0
            for _ in range(loops):
                store = await open_ours(ctx, backend, durability="fast")
                await fill_streams(store, size)
                start = time.perf_counter()
                report = await store.sweep(policy=statekeeper.Retention(keep_last=1))
                spent += time.perf_counter() - start
                if report.checkpoints_removed != size - size // 10:
                    raise AssertionError(f"the sweep removed {report.checkpoints_removed}")
                await store.close()
            return spent

        return sweeps

    return Workload(f"retention/sweep/{backend}", timer=timer, needs=_needs(backend), heavy=True)


def _cancel(task: asyncio.Future[Any]) -> Callable[[], Awaitable[None]]:
    async def cancel() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return cancel


def _saves_by_sweep(backend: str, size: int, during: bool) -> Workload:
    """Saves into a side stream of a filled store (built at durability fast, then
    reopened at full), each timed alone: while ``sweep(policy=Retention(keep_last=1))``
    runs on it (``during``), or with nothing else running."""

    async def timer(ctx: Context) -> Timer:
        import statekeeper

        state = make_state(1)
        current: dict[str, Any] = {}

        async def ready() -> Any:
            """The store to save to: a new one when a sweep has ended (its report
            checked), with its own sweep started."""
            sweep = current.get("sweep")
            if current and (sweep is None or not sweep.done()):
                return current["store"]
            if sweep is not None:
                report = await sweep
                if report.checkpoints_removed < size - size // 10:
                    raise AssertionError(f"the sweep removed {report.checkpoints_removed}")
                await current["store"].close()
            place = ctx.place(f"{backend}-store")
            built = await open_ours(ctx, backend, place=place, durability="fast")
            await fill_streams(built, size)  # no sync per batch: only the saves are timed
            await built.close()
            current["store"] = store = await open_ours(ctx, backend, place=place)
            if during:
                policy = statekeeper.Retention(keep_last=1)
                current["sweep"] = asyncio.ensure_future(store.sweep(policy=policy))
                ctx.closers.append(_cancel(current["sweep"]))  # before the store closes
            return store

        async def saves(loops: int) -> float:
            spent = 0.0
            for _ in range(loops):
                store = await ready()
                start = time.perf_counter()
                await store.save("side", state)
                spent += time.perf_counter() - start
            return spent

        return saves

    name = f"retention/save-{'during-sweep' if during else 'quiet'}/{backend}"
    return Workload(name, timer=timer, needs=_needs(backend), heavy=True, per_call=RETENTION_SAVES)


def disk_bytes(place: Path) -> int:
    """The bytes of every file under ``place``."""
    return sum(p.stat().st_size for p in place.rglob("*") if p.is_file())


def _space(backend: str, size: int) -> Workload:
    """What a store of ``size`` checkpoints takes on disk, closed, as built, after a
    sweep that removes 90%, and after ``compact()``."""

    async def count(ctx: Context) -> dict[str, tuple[float, str]]:
        import statekeeper

        place = ctx.place(f"{backend}-space")
        out: dict[str, tuple[float, str]] = {}
        for step in ("before", "swept", "compacted"):
            store = await open_ours(ctx, backend, place=place)
            if step == "before":
                await fill_streams(store, size)
            elif step == "swept":
                await store.sweep(policy=statekeeper.Retention(keep_last=1))
            else:
                await store.compact()
            await store.close()
            out[f"retention/space-{step}/{backend}"] = (disk_bytes(place), "byte")
        return out

    return Workload(f"retention/space/{backend}", count=count)


def _startup(what: str) -> Workload:
    def command(ctx: Context) -> list[str]:
        cli = [str(Path(sys.executable).with_name("statekeeper"))]  # the console script
        if what == "help":
            return [*cli, "--help"]
        place = ctx.scratch / "fixtures" / "startup"
        url = f"sqlite:///{place / 'cli.db'}"
        if not (place / "ready").exists():
            place.mkdir(parents=True, exist_ok=True)

            async def seed() -> None:
                import statekeeper

                async with statekeeper.open_store(url) as store:
                    for n in range(10):
                        await store.save("job", make_state(n))

            asyncio.run(seed())
            (place / "ready").touch()
        return [*cli, "latest", "job", "--url", url]

    return Workload(f"startup/{what}", command=command)


def catalogue(quick: bool) -> list[Workload]:
    out = []
    for op in ("save", "get_latest"):
        for size in SIZES:
            for backend in BACKENDS:
                out += [_encryption(op, size, backend, v) for v in ("plaintext", "encrypted")]
    out += [_envelope(op, size) for op in ("seal", "open") for size in SIZES]
    for op in TELEMETRY_OPS:
        for backend in TELEMETRY_BACKENDS:
            out += [_telemetry(op, backend, side) for side in ("off", "on")]
    size = retention_size(quick)
    out += [_retention(b, size) for b in RETENTION_BACKENDS]
    for b in RETENTION_BACKENDS:
        out += [_saves_by_sweep(b, size, during) for during in (False, True)]
    out += [_space(b, size) for b in ("sqlite", "file")]
    out += [_startup("help"), _startup("latest")]
    return out
