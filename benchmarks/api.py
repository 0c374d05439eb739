"""Issue 13's targets, measured in one run: cursor_at pages, metadata filters, batches.

    uv run nox -s bench_api                 # ~5-8 minutes; writes benchmarks/results/raw/api.md
    uv run nox -s bench_api -- --docs       # the same, and puts the section in docs/benchmarks.md

PostgreSQL is measured when ``STATEKEEPER_TEST_POSTGRES_URL`` is set. The raw figures
go to ``benchmarks/results/raw/api.json`` (not committed). See :mod:`skbench.api`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from skbench.adapters.statekeeper_stores import POSTGRES_URL  # noqa: E402
from skbench.api import ApiResults, ApiSettings, run  # noqa: E402
from skbench.api_report import SECTION, render  # noqa: E402
from skbench.script import (  # noqa: E402
    add_output_args,
    last_changes,
    load_raw,
    measuring,
    run_script,
    start_meta,
    write_section,
)
from skbench.source import command  # noqa: E402
from skbench.timing import Budget  # noqa: E402

#: The measured backends: the last commit to each is named in the report.
BACKENDS = {
    "memory": "src/statekeeper/backends/memory",
    "file": "src/statekeeper/backends/file",
    "SQL": "src/statekeeper/backends/sql",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=101_000, help="checkpoints in the stream")
    parser.add_argument("--depths", default="1000,100000", help="comma-separated depths")
    parser.add_argument("--quick", action="store_true", help="smaller budgets (debugging)")
    parser.add_argument("--only", help="comma-separated substrings of store names")
    add_output_args(
        parser,
        "api.md",
        from_json_help="re-render the section from a run's raw JSON (no measuring)",
    )
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> ApiSettings:
    depths = tuple(int(x) for x in args.depths.split(","))
    if max(depths) + 40 > args.size:
        raise SystemExit(f"--size {args.size} is too small for depth {max(depths)}")
    scale = 0.3 if args.quick else 1.0
    return ApiSettings(
        size=args.size,
        noise=args.size // 10,
        depths=depths,
        read_budget=Budget(reps=int(100 * scale), seconds=2.0 * scale),
        load_budget=Budget(reps=int(40 * scale), seconds=2.5 * scale),
        write_budget=Budget(reps=int(30 * scale), seconds=4.0 * scale),
        only=[x.strip().lower() for x in args.only.split(",")] if args.only else [],
    )


async def _postgres_settings() -> str:
    """Server version and commit settings, through asyncpg (psycopg is not installed here)."""
    try:
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
            return ", ".join([f"{n}={await conn.fetchval(f'SHOW {n}')}" for n in names])
        finally:
            await conn.close()
    except Exception as exc:  # reported, never fatal
        return f"unavailable ({type(exc).__name__})"


def rerender(args: argparse.Namespace) -> None:
    """Write the section again from a run's raw JSON, measuring nothing (for changes
    to the wording only); the section says it was re-rendered, and by what."""
    results = ApiResults()
    keys = ("meta", "machine", "stores", "ops", "loads", "log")
    saved = load_raw(args, results, keys, _command())
    args.size = saved["size"]
    args.depths = ",".join(map(str, saved["depths"]))
    commit = results.meta["commit"].split(",")[0]
    results.meta.setdefault("backends", last_changes(commit, BACKENDS))
    _write(args, results, settings_for(args))


def _write(args: argparse.Namespace, results: ApiResults, settings: ApiSettings) -> None:
    raw_settings = {"size": settings.size, "depths": settings.depths}
    write_section(args, results, render(results, settings), SECTION, raw_settings)


def _command() -> str:
    return command("bench_api", "benchmarks/api.py")


async def _fill_postgres(machine: dict[str, Any]) -> None:
    """Ask the server itself when :func:`describe_machine` could not."""
    if str(machine.get("postgresql", "")).startswith("unavailable"):
        machine["postgresql"] = await _postgres_settings()


async def main(args: argparse.Namespace) -> None:
    settings = settings_for(args)
    results = ApiResults()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-api-", dir=args.workdir))
    results.meta = start_meta(args, workdir, _command(), BACKENDS, key="backends")
    async with measuring(results, workdir, finish=_fill_postgres):
        await run(settings, workdir, results)
    _write(args, results, settings)


if __name__ == "__main__":
    run_script(parse_args, rerender, main, sys.argv[1:])
