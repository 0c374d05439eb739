"""Benchmarks: statekeeper's stores against LangGraph's and MAF's, side by side, in one run.

Run it through nox, which installs the pinned peers into the session's own env::

    uv run nox -s bench -- --quick     # a few minutes: N = 1k, 10k
    uv run nox -s bench                # full: N = 1k, 10k, 100k; writes docs/benchmarks.md

A full run writes ``docs/benchmarks.md`` and its plots under ``docs/benchmarks/``; a
quick run writes ``benchmarks/results/raw/quick.md`` (not committed). Both also
write the raw figures as JSON under ``benchmarks/results/raw/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from skbench.adapters.base import MAIN_STREAM  # noqa: E402
from skbench.adapters.statekeeper_stores import POSTGRES_URL, REDIS_URL  # noqa: E402
from skbench.floors import Floors, record_bytes  # noqa: E402
from skbench.machine import describe_machine  # noqa: E402
from skbench.plots import make_plots  # noqa: E402
from skbench.report import Report  # noqa: E402
from skbench.runner import (  # noqa: E402
    Results,
    Settings,
    count_redis_round_trips,
    open_stores,
    record_floor_constants,
    run_sizes,
    run_writer_workload,
    say,
)
from skbench.script import run_script  # noqa: E402
from skbench.timing import Budget  # noqa: E402


def settings_for(args: argparse.Namespace) -> Settings:
    if args.quick:
        settings = Settings(
            sizes=[1_000, 10_000],
            noise_ratio=1.0,
            op_budget=Budget(reps=30, seconds=0.3, rounds=3),
            list_budget=Budget(reps=3, seconds=0.6, min_reps=1, rounds=3),
            save_budget=Budget(reps=30, seconds=0.4, rounds=3),
            call_cap=1.0,
            list_cap=8.0,
            populate_cap=120.0,
            writer_processes=4,
            writer_saves=25,
            rss_pass=False,
        )
    else:
        settings = Settings(
            sizes=[1_000, 10_000, 100_000],
            noise_ratio=1.0,
            op_budget=Budget(reps=150, seconds=1.0),
            list_budget=Budget(reps=5, seconds=6.0, min_reps=1),
            save_budget=Budget(reps=150, seconds=1.2),
            call_cap=10.0,
            list_cap=40.0,
            populate_cap=1500.0,
            writer_processes=4,
            writer_saves=200,
        )
    if args.sizes:
        settings.sizes = [int(x) for x in args.sizes.split(",")]
    settings.only = [x.strip().lower() for x in args.only.split(",")] if args.only else []
    if args.deadline_minutes:
        settings.deadline = time.perf_counter() + 60 * args.deadline_minutes
    return settings


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and budgets")
    parser.add_argument("--sizes", help="comma-separated N values (overrides the mode's)")
    parser.add_argument("--only", help="comma-separated substrings of store names to run")
    parser.add_argument("--output", type=Path, help="markdown file to write")
    parser.add_argument("--no-writers", action="store_true", help="skip the 4-writer workload")
    parser.add_argument("--workdir", type=Path, help="where stores live (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--deadline-minutes",
        type=float,
        help="leave out a size whose bulk load would not fit in the time left (default: none)",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        help="re-render the report and plots from a raw JSON of an earlier run (no measuring)",
    )
    return parser.parse_args(argv)


def rerender(args: argparse.Namespace) -> Path:
    """Write the report again from a run's raw JSON (for changes to the report only)."""
    raw = json.loads(args.from_json.read_text())
    settings = settings_for(args)
    for key, value in raw["settings"].items():
        setattr(settings, key, value)
    results = Results()
    for key, value in raw.items():
        if hasattr(results, key):
            setattr(results, key, _int_keys(value))
    output = args.output or _default_output(raw["meta"]["mode"] == "quick")
    write_outputs(output, args.from_json.parent, results, settings, raw["machine"], raw["meta"])
    return output


def _int_keys(value: Any) -> Any:
    """JSON turned the size keys into strings; turn them back."""
    if isinstance(value, dict):
        return {(int(k) if k.isdigit() else k): _int_keys(v) for k, v in value.items()}
    return value


def _default_output(quick: bool) -> Path:
    return ROOT / "benchmarks/results/raw/quick.md" if quick else ROOT / "docs/benchmarks.md"


async def main(args: argparse.Namespace) -> Path:
    settings = settings_for(args)
    mode = "quick" if args.quick else "full"
    output: Path = args.output or _default_output(args.quick)
    raw_dir = ROOT / "benchmarks/results/raw"
    os.makedirs(raw_dir, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="skbench-", dir=args.workdir))
    results = Results()
    started = time.perf_counter()
    load_at_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    say(results, f"{mode} run, sizes {settings.sizes}, stores under {workdir}")
    adapters = []
    record = await record_bytes(MAIN_STREAM)
    floors = Floors(workdir, record, REDIS_URL)
    try:
        record_floor_constants(results, record)
        await floors.open()
        for name, problem in floors.problems.items():
            results.floors[name] = {"all": {"error": problem}}
        adapters = await open_stores(settings, workdir, results)
        if not args.no_writers:
            await run_writer_workload(settings, workdir, results)
        await count_redis_round_trips(adapters, results)
        await run_sizes(settings, adapters, floors, results)
    finally:
        await floors.close()
        for adapter in adapters:
            try:
                await adapter.close()
            except Exception as exc:  # cleanup must not hide the run's own error
                say(results, f"cleanup of {adapter.name} failed: {exc}")
        machine = describe_machine(workdir, POSTGRES_URL, REDIS_URL)
        machine["load_average_start"] = load_at_start
        if args.keep:
            say(results, f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.perf_counter() - started
    meta = {
        "command": _command(),
        "mode": mode,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "elapsed": elapsed,
    }
    write_outputs(output, raw_dir, results, settings, machine, meta)
    say(results, f"wrote {output} in {elapsed:.0f} s")
    return output


def write_outputs(
    output: Path,
    raw_dir: Path,
    results: Results,
    settings: Settings,
    machine: dict[str, Any],
    meta: dict[str, Any],
) -> None:
    """The markdown report, its plots next to it, and the raw figures as JSON."""
    images = make_plots(results, settings.sizes, output.parent / output.stem)
    report = Report(results, settings, machine, meta)
    text = report.render({t: os.path.relpath(p, output.parent) for t, p in images.items()})
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    raw = {
        "meta": meta,
        "machine": machine,
        "settings": {
            "sizes": settings.sizes,
            "noise_ratio": settings.noise_ratio,
            "writer_processes": settings.writer_processes,
            "writer_saves": settings.writer_saves,
        },
        **vars(results),
    }
    (raw_dir / f"{output.stem}.json").write_text(json.dumps(raw, indent=1, default=str))
    print(text)


def _command() -> str:
    extra = " ".join(shlex.quote(a) for a in sys.argv[1:])
    return "uv run nox -s bench" + (f" -- {extra}" if extra else "")


if __name__ == "__main__":
    run_script(parse_args, rerender, main, sys.argv[1:])
