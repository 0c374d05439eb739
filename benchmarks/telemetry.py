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
    print("| backend | operation | before µs | off µs | off/before | on µs | on − off µs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for backend in ("memory", "sqlite", "file"):
        for op in ("save", "get_latest", "list"):
            b, f, n = (statistics.median(runs[(backend, op, s)]) for s in ("before", "off", "on"))
            print(f"| {backend} | {op} | {b:.1f} | {f:.1f} | {f / b:.2f} | {n:.1f} | {n - f:+.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
