"""The features' costs: encryption at rest, telemetry, retention sweeps and the
command line's start-up.

- ``encryption/<op> <size>/<backend>-<plaintext|encrypted>``: ``save`` and
  ``get_latest`` of a 1 KB and a 100 KB state, a plaintext store beside one with
  ``encryption=Keyring(...)``; and ``encryption/<seal|open> <size>/envelope``, the
  envelope alone on the encoded state.
- ``telemetry/<op>/<backend>-<off|on>``: ``save`` and ``get_latest``
  with telemetry off (the default) and on, with the OpenTelemetry SDK and a span
  exporter that drops every span.
- ``retention/sweep/<backend>``: ``sweep(policy=Retention(keep_last=1))`` over a
  store of ``retention_size`` checkpoints in a tenth as many streams, rebuilt
  (untimed) before each sweep; pyperf's value is one sweep.
- ``startup/<help|latest>``: ``statekeeper --help`` and ``statekeeper latest`` on a
  10-checkpoint SQLite store, each a whole process, timed by pyperf's ``command``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from .harness import Context, Op, Timer, Workload, checked
from .payload import _WORDS, make_state
from .subjects import POSTGRES_URL, reachable, server_name

BACKENDS = ("memory", "sqlite", "file")
SIZES = {"1KB": 1, "100KB": 100}


def big_state(kb: int) -> dict[str, Any]:
    """The ~1 KB state, its messages repeated to about ``kb`` KB."""
    state = make_state(1)
    state["notes"] = [" ".join(_WORDS)] * (kb * 6 if kb > 1 else 0)
    return state


async def open_ours(ctx: Context, backend: str, **options: Any) -> Any:
    import statekeeper

    place = ctx.place(f"{backend}-store")
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


def _retention(backend: str, size: int) -> Workload:
    async def timer(ctx: Context) -> Timer:
        import statekeeper

        state = make_state(1)

        async def sweeps(loops: int) -> float:
            spent = 0.0
            for _ in range(loops):
                store = await open_ours(ctx, backend, durability="fast")
                items = [
                    statekeeper.NewCheckpoint(stream=f"s{i % (size // 10)}", state=state)
                    for i in range(size)
                ]
                for at in range(0, size, 1000):
                    await store.save_many(items[at : at + 1000])
                start = time.perf_counter()
                report = await store.sweep(policy=statekeeper.Retention(keep_last=1))
                spent += time.perf_counter() - start
                if report.checkpoints_removed != size - size // 10:
                    raise AssertionError(f"the sweep removed {report.checkpoints_removed}")
                await store.close()
            return spent

        return sweeps

    return Workload(f"retention/sweep/{backend}", timer=timer, needs=_needs(backend), heavy=True)


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
    for op in ("save", "get_latest"):
        for backend in ("memory", "sqlite", "file"):
            out += [_telemetry(op, backend, side) for side in ("off", "on")]
    size = 200 if quick else 20_000
    out += [_retention(b, size) for b in ("sqlite", "file", "postgresql")]
    out += [_startup("help"), _startup("latest")]
    return out
