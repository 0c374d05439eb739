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
from skbench.integrations import Results, Settings  # noqa: E402
from skbench.integrations_af import run  # noqa: E402
from skbench.integrations_report import SECTION, render  # noqa: E402
from skbench.machine import describe_machine  # noqa: E402
from skbench.source import command, git, import_source, splice  # noqa: E402
from skbench.timing import Budget  # noqa: E402

DOCS = ROOT / "docs/benchmarks.md"
SESSION = "bench_integrations"
#: What the figures depend on: the last commit to each, named in the report.
PATHS = {
    "LangGraph saver": "src/statekeeper/integrations/langgraph",
    "Agent Framework storage": "src/statekeeper/integrations/agent_framework.py",
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
    parser.add_argument(
        "--output", type=Path, default=ROOT / "benchmarks/results/raw/integrations.md"
    )
    parser.add_argument("--docs", action="store_true", help=f"also splice the section into {DOCS}")
    parser.add_argument("--workdir", type=Path, help="where stores live (default: a temp dir)")
    parser.add_argument(
        "--from-json", type=Path, help="re-render the section from a run's raw JSON"
    )
    parser.add_argument("--rev", default="HEAD", help="measure this commit's src/ (default HEAD)")
    parser.add_argument(
        "--working-tree", action="store_true", help="measure src/ as it is, edits and all"
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
        postgres=bool(os.environ.get("STATEKEEPER_TEST_POSTGRES_URL")),
        only=[x.strip().lower() for x in args.only.split(",")] if args.only else [],
    )


def _last_changes(commit: str) -> str:
    return ", ".join(
        f"{name} `{git('log', '-1', '--format=%h', commit, '--', path)}`"
        for name, path in PATHS.items()
    )


def _source(args: argparse.Namespace, workdir: Path) -> dict[str, str]:
    """Which statekeeper is measured (see :mod:`skbench.source`), and the last commit
    to touch each measured part."""
    commit, facts = import_source(args, workdir)
    if commit is not None:
        facts["paths"] = _last_changes(commit)
    return facts


def _command() -> str:
    return command(SESSION, "benchmarks/integrations.py")


def _write(args: argparse.Namespace, results: Results, settings: Settings) -> None:
    section = render(results, settings.before_at, settings.size, settings.maf_sizes)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(section, encoding="utf-8")
    raw = {
        "settings": {
            "size": settings.size,
            "before_at": settings.before_at,
            "maf_sizes": settings.maf_sizes,
        },
        **vars(results),
    }
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
    args.size = raw["settings"]["size"]
    args.before = raw["settings"]["before_at"]
    args.maf_sizes = ",".join(map(str, raw["settings"]["maf_sizes"]))
    settings = settings_for(args)
    results = Results()
    for key in ("meta", "machine", "subjects", "ops", "sizes", "loads", "log"):
        setattr(results, key, raw[key])
    results.meta["rerendered"] = _command()
    _write(args, results, settings)


async def main(args: argparse.Namespace) -> None:
    settings = settings_for(args)
    results = Results()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-int-", dir=args.workdir))
    results.meta = {
        "command": _command(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        **_source(args, workdir),
    }
    started = time.perf_counter()
    try:
        await run(settings, workdir, results)
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
