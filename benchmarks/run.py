"""Run every benchmark, keep pyperf's results, and write ``docs/benchmarks.md``.

    uv run nox -s bench                              # everything, ~40 minutes
    uv run nox -s bench -- --quick                   # every workload once, small sizes
    uv run nox -s bench -- --only 'save/|af/save'    # a subset (a regular expression)
    uv run nox -s bench -- --large --only '@100000/'  # the reads at 100,000 (opt-in, slow)
    uv run nox -s bench -- --rev 88487cc -o before.json.gz   # another commit's src/
    uv run nox -s bench -- --docs --before benchmarks/results/88487cc.json.gz
    uv run python benchmarks/run.py --render after.json.gz --before before.json.gz --docs

Each workload runs through ``benchmarks/suite.py`` under pyperf (its own worker
processes, calibrated loops); the results of the run go into one pyperf JSON file
(``--output``, default ``benchmarks/results/latest.json.gz``) with the run's facts
beside it (``*.facts.json``: command, commit, machine, what was skipped and why).
``--rev REV`` measures ``git archive REV src`` instead of the checkout, so that a
before/after comparison is one run at each end, each its own JSON file;
``--before FILE`` adds the before/after table to the document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(HERE))

from skbench import workloads  # noqa: E402
from skbench.harness import Workload  # noqa: E402
from skbench.subjects import drop_server_data, missing, new_token  # noqa: E402

PEERS = (
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "agent-framework-core",
)
#: What a worker process keeps of the environment (pyperf drops the rest).
INHERIT = (
    "PYTHONPATH",
    "SKBENCH_TOKEN",
    "STATEKEEPER_TEST_POSTGRES_URL",
    "STATEKEEPER_TEST_REDIS_URL",
)


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def export(rev: str, into: Path) -> str:
    """``git archive REV src`` unpacked under ``into``; its ``src`` directory."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    if not commit:
        raise SystemExit(f"--rev {rev!r} is not a commit")
    archive = subprocess.run(
        ["git", "archive", commit, "src"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return str(into / "src")


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({cpu}), load averages {load} at the start; "
        f"{platform.system()} {platform.release()}; Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}"
    )


def peers() -> str:
    found = []
    for name in PEERS:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join(found)


def pyperf_args(args: argparse.Namespace, workload: Workload) -> list[str]:
    if args.quick:
        return ["--debug-single-value"]
    processes = max(1, args.processes // 2) if workload.heavy else args.processes
    out = ["--processes", str(processes)]
    if workload.per_call:  # one call per value: pyperf's percentiles are the calls'
        return [*out, "--values", str(workload.per_call), "--loops", "1", "--warmups", "1"]
    return [*out, "--values", str(args.values)]


def measure(
    args: argparse.Namespace, chosen: list[Workload], scratch: Path, env: dict[str, str]
) -> tuple[list[Path], dict[str, str]]:
    """Each workload through suite.py under pyperf; its JSON file, or why it failed."""
    done: list[Path] = []
    failed: dict[str, str] = {}
    for n, workload in enumerate(chosen, 1):
        out = scratch / "results" / f"{n:04}.json"
        out.parent.mkdir(exist_ok=True)
        cmd = [
            sys.executable,
            str(HERE / "suite.py"),
            "--scratch",
            str(scratch),
            "--workload",
            workload.name,
            "--quiet",
            "--inherit-environ",
            ",".join(INHERIT),
            "-o",
            str(out),
            *pyperf_args(args, workload),
            *(["--quick"] if args.quick else []),
            *(["--large"] if args.large else []),
        ]
        started = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        took = time.monotonic() - started
        if proc.returncode != 0 or not out.exists():
            said = f"{proc.stdout}\n{proc.stderr}".strip().splitlines()
            errors = [line for line in said if re.match(r"^[\w.]+(Error|Exception)\b", line)]
            failed[workload.name] = (errors or said or [f"exit status {proc.returncode}"])[0]
            print(
                f"[{n}/{len(chosen)}] {workload.name}: FAILED {failed[workload.name]}", flush=True
            )
            continue
        done.append(out)
        print(f"[{n}/{len(chosen)}] {workload.name} ({took:.0f} s)", flush=True)
    return done, failed


def merge(files: list[Path], output: Path) -> None:
    import pyperf

    benchmarks = [b for f in files for b in pyperf.BenchmarkSuite.load(str(f)).get_benchmarks()]
    output.parent.mkdir(parents=True, exist_ok=True)
    if benchmarks:
        pyperf.BenchmarkSuite(benchmarks).dump(str(output), replace=True)


def facts_path(output: Path) -> Path:
    return output.with_name(output.name.split(".json")[0] + ".facts.json")


def render(args: argparse.Namespace, results_file: Path) -> str:
    from skbench import render, report

    results = render.load(results_file)
    facts = json.loads(facts_path(results_file).read_text())
    before = before_facts = None
    if args.before:
        before = render.load(args.before)
        before_facts = json.loads(facts_path(Path(args.before)).read_text())
    page = Path(args.docs)
    plot_dir = page.parent / "benchmarks" if page.resolve() == DOCS.resolve() else None
    return report.document(results, facts, before, before_facts, plot_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every workload once, small sizes")
    parser.add_argument("--only", help="run the workloads whose name matches this expression")
    parser.add_argument("--rev", help="measure this commit's src/ (git archive), not the checkout")
    parser.add_argument(
        "-o", "--output", default=str(HERE / "results" / "latest.json.gz"), help="pyperf JSON"
    )
    parser.add_argument("--docs", nargs="?", const=str(DOCS), help="write the page (here)")
    parser.add_argument("--before", help="a before run's pyperf JSON: add the before/after table")
    parser.add_argument("--render", help="render this run's pyperf JSON, measure nothing")
    parser.add_argument("--processes", type=int, default=4, help="pyperf worker processes")
    parser.add_argument("--values", type=int, default=3, help="values per worker process")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument(
        "--large",
        action="store_true",
        help="also read at 100,000 checkpoints (slow: not in the default run)",
    )
    args = parser.parse_args(argv)

    if args.render:
        output = Path(args.render)
    else:
        chosen = [
            w
            for w in workloads(args.quick, args.large)
            if not args.only or re.search(args.only, w.name)
        ]
        if args.list:
            print("\n".join(w.name for w in chosen))
            return 0
        skipped = {w.name: why for w in chosen if (why := missing(w.needs))}
        chosen = [w for w in chosen if w.name not in skipped]
        output = Path(args.output)
        started = time.monotonic()
        token = new_token()
        with tempfile.TemporaryDirectory(prefix="skbench-") as tmp:
            scratch = Path(tmp)
            env = {**os.environ, "SKBENCH_TOKEN": token}
            source = "the checkout's src/"
            if args.rev:
                env["PYTHONPATH"] = export(args.rev, scratch / "rev")
                source = git("log", "-1", "--format=%h", args.rev) + " (git archive of src/)"
            else:
                head = git("log", "-1", "--format=%h")
                src = git("log", "-1", "--format=%h", "--", "src")
                dirty = git("status", "--porcelain", "--", "src")
                source = f"{head}, src/ as of {src}" + (
                    ", with uncommitted changes" if dirty else ""
                )
            try:
                files, failed = measure(args, chosen, scratch, env)
            finally:
                env_backup = os.environ.get("SKBENCH_TOKEN")
                asyncio.run(drop_server_data(token))
                del env_backup
            merge(files, output)
        via_nox = os.environ.get("NOX_CURRENT_SESSION") == "bench"
        extra = " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        command = (
            ("uv run nox -s bench" + (f" -- {extra}" if extra else ""))
            if via_nox
            else (f"uv run python benchmarks/run.py {extra}".strip())
        )
        facts = {
            "command": command,
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "source": source,
            "seconds": time.monotonic() - started,
            "machine": machine(),
            "peers": peers(),
            "pyperf": f"pyperf {version('pyperf')}",
            "settings": "one value per benchmark: --debug-single-value (quick mode)"
            if args.quick
            else f"{args.processes} processes of {args.values} values each after a warm-up, "
            f"{max(1, args.processes // 2)} for the slow ones; latency percentiles from "
            "one call per value (--loops 1)",
            "output": os.path.relpath(output, ROOT) if output.is_absolute() else str(output),
            "skipped": skipped,
            "failed": failed,
        }
        facts_path(output).write_text(json.dumps(facts, indent=1) + "\n")
        print(f"{len(files)} measured, {len(skipped)} skipped, {len(failed)} failed: {output}")
    if args.docs:
        Path(args.docs).write_text(render(args, output))
        print(f"wrote {args.docs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
