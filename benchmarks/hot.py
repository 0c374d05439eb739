"""Issue 15's targets, measured in one run with the peers: listing, positional pages,
reads against the worker hop, single saves against the bare writes, group commit.

    uv run nox -s bench_hot                 # ~5-8 minutes; writes benchmarks/results/raw/hot.md
    uv run nox -s bench_hot -- --quick      # ~2 minutes, smaller big stream and budgets
    uv run nox -s bench_hot -- --docs       # the same, and puts the section (and its plot)
                                            # into docs/benchmarks.md

The raw figures go to ``benchmarks/results/raw/hot.json`` (not committed). See
:mod:`skbench.hot` and :mod:`skbench.hot_group`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from skbench.hot import HotResults, HotSettings, run  # noqa: E402
from skbench.hot_group import STORES, run_group  # noqa: E402
from skbench.hot_report import SECTION, render  # noqa: E402
from skbench.plots import plot_rates  # noqa: E402
from skbench.script import (  # noqa: E402
    DOCS,
    add_output_args,
    load_raw,
    measuring,
    run_script,
    start_meta,
    write_section,
)
from skbench.source import command  # noqa: E402
from skbench.timing import Budget  # noqa: E402

SESSION = "bench_hot"
PLOT = "hot_group_commit.png"
#: What the figures depend on: the last commit to each, named in the report.
PATHS = {
    "memory": "src/statekeeper/backends/memory",
    "file": "src/statekeeper/backends/file",
    "SQL": "src/statekeeper/backends/sql",
    "codec": "src/statekeeper/codec",
    "record": "src/statekeeper/record",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, help="the big stream (default 100000; quick 20000)")
    parser.add_argument("--tasks", default="1,8,64", help="group-commit concurrency levels")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and budgets")
    parser.add_argument("--no-group", action="store_true", help="leave out group commit")
    parser.add_argument("--no-strace", action="store_true", help="do not count the syncs")
    add_output_args(parser, "hot.md")
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> HotSettings:
    quick = args.quick
    big = args.big or (20_000 if quick else 100_000)
    if big < 2_000:
        raise SystemExit("--big must be at least 2000")
    scale = 0.35 if quick else 1.0
    return HotSettings(
        big=big,
        list_budget=Budget(reps=5 if quick else 15, seconds=10.0 * scale, min_reps=3),
        read_budget=Budget(reps=300 if quick else 1000, seconds=5.0 * scale, min_reps=5),
        write_budget=Budget(reps=150 if quick else 400, seconds=6.0 * scale, min_reps=5),
        group_tasks=tuple(int(x) for x in args.tasks.split(",")),
        group_saves=1024 if quick else 3072,
        group_rounds=1 if quick else 5,
        strace=not args.no_strace,
    )


def _command() -> str:
    return command(SESSION, "benchmarks/hot.py")


def _plot(results: HotResults, directory: Path) -> Path | None:
    series = {}
    for store in STORES:
        points = []
        for tasks, cell in results.group.get(store, {}).items():
            rates = sorted(r["rate"] for r in cell.get("rounds", []) if r.get("rate"))
            if rates:
                points.append((int(tasks), rates[len(rates) // 2], rates[0], rates[-1]))
        series[store] = sorted(points)
    if not any(series.values()):
        return None
    try:
        return plot_rates(
            series,
            directory / PLOT,
            'saves/s against concurrent tasks, each to its own stream, durability="full"',
            "tasks saving at once (log scale)",
        )
    except ImportError as exc:  # matplotlib lives in the bench sessions' env only
        results.say(f"no plot: {exc}")
        return None


def _write(args: argparse.Namespace, results: HotResults, settings: HotSettings) -> None:
    plot_dir = DOCS.parent / "benchmarks" if args.docs else args.output.parent
    plot = _plot(results, plot_dir)
    link = None
    if plot is not None:
        link = f"benchmarks/{PLOT}" if args.docs else PLOT
    section = render(results, settings.big, link)
    write_section(args, results, section, SECTION, {"big": settings.big})


def rerender(args: argparse.Namespace) -> None:
    """Write the section again from a run's raw JSON, measuring nothing; it says so."""
    results = HotResults()
    keys = ("meta", "machine", "subjects", "ops", "loads", "log", "hops", "group")
    args.big = load_raw(args, results, keys, _command())["big"]
    _write(args, results, settings_for(args))


async def main(args: argparse.Namespace) -> None:
    settings = settings_for(args)
    results = HotResults()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-hot-", dir=args.workdir))
    results.meta = start_meta(args, workdir, _command(), PATHS)
    async with measuring(results, workdir):
        await run(settings, workdir, results)
        if not args.no_group:
            results.mark_load("group commit")
            results.say("group commit: child processes")
            results.group = await asyncio.to_thread(
                run_group,
                settings.group_tasks,
                settings.group_saves,
                settings.group_rounds,
                workdir,
                results.say,
                settings.strace,
            )
            results.group["settings"] = {
                "saves": settings.group_saves,
                "rounds": settings.group_rounds,
            }
        results.mark_load("end")
    _write(args, results, settings)


if __name__ == "__main__":
    run_script(parse_args, rerender, main, sys.argv[1:])
