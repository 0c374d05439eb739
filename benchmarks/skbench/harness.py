"""What a workload is, and how pyperf times it.

A :class:`Workload` names one measurement (``area/what/subject``) and says how to
set it up: ``make`` builds, in the pyperf worker process, the one call that is timed
(an ``async`` callable of no arguments), or ``timer`` times ``loops`` calls itself
where every call needs untimed work of its own first (a sweep needs a full store),
or ``command`` is a command line that pyperf times whole (start-up). pyperf does
the rest: it calibrates the loops, runs each workload in fresh worker processes,
and keeps every value; the medians and ratios come from its JSON. A workload with
``per_call`` set runs one call per value (``--loops 1``), so that pyperf's
percentiles are the calls' own (a save's p99).

A ``count`` is not a timing: a deterministic quantity (WAL frames per commit, bytes
on disk) measured once, written by :func:`counted` as pyperf benchmarks of one value
in their unit (``integer``, ``byte``), so that the page's one renderer and the
before/after table read it like every other result.

Setup happens in each worker process, so what is slow to build and only read is
built once per run and reopened: :meth:`Context.fixture` keeps a filled on-disk
store under the run's scratch directory, keyed by subject and size.
"""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .subjects import SUBJECTS, Subject

Op = Callable[[], Awaitable[Any]]
Timer = Callable[[int], Awaitable[float]]


@dataclass(frozen=True)
class Workload:
    """One benchmark: its pyperf name and how a worker process sets it up."""

    name: str
    make: Callable[[Context], Awaitable[Op]] | None = None
    timer: Callable[[Context], Awaitable[Timer]] | None = None
    command: Callable[[Context], list[str]] | None = None
    #: A quantity, not a timing: {benchmark name: (value, pyperf unit)}.
    count: Callable[[Context], Awaitable[dict[str, tuple[float, str]]]] | None = None
    #: Modules and servers it needs (see :func:`skbench.subjects.missing`).
    needs: tuple[str, ...] = ()
    #: Items one call handles: pyperf then reports the time per item.
    inner: int = 1
    #: Slow to set up or to call: fewer worker processes.
    heavy: bool = False
    #: Values per worker process, each one call (``--loops 1``): 0 lets pyperf
    #: calibrate the loops and average them.
    per_call: int = 0


@dataclass
class Context:
    """A worker's view of the run: where fixtures live, and what to close at exit."""

    scratch: Path
    quick: bool
    closers: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)
    _fresh: int = 0

    def place(self, label: str) -> Path:
        """A new empty directory of this worker process."""
        self._fresh += 1
        path = self.scratch / "work" / f"{label}-{time.monotonic_ns()}-{self._fresh}"
        path.mkdir(parents=True)
        self.closers.append(_remover(path))
        return path

    async def fresh(self, subject: str | type[Subject]) -> Subject:
        """An opened, empty subject of its own (what saves are timed on)."""
        cls = SUBJECTS[subject] if isinstance(subject, str) else subject
        made = cls()
        made.place = self.place(cls.__name__.lower())
        await made.open(made.place)
        self.closers.append(made.close)
        return made

    async def fixture(self, subject: str | type[Subject], size: int) -> Subject:
        """An opened subject holding ``size`` checkpoints in its main stream and as
        many in the noise streams; an on-disk one is built once per run and reopened."""
        cls = SUBJECTS[subject] if isinstance(subject, str) else subject
        made = cls()
        if not cls.on_disk:
            await made.open(self.place(cls.__name__.lower()))
            self.closers.append(made.close)
            await made.fill(size)
            return made
        place = self.scratch / "fixtures" / f"{cls.__name__.lower()}-{size}"
        ready = place / "ready.json"
        if ready.exists():
            facts = json.loads(ready.read_text())
            await made.open(place)
            made.ids, made.middle = facts["ids"], facts["middle"]
        else:
            shutil.rmtree(place, ignore_errors=True)
            place.mkdir(parents=True)
            await made.open(place)
            await made.fill(size)
            ready.write_text(json.dumps({"ids": made.ids, "middle": made.middle}))
        self.closers.append(made.close)
        return made


def _remover(path: Path) -> Callable[[], Awaitable[None]]:
    async def remove() -> None:
        shutil.rmtree(path, ignore_errors=True)

    return remove


async def checked(op: Op, expect: Callable[[Any], bool], what: str) -> Op:
    """``op``, after one call whose result ``expect`` accepts (a wrong answer fast is
    no result): raises ``AssertionError`` naming ``what`` otherwise."""
    got = await op()
    if not expect(got):
        raise AssertionError(f"{what}: unexpected result {got!r:.200}")
    return op


class Worker:
    """The timing side, in one pyperf process: sets a workload up on first use (one
    event loop for the process), times ``loops`` calls with the collector off;
    :meth:`close` closes what it opened."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.loop = asyncio.new_event_loop()
        self.timers: dict[str, Timer] = {}

    def time(self, loops: int, workload: Workload) -> float:
        timer = self.timers.get(workload.name)
        if timer is None:
            timer = self.loop.run_until_complete(self._prepare(workload))
            self.timers[workload.name] = timer
        return self.loop.run_until_complete(timer(loops))

    async def _prepare(self, workload: Workload) -> Timer:
        if workload.timer is not None:
            return await workload.timer(self.ctx)
        assert workload.make is not None
        op = await workload.make(self.ctx)

        async def timed(loops: int) -> float:
            gc.collect()
            gc.disable()
            try:
                start = time.perf_counter()
                for _ in range(loops):
                    await op()
                return time.perf_counter() - start
            finally:
                gc.enable()

        return timed

    def close(self) -> None:
        async def close_all() -> None:
            for close in reversed(self.ctx.closers):
                try:
                    await close()
                except Exception as exc:  # a close after a failed run: say, go on
                    print(f"close: {type(exc).__name__}: {exc}")

        if not self.loop.is_closed():
            self.loop.run_until_complete(close_all())
            self.loop.close()


def counted(values: dict[str, tuple[float, str]]) -> Any:
    """A pyperf ``BenchmarkSuite`` of one benchmark per count, each one value in its
    unit (a count must be positive: pyperf keeps no zero)."""
    import pyperf

    return pyperf.BenchmarkSuite(
        [
            pyperf.Benchmark(
                [pyperf.Run([value], metadata={"name": name, "unit": unit}, collect_metadata=False)]
            )
            for name, (value, unit) in values.items()
        ]
    )


def register(runner: Any, workload: Workload, worker: Worker) -> None:
    """Hand ``workload`` to the pyperf ``runner`` (a manager spawns workers for it; a
    worker process runs it)."""
    if workload.command is not None:
        runner.bench_command(workload.name, workload.command(worker.ctx))
        return
    runner.bench_time_func(workload.name, worker.time, workload, inner_loops=workload.inner)
