"""Retention sweeps, measured in one run: a sweep over 100,000 checkpoints in 10,000
streams on SQLite, the file store and PostgreSQL, with saves going on beside it, and
the space it gives back.

    uv run nox -s bench_retention                  # writes benchmarks/results/raw/retention.md
    uv run nox -s bench_retention -- --docs        # the same, and puts the section into
                                                   # docs/benchmarks.md
    uv run nox -s bench_retention -- --size 10000 --streams 1000   # a quick look

PostgreSQL is measured at ``STATEKEEPER_TEST_POSTGRES_URL`` (its tables are dropped
afterwards). The raw figures go to ``benchmarks/results/raw/retention.json`` (not
committed). See :mod:`skbench.retention`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from skbench.retention import RetentionResults, RetentionSettings, run  # noqa: E402
from skbench.retention_report import SECTION, render  # noqa: E402
from skbench.script import (  # noqa: E402
    add_output_args,
    load_raw,
    measuring,
    run_script,
    start_meta,
    write_section,
)
from skbench.source import command  # noqa: E402

SESSION = "bench_retention"
PATHS = {
    "retention": "src/statekeeper/_core/retention.py",
    "file backend": "src/statekeeper/backends/file",
    "SQL backend": "src/statekeeper/backends/sql",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000, help="checkpoints in all")
    parser.add_argument("--streams", type=int, default=10_000, help="streams they are in")
    parser.add_argument("--saves", type=int, default=300, help="timed saves on the quiet store")
    parser.add_argument("--only", help="comma-separated substrings of store names")
    add_output_args(parser, "retention.md")
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> RetentionSettings:
    if args.streams < 1 or args.size < args.streams * 2:
        raise SystemExit("--size must be at least twice --streams")
    only = tuple(x.strip().lower() for x in args.only.split(",")) if args.only else ()
    return RetentionSettings(args.size, args.streams, args.saves, only)


def _command() -> str:
    return command(SESSION, "benchmarks/retention.py")


def _write(
    args: argparse.Namespace, results: RetentionResults, settings: RetentionSettings
) -> None:
    raw = {"size": settings.size, "streams": settings.streams, "saves": settings.saves}
    write_section(args, results, render(results, settings), SECTION, raw)


def rerender(args: argparse.Namespace) -> None:
    """Write the section again from a run's raw JSON, measuring nothing; it says so."""
    results = RetentionResults()
    saved = load_raw(args, results, ("meta", "machine", "stores", "loads", "log"), _command())
    args.size, args.streams, args.saves = saved["size"], saved["streams"], saved["saves"]
    _write(args, results, settings_for(args))


async def main(args: argparse.Namespace) -> None:
    settings = settings_for(args)
    results = RetentionResults()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-retention-", dir=args.workdir))
    results.meta = start_meta(args, workdir, _command(), PATHS)
    async with measuring(results, workdir):
        await run(settings, workdir, results)
    _write(args, results, settings)


if __name__ == "__main__":
    run_script(parse_args, rerender, main, sys.argv[1:])
