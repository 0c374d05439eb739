"""Two revisions of statekeeper, measured side by side in one run: is every hot path
of the redesign (issue 23) within 10% of where it started?

    uv run nox -s bench_compare                       # dc54e45 against HEAD, <= 10 minutes
    uv run nox -s bench_compare -- --quick            # ~2 minutes
    uv run nox -s bench_compare -- --before A --after B --only sqlite,codec
    uv run nox -s bench_compare -- --after-working-tree --docs

Each revision's ``src/`` (and the Redis plugin's) is exported with ``git archive``
and measured in its own child processes, through the public API only; rounds
alternate between the two. Memory, file, SQLite, PostgreSQL (when
``STATEKEEPER_TEST_POSTGRES_URL`` is set), the codec and the command line's
start-up. Writes ``benchmarks/results/raw/compare.md`` (+ ``.json``, raw samples
included); ``--docs`` also replaces the section "Before and after the redesign" of
``docs/benchmarks.md``. See :mod:`skbench.compare_run`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from skbench.compare_report import SECTION, render  # noqa: E402
from skbench.compare_run import CompareResults, Settings, loadavg, run_workload  # noqa: E402
from skbench.compare_source import Side, export, working_tree  # noqa: E402
from skbench.compare_startup import run_startup  # noqa: E402
from skbench.machine import describe_machine  # noqa: E402
from skbench.script import DOCS, add_output_args, load_raw  # noqa: E402
from skbench.source import command, splice  # noqa: E402

#: The commit the redesign started from.
START = "dc54e45"
POSTGRES_ENV = "STATEKEEPER_TEST_POSTGRES_URL"
WORKLOADS = ("memory", "file", "sqlite", "postgresql", "codec", "startup")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=START, help=f"the old revision (default {START})")
    parser.add_argument("--after", default="HEAD", help="the new revision (default HEAD)")
    parser.add_argument(
        "--after-working-tree",
        action="store_true",
        help="measure the checkout as it is, edits and all, as the after side",
    )
    parser.add_argument("--quick", action="store_true", help="~2 minutes, fewer rounds")
    parser.add_argument("--only", help="comma-separated substrings of " + ", ".join(WORKLOADS))
    parser.add_argument("--size", type=int, help="checkpoints in each store's main stream")
    parser.add_argument("--rounds", type=int, help="rounds on each side")
    parser.add_argument("--replicas", type=int, default=2, help="processes per side")
    add_output_args(parser, "compare.md", workdir_help="where the exports and stores go")
    args = parser.parse_args(argv)
    if args.rev != "HEAD" or args.working_tree:
        parser.error("use --before / --after / --after-working-tree, not --rev / --working-tree")
    return args


def settings_for(args: argparse.Namespace) -> Settings:
    only = [x.strip().lower() for x in args.only.split(",")] if args.only else []
    return Settings(
        size=args.size or (5_000 if args.quick else 10_000),
        rounds=args.rounds or (12 if args.quick else 30),
        slice_seconds=0.03 if args.quick else 0.075,
        chunk_seconds=0.015 if args.quick else 0.025,
        replicas=max(1, args.replicas),
        startup_rounds=6 if args.quick else 20,
        calibrate_seconds=0.1 if args.quick else 0.25,
        postgres_url=os.environ.get(POSTGRES_ENV, ""),
        only=only,
    )


def _command() -> str:
    return command("bench_compare", "benchmarks/compare.py")


def _side_meta(side: Side) -> dict[str, str | None]:
    return {"rev": side.rev, "commit": side.commit, "describe": side.describe, "note": side.note}


def _write(args: argparse.Namespace, results: CompareResults) -> None:
    """As :func:`skbench.script.write_section`, but the raw JSON compact: it holds
    every call's nanoseconds, hundreds of thousands of them."""
    section = render(results)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(section, encoding="utf-8")
    raw = {"settings": results.meta.get("settings", {}), **vars(results)}
    with args.output.with_suffix(".json").open("w", encoding="utf-8") as out:
        json.dump(raw, out, separators=(",", ":"), default=str)
    if args.docs:
        DOCS.write_text(splice(DOCS.read_text(encoding="utf-8"), SECTION, section), "utf-8")
        results.say(f"spliced the section into {DOCS}")
    print(section)
    results.say(f"wrote {args.output} (+ .json)")


def rerender(args: argparse.Namespace) -> None:
    results = CompareResults()
    saved = load_raw(args, results, ("meta", "machine", "groups", "loads", "log"), _command())
    for group in results.groups.values():
        group.setdefault("replicas", saved.get("replicas", 1))
    _write(args, results)


def measure(args: argparse.Namespace, settings: Settings, workdir: Path) -> CompareResults:
    results = CompareResults()
    results.meta = {
        "command": _command(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load_start": loadavg(),
        "settings": {
            "size": settings.size,
            "rounds": settings.rounds,
            "slice_ms": round(settings.slice_seconds * 1000),
            "replicas": settings.replicas,
        },
    }
    started = time.perf_counter()
    before = export("before", args.before, workdir / "trees")
    after = (
        working_tree("after")
        if args.after_working_tree
        else export("after", args.after, workdir / "trees")
    )
    sides = [before, after]
    results.meta["before"], results.meta["after"] = _side_meta(before), _side_meta(after)
    results.say(f"before: {before.describe} ({before.note})")
    results.say(f"after:  {after.describe} ({after.note})")
    chosen = [w for w in WORKLOADS if not settings.only or any(k in w for k in settings.only)]
    for name in chosen:
        if name == "postgresql" and not settings.postgres_url:
            results.groups[name] = {"unavailable": f"{POSTGRES_ENV} is not set"}
            results.say(f"PostgreSQL left out: {POSTGRES_ENV} is not set")
        elif name == "startup":
            run_startup(sides, settings, workdir, results)
        else:
            run_workload(name, sides, settings, workdir, results)
    results.meta["load_end"] = loadavg()
    results.meta["elapsed"] = time.perf_counter() - started
    results.machine = describe_machine(workdir, settings.postgres_url, "")
    return results


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.from_json:
        rerender(args)
        return 0
    settings = settings_for(args)
    workdir = Path(tempfile.mkdtemp(prefix="skbench-compare-", dir=args.workdir))
    try:
        results = measure(args, settings, workdir)
    finally:
        _remove(workdir)
    _write(args, results)
    return 0


def _remove(workdir: Path) -> None:
    """Remove the exports and the stores without waiting: a file store is some 10^4
    files, and on a busy disk their unlinking takes minutes that measure nothing."""
    rm = shutil.which("rm")
    if rm is None:
        shutil.rmtree(workdir, ignore_errors=True)
        return
    proc = subprocess.Popen(
        [rm, "-rf", "--", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    print(f"removing {workdir} in the background (pid {proc.pid})", flush=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
