"""How ``compare.py`` measures one workload on both sides, side by side.

For each workload (a backend's store, or the codec) one child process per side
(:mod:`skbench.compare_child`) builds its own store and checks every read once.
Then, untimed, a calibration sizes the rounds: each op gets the same number of
calls per round on both sides (:func:`skbench.compare_stats.plan_for`), so the
stores grow alike under the writes. Then many rounds: in each, every op in
turn runs in chunks of a few milliseconds of calls, alternating between the two
sides (:func:`_round`), so that a burst of other work on the shared machine falls
on both alike. Each reply carries the raw per-call seconds; nothing is summarised
until the report (:mod:`skbench.compare_stats`, :mod:`skbench.compare_report`).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .compare_source import Side
from .compare_stats import MAX_CHUNK, plan_for
from .compare_workloads import BATCH, SAVE_MANY, WRITE_OPS

#: Calls per chunk at most for the ops that add checkpoints (see ``WRITE_OPS``), and
#: checkpoints a round at most from each of them: the stores stay near their built
#: size (a ``save_many`` of 100 then runs once a round).
WRITE_CHUNK = 40
WRITE_BUDGET = 60

__all__ = ["ChildFailed", "CompareResults", "Settings", "loadavg", "run_workload"]


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Settings:
    size: int
    rounds: int
    slice_seconds: float  # per op per side per round
    chunk_seconds: float  # per op per side between two switches of side
    calibrate_seconds: float
    postgres_url: str
    #: Processes per side, each with its own store, taking the chunks in turn: one
    #: process of identical code can be a few % off another (memory layout), and
    #: on PostgreSQL each has its own server connections.
    replicas: int = 2
    only: list[str] = field(default_factory=list)
    startup_seed: int = 10
    startup_rounds: int = 0  # 0: as many as ``rounds``


@dataclass
class CompareResults:
    meta: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    #: workload -> {"info": {...}, "ops": {op: {"reps", "before", "after", "error"}}};
    #: "before" and "after" are lists of rounds, each a list of per-call nanoseconds
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    loads: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
        self.log.append(message)


class ChildFailed(RuntimeError):
    """A side's child process died or reported a failure."""


class Child:
    """The parent's end of one :mod:`skbench.compare_child` process."""

    def __init__(self, side: Side, workdir: Path) -> None:
        self.side = side
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "child.log"
        self._log: IO[str] = self.log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "skbench.compare_child", "--expect", str(side.paths[0])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=side.env(),
            cwd=workdir,
            text=True,
        )
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise ChildFailed(
                f"{self.side.label} child exited ({self.proc.returncode}): {self.tail()}"
            )
        reply: dict[str, Any] = json.loads(line)
        if "failed" in reply:
            raise ChildFailed(f"{self.side.label}: {reply['failed']}")
        return reply

    def ask(self, **msg: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # _read reports how it died
        return self._read()

    def tail(self) -> str:
        self._log.flush()
        text = self.log_path.read_text(encoding="utf-8", errors="replace").strip()
        return text[-1500:] or "(nothing on stderr)"

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.ask(cmd="close")
        except (ChildFailed, OSError, ValueError):
            pass
        finally:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._log.close()


def _median(samples: list[int]) -> float:
    """The median of nanosecond samples, in seconds."""
    return statistics.median(samples) / 1e9 if samples else float("nan")


def run_workload(
    name: str,
    sides: list[Side],
    settings: Settings,
    workdir: Path,
    results: CompareResults,
    *,
    say: Callable[[str], None] | None = None,
) -> None:
    """Measure workload ``name`` on both ``sides``; fill ``results.groups[name]``."""
    say = say or results.say
    group: dict[str, Any] = {"info": {}, "ops": {}, "loads": [f"start {loadavg()}"]}
    group["replicas"] = settings.replicas
    results.groups[name] = group
    children: dict[str, list[Child]] = {side.label: [] for side in sides}
    try:
        for side in sides:
            replies = []
            for i in range(settings.replicas):
                where = workdir / name / side.label / str(i)
                children[side.label].append(child := Child(side, where))
                replies.append(
                    child.ask(
                        cmd="open",
                        workload=name,
                        size=settings.size,
                        workdir=str(where),
                        postgres_url=settings.postgres_url,
                    )
                )
            group["info"][side.label] = opened = _merge(replies)
            built = (
                f"built {opened['saved']:,} checkpoints in "
                + ", ".join(f"{s:.1f} s" for s in opened["builds"])
                if opened["saved"]
                else "ready"
            )
            say(
                f"{name} {side.label} ({settings.replicas} processes): {built}"
                + "".join(f"; WRONG ANSWER {op}: {p}" for op, p in opened["problems"].items())
            )
        ops = _measurable(group, sides)
        plan = _calibrate(children, ops, settings, group)
        group["loads"].append(f"rounds {loadavg()}")
        say(f"{name}: {settings.rounds} rounds of {len(plan)} ops, sides alternating")
        for r in range(settings.rounds):
            _round(r, plan, sides, children, group, f"{name} ", say)
            if (r + 1) % 10 == 0 and r + 1 < settings.rounds:
                say(f"  {name}: {r + 1} rounds done (load {loadavg()})")
        _say_medians(name, group, sides, say)
    except ChildFailed as exc:
        group["failed"] = str(exc)
        say(f"{name}: FAILED: {exc}")
    finally:
        for replicas in children.values():
            for child in replicas:
                child.close()
        group["loads"].append(f"end {loadavg()}")


def _round(
    r: int,
    plan: dict[str, tuple[int, int]],
    sides: list[Side],
    children: dict[str, list[Child]],
    group: dict[str, Any],
    prefix: str,
    say: Callable[[str], None],
) -> None:
    """Round ``r``: each op in turn (in an order shuffled per round), in ``chunks``
    of ``reps`` calls that alternate between the sides (A B, B A, A B, ...; which
    goes first alternates between ops and rounds too), each chunk on the next of
    the side's processes (:attr:`Settings.replicas`). A chunk is a few
    milliseconds, so a burst of other work on the machine falls on both sides of
    every op alike; the round's samples of a side are its chunks together."""
    names = list(plan)
    random.Random(r).shuffle(names)
    for k, op in enumerate(names):
        reps, chunks = plan[op]
        cell = group["ops"][op]
        got: dict[str, list[int]] = {side.label: [] for side in sides}
        for c in range(chunks):
            order = sides if (r + k + c) % 2 == 0 else sides[::-1]
            for side in order:
                if "error" in cell:
                    return
                replicas = children[side.label]
                child = replicas[(r + c) % len(replicas)]
                reply = child.ask(cmd="round", reps={op: reps}, seed=r)
                got[side.label] += reply["samples"].get(op, [])
                for name, error in reply["errors"].items():
                    group["ops"][name]["error"] = f"{side.label}: {error}"
                    say(f"  {prefix}{name}: ERROR on {side.label}: {error}")
        for label, samples in got.items():
            cell[label].append(samples)


def _merge(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's replicas' answers to ``open`` as one: the ops all can run, every
    wrong answer any of them found."""
    merged = dict(replies[0])
    merged["builds"] = [r["build_seconds"] for r in replies]
    merged["problems"] = {k: v for r in replies for k, v in r["problems"].items()}
    merged["ops"] = [op for op in replies[0]["ops"] if all(op in r["ops"] for r in replies)]
    return merged


def _measurable(group: dict[str, Any], sides: list[Side]) -> list[str]:
    """The ops both sides can run; an op either side answered wrongly is an error."""
    infos = [group["info"][s.label] for s in sides]
    ops = [op for op in infos[0]["ops"] if all(op in i["ops"] for i in infos[1:])]
    for side, info in zip(sides, infos, strict=True):
        for op, problem in info["problems"].items():
            group["ops"].setdefault(op, {"before": [], "after": []})
            group["ops"][op]["error"] = f"wrong answer on {side.label}: {problem}"
    for op in ops:
        group["ops"][op] = {"before": [], "after": []}
    return ops


def _calibrate(
    children: dict[str, list[Child]],
    ops: list[str],
    settings: Settings,
    group: dict[str, Any],
) -> dict[str, tuple[int, int]]:
    """Untimed calls of every op on each side; then each op's calls per chunk and
    chunks per round (:func:`skbench.compare_stats.plan_for`), the same on both."""
    medians: dict[str, list[float]] = {op: [] for op in ops}
    for replicas in children.values():
        child = replicas[0]
        reply = child.ask(cmd="calibrate", seconds=settings.calibrate_seconds)
        for op, samples in reply["samples"].items():
            if op in medians:
                medians[op].append(_median(samples))
        for op, error in reply["errors"].items():
            group["ops"][op]["error"] = f"{child.side.label}: {error}"
    plan = {
        op: plan_for(
            m,
            settings.slice_seconds,
            settings.chunk_seconds,
            WRITE_CHUNK if op in WRITE_OPS else MAX_CHUNK,
        )
        for op, m in medians.items()
    }
    for op in plan.keys() & WRITE_OPS:
        plan[op] = _within_write_budget(op, *plan[op])
    for op, (reps, chunks) in plan.items():
        group["ops"][op]["reps"] = reps * chunks
        group["ops"][op]["chunks"] = chunks
    return {op: p for op, p in plan.items() if "error" not in group["ops"][op]}


def _within_write_budget(op: str, reps: int, chunks: int) -> tuple[int, int]:
    """At most :data:`WRITE_BUDGET` checkpoints a round from one write op: fewer
    chunks first, then fewer calls (at least one call a round)."""
    calls = max(1, WRITE_BUDGET // (BATCH if op == SAVE_MANY else 1))
    if reps * chunks <= calls:
        return reps, chunks
    if reps > calls:
        return calls, 1
    return reps, max(1, calls // reps)


def _say_medians(
    name: str, group: dict[str, Any], sides: list[Side], say: Callable[[str], None]
) -> None:
    for op, cell in group["ops"].items():
        if "error" in cell:
            continue
        meds = [_median([x for r in cell[s.label] for x in r]) for s in sides]
        say(f"  {name} {op}: " + " vs ".join(f"{m * 1e6:.1f} µs" for m in meds))
