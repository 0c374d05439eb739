"""Timing: per-call samples, interleaved across stores, summarised as median and spread.

Each measured call is timed on its own with ``perf_counter_ns``, so a summary is a
median of calls, not a mean of a batch: one slow outlier (a checkpoint of the
shared disk, another engineer's test burst) moves the p90, not the headline.

Stores that are compared with each other are measured in interleaved rounds: round
1 runs a slice of every store's calls, then round 2, and so on. Background load on
this shared 2-core machine then falls on all of them alike instead of on whichever
store happened to run during a burst.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Op = Callable[[int], Awaitable[Any]]


@dataclass(frozen=True)
class Stat:
    """Summary of one operation's per-call times, in seconds."""

    median: float
    p10: float
    p90: float
    n: int

    @classmethod
    def of(cls, samples: list[float]) -> Stat:
        if not samples:
            raise ValueError("no samples")
        ordered = sorted(samples)
        return cls(
            median=statistics.median(ordered),
            p10=_quantile(ordered, 0.10),
            p90=_quantile(ordered, 0.90),
            n=len(ordered),
        )

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "p10": self.p10, "p90": self.p90, "n": self.n}


def _quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted data (numpy's default method)."""
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Budget:
    """How long to measure one operation of one store at one size.

    ``reps`` calls at most, stopping early once ``seconds`` of calls have run, but
    never fewer than ``min_reps`` calls (a single call that overruns still counts).
    """

    reps: int
    seconds: float
    min_reps: int = 3
    rounds: int = 5


@dataclass
class _Progress:
    samples: list[float] = field(default_factory=list)
    spent: float = 0.0
    error: str | None = None


async def measure_interleaved(
    ops: Mapping[str, Op], budget: Budget, *, warmup: int = 1
) -> dict[str, list[float] | str]:
    """Run each op in ``ops`` in interleaved rounds; return samples (s) or an error.

    The op is called with a running call index (so a workload can walk through a
    list of ids). ``warmup`` calls per op run first and are not recorded.
    """
    progress = {name: _Progress() for name in ops}
    index = dict.fromkeys(ops, 0)
    for name, op in ops.items():
        for _ in range(warmup):
            try:
                await op(index[name])
            except Exception as exc:  # a store that fails is reported, not fatal
                progress[name].error = f"{type(exc).__name__}: {exc}"
                break
            index[name] += 1
    per_round_reps = max(1, math.ceil(budget.reps / budget.rounds))
    per_round_time = budget.seconds / budget.rounds
    for _ in range(budget.rounds):
        for name, op in ops.items():
            state = progress[name]
            if state.error is not None or _done(state, budget):
                continue
            gc.collect()
            round_start = time.perf_counter()
            taken = 0
            while taken < per_round_reps:
                t0 = time.perf_counter_ns()
                try:
                    await op(index[name])
                except Exception as exc:
                    state.error = f"{type(exc).__name__}: {exc}"
                    break
                elapsed = (time.perf_counter_ns() - t0) / 1e9
                index[name] += 1
                state.samples.append(elapsed)
                state.spent += elapsed
                taken += 1
                if _done(state, budget):
                    break
                if time.perf_counter() - round_start > per_round_time and (
                    len(state.samples) >= budget.min_reps
                ):
                    break
    out: dict[str, list[float] | str] = {}
    for name, state in progress.items():
        out[name] = state.error if state.error is not None else state.samples
    return out


def _done(state: _Progress, budget: Budget) -> bool:
    if len(state.samples) >= budget.reps:
        return True
    return state.spent >= budget.seconds and len(state.samples) >= budget.min_reps


def format_seconds(value: float) -> str:
    """A duration with three significant figures in a readable unit."""
    if value < 1e-6:
        return f"{value * 1e9:.3g} ns"
    if value < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if value < 1.0:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def format_stat(stat: Stat) -> str:
    return f"{format_seconds(stat.median)} ({format_seconds(stat.p10)}-{format_seconds(stat.p90)})"
