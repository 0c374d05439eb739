"""The "Retention sweeps" section of docs/benchmarks.md, from one run's
:class:`RetentionResults` alone."""

from __future__ import annotations

from typing import Any

from .hot_report import _table, header_lines
from .retention import RetentionResults, RetentionSettings
from .timing import format_seconds

SECTION = "## Retention sweeps"


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1024 / 1024:,.1f} MiB"


def _latency(cell: dict[str, Any], key: str, q: str) -> str:
    part = cell.get(key, {})
    return format_seconds(part[q]) if q in part else "-"


def render(results: RetentionResults, settings: RetentionSettings) -> str:
    lines = header_lines(results, SECTION, "")
    per = settings.size // max(settings.streams, 1)
    lines.append(
        f"Each store holds {settings.size:,} checkpoints in {settings.streams:,} streams "
        f"({per} each, ~1 KB states, built with `save_many` through a "
        '`durability="fast"` handle, untimed). Then, on the store opened as a user '
        f'would (`durability="full"`): {settings.saves} saves one at a time into a side '
        "stream on the quiet store, then `sweep(policy=Retention(keep_last=1))`, which "
        f"removes {per - 1} of every {per}, with a task saving one at a time into "
        "another side stream for as long as the sweep runs, in the same process and "
        "event loop (its first saves may land before the sweep reads its first page, "
        "and are then older than the sweep and counted among the removed). The "
        "machine is shared (the load averages above say how busy it was): read the "
        "latencies as indications, the ratios as the point."
    )
    lines.append("")
    rows = []
    for name, cell in results.stores.items():
        if "error" in cell:
            rows.append([name, "-", "-", "-", "-", "-", f"not measured: {cell['error']}"])
            continue
        sweep = cell["sweep"]
        quiet, during = cell.get("quiet", {}), cell.get("during", {})
        ratio = (
            f"x{during['p50'] / quiet['p50']:.1f} / x{during['p99'] / quiet['p99']:.1f}"
            if "p50" in during and "p50" in quiet
            else "-"
        )
        rows.append(
            [
                name,
                f"{sweep['checkpoints_removed']:,}",
                f"{sweep['seconds']:.1f} s",
                f"{cell['removed_per_s']:,.0f}",
                f"{_latency(cell, 'quiet', 'p50')} / {_latency(cell, 'quiet', 'p99')}",
                f"{_latency(cell, 'during', 'p50')} / {_latency(cell, 'during', 'p99')} "
                f"(n={during.get('n', 0)})",
                ratio,
            ]
        )
    header = [
        "store",
        "removed",
        "sweep time",
        "removed/s",
        "save p50 / p99, quiet",
        "save p50 / p99, during the sweep",
        "during / quiet (p50 / p99)",
    ]
    lines += _table(header, rows)
    lines.append("")
    space = []
    for name, cell in results.stores.items():
        if "error" in cell or cell.get("disk_before") is None:
            continue
        row = [name, _bytes(cell["disk_before"]), _bytes(cell["disk_after"])]
        reclaimed = cell["sweep"].get("bytes_reclaimed")
        row.append(_bytes(reclaimed) if reclaimed is not None else "not reported")
        if "disk_compacted" in cell:
            row.append(f"{_bytes(cell['disk_compacted'])} ({cell['compact_s']:.1f} s)")
        else:
            row.append("-")
        space.append(row)
    if space:
        lines.append("Space on disk (after closing the store, so SQLite's WAL is checkpointed):")
        lines.append("")
        header = ["store", "before", "after the sweep", "bytes_reclaimed", "after compact"]
        lines += _table(header, space)
        lines.append("")
    return "\n".join(lines)
