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
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from skbench.adapters.statekeeper_stores import POSTGRES_URL, REDIS_URL  # noqa: E402
from skbench.hot import HotResults, HotSettings, run  # noqa: E402
from skbench.hot_group import STORES, run_group  # noqa: E402
from skbench.hot_report import SECTION, render  # noqa: E402
from skbench.machine import describe_machine  # noqa: E402
from skbench.plots import plot_rates  # noqa: E402
from skbench.source import command, git, import_source, splice  # noqa: E402
from skbench.timing import Budget  # noqa: E402

DOCS = ROOT / "docs/benchmarks.md"
SESSION = "bench_hot"
PLOT = "hot_group_commit.png"
#: What the figures depend on: the last commit to each, named in the report.
PATHS = {
    "memory": "src/statekeeper/backends/memory.py",
    "file": "src/statekeeper/backends/file",
    "SQL": "src/statekeeper/backends/sql",
    "codec": "src/statekeeper/codec.py",
    "record": "src/statekeeper/record.py",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, help="the big stream (default 100000; quick 20000)")
    parser.add_argument("--tasks", default="1,8,64", help="group-commit concurrency levels")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and budgets")
    parser.add_argument("--no-group", action="store_true", help="leave out group commit")
    parser.add_argument("--no-strace", action="store_true", help="do not count the syncs")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/raw/hot.md")
    parser.add_argument("--docs", action="store_true", help=f"also splice the section into {DOCS}")
    parser.add_argument("--workdir", type=Path, help="where stores live (default: a temp dir)")
    parser.add_argument("--from-json", type=Path, help="re-render from a run's raw JSON")
    parser.add_argument("--rev", default="HEAD", help="measure this commit's src/ (default HEAD)")
    parser.add_argument(
        "--working-tree", action="store_true", help="measure src/ as it is, edits and all"
    )
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
        group_rounds=1 if quick else 3,
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
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(section, encoding="utf-8")
    raw = {"settings": {"big": settings.big}, **vars(results)}
    args.output.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    if args.docs:
        DOCS.write_text(
            splice(DOCS.read_text(encoding="utf-8"), SECTION, section), encoding="utf-8"
        )
        results.say(f"spliced the section into {DOCS}")
    print(section)
    results.say(f"wrote {args.output}")


def rerender(args: argparse.Namespace) -> None:
    """Write the section again from a run's raw JSON, measuring nothing; it says so."""
    raw = json.loads(args.from_json.read_text(encoding="utf-8"))
    args.big = raw["settings"]["big"]
    settings = settings_for(args)
    results = HotResults()
    for key in ("meta", "machine", "subjects", "ops", "loads", "log", "hops", "group"):
        setattr(results, key, raw[key])
    results.meta["rerendered"] = _command()
    _write(args, results, settings)


async def main(args: argparse.Namespace) -> None:
    settings = settings_for(args)
    results = HotResults()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-hot-", dir=args.workdir))
    results.meta = {"command": _command(), "date": time.strftime("%Y-%m-%d %H:%M %Z")}
    commit, facts = import_source(args, workdir)
    results.meta.update(facts)
    if commit is not None:
        results.meta["paths"] = ", ".join(
            f"{name} `{git('log', '-1', '--format=%h', commit, '--', path)}`"
            for name, path in PATHS.items()
        )
    started = time.perf_counter()
    try:
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
    finally:
        results.machine = describe_machine(workdir, POSTGRES_URL, REDIS_URL)
        shutil.rmtree(workdir, ignore_errors=True)
    results.meta["elapsed"] = time.perf_counter() - started
    _write(args, results, settings)


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    if arguments.from_json:
        rerender(arguments)
    else:
        asyncio.run(main(arguments))
