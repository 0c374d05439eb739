"""Issue 16's targets, measured in one run against LangGraph's AsyncPostgresSaver on the
same server: saves from 1, 4 and 16 writer processes, get_latest, a middle page.

    uv run nox -s bench_pg                  # ~3-5 minutes; writes benchmarks/results/raw/pg.md
    uv run nox -s bench_pg -- --quick       # ~1-2 minutes (one round, shorter cells)
    uv run nox -s bench_pg -- --docs        # the same, and puts the section into
                                            # docs/benchmarks.md

Needs ``STATEKEEPER_TEST_POSTGRES_URL``. The raw figures go to
``benchmarks/results/raw/pg.json`` (not committed). See :mod:`skbench.pg`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from skbench.pg import PgResults, PgSettings, run  # noqa: E402
from skbench.pg_report import SECTION, render  # noqa: E402
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

SESSION = "bench_pg"
PATHS = {"SQL backend": "src/statekeeper/backends/sql", "record": "src/statekeeper/record.py"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", default="1,4,16", help="writer processes per level")
    parser.add_argument("--seconds", type=float, help="seconds per cell (default 4; quick 1.5)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; quick 1)")
    parser.add_argument("--size", type=int, default=10_000, help="the read stream's length")
    parser.add_argument("--quick", action="store_true", help="one short round (debugging)")
    add_output_args(parser, "pg.md", workdir_help="where the src/ snapshot goes")
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> PgSettings:
    if args.size < 100:
        raise SystemExit("--size must be at least 100")
    quick = args.quick
    return PgSettings(
        writers=tuple(int(x) for x in args.writers.split(",")),
        seconds=args.seconds or (1.5 if quick else 4.0),
        rounds=args.rounds or (1 if quick else 3),
        size=args.size,
        read_budget=Budget(reps=150 if quick else 500, seconds=1.5 if quick else 4.0, min_reps=5),
    )


def _command() -> str:
    return command(SESSION, "benchmarks/pg.py")


def _write(args: argparse.Namespace, results: PgResults, settings: PgSettings) -> None:
    raw_settings = vars(settings) | {"read_budget": None}
    write_section(args, results, render(results, settings), SECTION, raw_settings)


def rerender(args: argparse.Namespace) -> None:
    """Write the section again from a run's raw JSON, measuring nothing; it says so."""
    results = PgResults()
    keys = ("meta", "machine", "subjects", "ops", "loads", "log", "writers")
    saved = load_raw(args, results, keys, _command())
    args.writers = ",".join(map(str, saved["writers"]))
    args.seconds, args.rounds, args.size = saved["seconds"], saved["rounds"], saved["size"]
    _write(args, results, settings_for(args))


async def main(args: argparse.Namespace) -> None:
    if not os.environ.get("STATEKEEPER_TEST_POSTGRES_URL"):
        raise SystemExit("bench_pg needs STATEKEEPER_TEST_POSTGRES_URL (see benchmarks/README.md)")
    settings = settings_for(args)
    results = PgResults()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-pg-", dir=args.workdir))
    results.meta = start_meta(args, workdir, _command(), PATHS)
    async with measuring(results, workdir):
        await run(settings, results)
    _write(args, results, settings)


if __name__ == "__main__":
    run_script(parse_args, rerender, main, sys.argv[1:])
