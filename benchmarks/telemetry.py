"""Telemetry (SPEC S18), measured: its cost when off, and what it adds when on.

    uv run nox -s bench_telemetry              # ~6 minutes (more on a loaded machine)
    uv run nox -s bench_telemetry -- --docs    # and write its section of docs/benchmarks.md
    uv run nox -s bench_telemetry -- --quick   # ~1 minute

Four sides, each a fresh child process per round, in an order rotated round by
round in one run so that drift and noise fall on all of them alike:

- ``before``: the tree before telemetry (``git archive BEFORE``, by default the
  commit this work started from), telemetry absent;
- ``A/A``: the same tree again, the run's null test: what off/before reads when
  nothing differs;
- ``off``: this checkout, telemetry off (the default);
- ``on``: this checkout, ``telemetry=Telemetry(...)`` with the OpenTelemetry SDK,
  a no-op span exporter behind a ``SimpleSpanProcessor`` and an in-memory metric
  reader (so every span and metric point is made and handed on, then dropped).

Workloads: ``save`` of a 1 KB state, ``get_latest`` and ``list(limit=20)`` on
memory, SQLite and the file store (``durability="fast"``, so that the fsync does
not hide what is measured). Each round reports the median of per-operation times
over chunks; the table gives the median over rounds of each side, the median of
the per-round ratios off/before and A/A/before (with their min-max over rounds),
and the median of the per-round differences on - off. ``--docs`` splices the
section "Telemetry" into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from skbench.source import command, splice  # noqa: E402

BEFORE = "1eef0d7"
DOCS = ROOT / "docs" / "benchmarks.md"
HEADING = "## Telemetry"
SIDES = ("before", "A/A", "off", "on")
BACKENDS = ("memory", "sqlite", "file")
OPS = ("save", "get_latest", "list")

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
from statekeeper import BaseCheckpointStore, telemetry

chunks, per_chunk = int(sys.argv[1]), int(sys.argv[2])
telemetry.enable()  # the wrappers are installed the first time telemetry is on...
telemetry.disable()  # ...and stay: this store runs them with telemetry off
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


def child(code: str, src: Path, *argv: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, check=True
    )
    got: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def side_run(src: Path, side: str, backend: str, chunks: int, per_chunk: int) -> dict[str, float]:
    mode = "on" if side == "on" else "off"
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, backend, str(chunks), str(per_chunk)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(src)), (got["file"], src)  # the tree asked for
    return {op: float(us) for op, us in got["us"].items()}


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def render(runs: dict[tuple[str, str, str], list[float]], meta: dict[str, Any]) -> str:
    lines = [
        HEADING,
        "",
        f"Generated by `{meta['command']}` on {meta['date']}, in {meta['seconds']} s, "
        f"from commit `{meta['commit']}` (its working tree, with nothing uncommitted) "
        f"against `{meta['before']}` (exported with git archive). Every figure in this "
        "section comes from that one run.",
        "",
        f"Machine: {os.cpu_count()} cores ({cpu()}), shared, so the load averages say "
        "how noisy the run was: (1/5/15 min) "
        f"{meta['load_start']} at the start, {meta['load_end']} at the end; Python "
        f"{platform.python_version()}, opentelemetry-sdk {meta['sdk']}.",
        "",
        f"{meta['rounds']} rounds; in each, every side runs in a fresh process (in an order "
        f"rotated per round), {meta['chunks']} chunks of {meta['per_chunk']} calls per "
        "operation after a warm-up chunk, and reports the median chunk's time per call. "
        "*before*: the tree before telemetry; *A/A*: the same tree again (the run's null "
        "test); *off*: this tree, telemetry off; *on*: this tree with "
        "`telemetry=Telemetry(...)`, the OpenTelemetry SDK, a no-op span exporter behind a "
        "`SimpleSpanProcessor` and an in-memory metric reader (every span and metric point "
        'is made and handed on). A 1 KB state; SQLite and file at `durability="fast"`; '
        "`list` is a page of 20 of 40+ checkpoints. Ratios and differences are taken per "
        "round, then their median (and min-max over the rounds).",
        "",
        "### Off: this tree against the tree before it",
        "",
        "| store | operation | before µs | off µs | off/before (rounds' min-max) "
        "| A/A/before (rounds' min-max) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for backend in BACKENDS:
        for op in OPS:
            before, again, off = (runs[(backend, op, s)] for s in ("before", "A/A", "off"))
            ratio = [f / b for f, b in zip(off, before, strict=True)]
            null = [a / b for a, b in zip(again, before, strict=True)]
            lines.append(
                f"| {backend} | {op} | {statistics.median(before):.1f} | "
                f"{statistics.median(off):.1f} | x{spread(ratio, '.2f')} | "
                f"x{spread(null, '.2f')} |"
            )
    medians = {
        side: [
            statistics.median(
                [x / b for x, b in zip(runs[(k, op, side)], runs[(k, op, "before")], strict=True)]
            )
            for k in BACKENDS
            for op in OPS
        ]
        for side in ("off", "A/A")
    }
    off, null = medians["off"], medians["A/A"]
    lines += [
        "",
        f"Off against before, the medians of the per-round ratios run from x{min(off):.2f} "
        f"to x{max(off):.2f} over the {len(off)} rows, where the null test (A/A) runs from "
        f"x{min(null):.2f} to x{max(null):.2f}"
        + (
            ": no difference this run can tell from its noise. "
            if min(null) <= min(off) and max(off) <= max(null)
            else ". "
        )
        + "The precise figure is the one-process measurement below.",
        "",
        "### The off path alone",
        "",
        "A process that never turns telemetry on runs the operations unwrapped: the "
        "wrappers are installed the first time it is on (a store made with "
        "`telemetry=`, or `enable()`), and stay. What a store with telemetry off then "
        f"pays: in one process, {meta['wrapper_chunks']} chunks of "
        f"{meta['wrapper_calls']} `get_latest` calls on a memory store, alternating "
        "between the instrumented method and the method it wraps "
        "(`BaseCheckpointStore.get_latest.__wrapped__`): "
        f"{meta['wrapped']:.2f} µs against {meta['bare']:.2f} µs per call, a median "
        f"difference of paired chunks of {meta['diff']:+.2f} µs: one attribute and one "
        "global read, the method's arguments passed on and, on Python 3.11, one more "
        "coroutine (the wrapper stays a coroutine function).",
        "",
        "### On: what the SDK with a no-op exporter adds",
        "",
        "| store | operation | off µs | on µs | on - off µs (rounds' min-max) |",
        "|---|---|---:|---:|---:|",
    ]
    for backend in BACKENDS:
        for op in OPS:
            off, on = runs[(backend, op, "off")], runs[(backend, op, "on")]
            diff = [n - f for n, f in zip(on, off, strict=True)]
            lines.append(
                f"| {backend} | {op} | {statistics.median(off):.1f} | "
                f"{statistics.median(on):.1f} | {spread(diff, '+.1f')} |"
            )
    lines += [
        "",
        "On, most of the added time is the SDK's: making and ending a span and recording "
        "two or three histogram points (the duration, each state's size, and the "
        "group-commit size of a write that rode in one), which on this loaded machine "
        "take tens of microseconds each; a `list` records one size point per item. "
        "A `BatchSpanProcessor` moves the export off the caller, not the span's making.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help=f"the tree before (default {BEFORE})")
    parser.add_argument("--rounds", type=int, help="rounds per side (default 10; quick 2)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--docs", action="store_true", help=f"splice the section into {DOCS}")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 10)
    # many short rounds rather than few long ones: on a shared machine the load
    # drifts within minutes, and a round's sides run close together
    chunks, per_chunk = (5, 100) if args.quick else (7, 100)
    started = time.monotonic()
    head = subprocess.run(
        ["git", "log", "-1", "--format=%h, committed %ci"], cwd=ROOT, text=True,
        capture_output=True, check=True,
    ).stdout.strip()  # fmt: skip
    meta: dict[str, Any] = {
        "command": command("bench_telemetry", "benchmarks/telemetry.py"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": head,
        "before": args.before,
        "load_start": loadavg(),
        "rounds": rounds,
        "chunks": chunks,
        "per_chunk": per_chunk,
    }
    with tempfile.TemporaryDirectory() as tmp:
        before = export(args.before, Path(tmp) / "before")
        trees = {"before": before, "A/A": before, "off": ROOT / "src", "on": ROOT / "src"}
        runs: dict[tuple[str, str, str], list[float]] = {}
        for r in range(rounds):
            for backend in BACKENDS:
                order = SIDES[r % 4 :] + SIDES[: r % 4]
                for side in order:
                    got = side_run(trees[side], side, backend, chunks, per_chunk)
                    for op, us in got.items():
                        runs.setdefault((backend, op, side), []).append(us)
            print(f"round {r + 1}/{rounds}", file=sys.stderr)
    wrapper_chunks, wrapper_calls = chunks * 20, per_chunk * 5
    w = child(WRAPPER, ROOT / "src", str(wrapper_chunks), str(wrapper_calls))
    from importlib.metadata import version

    meta.update(
        wrapped=w["wrapped"],
        bare=w["bare"],
        diff=w["diff"],
        wrapper_chunks=wrapper_chunks,
        wrapper_calls=wrapper_calls,
        load_end=loadavg(),
        seconds=round(time.monotonic() - started),
        sdk=version("opentelemetry-sdk"),
    )
    section = render(runs, meta)
    if args.docs:
        DOCS.write_text(splice(DOCS.read_text("utf-8"), HEADING, section), encoding="utf-8")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
