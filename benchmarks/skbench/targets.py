"""Every target from the backend issues (2, 3, 4 and 8), its measured figure, met or not."""

from __future__ import annotations

from dataclasses import dataclass

from .runner import Results, Settings
from .timing import format_seconds


@dataclass
class Target:
    issue: int
    text: str
    figure: str
    met: bool | None  # None: could not be measured in this run

    @property
    def verdict(self) -> str:
        return {True: "met", False: "**not met**", None: "not measured"}[self.met]


def _k(size: int) -> str:
    return f"{size // 1000}k" if size >= 1000 else str(size)


class _Eval:
    def __init__(self, results: Results, settings: Settings) -> None:
        self.r = results
        self.small = settings.sizes[0]
        self.large = settings.sizes[-1]
        self.sizes = settings.sizes

    def med(self, op: str, row: str, size: int | None = None) -> float | None:
        return self.r.median(op, row, self.large if size is None else size)

    def largest(self, op: str, row: str) -> int | None:
        found = [n for n in self.sizes if self.r.median(op, row, n) is not None]
        return found[-1] if found else None

    def growth(self, issue: int, op: str, row: str, limit: float, what: str) -> Target:
        at = self.largest(op, row)
        small = self.med(op, row, self.small)
        label = f"{what} at the largest N ≤ {limit:g}x its cost at N={_k(self.small)}"
        if at is None or small is None or at == self.small:
            return Target(issue, label, "not measured", None)
        large = self.med(op, row, at)
        assert large is not None
        ratio = large / small
        figure = (
            f"{format_seconds(large)} at N={_k(at)} vs {format_seconds(small)} at "
            f"N={_k(self.small)}: x{ratio:.2f}"
        )
        return Target(issue, label, *self._at_largest(at, figure, ratio <= limit))

    def _at_largest(self, at: int, figure: str, met: bool) -> tuple[str, bool | None]:
        """A size-dependent target counts only at the run's largest N."""
        if at == self.large:
            return figure, met
        return f"{figure}; N={_k(self.large)} not measured (see left out)", None

    def absolute(
        self, issue: int, op: str, row: str, limit: float, what: str, *, sized: bool = True
    ) -> Target:
        at = self.largest(op, row)
        label = f"{what} ≤ {format_seconds(limit)}"
        if at is None:
            return Target(issue, label, "not measured", None)
        value = self.med(op, row, at)
        assert value is not None
        figure = f"{format_seconds(value)} at N={_k(at)}"
        if not sized:
            return Target(issue, label, figure, value <= limit)
        return Target(issue, label, *self._at_largest(at, figure, value <= limit))

    def floor(self, issue: int, row: str, floor: str, limit: float, what: str) -> Target:
        at = self.largest("save", row)
        base = self.r.floor_median(floor, at) if at is not None else None
        label = f"{what} ≤ {limit:g}x {floor} (same run, same rounds)"
        if at is None or base is None:
            return Target(issue, label, "not measured", None)
        value = self.med("save", row, at)
        assert value is not None
        ratio = value / base
        figure = (
            f"{format_seconds(value)} vs floor {format_seconds(base)} (N={_k(at)}): x{ratio:.2f}"
        )
        return Target(issue, label, figure, ratio <= limit)

    def versus(
        self, issue: int, op: str, row: str, peer: str, factor: float, what: str, size: int | None
    ) -> Target:
        """``row`` at least ``factor``x faster than ``peer`` (factor 1: no slower)."""
        candidates = [
            n
            for n in self.sizes
            if self.r.median(op, row, n) is not None and self.r.median(op, peer, n) is not None
        ]
        at = size if size in candidates else (candidates[-1] if candidates else None)
        label = what
        if at is None:
            return Target(issue, label, "not measured (no common N)", None)
        ours = self.med(op, row, at)
        theirs = self.med(op, peer, at)
        assert ours is not None and theirs is not None
        speedup = theirs / ours
        relation = f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"
        figure = f"{format_seconds(ours)} vs {format_seconds(theirs)} at N={_k(at)}: {relation}"
        if size is not None and at != size:
            figure += f"; N={_k(size)} not measured in this run"
            return Target(issue, label, figure, None)
        return Target(issue, label, figure, speedup >= factor)

    def memory_flat(self, issue: int, store: str) -> Target:
        cells = self.r.memory.get(store, {})
        measured = [n for n in self.sizes if "tracemalloc_peak" in cells.get(n, {})]
        label = (
            "peak memory while listing page by page stays flat (peak at the largest N ≤ 2x "
            "the peak at the smallest N, + 256 KiB)"
        )
        if len(measured) < 2:
            return Target(issue, label, "not measured", None)
        small = cells[measured[0]]["tracemalloc_peak"]
        large = cells[measured[-1]]["tracemalloc_peak"]
        figure = (
            f"{large / 2**20:.2f} MiB at N={_k(measured[-1])} vs {small / 2**20:.2f} MiB "
            f"at N={_k(measured[0])}"
        )
        return Target(issue, label, figure, large <= 2 * small + 256 * 1024)

    def writers(self, issue: int, store: str) -> Target:
        w = self.r.writers.get(store)
        label = "PostgreSQL, 4 concurrent writers: throughput reported, no save lost"
        if not w or w.get("problem"):
            return Target(issue, label, (w or {}).get("problem") or "not measured", None)
        expected = w["processes"] * w["saves_each"]
        figure = (
            f"{w['throughput_per_s']:.0f} saves/s, median latency "
            f"{format_seconds(w['median_latency_s'])}, {w['errors']} errors, "
            f"{w['counted']} of {expected} counted"
        )
        return Target(issue, label, figure, w["errors"] == 0 and w["counted"] == expected)

    def round_trips(self, issue: int, op: str) -> Target:
        value = self.r.round_trips.get(op)
        label = f"Redis {op}: ≤ 3 round trips (client-side count of requests sent)"
        if value is None:
            return Target(issue, label, "not measured", None)
        return Target(issue, label, f"{value:g} round trips per call", value <= 3)


def collect(results: Results, settings: Settings) -> list[Target]:
    e = _Eval(results, settings)
    mem, file_, sql, pg, red = (
        "statekeeper memory",
        "statekeeper file",
        "statekeeper sqlite",
        "statekeeper postgresql",
        "statekeeper redis",
    )
    async_sqlite = "LangGraph AsyncSqliteSaver"
    return [
        e.growth(2, "get_latest", mem, 2.0, "memory get_latest"),
        e.growth(2, "middle_page", mem, 2.5, "memory middle page of 20"),
        e.floor(3, f"{file_} (full)", "durable file write", 1.3, "file save, durability=full"),
        e.absolute(3, "save", f"{file_} (fast)", 0.3e-3, "file save, durability=fast", sized=False),
        e.absolute(3, "get_latest", file_, 3e-3, "file get_latest with N in the stream + N noise"),
        e.growth(3, "get_latest", file_, 2.0, "file get_latest"),
        e.absolute(3, "middle_page", file_, 10e-3, "file middle page of 20"),
        e.memory_flat(3, file_),
        e.growth(4, "get_latest", sql, 2.0, "SQLite get_latest"),
        e.versus(
            4,
            "get_latest",
            sql,
            async_sqlite,
            1.0,
            "SQLite get_latest no slower than AsyncSqliteSaver.aget_tuple (largest common N)",
            None,
        ),
        e.floor(4, f"{sql} (full)", "sqlite insert FULL", 1.5, "SQLite save, durability=full"),
        e.versus(
            4,
            "list_all",
            sql,
            async_sqlite,
            10.0,
            "SQLite list all of a 10k stream ≥ 10x faster than AsyncSqliteSaver.alist",
            10_000,
        ),
        e.writers(4, pg),
        e.growth(8, "get_latest", red, 2.0, "Redis get_latest"),
        e.round_trips(8, "save"),
        e.round_trips(8, "get_latest"),
    ]


def targets_section(results: Results, settings: Settings) -> str:
    lines = [
        "## Performance targets\n",
        f"Measured in this run (largest N = {_k(settings.sizes[-1])}; the targets are "
        "stated at 100k, so a quick run only indicates them).\n",
        "| target | measured | verdict |",
        "|---|---|---|",
    ]
    for t in collect(results, settings):
        lines.append(f"| {t.text} | {t.figure} | {t.verdict} |")
    return "\n".join(lines) + "\n"
