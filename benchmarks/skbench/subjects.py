"""The stores under test, ours and the peers', behind one small interface.

A :class:`Subject` is one store driven through its own documented API: statekeeper's
``save``/``get_latest``/``load``/``list``, LangGraph's ``put``/``get_tuple``/``list``
(and their ``a``-prefixed twins), Agent Framework's ``save``/``get_latest``/``load``/
``list_checkpoints``. Where a peer has no equivalent (no cursor, no paging) the
subject does what a user of that peer would have to do, and :attr:`Subject.note` says
so in the rendered table.

A subject holds one main stream (``MAIN``) and as many checkpoints again spread over
ten noise streams; :meth:`Subject.fill` builds them untimed, through the cheapest
path that gives the same data (``save_many`` at ``durability="fast"``, a peer's
connection at ``synchronous=OFF``), since only the measured calls pay for durability.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from .payload import make_state

MAIN = "bench-main"
NOISE = tuple(f"bench-noise-{i}" for i in range(10))
POSTGRES_URL = os.environ.get("STATEKEEPER_TEST_POSTGRES_URL", "")
REDIS_URL = os.environ.get("STATEKEEPER_TEST_REDIS_URL", "")
LIST_PAGE = 100  # the page size a whole-stream listing uses (what an export would)


class Unavailable(Exception):
    """The subject cannot run here (a peer not installed, a server not reachable)."""


def reachable(url: str) -> None:
    """Raise :class:`Unavailable` unless ``url``'s host and port accept a connection."""
    if not url:
        raise Unavailable("no server URL in the environment")
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 2).close()
    except OSError as exc:
        raise Unavailable(f"{parts.hostname}:{parts.port} is unreachable: {exc}") from exc


def metadata(step: int) -> dict[str, Any]:
    """A checkpoint's metadata: one in 100 is ``source="input"`` (the filtered pages)."""
    return {"step": step, "source": "input" if step % 100 == 0 else "loop"}


def plan(size: int) -> list[tuple[str, int]]:
    """``size`` checkpoints of the main stream, interleaved with ``size`` more over the
    noise streams, in save order."""
    out: list[tuple[str, int]] = []
    for step in range(size):
        out.append((MAIN, step))
        out.append((NOISE[step % len(NOISE)], step))
    return out


class Subject:
    """One store under test; ``ids`` are the main stream's ids in save order."""

    #: How the store is named in benchmark names and tables.
    title: ClassVar[str]
    #: What this store's contract does differently, shown beside its rows.
    note: ClassVar[str] = ""
    #: Its state lives in files under ``place``: a built fixture can be reopened.
    on_disk: ClassVar[bool] = False

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.middle: Any = None
        #: Its directory, once :meth:`skbench.harness.Context.fresh` opened it there.
        self.place: Path | None = None
        self.step = 10**6  # states saved by the timed calls differ from the fixture's

    async def open(self, place: Path) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        return None

    async def fill(self, size: int) -> None:
        """Untimed: the main stream and the noise, then where the middle page starts."""
        for stream, step in plan(size):
            ident = await self.put(stream, step)
            if stream == MAIN:
                self.ids.append(ident)
        self.middle = await self.find_middle()

    async def put(self, stream: str, step: int) -> str:
        raise NotImplementedError

    async def save(self) -> None:
        """The timed save: the next state at the end of the main stream."""
        self.step += 1
        await self.put(MAIN, self.step)

    async def get_latest(self) -> Any:
        raise NotImplementedError

    async def load(self, ident: str) -> Any:
        raise NotImplementedError

    async def first_page(self) -> int:
        raise NotImplementedError

    async def find_middle(self) -> Any:
        return self.ids[len(self.ids) // 2] if self.ids else None

    async def middle_page(self) -> int:
        raise NotImplementedError

    async def list_all(self) -> int:
        raise NotImplementedError


# -- statekeeper ---------------------------------------------------------------------


class Ours(Subject):
    """A statekeeper store opened by URL, as a user would, at one durability."""

    backend: ClassVar[str]
    durability: ClassVar[str | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.store: Any = None

    def location(self, place: Path) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    async def open(self, place: Path) -> None:
        import statekeeper

        url, options = self.location(place)
        if self.durability:
            options["durability"] = self.durability
        self.store = statekeeper.open_store(url, **options)
        await self.store.open()

    async def close(self) -> None:
        await self.store.close()

    async def fill(self, size: int) -> None:
        # in batches: one commit (one fsync at "full") per thousand, untimed
        import statekeeper

        items = [
            statekeeper.NewCheckpoint(stream=s, state=make_state(n), metadata=metadata(n))
            for s, n in plan(size)
        ]
        for at in range(0, len(items), 1000):
            for cp in await self.store.save_many(items[at : at + 1000]):
                if cp.stream == MAIN:
                    self.ids.append(str(cp.id))
        self.middle = await self.find_middle()

    async def put(self, stream: str, step: int) -> str:
        cp = await self.store.save(stream, make_state(step), metadata=metadata(step))
        return str(cp.id)

    async def get_latest(self) -> Any:
        return await self.store.get_latest(MAIN)

    async def load(self, ident: str) -> Any:
        return await self.store.load(ident)

    async def first_page(self) -> int:
        return len((await self.store.list(MAIN, limit=20)).items)

    async def find_middle(self) -> Any:
        return await self.store.cursor_at(self.ids[len(self.ids) // 2])

    async def middle_page(self) -> int:
        return len((await self.store.list(MAIN, limit=20, after=self.middle)).items)

    async def list_all(self) -> int:
        seen, cursor = 0, None
        while True:
            page = await self.store.list(MAIN, limit=LIST_PAGE, after=cursor)
            seen += len(page.items)
            if page.next_cursor is None:
                return seen
            cursor = page.next_cursor


class OursMemory(Ours):
    title = "statekeeper memory"
    backend = "memory"

    def location(self, place: Path) -> tuple[str, dict[str, Any]]:
        return "memory://", {}


class OursFile(Ours):
    title = 'statekeeper file, durability="full"'
    backend, durability, on_disk = "file", "full", True

    def location(self, place: Path) -> tuple[str, dict[str, Any]]:
        return f"file://{place / 'store'}", {}


class OursFileFast(OursFile):
    title, durability = 'statekeeper file, durability="fast"', "fast"


class OursSqlite(Ours):
    title = 'statekeeper sqlite, durability="full"'
    backend, durability, on_disk = "sqlite", "full", True

    def location(self, place: Path) -> tuple[str, dict[str, Any]]:
        return f"sqlite:///{place / 'store.db'}", {}


class OursSqliteFast(OursSqlite):
    title, durability = 'statekeeper sqlite, durability="fast"', "fast"


class OursPostgres(Ours):
    """In tables of their own, named after the fixture's directory (so a reopened
    fixture finds them); :func:`drop_server_data` removes them after the run."""

    title = 'statekeeper postgresql, durability="full"'
    backend, durability, on_disk = "postgresql", "full", True

    def location(self, place: Path) -> tuple[str, dict[str, Any]]:
        reachable(POSTGRES_URL)
        return POSTGRES_URL, {"table_prefix": server_name(place) + "_"}


class OursRedis(Ours):
    title = "statekeeper redis"
    backend, on_disk = "redis", True
    note = "durability=full with allow_unsafe_durability=True: the server keeps no AOF"

    def location(self, place: Path) -> tuple[str, dict[str, Any]]:
        reachable(REDIS_URL)
        return REDIS_URL, {"key_prefix": server_name(place), "allow_unsafe_durability": True}


def server_name(place: Path) -> str:
    """The name a fixture's server-side data takes: the run's scratch token and the
    fixture's directory, so that every run's data can be found and dropped."""
    token = os.environ.get("SKBENCH_TOKEN", "skb")
    digest = hashlib.blake2b(place.name.encode(), digest_size=6).hexdigest()
    return f"{token}_{digest}"  # short: a table prefix is at most 40 characters


# -- LangGraph -----------------------------------------------------------------------


def lg_config(stream: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": stream, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


class LangGraphPut:
    """The ``put`` arguments a graph step makes: the parent checkpoint in the config, a
    time-ordered ``uuid6`` id, one channel ``state`` holding the ~1 KB state, its
    version bumped (one blob per put: the cheapest shape for every saver)."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self.heads: dict[str, tuple[str, Any]] = {}

    def __call__(self, stream: str, step: int) -> tuple[Any, Any, Any, Any]:
        from langgraph.checkpoint.base import LATEST_VERSION
        from langgraph.checkpoint.base.id import uuid6

        parent, version = self.heads.get(stream, (None, None))
        new = self.saver.get_next_version(version, None)
        checkpoint = {
            "v": LATEST_VERSION,
            "id": str(uuid6(clock_seq=step)),
            "ts": datetime.now(UTC).isoformat(),
            "channel_values": {"state": make_state(step)},
            "channel_versions": {"state": new},
            "versions_seen": {"step": {"state": version}} if version else {},
            "pending_sends": [],
            "updated_channels": ["state"],
        }
        self.heads[stream] = (checkpoint["id"], new)
        metadata = {"source": "loop", "step": step, "parents": {}}
        return lg_config(stream, parent), checkpoint, metadata, {"state": new}


class LangGraphSync(Subject):
    """A saver with a synchronous API, called directly as a sync graph would."""

    note = "orders by the client-made uuid6 id; list(before=<config>) for the middle page"

    def __init__(self) -> None:
        super().__init__()
        self.saver: Any = None
        self.stack = AsyncExitStack()
        self.args: LangGraphPut

    async def close(self) -> None:
        await self.stack.aclose()

    async def put(self, stream: str, step: int) -> str:
        config, checkpoint, metadata, versions = self.args(stream, step)
        self.saver.put(config, checkpoint, metadata, versions)
        return str(checkpoint["id"])

    async def get_latest(self) -> Any:
        return self.saver.get_tuple(lg_config(MAIN))

    async def load(self, ident: str) -> Any:
        return self.saver.get_tuple(lg_config(MAIN, ident))

    async def first_page(self) -> int:
        return len(list(self.saver.list(lg_config(MAIN), limit=20)))

    async def find_middle(self) -> Any:
        return lg_config(MAIN, self.ids[len(self.ids) // 2])

    async def middle_page(self) -> int:
        return len(list(self.saver.list(lg_config(MAIN), before=self.middle, limit=20)))

    async def list_all(self) -> int:
        return sum(1 for _ in self.saver.list(lg_config(MAIN)))


class InMemorySaver(LangGraphSync):
    title = "LangGraph InMemorySaver"

    async def open(self, place: Path) -> None:
        from langgraph.checkpoint.memory import InMemorySaver as Saver

        self.saver = Saver()
        self.args = LangGraphPut(self.saver)


class SqliteSaver(LangGraphSync):
    title = "LangGraph SqliteSaver"
    on_disk = True

    async def open(self, place: Path) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver as Saver

        self.saver = self.stack.enter_context(Saver.from_conn_string(str(place / "lg.db")))
        self.saver.setup()
        self.args = LangGraphPut(self.saver)

    async def fill(self, size: int) -> None:
        self.saver.conn.execute("PRAGMA synchronous=OFF")  # untimed; puts run at FULL
        try:
            await super().fill(size)
        finally:
            self.saver.conn.execute("PRAGMA synchronous=FULL")


class AsyncSqliteSaver(LangGraphSync):
    title = "LangGraph AsyncSqliteSaver"
    on_disk = True

    async def open(self, place: Path) -> None:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as Saver

        self.path = str(place / "lg.db")
        self.saver = await self.stack.enter_async_context(Saver.from_conn_string(self.path))
        await self.saver.setup()
        self.args = LangGraphPut(self.saver)

    async def fill(self, size: int) -> None:
        # the same schema and rows through the sync saver on the same file, untimed
        bulk = SqliteSaver()
        bulk.saver, bulk.args = None, self.args
        from langgraph.checkpoint.sqlite import SqliteSaver as Saver

        with Saver.from_conn_string(self.path) as saver:
            bulk.saver = saver
            bulk.args.saver = saver
            await SqliteSaver.fill(bulk, size)
        self.args.saver = self.saver
        self.ids, self.middle = bulk.ids, bulk.middle

    async def put(self, stream: str, step: int) -> str:
        config, checkpoint, metadata, versions = self.args(stream, step)
        await self.saver.aput(config, checkpoint, metadata, versions)
        return str(checkpoint["id"])

    async def get_latest(self) -> Any:
        return await self.saver.aget_tuple(lg_config(MAIN))

    async def load(self, ident: str) -> Any:
        return await self.saver.aget_tuple(lg_config(MAIN, ident))

    async def first_page(self) -> int:
        return len([t async for t in self.saver.alist(lg_config(MAIN), limit=20)])

    async def middle_page(self) -> int:
        page = self.saver.alist(lg_config(MAIN), before=self.middle, limit=20)
        return len([t async for t in page])

    async def list_all(self) -> int:
        return len([t async for t in self.saver.alist(lg_config(MAIN))])


class AsyncPostgresSaver(AsyncSqliteSaver):
    """In a schema of its own (its table names are fixed), named like our tables."""

    title = "LangGraph AsyncPostgresSaver"

    async def open(self, place: Path) -> None:
        import psycopg
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as Saver

        reachable(POSTGRES_URL)
        libpq = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://", 1)
        schema = server_name(place)
        async with await psycopg.AsyncConnection.connect(libpq, autocommit=True) as conn:
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conninfo = f"{libpq}?options=-csearch_path%3D{schema}"
        self.saver = await self.stack.enter_async_context(Saver.from_conn_string(conninfo))
        await self.saver.setup()
        self.args = LangGraphPut(self.saver)

    async def fill(self, size: int) -> None:
        await self.saver.conn.execute("SET synchronous_commit TO off")  # untimed
        try:
            await Subject.fill(self, size)
        finally:
            await self.saver.conn.execute("RESET synchronous_commit")
        await self.saver.conn.execute("ANALYZE checkpoints, checkpoint_blobs")


# -- Agent Framework -----------------------------------------------------------------


class AgentFramework(Subject):
    """An Agent Framework ``CheckpointStorage``: a chain of ``WorkflowCheckpoint`` per
    workflow, as the workflow runner writes them."""

    note = "no paging API: list_checkpoints() of the whole workflow, sort, slice"

    def __init__(self) -> None:
        super().__init__()
        self.storage: Any = None
        self.heads: dict[str, str] = {}

    async def put(self, stream: str, step: int) -> str:
        from agent_framework import WorkflowCheckpoint

        checkpoint = WorkflowCheckpoint(
            workflow_name=stream,
            graph_signature_hash="bench-graph",
            previous_checkpoint_id=self.heads.get(stream),
            state=make_state(step),
            iteration_count=step,
            metadata={"step": step},
        )
        self.heads[stream] = ident = str(await self.storage.save(checkpoint))
        return ident

    async def get_latest(self) -> Any:
        return await self.storage.get_latest(workflow_name=MAIN)

    async def load(self, ident: str) -> Any:
        return await self.storage.load(ident)

    async def _ordered(self) -> list[Any]:
        every = await self.storage.list_checkpoints(workflow_name=MAIN)
        return sorted(every, key=lambda cp: datetime.fromisoformat(cp.timestamp), reverse=True)

    async def first_page(self) -> int:
        return len((await self._ordered())[:20])

    async def middle_page(self) -> int:
        ordered = await self._ordered()
        at = next(i for i, cp in enumerate(ordered) if cp.checkpoint_id == self.middle)
        return len(ordered[at + 1 : at + 21])

    async def list_all(self) -> int:
        return len(await self.storage.list_checkpoints(workflow_name=MAIN))


class AfInMemory(AgentFramework):
    title = "Agent Framework InMemoryCheckpointStorage"

    async def open(self, place: Path) -> None:
        from agent_framework import InMemoryCheckpointStorage

        self.storage = InMemoryCheckpointStorage()


class AfFile(AgentFramework):
    title = "Agent Framework FileCheckpointStorage"
    note = "one JSON file per checkpoint, no fsync; get_latest reads every file"
    on_disk = True

    async def open(self, place: Path) -> None:
        from agent_framework import FileCheckpointStorage

        self.storage = FileCheckpointStorage(str(place / "files"))


#: Every subject by the short name benchmark names use.
SUBJECTS: dict[str, type[Subject]] = {
    "memory": OursMemory,
    "file-full": OursFile,
    "file-fast": OursFileFast,
    "sqlite-full": OursSqlite,
    "sqlite-fast": OursSqliteFast,
    "postgresql-full": OursPostgres,
    "redis": OursRedis,
    "InMemorySaver": InMemorySaver,
    "SqliteSaver": SqliteSaver,
    "AsyncSqliteSaver": AsyncSqliteSaver,
    "AsyncPostgresSaver": AsyncPostgresSaver,
    "AF-InMemory": AfInMemory,
    "AF-File": AfFile,
}

#: What each subject needs to run: modules to import, servers to reach.
NEEDS: dict[str, tuple[str, ...]] = {
    "postgresql-full": ("asyncpg", "postgres"),
    "redis": ("statekeeper_redis", "redis"),
    "InMemorySaver": ("langgraph.checkpoint.memory",),
    "SqliteSaver": ("langgraph.checkpoint.sqlite",),
    "AsyncSqliteSaver": ("langgraph.checkpoint.sqlite", "aiosqlite"),
    "AsyncPostgresSaver": ("langgraph.checkpoint.postgres", "psycopg", "postgres"),
    "AF-InMemory": ("agent_framework",),
    "AF-File": ("agent_framework",),
}


def missing(needs: tuple[str, ...]) -> str | None:
    """Why something that needs ``needs`` cannot run here, or ``None``."""
    import importlib.util

    for need in needs:
        if need in ("postgres", "redis"):
            try:
                reachable(POSTGRES_URL if need == "postgres" else REDIS_URL)
            except Unavailable as exc:
                return f"{need}: {exc}"
            continue
        try:
            found = importlib.util.find_spec(need) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{need} is not installed (benchmarks/requirements.txt)"
    return None


async def drop_server_data(token: str) -> None:
    """Remove every table, schema and key a run named with ``token`` made."""
    if POSTGRES_URL and missing(("asyncpg", "postgres")) is None:
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        conn = await asyncpg.connect(POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            like = token.lower().replace("_", r"\_") + "%"
            for (name,) in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname='public' AND tablename LIKE $1",
                like,
            ):
                await conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')
            for (name,) in await conn.fetch(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE $1", like
            ):
                await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()
    if REDIS_URL and missing(("redis", "redis")) is None:
        import redis.asyncio as aioredis

        client = aioredis.from_url(REDIS_URL)
        try:
            async for key in client.scan_iter(match="{" + token.lower() + "*", count=1000):
                await client.delete(key)
        finally:
            await client.aclose()


def new_token() -> str:
    return f"skb{secrets.token_hex(3)}"


Factory = Callable[[], Subject]
