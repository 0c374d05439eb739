"""Group commit (issue 15, S15): 1, 8 and 64 tasks saving at once, each to its own
stream, at ``durability="full"``, and how many syncs each save cost.

Every run is a child process (``python -m skbench.hot_group``, importing the same
statekeeper as the parent) on a fresh store in its own directory: it opens the store,
saves once to each task's stream (the warm-up: stream creation is not what is
measured), then starts every task at once, each making ``saves // tasks`` saves to
its own stream, one after another. Saves per second are all saves over the wall time
from the start to the last task's end; the latencies are each save's own.

The rates come from ``rounds`` untraced children per store and level. The syncs are
counted in two more children under ``strace -f -c --seccomp-bpf -e
trace=fsync,fdatasync``: one with the load and one that only opens, warms up and
closes; the difference over the number of saves is the syncs per save.

Stores: statekeeper's SQLite and file stores, and LangGraph's ``AsyncSqliteSaver`` under
the same load (every task on the one saver; its ``aput`` takes the saver's lock, one
commit per put, ``synchronous=FULL``: SQLite's default in WAL mode).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .hot import LG_ASYNC, SK_FILE, SK_SQLITE

STORES = (SK_SQLITE, SK_FILE, LG_ASYNC)
HERE = Path(__file__).resolve().parent.parent  # benchmarks/


async def _open(store: str, directory: Path) -> tuple[Any, Any]:
    """(save(stream, step) coroutine function, close coroutine function)."""
    if store == LG_ASYNC:
        from .adapters.langgraph_peers import AsyncSqliteSaverStore

        adapter = AsyncSqliteSaverStore()
        adapter.path = str(directory / "lg.db")
        await adapter.attach()

        async def put(stream: str, step: int) -> Any:
            return await adapter._save(stream, step, "default")

        return put, adapter.detach
    import statekeeper

    from .payload import make_state

    url = (
        f"sqlite:///{directory / 'sk.db'}"
        if store == SK_SQLITE
        else f"file://{directory / 'sk-file'}"
    )
    handle = statekeeper.open_store(url, durability="full")
    await handle.open()

    async def save(stream: str, step: int) -> Any:
        return await handle.save(stream, make_state(step))

    return save, handle.close


async def child(store: str, directory: Path, tasks: int, saves: int) -> dict[str, Any]:
    save, close = await _open(store, directory)
    each = saves // tasks if saves else 0
    latencies: list[float] = []
    try:
        await asyncio.gather(*(save(f"group-{t:03d}", t) for t in range(tasks)))
        start = asyncio.Event()

        async def task(t: int) -> float:
            await start.wait()
            for n in range(each):
                t0 = time.perf_counter()
                await save(f"group-{t:03d}", 1000 * t + n + 1)
                latencies.append(time.perf_counter() - t0)
            return time.perf_counter()

        runners = [asyncio.create_task(task(t)) for t in range(tasks)]
        await asyncio.sleep(0)
        began = time.perf_counter()
        start.set()
        ends = await asyncio.gather(*runners)
        wall = (max(ends) - began) if each else 0.0
    finally:
        await close()
    import statekeeper

    return {
        "saves": len(latencies),
        "wall": wall,
        "median": statistics.median(latencies) if latencies else None,
        "p90": statistics.quantiles(latencies, n=10)[-1] if len(latencies) > 1 else None,
        "statekeeper": str(Path(statekeeper.__file__).parent),
    }


# -- the parent's side -------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    """The parent's import path (the exported src/ snapshot first), for the child."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _child_command(store: str, directory: Path, tasks: int, saves: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "skbench.hot_group",
        store,
        str(directory),
        str(tasks),
        str(saves),
    ]


def _run_child(
    store: str, tasks: int, saves: int, workdir: Path, trace: Path | None = None
) -> dict[str, Any]:
    """One child on a fresh store (removed after); under strace when ``trace`` is given."""
    directory = Path(tempfile.mkdtemp(prefix="group-", dir=workdir))
    command = _child_command(store, directory, tasks, saves)
    if trace is not None:
        strace = ["strace", "-f", "-c", "--seccomp-bpf", "-o", str(trace)]
        command = [*strace, "-e", "trace=fsync,fdatasync", "--", *command]
    try:
        done = subprocess.run(
            command, cwd=HERE, env=_child_env(), capture_output=True, text=True, timeout=600
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"child exited {done.returncode}: {' | '.join(tail)}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def parse_strace(text: str) -> dict[str, int]:
    """``{"fsync": n, "fdatasync": n}`` from an ``strace -c`` summary."""
    out = {"fsync": 0, "fdatasync": 0}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in out and parts[3].isdigit():
            out[parts[-1]] = int(parts[3])
    return out


def count_syncs(store: str, tasks: int, saves: int, workdir: Path) -> dict[str, Any]:
    """Syncs per save: a traced run with the load minus a traced run without it."""
    counts = []
    for load in (saves, 0):
        trace = workdir / f"strace-{os.getpid()}-{time.monotonic_ns()}.txt"
        try:
            made = _run_child(store, tasks, load, workdir, trace)["saves"]
            counts.append((made, parse_strace(trace.read_text())))
        finally:
            trace.unlink(missing_ok=True)
    (made, loaded), (_, idle) = counts
    per = {name: (loaded[name] - idle[name]) / made for name in loaded} if made else {}
    return {"saves": made, "loaded": loaded, "idle": idle, "per_save": per}


def run_group(
    tasks_levels: tuple[int, ...],
    saves: int,
    rounds: int,
    workdir: Path,
    say: Any,
    trace: bool = True,
) -> dict[str, Any]:
    """Every store at every level: ``rounds`` rates (levels and stores interleaved) and
    one sync count each. Returns ``{store: {tasks: {...}}}`` plus ``"strace"``."""
    out: dict[str, Any] = {store: {} for store in STORES}
    have_strace = trace and shutil.which("strace") is not None
    out["strace"] = (
        "strace -f -c --seccomp-bpf -e trace=fsync,fdatasync"
        if have_strace
        else ("not run" if not trace else "strace is not installed")
    )
    for r in range(rounds):
        for tasks in tasks_levels:
            order = STORES if r % 2 == 0 else STORES[::-1]
            for store in order:
                cell = out[store].setdefault(str(tasks), {"rounds": []})
                try:
                    got = _run_child(store, tasks, saves, workdir)
                except Exception as exc:  # reported, the run goes on
                    cell["error"] = f"{type(exc).__name__}: {exc}"
                    say(f"  group {store} x{tasks}: ERROR {exc}")
                    continue
                got["rate"] = got["saves"] / got["wall"] if got["wall"] else 0.0
                cell["rounds"].append(got)
                cell["statekeeper"] = got.pop("statekeeper")
                say(
                    f"  group {store} x{tasks} round {r + 1}: {got['rate']:,.0f} saves/s, "
                    f"p90 {got['p90'] * 1e3:.2f} ms"
                )
    if have_strace:
        for tasks in tasks_levels:
            for store in STORES:
                cell = out[store].setdefault(str(tasks), {"rounds": []})
                try:
                    cell["syncs"] = count_syncs(store, tasks, saves, workdir)
                except Exception as exc:
                    cell["syncs"] = {"error": f"{type(exc).__name__}: {exc}"}
                say(f"  group {store} x{tasks} syncs: {cell['syncs']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="one group-commit child run")
    parser.add_argument("store", choices=STORES)
    parser.add_argument("directory", type=Path)
    parser.add_argument("tasks", type=int)
    parser.add_argument("saves", type=int)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(child(args.store, args.directory, args.tasks, args.saves))))


if __name__ == "__main__":
    main()
