"""Issue 14's targets, measured in one run with the peers: the LangGraph saver and the
Agent Framework storage against the frameworks' own.

    uv run nox -s bench_integrations              # a few minutes; writes
                                                  # benchmarks/results/raw/integrations.md
    uv run nox -s bench_integrations -- --docs    # the same, and puts the section into
                                                  # docs/benchmarks.md

PostgreSQL is measured when ``STATEKEEPER_TEST_POSTGRES_URL`` is set. The raw figures
go to ``benchmarks/results/raw/integrations.json`` (not committed). See
:mod:`skbench.integrations` and :mod:`skbench.integrations_af`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from skbench.integrations import Results, Settings  # noqa: E402
from skbench.integrations_af import run  # noqa: E402
from skbench.integrations_report import SECTION, render  # noqa: E402
from skbench.script import (  # noqa: E402
    add_output_args,
    load_raw,
    measuring,
    run_script,
    start_meta,
    write_section,
)
from skbench.source import command  # noqa: E402
from skbench.timing import Budget  # noqa: E402

SESSION = "bench_integrations"
#: What the figures depend on: the last commit to each, named in the report.
PATHS = {
    "LangGraph saver": "src/statekeeper/integrations/langgraph",
    "Agent Framework storage": "src/statekeeper/integrations/agent_framework",
    "SQL backend": "src/statekeeper/backends/sql",
    "file backend": "src/statekeeper/backends/file",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=2000, help="checkpoints in the thread")
    parser.add_argument(
        "--before", type=int, default=1000, help="alist(before=<the N-th checkpoint put>)"
    )
    parser.add_argument(
        "--maf-sizes", default="10,10000", help="Agent Framework workflow sizes, ascending"
    )
    parser.add_argument("--quick", action="store_true", help="smaller budgets (debugging)")
    parser.add_argument(
        "--only", help="comma-separated parts: sqlite, postgres, agent (default: all)"
    )
    add_output_args(
        parser, "integrations.md", from_json_help="re-render the section from a run's raw JSON"
    )
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Settings:
    if not 20 < args.before <= args.size:
        raise SystemExit(f"--before {args.before} must be in (20, --size]")
    scale = 0.3 if args.quick else 1.0
    return Settings(
        size=args.size,
        before_at=args.before,
        maf_sizes=tuple(sorted(int(x) for x in args.maf_sizes.split(","))),
        read_budget=Budget(reps=int(300 * scale), seconds=5.0 * scale, min_reps=5),
        latest_budget=Budget(reps=int(300 * scale), seconds=5.0 * scale, min_reps=5),
        # the same number of runs for every saver: their threads count in the size
        graph_budget=Budget(reps=3 if args.quick else 8, seconds=float("inf"), min_reps=1),
        save_budget=Budget(reps=int(300 * scale), seconds=3.0 * scale, min_reps=20),
        writes=min(args.size, int(500 * scale)),
        postgres=bool(os.environ.get("STATEKEEPER_TEST_POSTGRES_URL")),
        only=[x.strip().lower() for x in args.only.split(",")] if args.only else [],
    )


def _command() -> str:
    return command(SESSION, "benchmarks/integrations.py")


def _write(args: argparse.Namespace, results: Results, settings: Settings) -> None:
    section = render(results, settings.before_at, settings.size, settings.maf_sizes)
    raw_settings = {
        "size": settings.size,
        "before_at": settings.before_at,
        "maf_sizes": settings.maf_sizes,
    }
    write_section(args, results, section, SECTION, raw_settings)


def rerender(args: argparse.Namespace) -> None:
    """Write the section again from a run's raw JSON, measuring nothing; it says so."""
    results = Results()
    keys = ("meta", "machine", "subjects", "ops", "sizes", "loads", "log")
    saved = load_raw(args, results, keys, _command())
    args.size = saved["size"]
    args.before = saved["before_at"]
    args.maf_sizes = ",".join(map(str, saved["maf_sizes"]))
    _write(args, results, settings_for(args))


async def main(args: argparse.Namespace) -> None:
    settings = settings_for(args)
    results = Results()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-int-", dir=args.workdir))
    results.meta = start_meta(args, workdir, _command(), PATHS)
    async with measuring(results, workdir):
        await run(settings, workdir, results)
    _write(args, results, settings)


if __name__ == "__main__":
    run_script(parse_args, rerender, main, sys.argv[1:])
