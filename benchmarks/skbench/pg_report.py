"""The PostgreSQL section of docs/benchmarks.md, from one run's :class:`PgResults` alone."""

from __future__ import annotations

import statistics
from typing import Any

from .hot_report import _table, header_lines, judge, ratio_text
from .pg import LATEST, LATEST_TUPLE, LG, PAGE, SK, PgResults, PgSettings, middle_op
from .timing import Stat, format_seconds, format_stat

SECTION = "## PostgreSQL at scale, against AsyncPostgresSaver"
#: writers -> the least ratio of rates (ours over LangGraph's) the target asks for
RATE_TARGETS = {1: 1.0, 16: 1.5}


def _runs(results: PgResults, side: str, writers: int) -> list[dict[str, Any]]:
    return [r for r in results.writers.get(side, {}).get(str(writers), []) if "rate" in r]


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def target_rows(results: PgResults, settings: PgSettings) -> list[list[str]]:
    rows = []
    for writers, least in RATE_TARGETS.items():
        label = f"saves/s, {writers} writer process{'es' if writers > 1 else ''}"
        ours, theirs = (
            _median(_runs(results, SK, writers), "rate"),
            _median(_runs(results, LG, writers), "rate"),
        )
        if not ours or not theirs:
            rows.append([label, "-", "-", f"not measured at {writers} writers"])
            continue
        p90s = (
            _median(_runs(results, SK, writers), "p90"),
            _median(_runs(results, LG, writers), "p90"),
        )
        figures = f"{ours:,.0f} vs {theirs:,.0f} saves/s"
        if all(p90s):
            figures += f" (p90 latency {format_seconds(p90s[0])} vs {format_seconds(p90s[1])})"
        verdict = judge(theirs / ours, 1 / least, target=f"≥ {least:g}x the rate")
        rows.append([label, f"x{ours / theirs:.2f} the rate", figures, verdict])
    for label, ours, theirs in (
        ("`get_latest` vs `aget_tuple` (latest)", (SK, LATEST), (LG, LATEST_TUPLE)),
        (
            f"middle page of {PAGE} at {settings.size:,}: `list(after=cursor)` vs "
            f"`alist(before=, limit={PAGE})`",
            (SK, middle_op(settings.size)),
            (LG, middle_op(settings.size)),
        ),
    ):
        num, den = results.stat(*ours), results.stat(*theirs)
        if num is None or den is None:
            why = [
                results.ops.get(s, {}).get(o, {}).get("error", f"{s} {o}: not measured")
                for (s, o), x in ((ours, num), (theirs, den))
                if x is None
            ]
            rows.append([label, "-", "-", "not measured: " + "; ".join(why)])
            continue
        ratio, p10 = num.median / den.median, num.p10 / den.p10
        rows.append(
            [
                label,
                f"{ratio_text(ratio)} (p10s: {ratio_text(p10)})",
                f"{format_stat(num)} vs {format_stat(den)}",
                judge(ratio, 1.0, p10),
            ]
        )
    return rows


def render(results: PgResults, settings: PgSettings) -> str:
    lines = header_lines(results, SECTION, "")
    subjects = results.subjects
    lines.append(
        f"Server: {results.meta.get('server', '?')}. statekeeper: "
        f"{subjects.get(SK, {}).get('setting', '?')} "
        f"({subjects.get(SK, {}).get('backend', '?')}); LangGraph `AsyncPostgresSaver`: "
        f"{subjects.get(LG, {}).get('setting', '?')}. Writers: "
        f"{', '.join(map(str, settings.writers))} processes (started once, "
        f"{max(settings.writers)} in all, each with its own connections), each saving to its "
        f"own stream for {settings.seconds:g} s per cell, ~1 KB state; rounds: {settings.rounds}, "
        "the two sides' order alternating; saves/s and p90 are the median over the "
        "rounds. Reads: one stream of "
        f"{settings.size:,} on each side, ANALYZEd, each read checked once, then interleaved "
        "one call per round."
    )
    lines.append("")
    lines += ["### Targets", ""]
    lines += _table(
        ["target", "ratio (ours vs LangGraph)", "figures: ours vs LangGraph", "verdict"],
        target_rows(results, settings),
    )
    lines.append("")
    lines += ["### Saves from writer processes, each to its own stream", ""]
    rows = []
    for writers in settings.writers:
        row = [str(writers)]
        for side in (SK, LG):
            runs = _runs(results, side, writers)
            errors = [
                r for r in results.writers.get(side, {}).get(str(writers), []) if "error" in r
            ]
            if not runs:
                row += [errors[0]["error"] if errors else "-", "-"]
                continue
            rates = [r["rate"] for r in runs]
            failed = sum(r.get("errors", 0) for r in runs)
            note = f"; {failed} failed saves ({runs[0].get('first_error')})" if failed else ""
            row.append(
                f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}){note}"
            )
            p50, p90 = _median(runs, "p50"), _median(runs, "p90")
            row.append(f"{format_seconds(p50)} / {format_seconds(p90)}" if p50 and p90 else "-")
        rows.append(row)
    lines += _table(
        [
            "writers",
            "statekeeper saves/s (min-max)",
            "statekeeper latency p50 / p90",
            "AsyncPostgresSaver saves/s (min-max)",
            "AsyncPostgresSaver latency p50 / p90",
        ],
        rows,
    )
    lines.append("")
    counts = results.writers.get("counts")
    if counts:
        lines.append(
            "Counted after the writers: "
            + "; ".join(
                f"{side}: {c['found']:,} checkpoints in the writer streams, "
                f"{c['acknowledged']:,} saves acknowledged"
                for side, c in counts.items()
            )
            + "."
        )
        lines.append("")
    lines += ["### Reads, median (p10-p90) per call", ""]
    rows = []
    for side, cells in results.ops.items():
        for op, cell in cells.items():
            if "stat" in cell:
                stat = Stat(**cell["stat"])
                rows.append([side, op, f"{format_stat(stat)} n={stat.n}"])
            else:
                rows.append([side, op, cell.get("error", "-")])
    lines += _table(["side", "workload", "median (p10-p90)"], rows)
    lines.append("")
    return "\n".join(lines) + "\n"
