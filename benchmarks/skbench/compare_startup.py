"""Start-up of the command line on both sides, as ``benchmarks/startup.py`` times it:
``statekeeper --help`` and ``statekeeper latest job --url sqlite:///...`` on a
10-checkpoint SQLite store, through this environment's console script, with each
side's trees first on ``PYTHONPATH`` so that the script imports that side.

Each side seeds its own store with its own statekeeper, and each command's answer
is checked once (``--help`` names ``latest``; ``latest`` prints the id and the
state of the last checkpoint saved). Then rounds alternate between the sides, one
run of each command per side per round, timed by wall clock.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .compare_run import CompareResults, Settings, loadavg
from .compare_source import Side

__all__ = ["HELP", "LATEST", "run_startup"]

HELP = "statekeeper --help"
LATEST = "statekeeper latest (SQLite, 10 checkpoints)"

_SEED = """
import asyncio, sys, statekeeper
async def main():
    async with statekeeper.open_store(sys.argv[1]) as store:
        for step in range(int(sys.argv[2])):
            cp = await store.save("job", {"step": step}, tags={"job": "bench"})
    print(cp.id)
asyncio.run(main())
"""


def _script() -> list[str]:
    script = Path(sys.executable).parent / "statekeeper"
    if script.exists():
        return [str(script)]
    found = shutil.which("statekeeper")
    if found is None:
        raise SystemExit("no statekeeper console script: uv sync --extra cli")
    return [found]


def _commands(side: Side, workdir: Path, seed: int) -> tuple[dict[str, list[str]], str]:
    """The two command lines for ``side``, and the id its seeded store ends with."""
    workdir.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{workdir / 'startup.db'}"
    done = subprocess.run(
        [sys.executable, "-c", _SEED, url, str(seed)],
        env=side.env(),
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
    )
    script = _script()
    return {HELP: [*script, "--help"], LATEST: [*script, "latest", "job", "--url", url]}, (
        done.stdout.strip()
    )


def _run(argv: list[str], side: Side, cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(argv, env=side.env(), cwd=cwd, capture_output=True, text=True)
    return time.perf_counter() - start, done


def _problem(op: str, done: subprocess.CompletedProcess[str], last_id: str, seed: int) -> str:
    if done.returncode != 0:
        return f"exit status {done.returncode}: {done.stderr.strip()[-300:]}"
    if op == HELP and "latest" not in done.stdout:
        return "--help does not list latest"
    if op == LATEST and (last_id not in done.stdout or f'"step": {seed - 1}' not in done.stdout):
        return "latest did not print the last checkpoint saved"
    return ""


def run_startup(
    sides: list[Side], settings: Settings, workdir: Path, results: CompareResults
) -> None:
    """Fill ``results.groups["startup"]``: both commands, rounds alternating sides."""
    group: dict[str, Any] = {"info": {}, "ops": {}, "loads": [f"start {loadavg()}"]}
    results.groups["startup"] = group
    plans: dict[str, tuple[dict[str, list[str]], str, Path]] = {}
    for side in sides:
        cwd = workdir / "startup" / side.label
        commands, last_id = _commands(side, cwd, settings.startup_seed)
        plans[side.label] = (commands, last_id, cwd)
        problems = {}
        for op, argv in commands.items():
            _run(argv, side, cwd)  # warm-up: bytecode written, files cached
            _, done = _run(argv, side, cwd)
            problem = _problem(op, done, last_id, settings.startup_seed)
            if problem:
                problems[op] = problem
        group["info"][side.label] = {"problems": problems, "command": json.dumps(commands)}
        for op in commands:
            cell = group["ops"].setdefault(op, {"before": [], "after": [], "reps": 1})
            if op in problems:
                cell["error"] = f"wrong answer on {side.label}: {problems[op]}"
                results.say(f"startup {side.label} {op}: WRONG ANSWER: {problems[op]}")
    rounds = settings.startup_rounds or settings.rounds
    results.say(f"startup: {rounds} rounds of both commands on each side, alternating")
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for side in order:
            commands, _, cwd = plans[side.label]
            for op, argv in commands.items():
                cell = group["ops"][op]
                if "error" in cell:
                    continue
                seconds, done = _run(argv, side, cwd)
                if done.returncode != 0:
                    cell["error"] = f"{side.label}: exit status {done.returncode}"
                    continue
                cell[side.label].append([round(seconds * 1e9)])
    group["loads"].append(f"end {loadavg()}")
