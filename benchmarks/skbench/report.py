"""``docs/benchmarks.md``: which rows each section shows, rendered by
:func:`skbench.render.table` from one run's pyperf results (and, for the before/after
section, another run's)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import plots
from .features import (
    BACKENDS,
    RETENTION_BACKENDS,
    TELEMETRY_BACKENDS,
    TELEMETRY_OPS,
    retention_size,
)
from .features import SIZES as STATE_SIZES
from .frameworks import LANGGRAPH_PAIRS, LANGGRAPH_READS
from .render import Results, Row, before_after, table
from .stores import FLOORS, LARGE, PEERS, READERS, READS, WAL_COMMITS, sizes
from .subjects import SUBJECTS

FLOOR_TITLES = {
    "floor-durable-write": "bare durable write (temp file, write, fsync, rename, fsync dir)",
    "floor-plain-write": "bare write (temp file, write, rename, no fsync)",
    "floor-sqlite-FULL": "bare `BEGIN IMMEDIATE; INSERT; COMMIT`, WAL, synchronous=FULL",
    "floor-sqlite-NORMAL": "bare `BEGIN IMMEDIATE; INSERT; COMMIT`, WAL, synchronous=NORMAL",
}


def title(subject: str) -> str:
    return FLOOR_TITLES.get(subject) or SUBJECTS[subject].title


def targets() -> list[Row]:
    """The six single-save targets: a single save against its peer or its floor."""
    return [
        Row("SQLite full save vs `SqliteSaver.put`", "save/sqlite-full", "save/SqliteSaver", 1.0),
        Row(
            "SQLite full save vs the bare transaction at FULL",
            "save/sqlite-full",
            "save/floor-sqlite-FULL",
            1.2,
        ),
        Row(
            "file full save vs the bare durable write",
            "save/file-full",
            "save/floor-durable-write",
            1.3,
        ),
        Row("memory save vs `InMemorySaver.put`", "save/memory", "save/InMemorySaver", 1.0),
        Row(
            "Agent Framework storage over SQLite, full, vs the bare transaction",
            "af/save/af-sqlite-full",
            "save/floor-sqlite-FULL",
            1.3,
        ),
        Row(
            "Agent Framework storage over the file store, full, vs the bare durable write",
            "af/save/af-file-full",
            "save/floor-durable-write",
            1.3,
        ),
    ]


SAVE_BASELINES = {
    "memory": "InMemorySaver",
    "sqlite-full": "SqliteSaver",
    "sqlite-fast": "floor-sqlite-NORMAL",
    "file-full": "floor-durable-write",
    "file-fast": "floor-plain-write",
    "postgresql-full": "AsyncPostgresSaver",
}
READ_BASELINES = {
    "memory": "InMemorySaver",
    "file-full": "SqliteSaver",
    "sqlite-full": "SqliteSaver",
    "postgresql-full": "AsyncPostgresSaver",
    "redis": "AsyncPostgresSaver",
}


def saves() -> list[Row]:
    out = []
    for subject in [*SUBJECTS]:
        if subject.startswith(("lg-", "af-")) or subject == "AsyncSqliteSaver-NORMAL":
            continue
        base = SAVE_BASELINES.get(subject)
        out.append(
            Row(
                title(subject),
                f"save/{subject}",
                f"save/{base}" if base else None,
                against=title(base) if base else "",
            )
        )
    out += [Row(title(f), f"save/{f}") for f in FLOORS]
    out.append(Row("one Redis PING (the floor of a Redis read)", "read/floor-redis-ping"))
    return out


HOP = "`Worker.run(noop)`"


def hop() -> list[Row]:
    """The round trip to a thread, against ``to_thread`` and as a share of a save."""
    out = [
        Row(
            f"{HOP}: statekeeper's worker thread, there and back",
            "hop/worker-run",
            "hop/to_thread",
            against="`asyncio.to_thread(noop)`",
        ),
        Row("`asyncio.to_thread(noop)`", "hop/to_thread"),
    ]
    for s in ("sqlite-full", "sqlite-fast", "file-full", "file-fast"):
        label = f"{HOP} against one save: {title(s)}"
        out.append(Row(label, "hop/worker-run", f"save/{s}", against="the save"))
    return out


def wal_frames() -> list[Row]:
    floor = "wal-frames/floor-sqlite-FULL"
    return [
        Row(
            f"{title('sqlite-full')}: a save",
            "wal-frames/sqlite-full",
            floor,
            against="the bare transaction",
        ),
        Row(
            "LangGraph SqliteSaver: a `put`",
            "wal-frames/SqliteSaver",
            floor,
            against="the bare transaction",
        ),
        Row(title("floor-sqlite-FULL"), floor),
    ]


def reads(results: Results, why: Mapping[str, str]) -> list[tuple[str, list[Row]]]:
    sizes = sorted({int(n.split("@")[1].split("/")[0]) for n in results if n.startswith("load@")})
    out = []
    for read in READS:
        for size in sizes:
            rows = []
            for subject in (*READERS, *PEERS, "AF-InMemory", "AF-File"):
                base = READ_BASELINES.get(subject)
                name = f"{read}@{size}/{subject}"
                if name not in results and name not in why:
                    continue  # not a size this subject is read at
                if f"{read}@{size}/{base}" not in results:
                    base = None  # the peer is read at the other size
                rows.append(
                    Row(
                        title(subject),
                        name,
                        f"{read}@{size}/{base}" if base else None,
                        against=title(base) if base else "",
                    )
                )
            out.append((f"`{read}`, {size:,} checkpoints in the stream", rows))
    return out


def concurrency() -> list[Row]:
    out = []
    for tasks in (1, 8, 64):
        for s in ("sqlite-full", "file-full", "AsyncSqliteSaver"):
            base = f"group@{tasks}/AsyncSqliteSaver" if s != "AsyncSqliteSaver" else None
            label = f"{title(s)}, {tasks} tasks, per save"
            out.append(Row(label, f"group@{tasks}/{s}", base, against="AsyncSqliteSaver"))
    for s in ("sqlite-full", "file-full", "SqliteSaver", "AsyncSqliteSaver", "AF-File"):
        base = "writers@4/SqliteSaver" if s in ("sqlite-full", "file-full") else None
        label = f"{title(s)}, 4 processes, per save"
        out.append(Row(label, f"writers@4/{s}", base, against="SqliteSaver"))
    for n in (1, 4, 16):
        label = f"{title('postgresql-full')}, {n} processes, per save"
        base = f"writers@{n}/AsyncPostgresSaver"
        out.append(
            Row(label, f"writers@{n}/postgresql-full", base, 1.0, against="AsyncPostgresSaver")
        )
    return out


def api(results: Results) -> list[Row]:
    out = []
    sizes = sorted({int(n.split("@")[1].split("/")[0]) for n in results if n.startswith("load@")})
    size = sizes[-1] if sizes else 0
    for s in ("memory", "file-full", "sqlite-full", "postgresql-full"):
        first = f"first_page@{size}/{s}"
        for name in sorted(n for n in results if n.startswith("api/cursor_page") and n.endswith(s)):
            depth = name.split("@")[1].split("/")[0]
            label = f"{title(s)}: cursor_at + page of 20 at depth {depth}"
            out.append(Row(label, name, first, 2.0, against="first page"))
        target = 3.0 if s in ("sqlite-full", "postgresql-full") else None
        label = f"{title(s)}: page of 20 filtered on metadata (1% match)"
        out.append(Row(label, f"api/filtered_page/{s}", first, target, against="first page"))
        label = f"{title(s)}: `save_many` of 100"
        target = 5.0 if s in ("sqlite-full", "file-full") else None
        out.append(Row(label, f"api/save_many100/{s}", f"save/{s}", target, against="one save"))
        label = f"{title(s)}: `load_many` of 100 ids"
        out.append(Row(label, f"api/load_many100/{s}", f"api/load100/{s}", against="100 loads"))
    return out


LG_TARGETS = {"aget_tuple_latest": 0.5, "alist_all": 0.5}


def langgraph() -> list[Row]:
    out = []
    for ours, peer in LANGGRAPH_PAIRS:
        reads = () if ours == "lg-sqlite-fast" else LANGGRAPH_READS  # as the catalogue
        for workload in ("aput", "aput_writes", "graph", *reads):
            label = f"{title(ours)}: `{workload}`"
            name, base = f"langgraph/{workload}/{ours}", f"langgraph/{workload}/{peer}"
            out.append(Row(label, name, base, LG_TARGETS.get(workload, 1.0), against=title(peer)))
    return out


def agent_framework(results: Results) -> list[Row]:
    floors = {"af-sqlite-full": "floor-sqlite-FULL", "af-file-full": "floor-durable-write"}
    out = []
    for s in ("af-sqlite-full", "af-sqlite-fast", "af-file-full", "af-file-fast"):
        base = f"save/{floors[s]}" if s in floors else "af/save/AF-File"
        against = title(floors[s]) if s in floors else title("AF-File")
        out.append(Row(f"{title(s)}: save", f"af/save/{s}", base, 1.3, against=against))
    out += [Row(f"{title(s)}: save", f"af/save/{s}") for s in ("AF-File", "AF-InMemory")]
    for name in sorted(n for n in results if n.startswith("af/get_latest")):
        head, subject = name.rsplit("/", 1)
        peer = f"{head}/AF-File" if f"{head}/AF-File" in results else f"{head}/AF-InMemory"
        label = f"{title(subject)}: `get_latest`, {head.split('@')[1]} checkpoints"
        base = peer if not subject.startswith("AF-") else None
        out.append(Row(label, name, base, 1.0 if base else None, against="its peer"))
    return out


def encryption() -> list[Row]:
    out = []
    for op in ("save", "get_latest"):
        for size in STATE_SIZES:
            for b in BACKENDS:
                name = f"encryption/{op} {size}/{b}-"
                label = f"{b}: `{op}` of a {size} state, encrypted"
                out.append(Row(label, name + "encrypted", name + "plaintext", against="plaintext"))
    for op in ("seal", "open"):
        out += [
            Row(f"the envelope alone: {op}, {s}", f"encryption/{op} {s}/envelope")
            for s in STATE_SIZES
        ]
    return out


def telemetry() -> list[Row]:
    out = []
    for op in TELEMETRY_OPS:
        for b in TELEMETRY_BACKENDS:
            name = f"telemetry/{op}/{b}-"
            out.append(Row(f"{b}: `{op}`, telemetry on", name + "on", name + "off", against="off"))
    return out


def retention() -> list[Row]:
    out = [Row(f"sweep, keep_last=1: {b}", f"retention/sweep/{b}") for b in RETENTION_BACKENDS]
    for b in RETENTION_BACKENDS:
        for p in (50, 99):
            name, quiet = f"retention/save-during-sweep/{b}", f"retention/save-quiet/{b}"
            label = f"{b}: a save while the sweep runs, p{p}"
            out.append(Row(label, name, quiet, against="no sweep", percentile=p))
    return out


def space() -> list[Row]:
    out = []
    for b in ("sqlite", "file"):
        before = f"retention/space-before/{b}"
        out += [
            Row(f"{b}: as built", before),
            Row(f"{b}: after the sweep", f"retention/space-swept/{b}", before, against="built"),
            Row(
                f"{b}: after the sweep and `compact()`",
                f"retention/space-compacted/{b}",
                before,
                against="built",
            ),
        ]
    return out


def startup() -> list[Row]:
    return [
        Row("`statekeeper --help`", "startup/help", target=0.3),
        Row("`statekeeper latest` on a 10-checkpoint SQLite store", "startup/latest", target=0.5),
    ]


def document(
    results: Results,
    facts: Mapping[str, Any],
    before: Results | None = None,
    before_facts: Mapping[str, Any] | None = None,
    plot_dir: Path | None = None,
) -> str:
    """The whole of ``docs/benchmarks.md`` for one run (and a before run), with its
    plots written into ``plot_dir`` (none when it is ``None``)."""
    why = dict.fromkeys(facts.get("failed", {}), "failed")
    why.update(dict.fromkeys(facts.get("skipped", {}), "skipped"))  # the reasons: at the end

    def section(heading: str, rows: list[Row], intro: str = "") -> list[str]:
        return [
            f"## {heading}",
            "",
            *([intro, ""] if intro else []),
            *table(results, rows, why=why),
            "",
        ]

    out = [
        "# Benchmarks: statekeeper against its peers and its floors",
        "",
        f"Generated by `{facts['command']}` on {facts['date']}, from `{facts['source']}`, "
        f"in {facts['seconds']:.0f} s. A ratio is of two medians measured side by side in "
        "one run.",
        "",
        f"Machine: {facts['machine']}. Peers: {facts['peers']}.",
        "",
        "Timing by [pyperf](https://pyperf.readthedocs.io) "
        f"({facts['pyperf']}): each benchmark runs in fresh worker processes "
        f"({facts['settings']}), each calibrating its loop count and recording its values; "
        "a cell is the **median** of every value, ± its median absolute deviation, per call "
        "(per save where several saves run at once). The raw results are "
        f"`{facts['output']}`; `python -m pyperf stats` and `python -m pyperf compare_to` "
        "read them.",
        "",
        *section(
            "Targets: a single save at the floor",
            targets(),
            "One save per call, ~1 KB state, against LangGraph's saver or the bare write "
            "the store must make, in the same run.",
        ),
        *section("Single saves, one checkpoint per call", saves()),
        *section(
            "The thread hop",
            hop(),
            "A round trip from the event loop to a thread and back, running a function "
            "that does nothing: through statekeeper's worker (`Worker.run`, the door of "
            "every store thread: the file store's pool, each SQLite connection's "
            "thread) and through `asyncio.to_thread`. Against a save, the ratio is one "
            "hop's time as a share of that save's median.",
        ),
        *section(
            "WAL frames per commit",
            wal_frames(),
            "A count, not a timing: the frames (one page each) one commit appends to "
            f"SQLite's write-ahead log, over {WAL_COMMITS} commits (after ten others) "
            "from an empty log, at synchronous=FULL. Counted twice, and the two must "
            "agree: the log file's growth past its 32-byte header in frames of "
            "page size + 24 bytes, and the frames SQLite reports "
            "(`PRAGMA wal_checkpoint`). Every frame is a page the commit writes and, "
            "at FULL, syncs.",
        ),
    ]
    out += [
        "## Reads and listings",
        "",
        "Ours against the peer of the same kind: "
        "in-process memory, embedded (files, SQLite), server. The default run reads "
        f"at {' and '.join(f'{n:,}' for n in sizes(False))} checkpoints; "
        f"{LARGE:,} only with `--large` (opt-in, as building and listing that many "
        "takes long; our stores and LangGraph's savers, not Agent Framework's), "
        "which is why a run without it has no such rows.",
        "",
    ]
    for heading, rows in reads(results, why):
        out += [f"### {heading}", "", *table(results, rows, why=why), ""]
    titles = {k: c.title for k, c in SUBJECTS.items()}
    plotted = {} if plot_dir is None else plots.make_plots(results, titles, plot_dir)
    if plotted:
        out += ["### Plots", ""]
        out += [f"![{title}](benchmarks/{name})\n" for name, title in plotted.items()]
    out += section(
        "Concurrent saves",
        concurrency(),
        "*Tasks*: that many asyncio tasks save at once, each to its own stream, on one "
        "store (group commit). *Processes*: that many writer processes, each with its "
        "own handle, save 5 checkpoints each to its own stream per call.",
    )
    out += section("Batch, positional and filtered access", api(results))
    out += section(
        "Under LangGraph",
        langgraph(),
        "`StatekeeperSaver` against LangGraph's saver of the same durability, on a "
        "thread put through each saver's own `aput`; `graph` is a compiled 100-step "
        "`StateGraph` run with `ainvoke` on a new thread per call.",
    )
    out += section("Under Agent Framework", agent_framework(results))
    out += section(
        "Encryption at rest", encryption(), "Stores at durability full (memory: its only mode)."
    )
    out += section(
        "Telemetry",
        telemetry(),
        "On: the OpenTelemetry SDK, a no-op span exporter. `list`: a page of 20.",
    )
    out += section(
        "Retention sweeps",
        retention(),
        f"One sweep removing 90%: a store of {retention_size(False):,} checkpoints "
        f"({retention_size(True):,} in a quick run) in a tenth as many streams, rebuilt "
        "untimed before each sweep. The saves: one at a time into a side stream of "
        'such a store at durability="full", each save one pyperf value (so that p50 '
        "and p99 are of single saves), while a sweep of the store runs in the same "
        "event loop, against the same kind of store with no sweep.",
    )
    out += section(
        "Space given back by a sweep",
        space(),
        "A count, not a timing: the bytes of every file of a store after closing it, "
        "as built, after a sweep like the one above, and after `compact()` "
        "(SQLite: a full `VACUUM`; the file store gives space back as it removes).",
    )
    out += section("Start-up of the command line", startup(), "Each a whole process.")
    out += ["## Before and after", ""]
    if before is not None:
        facts_b = before_facts or {}
        out += [
            f"Before: `{facts_b.get('source', '?')}` ({facts_b.get('date', '?')}); after: "
            f"`{facts['source']}`: one run at each end, each its own pyperf JSON, every "
            "benchmark both have. A ratio below 1 is faster (for a count: smaller) after.",
            "",
            *before_after(before, results),
            "",
        ]
    else:
        out += [
            "This run is the *before* of the next change: its pyperf JSON is kept as "
            f"`{facts['output']}`. The *after* run compares with it, one run at each end: "
            f"`uv run nox -s bench -- --docs --before {facts['output']}` (or, from two saved "
            "runs, `uv run python benchmarks/run.py --render AFTER.json.gz --before "
            f"{facts['output']} --docs`), which adds the after/before ratio of every "
            "benchmark both runs have; `python -m pyperf compare_to BEFORE AFTER --table` "
            "adds pyperf's significance test.",
            "",
        ]
    missing = sorted(why.items())
    if missing:
        out += ["## Skipped and failed", ""]
        out += [
            f"- `{name}`: {facts.get('skipped', {}).get(name) or facts.get('failed', {}).get(name)}"
            for name, _ in missing
        ]
        out.append("")
    return "\n".join(out)
