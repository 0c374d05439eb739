"""Start-up time of the ``statekeeper`` command line: the median wall time of
``statekeeper --help`` and of ``statekeeper latest`` on a 10-checkpoint SQLite
store, over N runs each, against the targets (0.3 s and 0.5 s).

Run it on an idle machine (it prints the load average it saw)::

    uv run python benchmarks/startup.py [--runs 15] [--uv] [--check]

It runs the console script of this environment directly (``.venv/bin/statekeeper``),
so uv's own start-up is left out; ``--uv`` also times ``uv run --frozen statekeeper``.
Bytecode is written and reused as in a normal installation (a set
``PYTHONDONTWRITEBYTECODE`` is removed, and one untimed run warms the cache).
``--check`` exits 1 when a median wall time is over its target. The CPU time
(user + system) is printed too: on a busy machine the wall time mostly measures
the wait for a core, the CPU time what start-up itself costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {"help": 0.3, "latest": 0.5}
CHECKPOINTS = 10


def _script() -> list[str]:
    script = Path(sys.executable).parent / "statekeeper"
    if script.exists():
        return [str(script)]
    found = shutil.which("statekeeper")
    if found is None:
        raise SystemExit("no statekeeper console script: uv sync --extra cli")
    return [found]


def _seed(url: str) -> None:
    import statekeeper

    async def main() -> None:
        async with statekeeper.open_store(url) as store:
            for step in range(CHECKPOINTS):
                await store.save("job", {"step": step}, tags={"job": "bench"})

    asyncio.run(main())


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(
    argv: list[str], cwd: Path, env: dict[str, str], runs: int
) -> tuple[list[float], list[float]]:
    """Wall times and CPU times (user + system, of the process and its children)."""
    subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)  # warm-up
    walls, cpus = [], []
    for _ in range(runs):
        cpu, start = _cpu(), time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu() - cpu)
    return walls, cpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command")
    parser.add_argument("--uv", action="store_true", help="also time uv run --frozen")
    parser.add_argument("--check", action="store_true", help="exit 1 over a target")
    args = parser.parse_args()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("STATEKEEPER_URL", "PYTHONDONTWRITEBYTECODE")
    }
    env["COLUMNS"] = "80"
    launchers = {"console script": _script()}
    if args.uv:
        uv = shutil.which("uv")
        if uv is None:
            raise SystemExit("--uv: uv is not on PATH")
        launchers["uv run --frozen"] = [uv, "run", "--frozen", "statekeeper"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"statekeeper start-up, {args.runs} runs each, load average {load:.2f} at start")
    over = False
    with tempfile.TemporaryDirectory(prefix="sk-startup-") as tmp:
        cwd = Path(tmp)
        url = f"sqlite:///{cwd / 'bench.db'}"
        _seed(url)
        commands = {"help": ["--help"], "latest": ["latest", "job", "--url", url]}
        for launcher, prefix in launchers.items():
            for name, command in commands.items():
                times, cpus = _time([*prefix, *command], cwd, env, args.runs)
                median = statistics.median(times)
                verdict = "ok" if median <= TARGETS[name] else "OVER"
                over |= launcher == "console script" and median > TARGETS[name]
                print(
                    f"  {launcher:16} {name:7} median {median:6.3f} s "
                    f"(min {min(times):.3f}, max {max(times):.3f}; "
                    f"CPU median {statistics.median(cpus):.3f} s) "
                    f"target {TARGETS[name]:.1f} s: {verdict}"
                )
    return 1 if args.check and over else 0


if __name__ == "__main__":
    raise SystemExit(main())
