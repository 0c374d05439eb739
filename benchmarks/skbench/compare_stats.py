"""The arithmetic of ``compare.py``, pure (no timing, no I/O), so it can be tested.

A measurement of one operation on one side is a list of rounds, each a list of
per-call seconds. Its headline is the median of all calls pooled, with p10-p90
(:class:`skbench.timing.Stat`). The ratio after/before is the ratio of the pooled
medians; its spread comes two ways:

- the lowest and highest ratio of one round's medians (rounds of the two sides are
  paired: round k of each ran back to back);
- the ratio of the p10s (the fastest tenth of calls, least touched by load);
- a bootstrap over rounds: resample the round indices with replacement (the same
  indices on both sides, keeping the pairs), take the ratio of pooled medians,
  and report the 2.5th and 97.5th percentiles of :data:`RESAMPLES` of them.

:func:`verdict` says whether the ratio is within the limit (x1.10), and
:func:`null_spread` how far apart two processes of the *same* side are in the
same run: the A/A test each run carries, against which a ratio is judged.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from .timing import Stat, _quantile

LIMIT = 1.10
RESAMPLES = 400
SEED = 23
MAX_CHUNK = 200
MAX_CHUNKS = 8
#: The bootstrap works on each round cut down to this many quantiles (a round of
#: a fast op holds hundreds of calls; pure Python must stay quick).
KEEP = 25

__all__ = [
    "LIMIT",
    "Ratio",
    "by_replica",
    "null_spread",
    "plan_for",
    "ratio_of",
    "summary",
    "verdict",
]


@dataclass(frozen=True)
class Ratio:
    """after/before of one operation, and how far it moves between rounds."""

    ratio: float
    p10: float  # after/before of the p10s: the fastest tenth, least touched by load
    low: float  # bootstrap 2.5th percentile
    high: float  # bootstrap 97.5th percentile
    round_min: float
    round_max: float
    rounds: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pooled(rounds: list[list[float]]) -> list[float]:
    return [x for r in rounds for x in r]


def _compress(samples: list[float], keep: int = KEEP) -> list[float]:
    """``samples`` as ``keep`` evenly spaced quantiles, when it holds more."""
    if len(samples) <= keep:
        return samples
    ordered = sorted(samples)
    return [_quantile(ordered, (i + 0.5) / keep) for i in range(keep)]


def summary(rounds: list[list[float]]) -> Stat:
    """Median and p10-p90 of every call of every round."""
    return Stat.of(_pooled(rounds))


def _paired(before: list[list[float]], after: list[list[float]]) -> list[int]:
    """The indices of rounds that have calls on both sides."""
    return [k for k in range(min(len(before), len(after))) if before[k] and after[k]]


def ratio_of(
    before: list[list[float]],
    after: list[list[float]],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Ratio:
    """after/before of the pooled medians, with its round and bootstrap spread."""
    pairs = _paired(before, after)
    if not pairs:
        raise ValueError("no round has calls on both sides")
    b = [before[k] for k in pairs]
    a = [after[k] for k in pairs]
    point = statistics.median(_pooled(a)) / statistics.median(_pooled(b))
    per_round = [statistics.median(x) / statistics.median(y) for x, y in zip(a, b, strict=True)]
    a, b = [_compress(x) for x in a], [_compress(y) for y in b]
    rng = random.Random(seed)
    n = len(pairs)
    boots = []
    for _ in range(resamples if n > 1 else 0):
        picks = [rng.randrange(n) for _ in range(n)]
        num = statistics.median([x for k in picks for x in a[k]])
        den = statistics.median([x for k in picks for x in b[k]])
        boots.append(num / den)
    boots.sort()
    low = _quantile(boots, 0.025) if boots else point
    high = _quantile(boots, 0.975) if boots else point
    p10 = _quantile(sorted(_pooled(after)), 0.1) / _quantile(sorted(_pooled(before)), 0.1)
    return Ratio(point, p10, low, high, min(per_round), max(per_round), n)


def verdict(r: Ratio, limit: float = LIMIT, null: float | None = None) -> str:
    """``yes`` when the ratio is within ``limit``; ``NO`` when it is beyond what
    noise explains; else ``unclear`` (measure again, on a quieter machine).

    Beyond noise means all of: the p10s' ratio is over ``limit`` too; the ratio is
    over ``limit`` times ``null``, the same run's A/A spread (:func:`null_spread`);
    and the bootstrap's low end is over both ``limit`` and ``null``.

    The p10s count because on a loaded machine the slow calls are the ones other
    work delayed, and which side more of those fall on is luck; a change that
    makes an operation slower moves its fastest calls too. The A/A spread counts
    because a ratio that two processes of the same code also show is no finding:
    where they differ by more than ``limit`` (saves that wait on a shared disk),
    this run cannot resolve ``limit``, and only a larger change is called."""
    if r.ratio <= limit:
        return "yes"
    spread = max(1.0, null or 1.0)
    if r.p10 > limit and r.ratio > limit * spread and r.low > max(limit, spread):
        return "NO"
    return "unclear"


def by_replica(rounds: list[list[float]], per_chunk: int, replicas: int) -> list[list[float]]:
    """Each process's calls, from rounds laid out as :mod:`skbench.compare_run` runs
    them: round ``r``'s chunk ``c`` (``per_chunk`` calls) ran on process
    ``(r + c) % replicas``."""
    out: list[list[float]] = [[] for _ in range(replicas)]
    for r, samples in enumerate(rounds):
        for start in range(0, len(samples), per_chunk):
            out[(r + start // per_chunk) % replicas] += samples[start : start + per_chunk]
    return out


def null_spread(
    before: list[list[float]], after: list[list[float]], per_chunk: int, replicas: int
) -> float | None:
    """The A/A comparison every run carries: the larger, over both sides, of the
    ratio between the medians of two processes of the same side (slower over
    faster, so at least 1). ``None`` with one process per side."""
    if replicas < 2 or per_chunk < 1:
        return None
    worst = 1.0
    for rounds in (before, after):
        parts = [p for p in by_replica(rounds, per_chunk, replicas) if p]
        if len(parts) < 2:
            return None
        medians = [statistics.median(p) for p in parts]
        worst = max(worst, max(medians) / min(medians))
    return worst


def plan_for(
    medians: list[float], slice_seconds: float, chunk_seconds: float, cap: int = MAX_CHUNK
) -> tuple[int, int]:
    """Calls per chunk and chunks per round of one op, the same on both sides.

    A chunk is about ``chunk_seconds`` of calls at the slower side's median (1 to
    ``cap`` calls), and a round about ``slice_seconds`` of them (1 to
    :data:`MAX_CHUNKS` chunks): a slow op gets one call per chunk and few chunks, a
    fast one many calls per chunk."""
    slowest = max((m for m in medians if m > 0 and math.isfinite(m)), default=0.0)
    if slowest == 0.0:
        return 1, 1
    reps = max(1, min(cap, round(chunk_seconds / slowest)))
    chunks = max(1, min(MAX_CHUNKS, round(slice_seconds / (reps * slowest))))
    return reps, chunks
