"""The one table renderer: rows of (benchmark, baseline, target) over pyperf results.

Every table of ``docs/benchmarks.md`` is a list of :class:`Row`: a benchmark's
median, optionally against a baseline's median (from the same run, or from another
run's results for a before/after table) as the ratio measured/baseline, and a
target that ratio must meet (``≤``; or, with no baseline, a limit in seconds).
Medians come from pyperf's values, every worker process's pooled; the spread shown
is pyperf's median absolute deviation. A row may show a percentile of the values
instead (pyperf's ``percentile``; of a workload timed one call per value, the
calls' p99), for the benchmark and its baseline alike. A value is shown in its
benchmark's pyperf unit: a duration, bytes, or a plain number (a count).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Row:
    """One line of a table: ``name``'s median, against ``baseline``'s if given."""

    label: str
    name: str
    baseline: str | None = None
    #: the ratio must be at most this (or, with no baseline, the median in seconds)
    target: float | None = None
    against: str = ""
    #: show this percentile of the values (of both sides), not their median
    percentile: int | None = None


Results = Mapping[str, Any]  # benchmark name -> pyperf.Benchmark


def load(path: str | Path) -> dict[str, Any]:
    """Every benchmark of a pyperf JSON file (``.json`` or ``.json.gz``), by name."""
    import pyperf

    suite = pyperf.BenchmarkSuite.load(str(path))
    return {bench.get_name(): bench for bench in suite.get_benchmarks()}


def duration(seconds: float) -> str:
    """``seconds`` in the unit that reads best, three significant figures."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if seconds >= scale or unit == "ns":
            return f"{seconds / scale:.3g} {unit}"
    raise AssertionError("unreachable")


def size(nbytes: float) -> str:
    """``nbytes`` in binary units, three significant figures."""
    for unit, scale in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def quantity(value: float, unit: str) -> str:
    """``value`` in pyperf's ``unit``: seconds, bytes, or a plain number."""
    if unit == "second":
        return duration(value)
    if unit == "byte":
        return size(value)
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def median(results: Results, name: str | None, percentile: int | None = None) -> float | None:
    """``name``'s median (or ``percentile``), ``None`` if it is not in ``results``."""
    bench = results.get(name) if name else None
    if bench is None:
        return None
    return float(bench.median() if percentile is None else bench.percentile(percentile))


def spread(results: Results, name: str) -> str:
    bench = results[name]
    values = bench.get_values()
    if len(values) < 2:
        return ""
    return f" ± {quantity(bench.median_abs_dev(), bench.get_unit())}"


def ratio_of(results: Results, row: Row, base: Results | None = None) -> float | None:
    """measured/baseline of the row's medians (or percentiles), ``None`` if either
    is missing."""
    ours = median(results, row.name, row.percentile)
    theirs = median(base or results, row.baseline, row.percentile)
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def ratio_text(value: float | None) -> str:
    """``x1.22``; below x0.01, one significant figure (``x0.0007``)."""
    if value is None:
        return "—"
    return f"x{value:.2f}" if value >= 0.01 else f"x{value:.1g}"


def verdict(row: Row, value: float | None) -> str:
    if row.target is None:
        return ""
    if value is None:
        return "not measured"
    shown = f"x{row.target:g}" if row.baseline else duration(row.target)
    return f"{'met' if value <= row.target else '**NOT met**'} (≤ {shown})"


def table(
    results: Results,
    rows: Iterable[Row],
    base: Results | None = None,
    headers: tuple[str, str] = ("measured", "baseline"),
    why: Mapping[str, str] | None = None,
) -> list[str]:
    """A Markdown table of ``rows``: median (± MAD), the baseline's, the ratio and
    the verdict. ``base`` holds the baselines when they come from another run;
    ``why`` says why a benchmark is missing (skipped, failed)."""
    why = why or {}
    rows = list(rows)
    with_base = any(r.baseline for r in rows)
    with_target = any(r.target is not None for r in rows)
    head = ["", headers[0], *([headers[1], "ratio"] if with_base else [])]
    head += ["target"] if with_target else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        ours = median(results, row.name, row.percentile)
        cells = [row.label, _cell(results, row.name, ours, why, row.percentile)]
        value: float | None = ours
        if with_base:
            theirs = median(base or results, row.baseline, row.percentile)
            if row.baseline is None:
                cells += ["", ""]
            else:
                value = ratio_of(results, row, base)
                label = f"{row.against}: " if row.against else ""
                cell = _cell(base or results, row.baseline, theirs, why, row.percentile)
                cells.append(label + cell)
                cells.append(ratio_text(value))
        if with_target:
            cells.append(verdict(row, value))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _cell(
    results: Results,
    name: str,
    value: float | None,
    why: Mapping[str, str],
    percentile: int | None = None,
) -> str:
    if value is None:
        return why.get(name, "not measured")
    shown = f"**{quantity(value, results[name].get_unit())}**"
    if percentile is not None:  # no spread: the MAD is the median's
        return f"p{percentile} {shown}"
    return shown + spread(results, name)


def before_after(before: Results, after: Results, names: Iterable[str] | None = None) -> list[str]:
    """Every benchmark both runs have (or ``names``): after against before."""
    common = [n for n in (names or after) if n in before and n in after]
    rows = [Row(f"`{n}`", n, n) for n in sorted(common)]
    return table(after, rows, base=before, headers=("after", "before"))
