"""The hot-paths section of docs/benchmarks.md, from one run's :class:`HotResults` alone
(a live run, or one re-read from its raw JSON: re-rendering measures nothing)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from .hot import (
    BIG,
    DURABLE,
    FLOOR,
    HOP,
    LG_ASYNC,
    LG_MEMORY,
    LG_SQLITE,
    LIST,
    LIST_ALL,
    LIST_PAGE,
    LIST_SIZE,
    PAGE,
    PLAIN,
    PUT,
    SAVE,
    SAVE_FAST,
    SAVE_FULL,
    SK_FILE,
    SK_MEMORY,
    SK_SQLITE,
    SMALL,
    SMALL_SIZE,
    SQLITE_FULL,
    HotResults,
    k,
    latest_op,
    load_op,
    middle_op,
)
from .hot_group import STORES
from .timing import Stat, format_seconds, format_stat

SECTION = "## Hot paths: listing, reads, saves and group commit"
GROUP_TASKS = 64


@dataclass(frozen=True)
class Target:
    """``ours / baseline <= limit``, each side a (subject, op) of the run."""

    label: str
    ours: tuple[str, str]
    baseline: tuple[str, str]
    limit: float


def ratio_text(value: float) -> str:
    if value < 0.01:
        return f"x{value:.2g}"
    return f"x{value:.2f}" if value < 10 else f"x{value:.0f}"


def judge(
    ratio: float, limit: float, p10_ratio: float | None = None, target: str | None = None
) -> str:
    """``met``/``NOT met`` against ``ratio <= limit``; borderline when the fastest tenth
    of calls (least touched by the shared machine's bursts) says otherwise."""
    met = ratio <= limit
    verdict = f"**{'met' if met else 'NOT met'}** (target {target or f'≤ x{limit:g}'})"
    if p10_ratio is not None and (p10_ratio <= limit) != met:
        verdict += "; borderline: the p10 ratio says otherwise"
    return verdict


def targets(big: int) -> list[Target]:
    out = [
        Target(
            "list all of 10k (ours: pages of 100), per item: vs `SqliteSaver.list`",
            (SK_SQLITE, LIST_ALL),
            (LG_SQLITE, LIST_ALL),
            1.2,
        ),
        Target(
            "list all of 10k (ours: pages of 100), per item: ≥ 4x faster than "
            "`AsyncSqliteSaver.alist` (ratio ≤ x0.25)",
            (SK_SQLITE, LIST_ALL),
            (LG_ASYNC, LIST_ALL),
            0.25,
        ),
        Target(
            "list all of 10k (ours: pages of 100), per item: vs `SqliteSaver.list`",
            (SK_MEMORY, LIST_ALL),
            (LG_SQLITE, LIST_ALL),
            1.0,
        ),
        Target(
            "list all of 10k (ours: pages of 100), per item: vs `SqliteSaver.list`",
            (SK_FILE, LIST_ALL),
            (LG_SQLITE, LIST_ALL),
            1.8,
        ),
    ]
    middle = middle_op(big)
    for ours in (SK_SQLITE, SK_FILE, SK_MEMORY):
        out.append(
            Target(
                f"middle page of {PAGE} at {k(big)}: vs `SqliteSaver.list(before=, limit={PAGE})`",
                (ours, middle),
                (LG_SQLITE, middle),
                2.0,
            )
        )
    for ours in (SK_SQLITE, SK_FILE):
        for n in (SMALL_SIZE, big):
            for op in (latest_op(n), load_op(n)):
                out.append(
                    Target(f"`{op}`: vs a no-op hop to its worker", (ours, op), (ours, HOP), 1.25)
                )
    out += [
        Target(
            f"memory `get_latest` at {k(SMALL_SIZE)}: vs `InMemorySaver.get_tuple`",
            (SK_MEMORY, latest_op(SMALL_SIZE)),
            (LG_MEMORY, f"get_tuple (latest) @{k(SMALL_SIZE)}"),
            1.0,
        ),
        Target("memory save: vs `InMemorySaver.put`", (SK_MEMORY, SAVE), (LG_MEMORY, PUT), 1.5),
        Target(
            f"file save, full: vs a bare {DURABLE}", (SK_FILE, SAVE_FULL), (FLOOR, DURABLE), 1.3
        ),
        Target(f"file save, fast: vs a bare {PLAIN}", (SK_FILE, SAVE_FAST), (FLOOR, PLAIN), 2.0),
        Target(
            f"SQLite save, full: vs a bare `{SQLITE_FULL}`",
            (SK_SQLITE, SAVE_FULL),
            (FLOOR, SQLITE_FULL),
            1.2,
        ),
    ]
    return out


def _stat(results: HotResults, side: tuple[str, str]) -> Stat | None:
    return results.stat(*side)


def _why(results: HotResults, side: tuple[str, str]) -> str:
    subject, op = side
    return (
        results.ops.get(subject, {}).get(op, {}).get("error")
        or results.subjects.get(subject, {}).get("unavailable")
        or (results.subjects.get(subject, {}).get("hop") if op == HOP else None)
        or f"{subject} {op}: not measured"
    )


def target_rows(results: HotResults, big: int) -> list[list[str]]:
    rows = []
    for target in targets(big):
        store = target.ours[0].removeprefix("statekeeper ")
        num, den = _stat(results, target.ours), _stat(results, target.baseline)
        if num is None or den is None:
            why = "; ".join(
                _why(results, s)
                for s, x in ((target.ours, num), (target.baseline, den))
                if x is None
            )
            rows.append([target.label, store, "-", "-", f"not measured: {why}"])
            continue
        ratio, p10 = num.median / den.median, num.p10 / den.p10
        figures = f"{format_stat(num)} vs {format_stat(den)}"
        if target.ours[1] == LIST_ALL:
            figures = (
                f"per item {format_seconds(num.median / LIST_SIZE)} vs "
                f"{format_seconds(den.median / LIST_SIZE)}; " + figures
            )
        rows.append(
            [
                target.label,
                store,
                f"{ratio_text(ratio)} (p10s: {ratio_text(p10)})",
                figures,
                judge(ratio, target.limit, p10),
            ]
        )
    for store in (SK_SQLITE, SK_FILE):
        hops = results.hops.get(store)
        if not hops:
            continue
        per = hops["hops"] / hops["pages"]
        rows.append(
            [
                f"worker hops per page of {LIST_PAGE} (list all of {LIST_SIZE:,})",
                store.removeprefix("statekeeper "),
                f"{per:.2g} per page",
                f"{hops['hops']} hops over {hops['pages']} pages",
                judge(per, 1.0, target="≤ 1 per page"),
            ]
        )
    rows += group_target_rows(results)
    return rows


def _rate(cell: dict[str, Any]) -> float | None:
    rates = [r["rate"] for r in cell.get("rounds", []) if r.get("rate")]
    return statistics.median(rates) if rates else None


def _syncs(cell: dict[str, Any]) -> float | None:
    per = cell.get("syncs", {}).get("per_save")
    return sum(per.values()) if per else None


def group_target_rows(results: HotResults) -> list[list[str]]:
    group = results.group
    if not group:
        return []
    rows = []
    top = str(GROUP_TASKS)
    sk, file_, lg = (group.get(s, {}) for s in (SK_SQLITE, SK_FILE, LG_ASYNC))
    ours, theirs = _rate(sk.get(top, {})), _rate(lg.get(top, {}))
    label = f"group commit, {GROUP_TASKS} tasks: SQLite saves/s ≥ 2x `AsyncSqliteSaver.aput`"
    if ours and theirs:
        ratio = theirs / ours
        rows.append(
            [
                label,
                "sqlite",
                f"x{ours / theirs:.2f} the rate",
                f"{ours:,.0f} vs {theirs:,.0f} saves/s",
                judge(ratio, 0.5, target="≥ 2x the rate"),
            ]
        )
    else:
        rows.append([label, "sqlite", "-", "-", f"not measured at {GROUP_TASKS} tasks"])
    for store, cell, limit in (
        ("sqlite", sk.get(top, {}), 0.25),
        ("file", file_.get(top, {}), 1.2),
    ):
        syncs = _syncs(cell)
        label = f"group commit, {GROUP_TASKS} tasks: syncs (fsync + fdatasync) per save"
        if syncs is None:
            why = cell.get("syncs", {}).get("error") or (
                group.get("strace") if cell else f"no {GROUP_TASKS}-task run"
            )
            rows.append([label, store, "-", "-", f"not measured: {why}"])
        else:
            per = cell["syncs"]["per_save"]
            rows.append(
                [
                    label,
                    store,
                    f"{syncs:.3g}",
                    f"fsync {per['fsync']:.3g}, fdatasync {per['fdatasync']:.3g} per save",
                    judge(syncs, limit, target=f"≤ {limit:g} per save"),
                ]
            )
    one, many = _rate(file_.get("1", {})), _rate(file_.get(top, {}))
    label = f"group commit, {GROUP_TASKS} tasks: file saves/s ≥ 3x its own 1-task rate"
    if one and many:
        rows.append(
            [
                label,
                "file",
                f"x{many / one:.2f} the rate",
                f"{many:,.0f} vs {one:,.0f} saves/s",
                judge(one / many, 1 / 3, target="≥ 3x the rate"),
            ]
        )
    else:
        rows.append([label, "file", "-", "-", f"not measured at 1 and {GROUP_TASKS} tasks"])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def header_lines(results: Any, section: str, what: str) -> list[str]:
    """The section's heading and where its figures come from (the PostgreSQL section
    shares it)."""
    meta, machine = results.meta, results.machine
    lines = [section, ""]
    lines.append(
        f"Generated by `{meta['command']}` on {meta['date']}, in {meta['elapsed']:.0f} s, "
        f"from commit `{meta['commit']}`{meta['tree_note']}"
        + (f"; last changes there: {meta['paths']}" if meta.get("paths") else "")
        + f". Every figure in this section comes from that one run{what}."
        + (
            f" The text was re-rendered from the run's raw figures by `{meta['rerendered']}`."
            if "rerendered" in meta
            else ""
        )
    )
    lines.append("")
    lines.append(
        f"Machine: {machine.get('nproc')} cores ({machine.get('cpu')}), shared with other "
        f"work during the run; stores on {machine.get('filesystem')}; Python "
        f"{machine.get('python')}, SQLite {machine.get('sqlite')}, PostgreSQL "
        f"{machine.get('postgresql')}. Load averages (1/5/15 min) as each phase began: "
        f"{'; '.join(results.loads)}."
    )
    lines.append("")
    return lines


def render(results: HotResults, big: int, plot: str | None) -> str:
    lines = header_lines(results, SECTION, "")
    builds = ", ".join(
        f"{name} {info['build_s']:.0f} s"
        for name, info in results.subjects.items()
        if "build_s" in info
    )
    skipped = [
        f"{n} ({i['unavailable']})" for n, i in results.subjects.items() if "unavailable" in i
    ]
    lg_setting = results.subjects.get(LG_SQLITE, {}).get("setting", "?")
    lines.append(
        f"Stores: statekeeper memory, file and SQLite, LangGraph `SqliteSaver` and "
        f"`AsyncSqliteSaver` (one database file), each with three streams interleaved: "
        f"`{BIG}` ({big:,}), `{LIST}` ({LIST_SIZE:,}) and `{SMALL}` ({SMALL_SIZE:,}), every "
        f"checkpoint the same ~1 KB state ({results.meta.get('record_bytes', '?')} bytes as a "
        f"statekeeper record); `InMemorySaver` holds `{SMALL}` only. Builds untimed ({builds}). "
        'Measured calls run at each store\'s durable default: ours `durability="full"` '
        f"unless the row says fast; LangGraph's SQLite savers: {lg_setting}. "
        "Each phase interleaves its workloads one call per round, in an order shuffled "
        "each round (a call right after an fsync pays for the journal commit that fsync "
        "started, so no workload always follows the same one); every read was checked "
        "once against the build's ids first."
        + (f" Skipped: {'; '.join(skipped)}." if skipped else "")
    )
    lines.append("")
    hops = [
        f"{n.removeprefix('statekeeper ')}: {i['hop']}"
        for n, i in results.subjects.items()
        if i.get("hop")
    ]
    if hops:
        lines.append("The no-op hop each store's reads are compared with: " + "; ".join(hops) + ".")
        lines.append("")
    lines += ["### Targets", ""]
    lines += _table(
        ["target", "store", "ratio of medians", "median (p10-p90): ours vs baseline", "verdict"],
        target_rows(results, big),
    )
    lines.append("")
    lines += group_lines(results, plot)
    lines += ["### Every workload, median (p10-p90) per call", ""]
    rows = []
    for subject, cells in results.ops.items():
        for op, cell in cells.items():
            if "stat" in cell:
                stat = Stat(**cell["stat"])
                figure = f"{format_stat(stat)} n={stat.n}"
                if op == LIST_ALL:
                    figure += f"; {format_seconds(stat.median / LIST_SIZE)} per item"
            else:
                figure = cell.get("error", "-")
            rows.append([subject, op, figure])
    lines += _table(["store", "workload", "median (p10-p90)"], rows)
    lines.append("")
    flat = []
    for store in (SK_SQLITE, SK_FILE):
        for op in (latest_op, load_op):
            small, large = results.stat(store, op(SMALL_SIZE)), results.stat(store, op(big))
            if small and large:
                flat.append(
                    f"{store.removeprefix('statekeeper ')} `{op(big)}` / `{op(SMALL_SIZE)}` "
                    f"x{large.median / small.median:.2f}"
                )
    if flat:
        lines.append("From 1k to the big stream (the target is flat): " + ", ".join(flat) + ".")
        lines.append("")
    return "\n".join(lines) + "\n"


def group_lines(results: HotResults, plot: str | None) -> list[str]:
    group = results.group
    if not group:
        return []
    lines = ["### Group commit: tasks saving at once, each to its own stream", ""]
    settings = group.get("settings", {})
    lines.append(
        f"Each cell: one child process per round on a fresh store, {settings.get('saves', '?')} "
        f'saves split over the tasks after one warm-up save per task, `durability="full"`; '
        f"saves/s is the median of the rounds ({settings.get('rounds', '?')}; min-max), latency "
        f"p50/p90 of every save in the last round. Syncs: {group.get('strace')}, around a child "
        "with the load minus one that only opens, warms up and closes, over the saves made."
    )
    lines.append("")
    rows = []
    for store in STORES:
        for tasks, cell in group.get(store, {}).items():
            rates = [r["rate"] for r in cell.get("rounds", []) if r.get("rate")]
            if not rates:
                rows.append([store, tasks, cell.get("error", "-"), "-", "-"])
                continue
            last = cell["rounds"][-1]
            latency = (
                f"{format_seconds(last['median'])} / {format_seconds(last['p90'])}"
                if last.get("p90")
                else "-"
            )
            syncs = cell.get("syncs", {})
            if syncs.get("per_save"):
                per = syncs["per_save"]
                sync_text = (
                    f"{sum(per.values()):.3g} "
                    f"(fsync {per['fsync']:.3g}, fdatasync {per['fdatasync']:.3g})"
                )
            else:
                sync_text = syncs.get("error", "-")
            rows.append(
                [
                    store,
                    tasks,
                    f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})",
                    latency,
                    sync_text,
                ]
            )
    lines += _table(["store", "tasks", "saves/s", "latency p50 / p90", "syncs per save"], rows)
    lines.append("")
    if plot:
        lines += [f"![saves per second against concurrent tasks]({plot})", ""]
    return lines
