"""Child-process workloads for crash, fault and concurrency tests.

Run as ``python -m statekeeper.testing.workloads <workload> --url URL ...``:

``writer``
    A seeded random loop of saves (explicit and store-assigned ids), CAS and
    plain updates and deletes (sometimes of the newest checkpoint, which is what
    exposes ``max(existing)+1`` sequences) over a few streams, logged through
    :class:`~statekeeper.testing.invariants.LoggedStore`. Prints ``ready`` once
    the store is open, so a parent can kill it mid-operation at a random time.
``crashpoint``
    A short fixed workload (saves, a CAS update, a delete, a save after deleting
    the newest) for killing at the K-th system call.
``actor``
    One process of a concurrent history: a ``writer`` (saves, CAS increments of
    a shared counter, CAS updates) or a ``reader`` (``get_latest``, cursor walks
    in both orders, loads), recorded with
    :class:`~statekeeper.testing.history.RecordingStore`. It prints ``ready`` and
    starts when a line arrives on stdin, so all actors start together.

Common options: ``--register scheme=pkg.mod:Class`` registers a backend (a
third-party backend or a deliberately broken mutant) and ``--setup pkg.mod:func``
calls a function before the store opens (to install a fault-injection layer).
``--option key=value`` passes a store option.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import random
import select
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from .. import open_store
from .._core.store import BaseCheckpointStore
from .._registry import register_backend
from ..errors import CheckpointNotFound, PreconditionFailed, StatekeeperError
from .recording import HistoryRecorder, LoggedStore, LogWriter, RecordingStore

__all__ = [
    "COUNTER_ID",
    "COUNTER_STREAM",
    "Child",
    "fork_workload",
    "main",
    "make_state",
    "writer_loop",
]

COUNTER_ID = "counter"
COUNTER_STREAM = "counter"


def make_state(token: str, n: int, rng: random.Random, max_size: int) -> dict[str, Any]:
    """A plain-JSON state carrying a unique token and a padding of random size."""
    return {"token": token, "n": n, "pad": "x" * rng.randint(0, max_size)}


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _open(args: argparse.Namespace) -> BaseCheckpointStore:
    for item in args.register:
        scheme, _, target = item.partition("=")
        register_backend(scheme, target)
    for target in args.setup:
        _resolve(target)()
    options = dict(item.split("=", 1) for item in args.option)
    return open_store(args.url, **options)


def _ready(args: argparse.Namespace) -> None:
    if args.ready_fd is not None:
        os.write(args.ready_fd, b"ready\n")
    else:
        sys.stdout.write("ready\n")
        sys.stdout.flush()


def _wait_go(args: argparse.Namespace) -> None:
    if args.go_fd is not None:
        os.read(args.go_fd, 1)
    else:
        sys.stdin.readline()


# -- writer ----------------------------------------------------------------------------


async def writer_loop(
    logged: LoggedStore,
    rng: random.Random,
    *,
    prefix: str,
    ops: int = 0,
    streams: int = 3,
    state_size: int = 400,
    stop_on_error: bool = False,
) -> int:
    """The ``writer`` workload over an open, logged store; returns the operations done.

    Runs ``ops`` operations (forever when 0): 55% saves (80% with an explicit id
    ``<prefix>-<n>``), 25% updates (80% compare-and-set) and 20% deletes (half of
    them of the newest checkpoint) of its own checkpoints, over ``streams``
    streams, with states of up to ``state_size`` padding characters.
    """
    names = [f"s{i}" for i in range(streams)]
    live: list[tuple[str, str]] = []  # (id, etag) of our own live checkpoints, oldest first
    n = 0
    while ops <= 0 or n < ops:
        n += 1
        token = f"{prefix}-{n}"
        state = make_state(token, n, rng, state_size)
        roll = rng.random()
        try:
            if roll < 0.55 or not live:
                explicit = rng.random() < 0.8
                cp = await logged.save(
                    rng.choice(names),
                    state,
                    id=token if explicit else None,
                    tags={"w": prefix, "k": str(n % 3)},
                )
                live.append((cp.id, cp.etag))
            elif roll < 0.80:
                i = rng.randrange(len(live))
                cid, etag = live[i]
                cas = rng.random() < 0.8
                cp = await logged.update(cid, state, if_match=etag if cas else None)
                live[i] = (cid, cp.etag)
            else:
                # deleting the newest now and then is what catches max+1 sequences
                i = len(live) - 1 if rng.random() < 0.5 else rng.randrange(len(live))
                cid, etag = live.pop(i)
                await logged.delete(cid, if_match=etag if rng.random() < 0.5 else None)
        except StatekeeperError as exc:
            if stop_on_error:
                raise
            print(f"error {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            live = [entry for entry in live if entry[0] != getattr(exc, "id", None)]
    return n


async def run_writer(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    log = LogWriter(args.log_fd if args.log_fd is not None else args.log, writer=args.prefix)
    async with _open(args) as store:
        _ready(args)
        await writer_loop(
            LoggedStore(store, log),
            rng,
            prefix=args.prefix,
            ops=args.ops,
            streams=args.streams,
            state_size=args.state_size,
            stop_on_error=args.stop_on_error,
        )
    log.close()
    print("done", flush=True)


# -- crash point -----------------------------------------------------------------------


async def run_crashpoint(args: argparse.Namespace) -> None:
    log = LogWriter(args.log_fd if args.log_fd is not None else args.log, writer="cp")
    async with _open(args) as store:
        s = LoggedStore(store, log)
        a = await s.save("alpha", {"step": 1, "token": "a"}, id="a", tags={"k": "x"})
        b = await s.save("alpha", {"step": 2, "token": "b"}, id="b")
        await s.save("beta", {"step": 1, "token": "c", "pad": "y" * 3000}, id="c")
        await s.update(a.id, {"step": 1, "token": "a2"}, if_match=a.etag)
        await s.delete(b.id)
        d = await s.save("alpha", {"step": 3, "token": "d"})
        await s.delete(d.id)  # the newest: the next sequence must still be higher
        await s.save("alpha", {"step": 4, "token": "e"}, id="e")
    log.close()
    print("done", flush=True)


# -- concurrent actors -----------------------------------------------------------------


async def _increment(store: RecordingStore, proc: str, n: int) -> None:
    for _ in range(8):
        try:
            cp = await store.load(COUNTER_ID)
            await store.update(
                COUNTER_ID,
                {"n": cp.state["n"] + 1, "by": proc, "op": n},
                if_match=cp.etag,
            )
            return
        except PreconditionFailed:
            continue


async def _writer_step(
    store: RecordingStore,
    proc: str,
    n: int,
    rng: random.Random,
    streams: Sequence[str],
    mine: list[tuple[str, str]],
) -> None:
    roll = rng.random()
    if roll < 0.5 or not mine:
        cp = await store.save(rng.choice(streams), {"by": proc, "n": n}, id=f"{proc}-{n}")
        mine.append((cp.id, cp.etag))
    elif roll < 0.85:
        await _increment(store, proc, n)
    else:
        i = rng.randrange(len(mine))
        cid, etag = mine[i]
        try:
            cp = await store.update(cid, {"by": proc, "n": n, "upd": True}, if_match=etag)
            mine[i] = (cid, cp.etag)
        except (PreconditionFailed, CheckpointNotFound):
            del mine[i]


async def _reader_step(store: RecordingStore, rng: random.Random, streams: Sequence[str]) -> None:
    roll = rng.random()
    stream = rng.choice(streams)
    if roll < 0.45:
        await store.get_latest(stream)
    elif roll < 0.85:
        order = "asc" if rng.random() < 0.6 else "desc"
        # a bounded walk: long streams must not starve the other kinds of read
        await store.walk(stream, order=order, limit=rng.randint(2, 7), max_pages=12)
    else:
        await store.load(COUNTER_ID)


async def run_actor(args: argparse.Namespace) -> None:
    proc = f"{args.role}{args.index}"
    rng = random.Random(args.seed * 1000 + args.index + (500 if args.role == "reader" else 0))
    streams = [f"h{i}" for i in range(args.streams)]
    recorder = HistoryRecorder(args.history, proc)
    async with _open(args) as raw:
        store = RecordingStore(raw, recorder)
        _ready(args)
        _wait_go(args)
        deadline = time.monotonic() + args.duration
        mine: list[tuple[str, str]] = []
        n = 0
        while time.monotonic() < deadline:
            n += 1
            try:
                if args.role == "writer":
                    await _writer_step(store, proc, n, rng, streams, mine)
                else:
                    await _reader_step(store, rng, streams)
            except StatekeeperError as exc:
                # recorded in the history already; timeouts under contention are allowed
                print(f"{proc}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    recorder.close()
    print("done", flush=True)


# -- command line ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m statekeeper.testing.workloads")
    sub = parser.add_subparsers(dest="workload", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", required=True, help="the store URL")
    common.add_argument("--register", action="append", default=[], metavar="SCHEME=MOD:CLS")
    common.add_argument("--setup", action="append", default=[], metavar="MOD:FUNC")
    common.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    common.add_argument("--ready-fd", type=int, help="announce readiness here, not on stdout")
    common.add_argument("--go-fd", type=int, help="wait for the start byte here, not on stdin")
    logged = argparse.ArgumentParser(add_help=False)
    logged.add_argument("--log", help="write-log file (fsynced per entry)")
    logged.add_argument("--log-fd", type=int, help="write-log pipe or socket descriptor")

    w = sub.add_parser("writer", parents=[common, logged], help="random writer loop")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--ops", type=int, default=0, help="stop after this many (0: until killed)")
    w.add_argument("--prefix", default="w", help="id prefix, unique per run")
    w.add_argument("--streams", type=int, default=3)
    w.add_argument("--state-size", type=int, default=400)
    w.add_argument("--stop-on-error", action="store_true")

    sub.add_parser("crashpoint", parents=[common, logged], help="short fixed workload")

    a = sub.add_parser("actor", parents=[common], help="one actor of a concurrent history")
    a.add_argument("--role", choices=["writer", "reader"], required=True)
    a.add_argument("--index", type=int, required=True)
    a.add_argument("--history", required=True)
    a.add_argument("--duration", type=float, default=3.0)
    a.add_argument("--streams", type=int, default=2)
    a.add_argument("--seed", type=int, default=0)
    return parser


class Child:
    """A workload running in a forked child process (see :func:`fork_workload`)."""

    def __init__(self, pid: int, ready_fd: int, go_fd: int) -> None:
        self.pid = pid
        self._ready_fd = ready_fd
        self._go_fd = go_fd
        self.status: int | None = None

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Wait until the workload opened its store; ``False`` if it died or timed out."""
        readable, _, _ = select.select([self._ready_fd], [], [], timeout)
        return bool(readable) and os.read(self._ready_fd, 64).startswith(b"ready")

    def go(self) -> None:
        """Send the start byte (for ``actor``)."""
        os.write(self._go_fd, b"g")

    def kill(self) -> None:
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, or ``-signal`` if it was killed (like ``subprocess``)."""
        if self.status is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                pid, status = os.waitpid(self.pid, os.WNOHANG if deadline else 0)
                if pid:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    self.kill()
                    deadline = None
                time.sleep(0.01)
            self.status = os.waitstatus_to_exitcode(status)
            os.close(self._ready_fd)
            os.close(self._go_fd)
        return self.status

    @property
    def killed(self) -> bool:
        return self.status == -signal.SIGKILL


def fork_workload(argv: Sequence[str], *, stopped: bool = False) -> Child:
    """Run ``main(argv)`` in a forked child of this process, which must not be running an
    event loop or hold open stores. Forking skips the interpreter start-up and imports,
    which makes hundreds of kill rounds affordable.

    With ``stopped`` the child stops itself (SIGSTOP) before doing anything, so a
    tracer such as strace can attach; resume it with SIGCONT.
    """
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(ready_r)
            os.close(go_w)
            if stopped:
                os.kill(os.getpid(), signal.SIGSTOP)
            main([*argv, "--ready-fd", str(ready_w), "--go-fd", str(go_r)])
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    return Child(pid, ready_r, go_w)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.workload in ("writer", "crashpoint") and args.log is None and args.log_fd is None:
        raise SystemExit("give --log or --log-fd")
    run = {"writer": run_writer, "crashpoint": run_crashpoint, "actor": run_actor}
    asyncio.run(run[args.workload](args))


if __name__ == "__main__":
    main()
