"""Under the frameworks: ``StatekeeperSaver`` against LangGraph's own savers, and
``StatekeeperCheckpointStorage`` against Agent Framework's storages.

LangGraph (``langgraph/<workload>/<saver>``): a thread of ``thread_size(quick)``
checkpoints put through each saver's own ``aput`` (untimed), then ``aput``,
``aput_writes`` (a task's output on a checkpoint, as a super-step writes it),
``aget_tuple`` of the latest and by id, ``alist`` of 10, of 20 before the middle
and of the whole thread, and a compiled 100-step ``StateGraph`` run with ``ainvoke``
on a new thread per call. Ours at ``durability="full"`` against the peer at
``synchronous=FULL`` (its default), ours at ``"fast"`` against ``synchronous=NORMAL``,
and on PostgreSQL ours against ``AsyncPostgresSaver``.

Agent Framework (``af/<workload>/<storage>``): ``save`` of a chain of workflow
checkpoints, and ``get_latest(workflow_name=)`` at each size; ours over the SQLite and
file stores at both durabilities against ``FileCheckpointStorage`` (no fsync) and
``InMemoryCheckpointStorage``; the floors are ``save/floor-*`` of :mod:`skbench.stores`.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, TypedDict

from .harness import Context, Op, Workload, checked
from .payload import make_state
from .stores import read_op
from .subjects import (
    MAIN,
    NEEDS,
    SUBJECTS,
    AfInMemory,
    AgentFramework,
    AsyncSqliteSaver,
    LangGraphPut,
    Subject,
    lg_config,
    reachable,
)
from .subjects import POSTGRES_URL as _PG

GRAPH_STEPS = 100
LG = ("langgraph.graph", "langgraph.checkpoint.sqlite", "aiosqlite")


def thread_size(quick: bool) -> int:
    return 40 if quick else 2_000


class OursUnderLangGraph(AsyncSqliteSaver):
    """``StatekeeperSaver`` over one of our stores (``codec="raw"``, as documented)."""

    title = 'StatekeeperSaver, SQLite, durability="full"'
    url = "sqlite"
    durability = "full"

    async def open(self, place: Path) -> None:
        import statekeeper
        from statekeeper.integrations.langgraph import StatekeeperSaver

        from .subjects import server_name

        if self.url == "sqlite":
            url, options = f"sqlite:///{place / 'sk.db'}", {}
        else:
            reachable(_PG)
            url, options = _PG, {"table_prefix": server_name(place) + "_"}
        store = statekeeper.open_store(url, codec="raw", durability=self.durability, **options)
        await store.open()
        self.stack.push_async_callback(store.close)
        self.saver = StatekeeperSaver(store)
        self.args = LangGraphPut(self.saver)

    async def fill(self, size: int) -> None:
        await Subject.fill(self, size)


class OursUnderLangGraphFast(OursUnderLangGraph):
    title, durability = 'StatekeeperSaver, SQLite, durability="fast"', "fast"


class OursUnderLangGraphPostgres(OursUnderLangGraph):
    title, url = "StatekeeperSaver, PostgreSQL", "postgresql"


class AsyncSqliteSaverNormal(AsyncSqliteSaver):
    title = "LangGraph AsyncSqliteSaver, synchronous=NORMAL"

    async def open(self, place: Path) -> None:
        await super().open(place)
        await self.saver.conn.execute("PRAGMA synchronous=NORMAL")


class OursUnderAf(AgentFramework):
    """``StatekeeperCheckpointStorage`` over one of our stores."""

    title = 'StatekeeperCheckpointStorage, SQLite, durability="full"'
    on_disk = True
    url = "sqlite"
    durability = "full"

    async def open(self, place: Path) -> None:
        import statekeeper
        from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage

        url = f"sqlite:///{place / 'af.db'}" if self.url == "sqlite" else f"file://{place / 's'}"
        store = statekeeper.open_store(url, codec="raw", durability=self.durability)
        self.storage = StatekeeperCheckpointStorage(store)  # opened by the storage

    async def close(self) -> None:
        await self.storage.aclose()


class OursUnderAfFast(OursUnderAf):
    title, durability = 'StatekeeperCheckpointStorage, SQLite, durability="fast"', "fast"


class OursUnderAfFile(OursUnderAf):
    title, url = 'StatekeeperCheckpointStorage, file, durability="full"', "file"


class OursUnderAfFileFast(OursUnderAf):
    title = 'StatekeeperCheckpointStorage, file, durability="fast"'
    url, durability = "file", "fast"


SUBJECTS.update(
    {
        "lg-sqlite-full": OursUnderLangGraph,
        "lg-sqlite-fast": OursUnderLangGraphFast,
        "lg-postgresql": OursUnderLangGraphPostgres,
        "AsyncSqliteSaver-NORMAL": AsyncSqliteSaverNormal,
        "af-sqlite-full": OursUnderAf,
        "af-sqlite-fast": OursUnderAfFast,
        "af-file-full": OursUnderAfFile,
        "af-file-fast": OursUnderAfFileFast,
        "AF-InMemory": AfInMemory,
    }
)
PG = ("asyncpg", "psycopg", "postgres")
NEEDS.update(
    {
        "lg-sqlite-full": LG,
        "lg-sqlite-fast": LG,
        "lg-postgresql": (*LG, *PG),
        "AsyncSqliteSaver-NORMAL": LG,
        **{f"af-{k}": ("agent_framework",) for k in ("sqlite-full", "sqlite-fast")},
        **{f"af-{k}": ("agent_framework",) for k in ("file-full", "file-fast")},
    }
)
#: (ours, the peer it is compared with): the pairs the tables show.
LANGGRAPH_PAIRS = (
    ("lg-sqlite-full", "AsyncSqliteSaver"),
    ("lg-sqlite-fast", "AsyncSqliteSaver-NORMAL"),
    ("lg-postgresql", "AsyncPostgresSaver"),
)
LANGGRAPH_READS = ("aget_tuple_latest", "aget_tuple_id", "alist10", "alist_middle", "alist_all")
#: The LangGraph reads that are a subject's reads (:func:`skbench.stores.read_op`).
AS_READS = {
    "aget_tuple_latest": "get_latest",
    "aget_tuple_id": "load",
    "alist_middle": "middle_page",
    "alist_all": "list_all",
}


class _State(TypedDict):
    n: int
    state: dict[str, Any]


def graph(saver: Any) -> Any:
    """One node looping ``GRAPH_STEPS`` times, writing the ~1 KB state each step."""
    from langgraph.graph import END, START, StateGraph

    def step(s: _State) -> dict[str, Any]:
        return {"n": s["n"] + 1, "state": make_state(s["n"])}

    builder = StateGraph(_State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["n"] < GRAPH_STEPS else END)
    return builder.compile(checkpointer=saver)


def _langgraph(workload: str, subject: str, size: int) -> Workload:
    async def make(ctx: Context) -> Op:
        if workload == "aput":  # on a thread of its own: the reads' thread stays as built
            fresh = await ctx.fresh(subject)
            await fresh.fill(10)
            return fresh.save
        made = await ctx.fixture(subject, size)
        saver = made.saver  # type: ignore[attr-defined]
        if workload == "aput_writes":
            tasks = itertools.count()

            async def writes() -> None:
                i = next(tasks)
                config = lg_config(MAIN, made.ids[i % len(made.ids)])
                output = [("state", make_state(i)), ("step", i)]
                await saver.aput_writes(config, output, f"task-{i:07}", "~__pregel_pull, step")

            return writes
        if workload == "graph":
            compiled, runs = graph(saver), itertools.count()

            async def run() -> int:
                config = {
                    "configurable": {"thread_id": f"graph-{next(runs)}"},
                    "recursion_limit": GRAPH_STEPS * 2 + 10,
                }
                return int((await compiled.ainvoke({"n": 0, "state": {}}, config))["n"])

            return await checked(run, lambda n: n == GRAPH_STEPS, workload)
        if workload == "alist10":

            async def ten() -> int:
                return len([t async for t in saver.alist(lg_config(MAIN), limit=10)])

            return await checked(ten, lambda n: n == 10, workload)
        return await read_op(made, AS_READS[workload], size)

    heavy = workload in ("graph", "alist_all")
    return Workload(f"langgraph/{workload}/{subject}", make, needs=NEEDS[subject], heavy=heavy)


def _af(workload: str, subject: str, size: int) -> Workload:
    async def make(ctx: Context) -> Op:
        if workload == "save":
            made = await ctx.fresh(subject)
            await made.fill(10)
            return made.save
        made = await ctx.fixture(subject, size)
        return await checked(made.get_latest, lambda cp: cp is not None, workload)

    name = "af/save" if workload == "save" else f"af/get_latest@{size}"
    return Workload(f"{name}/{subject}", make, needs=NEEDS[subject], heavy=subject == "AF-File")


AF_SUBJECTS = ("af-sqlite-full", "af-sqlite-fast", "af-file-full", "af-file-fast")


def catalogue(quick: bool, sizes: tuple[int, ...]) -> list[Workload]:
    size = thread_size(quick)
    out = []
    for ours, peer in LANGGRAPH_PAIRS:
        extra = ("aput_writes", "graph")
        reads = () if ours == "lg-sqlite-fast" else LANGGRAPH_READS
        for workload in ("aput", *extra, *reads):
            out += [_langgraph(workload, s, size) for s in (ours, peer)]
    out += [_af("save", s, 0) for s in (*AF_SUBJECTS, "AF-File", "AF-InMemory")]
    for n in sizes:
        for s in ("af-sqlite-full", "af-file-full", "AF-InMemory", "AF-File"):
            if s == "AF-File" and n != sizes[0]:
                continue  # reads every file of the workflow per call
            out.append(_af("get_latest", s, n))
    return out
