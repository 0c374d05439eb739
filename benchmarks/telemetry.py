"""Telemetry (SPEC S18), measured: its cost when off, and what it adds when on.

    uv run nox -s bench_telemetry              # ~3 minutes
    uv run nox -s bench_telemetry -- --quick   # ~1 minute

Three sides, each a fresh child process per round, alternated round by round in
one run so that drift and noise fall on all of them alike:

- ``before``: the tree before telemetry (``git archive BEFORE``, by default the
  commit this work started from), telemetry absent;
- ``off``: this checkout, telemetry off (the default);
- ``on``: this checkout, ``telemetry=Telemetry(...)`` with the OpenTelemetry SDK,
  a no-op span exporter behind a ``SimpleSpanProcessor`` and an in-memory metric
  reader (so every span and metric point is made and handed on, then dropped).

Workloads: ``save`` of a 1 KB state, ``get_latest`` and ``list(limit=20)`` on
memory, SQLite and the file store (``durability="fast"``, so that the fsync does
not hide what is measured). Each round reports the median of per-operation times
over chunks; the table gives the median over rounds, and off/before and
on/off ratios. The rows are printed as Markdown for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "1eef0d7"

CHILD = r"""
import asyncio, json, os, sys, tempfile, time
import statekeeper as sk

side, backend, chunks, per_chunk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
options = {}
if side == "on":
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Nothing(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(Nothing()))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    options["telemetry"] = sk.Telemetry(tracer_provider=tp, meter_provider=mp)
where = tempfile.mkdtemp()
url = {"memory": "memory://", "sqlite": f"sqlite:///{where}/b.db", "file": f"file://{where}/b"}[backend]
if backend != "memory":
    options["durability"] = "fast"
state = {"payload": "x" * 1000}

async def main():
    out = {}
    async with sk.open_store(url, **options) as store:
        for i in range(40):
            await store.save("s", state)
        ops = {
            "save": lambda: store.save("s", state),
            "get_latest": lambda: store.get_latest("s"),
            "list": lambda: store.list("s", limit=20),
        }
        for name, op in ops.items():
            for _ in range(per_chunk):  # warm
                await op()
            times = []
            for _ in range(chunks):
                t0 = time.perf_counter()
                for _ in range(per_chunk):
                    await op()
                times.append((time.perf_counter() - t0) / per_chunk * 1e6)
            times.sort()
            out[name] = times[len(times) // 2]
    print(json.dumps({"file": sk.__file__, "us": out}))

asyncio.run(main())
"""

#: The off path alone, in one process: the same get_latest called through the
#: instrumented method and through the method it wraps (``__wrapped__``), chunks
#: alternated, so the difference is the wrapper's one check and nothing else.
WRAPPER = r"""
import asyncio, json, sys, time
import statekeeper as sk
from statekeeper import BaseCheckpointStore

chunks, per_chunk = int(sys.argv[1]), int(sys.argv[2])
bare = BaseCheckpointStore.get_latest.__wrapped__

async def main():
    async with sk.open_store("memory://") as store:
        await store.save("s", {"payload": "x" * 1000})
        calls = {
            "wrapped": lambda: store.get_latest("s"),
            "bare": lambda: bare(store, "s"),
        }
        times = {name: [] for name in calls}
        for i in range(chunks):
            for name in (calls if i % 2 == 0 else reversed(list(calls))):
                call = calls[name]
                t0 = time.perf_counter()
                for _ in range(per_chunk):
                    await call()
                times[name].append((time.perf_counter() - t0) / per_chunk * 1e6)
        diffs = sorted(w - b for w, b in zip(times["wrapped"], times["bare"]))
        print(json.dumps({
            "wrapped": sorted(times["wrapped"])[chunks // 2],
            "bare": sorted(times["bare"])[chunks // 2],
            "diff": diffs[chunks // 2],
        }))

asyncio.run(main())
"""


def export(rev: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", rev, "src"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def child(src: Path, side: str, backend: str, chunks: int, per_chunk: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, side, backend, str(chunks), str(per_chunk)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(src)), (got["file"], src)  # the tree asked for
    return dict(got["us"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help=f"the tree before (default {BEFORE})")
    parser.add_argument("--rounds", type=int, help="rounds per side (default 9; quick 3)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 9)
    chunks, per_chunk = (7, 100) if args.quick else (11, 200)
    with tempfile.TemporaryDirectory() as tmp:
        before = export(args.before, Path(tmp) / "before")
        sides = {"before": before, "off": ROOT / "src", "on": ROOT / "src"}
        runs: dict[tuple[str, str, str], list[float]] = {}
        for backend in ("memory", "sqlite", "file"):
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for side in order:
                    got = child(sides[side], side, backend, chunks, per_chunk)
                    for op, us in got.items():
                        runs.setdefault((backend, op, side), []).append(us)
                print(f"{backend}: round {r + 1}/{rounds}", file=sys.stderr)
        wrapper = subprocess.run(
            [sys.executable, "-c", WRAPPER, str(chunks * 20), str(per_chunk * 5)],
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            capture_output=True,
            text=True,
            check=True,
        )
    w = json.loads(wrapper.stdout.strip().splitlines()[-1])
    print(
        f"off path alone (memory get_latest, one process, {chunks * 20} alternated chunks): "
        f"through the wrapper {w['wrapped']:.2f} µs, the bare method {w['bare']:.2f} µs, "
        f"median difference of paired chunks {w['diff']:+.2f} µs\n"
    )
    print(f"{rounds} rounds per side, {chunks} chunks of {per_chunk} calls per round\n")
    print("| backend | operation | before µs | off µs | off/before | on µs | on - off µs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for backend in ("memory", "sqlite", "file"):
        for op in ("save", "get_latest", "list"):
            b, f, n = (statistics.median(runs[(backend, op, s)]) for s in ("before", "off", "on"))
            print(
                f"| {backend} | {op} | {b:.1f} | {f:.1f} | {f / b:.2f} | {n:.1f} | {n - f:+.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
