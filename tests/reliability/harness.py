"""Drivers shared by the crash tests: the random kill loop (of the client or of the
database server) and the strace crash points."""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Protocol

from reliability_support import Backend

from statekeeper.testing.invariants import (
    InvariantViolation,
    Report,
    WriteLog,
    check_invariants,
)
from statekeeper.testing.workloads import fork_workload

#: System calls that change files: a crash point is "just before the K-th of one".
MUTATING_SYSCALLS = (
    "write,pwrite64,writev,pwritev,pwritev2,fsync,fdatasync,sync_file_range,"
    "rename,renameat,renameat2,unlink,unlinkat,ftruncate,link,linkat,mkdir,mkdirat,rmdir"
)
STRACE = shutil.which("strace")


async def check_store(backend: Backend, log: WriteLog, *, floor: int = 0) -> Report:
    """Open the store as a restarted application would and check every invariant."""
    try:
        store = backend.open()
        await store.open()
    except Exception as exc:
        report = Report(ops=len(log.ops), acked=sum(op.acked for op in log.ops))
        report.add("D", f"the store does not open after the crash: {exc!r}")
        raise InvariantViolation(report) from exc
    try:
        return await check_invariants(store, log, floor=floor)
    finally:
        await store.close()


@dataclass
class KillLoopResult:
    rounds: int = 0
    kills: int = 0
    ops: int = 0
    acked: int = 0
    in_doubt: int = 0
    records: int = 0


def kill_loop(
    backend: Backend,
    workdir: Path,
    *,
    rounds: int,
    seed: int,
    max_delay: float = 0.4,
    setup: Sequence[str] = (),
) -> KillLoopResult:
    """Run the writer workload ``rounds`` times over one store, SIGKILL it at a seeded
    random moment each time, and check the invariants after every kill.

    The first round's writer is killed only once it has acknowledged a write.

    Raises :class:`InvariantViolation` at the first round that breaks one.
    """
    rng = random.Random(seed)
    log_path = workdir / f"{backend.kind}-writes.log"
    result = KillLoopResult()
    floor = 0
    for r in range(rounds):
        child = fork_workload(
            [
                "writer",
                *backend.child_args(),
                "--log",
                str(log_path),
                "--seed",
                str(seed * 1000 + r),
                "--prefix",
                f"r{r}",
                *[arg for target in setup for arg in ("--setup", target)],
            ]
        )
        ready = child.wait_ready(60)
        if ready and r == 0:
            # the first writer is killed only after an acknowledged write, so the
            # loop checks some however slowly the writers start; the others at any
            # moment, before their first write included
            _wait_acks(log_path, f"r{r}", since=0, timeout=60, what="before the kill")
        if ready:
            time.sleep(rng.uniform(0.0, max_delay))
        child.kill()
        code = child.wait(30)
        if not ready and code != -signal.SIGKILL:
            raise AssertionError(f"round {r}: the writer died before it was ready (exit {code})")
        result.rounds += 1
        result.kills += code == -signal.SIGKILL
        log = WriteLog.read(log_path)
        report = asyncio.run(check_store(backend, log, floor=floor))
        floor = max(floor, report.probe_sequence or 0)
        result.ops, result.acked = report.ops, report.acked
        result.in_doubt, result.records = report.in_doubt, report.records
    return result


# -- server crash ----------------------------------------------------------------------


class CrashableServer(Protocol):
    """A database server the test runs itself (``scratch_postgres.ScratchPostgres``)."""

    def crash(self) -> int: ...

    def start(self) -> None: ...


@dataclass
class ServerCrashResult:
    rounds: int = 0
    server_kills: int = 0
    acked_by_crash: int = 0
    acked_after_restart: int = 0
    ops: int = 0
    acked: int = 0
    in_doubt: int = 0
    records: int = 0


def _acks(log_path: Path, writer: str, *, since: int = 0) -> int:
    """Acknowledged operations of ``writer`` (a ``--prefix``) begun after ``since`` (ns)."""
    log = WriteLog.read(log_path)
    return sum(
        1
        for op in log.ops
        if op.session.startswith(f"{writer}:") and op.acked and op.t_begin > since
    )


def _wait_acks(log_path: Path, writer: str, *, since: int, timeout: float, what: str) -> int:
    deadline = time.monotonic() + timeout
    while (n := _acks(log_path, writer, since=since)) == 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"{writer}: no acknowledged write {what} within {timeout:.0f} s")
        time.sleep(0.05)
    return n


def server_crash_loop(
    backend: Backend,
    server: CrashableServer,
    workdir: Path,
    *,
    rounds: int,
    seed: int,
    max_delay: float = 0.5,
) -> ServerCrashResult:
    """Run the writer workload against ``server`` and SIGKILL the server, not the
    writer, at a seeded random moment, ``rounds`` times; check the invariants after each.

    Each round: the writer runs until it has an acknowledged write, then a random
    while longer; the server's postmaster is SIGKILLed; after a random pause (the
    writer's calls fail meanwhile) the server restarts, running crash recovery; the
    same writer process must then get a write acknowledged again (its store
    reconnects by itself); a random while later the writer is killed, since the
    checker needs a quiet store, and D, A, R, L, S are checked on a freshly opened
    store.

    Raises :class:`InvariantViolation` at the first round that breaks one.
    """
    rng = random.Random(seed)
    log_path = workdir / f"{backend.kind}-server-crash-writes.log"
    result = ServerCrashResult()
    floor = 0
    for r in range(rounds):
        writer = f"sc{r}"
        child = fork_workload(
            [
                "writer",
                *backend.child_args(),
                "--log",
                str(log_path),
                "--seed",
                str(seed * 1000 + r),
                "--prefix",
                writer,
            ]
        )
        try:
            if not child.wait_ready(60):
                raise AssertionError(f"round {r}: the writer died before it was ready")
            _wait_acks(log_path, writer, since=0, timeout=60, what="before the crash")
            time.sleep(rng.uniform(0.0, max_delay))
            server.crash()
            result.server_kills += 1
            result.acked_by_crash += _acks(log_path, writer)
            time.sleep(rng.uniform(0.0, max_delay))
            server.start()
            restarted = time.monotonic_ns()
            _wait_acks(
                log_path, writer, since=restarted, timeout=60, what="after the server restarted"
            )
            time.sleep(rng.uniform(0.0, max_delay))
        finally:
            child.kill()
            child.wait(30)
        result.acked_after_restart += _acks(log_path, writer, since=restarted)
        result.rounds += 1
        log = WriteLog.read(log_path)
        report = asyncio.run(check_store(backend, log, floor=floor))
        floor = max(floor, report.probe_sequence or 0)
        result.ops, result.acked = report.ops, report.acked
        result.in_doubt, result.records = report.in_doubt, report.records
    return result


# -- crash points with strace ------------------------------------------------------------

_CALL = re.compile(r"^(\d+)\s+(\w+)\(")


def _strace_command(
    trace: Path, inject: tuple[str, int] | None, options: Sequence[str]
) -> list[str]:
    """strace tracing the mutating calls of every thread into ``trace``; with
    ``(name, k)`` it kills the traced process on entering the k-th ``name`` call
    of a thread."""
    assert STRACE is not None
    cmd = [STRACE, "-f", *options, "-o", str(trace), "-e", f"trace={MUTATING_SYSCALLS}"]
    if inject is not None:
        cmd += ["-e", f"inject={inject[0]}:signal=KILL:when={inject[1]}"]
    return cmd


@contextmanager
def strace_attached(
    pid: int, trace: Path, inject: tuple[str, int] | None, *, options: Sequence[str] = ()
) -> Iterator[None]:
    """Attach strace (see :func:`_strace_command`) to the stopped process ``pid`` and
    continue it; on leaving, wait for strace, and kill it if it is still running."""
    cmd = _strace_command(trace, inject, options)
    tracer = subprocess.Popen(
        [*cmd, "-p", str(pid)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    try:
        assert tracer.stderr is not None
        line = tracer.stderr.readline()  # "strace: Process N attached"
        if b"attached" not in line:
            raise AssertionError(f"strace did not attach: {line!r}")
        os.kill(pid, signal.SIGCONT)
        yield
        tracer.wait(30)
    finally:
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait()
        if tracer.stderr is not None:
            tracer.stderr.close()


def child_exit(job: Callable[[], Coroutine[Any, Any, None]]) -> NoReturn:  # pragma: no cover
    """The body of a forked child to trace: stop until strace is attached (it sends
    SIGCONT), run ``job``, and exit 0, or 1 with the traceback printed."""
    code = 1
    try:
        os.kill(os.getpid(), signal.SIGSTOP)  # until strace is attached
        asyncio.run(job())
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def most_per_name(per_thread: Counter[tuple[str, str]]) -> Counter[str]:
    """From counts per (thread, call name): the most calls of each name that one
    thread made (strace counts ``when=K`` per thread)."""
    calls: Counter[str] = Counter()
    for (_, name), n in per_thread.items():
        calls[name] = max(calls[name], n)
    return calls


def count_calls(trace: Path) -> Counter[str]:
    """The most calls of each mutating syscall one thread made, from an strace log."""
    per_thread: Counter[tuple[str, str]] = Counter()
    for text in trace.read_text(errors="replace").splitlines():
        m = _CALL.match(text)
        if m and "resumed>" not in text:
            per_thread[(m[1], m[2])] += 1
    return most_per_name(per_thread)


def run_python_traced(
    code: str, trace: Path, inject: tuple[str, int] | None
) -> tuple[int, set[str], Counter[str]]:
    """Run ``python -c code`` under strace (see :func:`_strace_command`); return its
    exit status, the word after each ``acked`` line it printed, and its calls (see
    :func:`count_calls`). Without ``inject`` it must succeed."""
    cmd = _strace_command(trace, inject, ["-qq"])
    done = subprocess.run(
        [*cmd, sys.executable, "-c", code], capture_output=True, timeout=120, check=False
    )
    acked = {
        line.split()[1] for line in done.stdout.decode().splitlines() if line.startswith("acked")
    }
    calls = count_calls(trace)
    if inject is None and done.returncode != 0:
        raise AssertionError(f"the child fails without faults: {done.stderr.decode()[-2000:]}")
    return done.returncode, acked, calls


def kill_file_store_sweep(
    workdir: Path,
    points: list[tuple[str, int]],
    run: Callable[[Path, tuple[str, int]], tuple[int, set[str], Counter[str]]],
    check: Callable[[Path, set[str]], Coroutine[Any, Any, None]],
) -> int:
    """For each crash point, ``run`` a child saving to a fresh file store under
    ``workdir`` killed there (see :func:`run_python_traced`), and ``check`` the store
    it left with what it acknowledged (on the same machine: no reboot, so the boot id
    is the recorded one). At least half the points must kill the child; returns how
    many did."""
    kills = 0
    for n, (name, k) in enumerate(points):
        root = workdir / f"kill{n}"
        status, acked, _ = run(root, (name, k))
        # strace reports the traced child's SIGKILL as its own exit (128 + 9)
        kills += status in (-signal.SIGKILL, 128 + signal.SIGKILL)
        if not (root / "statekeeper.json").exists():
            continue  # killed before the store existed
        try:
            asyncio.run(check(root, acked))
        except AssertionError as exc:
            raise AssertionError(f"after SIGKILL at {name} #{k}: {exc}") from exc
    assert kills >= len(points) // 2, f"only {kills} of {len(points)} points killed the child"
    return kills


@dataclass
class CrashRun:
    exit_code: int
    log: WriteLog
    calls: Counter[str] = field(default_factory=Counter)


def run_traced(
    backend: Backend, workdir: Path, inject: tuple[str, int] | None, *, setup: list[str] = ()
) -> CrashRun:
    """Run the ``crashpoint`` workload in a forked child under strace.

    Without ``inject`` this counts the mutating system calls per name (the most any
    one thread made, since strace counts per thread); with ``(name, k)`` the child
    is killed by SIGKILL on entering the k-th ``name`` call of a thread.
    """
    assert STRACE is not None
    parent_end, child_end = socket.socketpair()
    trace = workdir / "trace.txt"
    argv = ["crashpoint", *backend.child_args(), "--log-fd", str(child_end.fileno())]
    for target in setup:
        argv += ["--setup", target]
    child = fork_workload(argv, stopped=True)
    child_end.close()
    os.waitpid(child.pid, os.WUNTRACED)
    try:
        with strace_attached(child.pid, trace, inject):
            chunks = []
            parent_end.settimeout(60)
            while True:  # drain the log as the child runs: it never blocks on a full socket
                chunk = parent_end.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
            code = child.wait(60)
    finally:
        child.kill()
        child.wait(30)
        parent_end.close()
    return CrashRun(code, WriteLog.parse(b"".join(chunks)), count_calls(trace))


def crash_points(calls: Counter[str], *, budget: int | None, seed: int) -> list[tuple[str, int]]:
    """Every (syscall, k) point, or a seeded sample of ``budget`` of them that always
    keeps the first and last call of each name."""
    points = [(name, k) for name in sorted(calls) for k in range(1, calls[name] + 1)]
    if budget is None or len(points) <= budget:
        return points
    keep = {(name, 1) for name in calls} | {(name, calls[name]) for name in calls}
    rest = [p for p in points if p not in keep]
    rng = random.Random(seed)
    chosen = keep | set(rng.sample(rest, max(budget - len(keep), 0)))
    return sorted(chosen)


def crash_point_sweep(
    make: Callable[[], Backend],
    workdir: Path,
    *,
    budget: int | None,
    seed: int,
    setup: list[str] = (),
) -> dict[str, int]:
    """Kill the crashpoint workload at each chosen crash point on a fresh store, and check
    the invariants after each; returns the figures. Raises at the first violation."""
    baseline = run_traced(make(), workdir, None, setup=list(setup))
    if baseline.exit_code != 0:
        raise AssertionError(f"the crashpoint workload fails without faults: {baseline.exit_code}")
    points = crash_points(baseline.calls, budget=budget, seed=seed)
    figures = {"points": len(points), "total": sum(baseline.calls.values()), "kills": 0}
    for name, k in points:
        backend = make()
        run = run_traced(backend, workdir, (name, k), setup=list(setup))
        figures["kills"] += run.exit_code == -signal.SIGKILL
        try:
            asyncio.run(check_store(backend, run.log))
        except InvariantViolation as exc:
            raise AssertionError(f"after SIGKILL at {name} #{k}:\n{exc}") from exc
    return figures
