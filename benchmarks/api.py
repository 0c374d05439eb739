"""Issue 13's targets, measured in one run: cursor_at pages, metadata filters, batches.

    uv run nox -s bench_api                 # ~5-8 minutes; writes benchmarks/results/raw/api.md
    uv run nox -s bench_api -- --docs       # the same, and puts the section in docs/benchmarks.md

PostgreSQL is measured when ``STATEKEEPER_TEST_POSTGRES_URL`` is set. The raw figures
go to ``benchmarks/results/raw/api.json`` (not committed). See :mod:`skbench.api`.
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
from skbench.api import ApiResults, ApiSettings, run  # noqa: E402
from skbench.api_report import SECTION, render  # noqa: E402
from skbench.machine import describe_machine  # noqa: E402
from skbench.source import command, git, import_source, splice  # noqa: E402
from skbench.timing import Budget  # noqa: E402

DOCS = ROOT / "docs/benchmarks.md"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=101_000, help="checkpoints in the stream")
    parser.add_argument("--depths", default="1000,100000", help="comma-separated depths")
    parser.add_argument("--quick", action="store_true", help="smaller budgets (debugging)")
    parser.add_argument("--only", help="comma-separated substrings of store names")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/raw/api.md")
    parser.add_argument("--docs", action="store_true", help=f"also splice the section into {DOCS}")
    parser.add_argument("--workdir", type=Path, help="where stores live (default: a temp dir)")
    parser.add_argument(
        "--from-json",
        type=Path,
        help="re-render the section from a run's raw JSON (no measuring)",
    )
    parser.add_argument("--rev", default="HEAD", help="measure this commit's src/ (default HEAD)")
    parser.add_argument(
        "--working-tree", action="store_true", help="measure src/ as it is, edits and all"
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


def _source(args: argparse.Namespace, workdir: Path) -> dict[str, str]:
    """Which statekeeper is measured (see :mod:`skbench.source`), and the last commit
    to touch each measured backend."""
    commit, facts = import_source(args, workdir)
    if commit is not None:
        facts["backends"] = _backend_commits(commit)
    return facts


def _backend_commits(commit: str) -> str:
    """The last commit to touch each measured backend, as of ``commit``."""
    paths = {
        "memory": "src/statekeeper/backends/memory.py",
        "file": "src/statekeeper/backends/file",
        "SQL": "src/statekeeper/backends/sql",
    }
    return ", ".join(
        f"{name} `{git('log', '-1', '--format=%h', commit, '--', path)}`"
        for name, path in paths.items()
    )


def rerender(args: argparse.Namespace) -> None:
    """Write the section again from a run's raw JSON, measuring nothing (for changes
    to the wording only); the section says it was re-rendered, and by what."""
    raw = json.loads(args.from_json.read_text(encoding="utf-8"))
    args.size = raw["settings"]["size"]
    args.depths = ",".join(map(str, raw["settings"]["depths"]))
    settings = settings_for(args)
    results = ApiResults()
    for key in ("meta", "machine", "stores", "ops", "loads", "log"):
        setattr(results, key, raw[key])
    commit = results.meta["commit"].split(",")[0]
    results.meta.setdefault("backends", _backend_commits(commit))
    results.meta["rerendered"] = _command()
    _write(args, results, settings)


def _write(args: argparse.Namespace, results: ApiResults, settings: ApiSettings) -> None:
    section = render(results, settings)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(section, encoding="utf-8")
    raw = {"settings": {"size": settings.size, "depths": settings.depths}, **vars(results)}
    args.output.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    if args.docs:
        DOCS.write_text(
            splice(DOCS.read_text(encoding="utf-8"), SECTION, section), encoding="utf-8"
        )
        results.say(f"spliced the section into {DOCS}")
    print(section)
    results.say(f"wrote {args.output}")


def _command() -> str:
    return command("bench_api", "benchmarks/api.py")


async def main(args: argparse.Namespace) -> None:
    settings = settings_for(args)
    results = ApiResults()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-api-", dir=args.workdir))
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
        if str(results.machine.get("postgresql", "")).startswith("unavailable"):
            results.machine["postgresql"] = await _postgres_settings()
        shutil.rmtree(workdir, ignore_errors=True)
    results.meta["elapsed"] = time.perf_counter() - started
    _write(args, results, settings)


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    if arguments.from_json:
        rerender(arguments)
    else:
        asyncio.run(main(arguments))
