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
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from skbench.adapters.statekeeper_stores import POSTGRES_URL, REDIS_URL  # noqa: E402
from skbench.machine import describe_machine  # noqa: E402
from skbench.pg import PgResults, PgSettings, run  # noqa: E402
from skbench.pg_report import SECTION, render  # noqa: E402
from skbench.source import command, git, import_source, splice  # noqa: E402
from skbench.timing import Budget  # noqa: E402

DOCS = ROOT / "docs/benchmarks.md"
SESSION = "bench_pg"
PATHS = {"SQL backend": "src/statekeeper/backends/sql", "record": "src/statekeeper/record.py"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", default="1,4,16", help="writer processes per level")
    parser.add_argument("--seconds", type=float, help="seconds per cell (default 4; quick 1.5)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; quick 1)")
    parser.add_argument("--size", type=int, default=10_000, help="the read stream's length")
    parser.add_argument("--quick", action="store_true", help="one short round (debugging)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/raw/pg.md")
    parser.add_argument("--docs", action="store_true", help=f"also splice the section into {DOCS}")
    parser.add_argument("--workdir", type=Path, help="where the src/ snapshot goes")
    parser.add_argument("--from-json", type=Path, help="re-render from a run's raw JSON")
    parser.add_argument("--rev", default="HEAD", help="measure this commit's src/ (default HEAD)")
    parser.add_argument(
        "--working-tree", action="store_true", help="measure src/ as it is, edits and all"
    )
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
    section = render(results, settings)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(section, encoding="utf-8")
    raw = {"settings": vars(settings) | {"read_budget": None}, **vars(results)}
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
    saved = raw["settings"]
    args.writers = ",".join(map(str, saved["writers"]))
    args.seconds, args.rounds, args.size = saved["seconds"], saved["rounds"], saved["size"]
    settings = settings_for(args)
    results = PgResults()
    for key in ("meta", "machine", "subjects", "ops", "loads", "log", "writers"):
        setattr(results, key, raw[key])
    results.meta["rerendered"] = _command()
    _write(args, results, settings)


async def main(args: argparse.Namespace) -> None:
    if not os.environ.get("STATEKEEPER_TEST_POSTGRES_URL"):
        raise SystemExit("bench_pg needs STATEKEEPER_TEST_POSTGRES_URL (see benchmarks/README.md)")
    settings = settings_for(args)
    results = PgResults()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-pg-", dir=args.workdir))
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
        await run(settings, results)
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
