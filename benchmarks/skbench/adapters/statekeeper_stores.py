"""statekeeper's own stores, each opened by URL exactly as a user would.

A backend that is not importable yet (the file, SQL and Redis backends land while
this harness is written) or whose server is unreachable raises
:class:`StoreUnavailable`, and the run reports it as skipped rather than failing.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ..payload import make_state
from .base import Adapter, Kind, SaveMode, StoreUnavailable, WriterSpec

POSTGRES_URL = os.environ.get(
    "STATEKEEPER_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("STATEKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

LIST_PAGE = 100  # page size used to list a whole stream (what a UI or export would use)
MAX_PAGE = 1000  # the contract's largest page, used only to walk to the middle (untimed)


def _reachable(url: str) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    if port is None:
        return
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        raise StoreUnavailable(f"{host}:{port} is unreachable: {exc}") from exc


class StatekeeperAdapter(Adapter):
    """Drives one statekeeper store; subclasses say where it lives and how it saves."""

    family: ClassVar[str] = "statekeeper"
    distribution: ClassVar[str] = "statekeeper"
    cross_process = True
    #: Populate through ``durability="fast"`` when the store has a "fast" mode
    #: (the bulk load is untimed; the measured saves use each mode as labelled).
    populate_mode: ClassVar[str | None] = "fast"
    #: Concurrent saves in flight while populating (hides server round trips).
    populate_concurrency: ClassVar[int] = 1

    def __init__(self) -> None:
        super().__init__()
        self.stores: dict[str, Any] = {}
        self.url = ""
        self.options: dict[str, Any] = {}

    # subclasses: where the store lives and what each mode passes as options
    def _location(self, workdir: Path) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def _mode_options(self) -> dict[str, dict[str, Any]]:
        return {m.label: {"durability": m.label} for m in self.save_modes()}

    async def open(self, workdir: Path) -> None:
        import statekeeper
        from statekeeper.errors import BackendNotFound

        self.url, self.options = self._location(workdir)
        try:
            for label, extra in self._mode_options().items():
                store = statekeeper.open_store(self.url, **self.options, **extra)
                self.stores[label] = store
        except BackendNotFound as exc:
            raise StoreUnavailable(str(exc)) from exc
        for store in self.stores.values():
            await store.open()

    async def close(self) -> None:
        for store in self.stores.values():
            await store.close()
        await self._cleanup()

    async def _cleanup(self) -> None:
        """Remove server-side data (files are removed with the work directory)."""
        return None

    def populate_label(self) -> str | None:
        modes = {m.label for m in self.save_modes()}
        return self.populate_mode if self.populate_mode in modes else None

    @property
    def main(self) -> Any:
        return self.stores[self.default_mode().label]

    async def populate(self, plan: Iterator[tuple[str, int]]) -> None:
        mode = self.populate_mode if self.populate_mode in self.stores else None
        label = mode or self.default_mode().label
        if self.populate_concurrency <= 1:
            for stream, step in plan:
                await self.save(stream, step, label)
            return
        batch: list[tuple[str, int]] = []
        for item in plan:
            batch.append(item)
            if len(batch) >= self.populate_concurrency:
                await asyncio.gather(*(self.save(s, n, label) for s, n in batch))
                batch = []
        await asyncio.gather(*(self.save(s, n, label) for s, n in batch))

    async def _save(self, stream: str, step: int, mode: str) -> str:
        cp = await self.stores[mode].save(stream, make_state(step), metadata={"step": step})
        return str(cp.id)

    async def get_latest(self, stream: str) -> Any:
        return await self.main.get_latest(stream)

    async def load(self, stream: str, ident: str) -> Any:
        return await self.main.load(ident)

    async def first_page(self, stream: str) -> int:
        page = await self.main.list(stream, limit=20)
        return len(page.items)

    async def prepare_middle(self, stream: str) -> Any:
        target = self.count // 2
        walked = 0
        cursor = None
        while walked < target:
            limit = min(MAX_PAGE, target - walked)
            page = await self.main.list(stream, limit=limit, after=cursor, include_state=False)
            walked += len(page.items) + len(page.skipped)
            cursor = page.next_cursor
            if cursor is None:
                break
        return cursor

    async def middle_page(self, stream: str, token: Any) -> int:
        page = await self.main.list(stream, limit=20, after=token)
        return len(page.items)

    async def list_all(self, stream: str) -> int:
        seen = 0
        cursor = None
        while True:
            page = await self.main.list(stream, limit=LIST_PAGE, after=cursor)
            seen += len(page.items)
            cursor = page.next_cursor
            if cursor is None:
                return seen

    def writer_spec(self) -> WriterSpec | None:
        if not self.cross_process:
            return None
        return WriterSpec(
            factory=f"{__name__}:attach_store",
            params={"cls": type(self).__name__, "url": self.url, "options": self.options},
        )

    async def attach(self, mode: str | None = None) -> None:
        import statekeeper

        label = mode or self.default_mode().label
        extra = self._mode_options()[label]
        self.stores = {label: statekeeper.open_store(self.url, **self.options, **extra)}
        await self.stores[label].open()

    async def detach(self) -> None:
        for store in self.stores.values():
            await store.close()

    def noop_hop(self, store: Any) -> tuple[Callable[[], Awaitable[Any]] | None, str]:
        """A call that does nothing on the worker ``store``'s reads run on, and how it
        is made: the cost of the thread hop alone, the floor of ``get_latest`` and
        ``load`` (issue 15). ``None`` when this store has no worker to hop to, or its
        internals moved (the report then says the floor was not measured)."""
        return None, f"{self.name} has no worker thread"


def _noop(*_: Any) -> None:
    """The body of a no-op hop."""


def attach_store(cls: str, url: str, options: dict[str, Any]) -> Adapter:
    """Child-process factory: a handle on an existing store (see ``writer_spec``)."""
    adapter: StatekeeperAdapter = globals()[cls]()
    adapter.url, adapter.options = url, options
    return adapter


class MemoryStore(StatekeeperAdapter):
    name = "statekeeper memory"
    kind: ClassVar[Kind] = "memory"
    cross_process = False
    populate_mode = None

    def _location(self, workdir: Path) -> tuple[str, dict[str, Any]]:
        return "memory://", {}

    def _mode_options(self) -> dict[str, dict[str, Any]]:
        return {"memory": {}}

    def default_mode(self) -> SaveMode:
        return SaveMode("memory", "process-memory", "in-process memory, nothing persisted")


class FileStore(StatekeeperAdapter):
    name = "statekeeper file"
    kind: ClassVar[Kind] = "embedded"

    def _location(self, workdir: Path) -> tuple[str, dict[str, Any]]:
        return f"file://{workdir / 'sk-file'}", {}

    def default_mode(self) -> SaveMode:
        return self.save_modes()[0]

    def save_modes(self) -> list[SaveMode]:
        return [
            SaveMode("full", "power-loss", "temp file, fsync, rename, fsync directory"),
            SaveMode("fast", "process-crash", "temp file, rename; no fsync"),
        ]

    def noop_hop(self, store: Any) -> tuple[Callable[[], Awaitable[Any]] | None, str]:
        # Every operation of the file store runs as one ``_run(what, func, *args)``:
        # one trip to its worker (today ``asyncio.to_thread``) with the engine held
        # active. A no-op through the same door costs the trip and nothing else.
        run = getattr(store, "_run", None)
        if run is None:
            return None, "FileCheckpointStore._run is gone: the file store's hop moved"

        async def hop() -> Any:
            return await run("no-op", _noop)

        return hop, "`FileCheckpointStore._run('no-op', lambda: None)`: every operation's door"


class SqliteStore(StatekeeperAdapter):
    name = "statekeeper sqlite"
    kind: ClassVar[Kind] = "embedded"

    def _location(self, workdir: Path) -> tuple[str, dict[str, Any]]:
        return f"sqlite:///{workdir / 'sk.db'}", {}

    def default_mode(self) -> SaveMode:
        return self.save_modes()[0]

    def save_modes(self) -> list[SaveMode]:
        return [
            SaveMode("full", "power-loss", "WAL, synchronous=FULL, BEGIN IMMEDIATE"),
            SaveMode("fast", "process-crash", "WAL, synchronous=NORMAL, BEGIN IMMEDIATE"),
        ]

    def noop_hop(self, store: Any) -> tuple[Callable[[], Awaitable[Any]] | None, str]:
        # Reads run on a reader thread that owns its connection:
        # ``SqliteRuntime._reader_worker().call(fn)``. A no-op there is the hop alone.
        runtime = getattr(store, "_runtime", None)
        pick = getattr(runtime, "_reader_worker", None)
        if pick is None:
            return None, "SqliteRuntime._reader_worker is gone: the SQLite read path moved"

        async def hop() -> Any:
            return await pick().call(_noop)

        return hop, "`SqliteRuntime._reader_worker().call(lambda conn: None)`: a reader thread"


class PostgresStore(StatekeeperAdapter):
    name = "statekeeper postgresql"
    kind: ClassVar[Kind] = "server"
    # a few saves in flight overlap their round trips; more only queue on the counter row
    populate_concurrency = 4

    def _location(self, workdir: Path) -> tuple[str, dict[str, Any]]:
        _reachable(POSTGRES_URL)
        self.prefix = f"skb{secrets.token_hex(4)}_"
        return POSTGRES_URL, {"table_prefix": self.prefix}

    def default_mode(self) -> SaveMode:
        return self.save_modes()[0]

    def save_modes(self) -> list[SaveMode]:
        return [
            SaveMode(
                "full", "power-loss", "one transaction per save, commit waits for the WAL flush"
            ),
            SaveMode(
                "fast",
                "server-memory",
                "synchronous_commit=off: a server crash can lose the last few commits",
            ),
        ]

    async def _tables(self, conn: Any) -> list[str]:
        rows = await conn.fetch(
            "SELECT schemaname, tablename FROM pg_tables WHERE tablename LIKE $1",
            self.prefix.replace("_", r"\_") + "%",
        )
        return [f'"{row["schemaname"]}"."{row["tablename"]}"' for row in rows]

    async def _admin(self) -> Any:
        import asyncpg  # type: ignore[import-untyped]

        return await asyncpg.connect(POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://"))

    async def after_populate(self) -> None:
        # autovacuum would have analyzed the bulk-loaded tables in steady state
        conn = await self._admin()
        try:
            for table in await self._tables(conn):
                await conn.execute(f"ANALYZE {table}")
        finally:
            await conn.close()

    async def _cleanup(self) -> None:
        conn = await self._admin()
        try:
            for table in await self._tables(conn):
                await conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
        finally:
            await conn.close()


class RedisStore(StatekeeperAdapter):
    name = "statekeeper redis"
    kind: ClassVar[Kind] = "server"
    populate_concurrency = 16
    populate_mode = None
    #: The local server has no AOF, so durability="full" (the default) would rightly
    #: refuse it; the bench opts out, and the table says what a save then survives.
    opt_out: ClassVar[dict[str, Any]] = {"allow_unsafe_durability": True}

    def _location(self, workdir: Path) -> tuple[str, dict[str, Any]]:
        _reachable(REDIS_URL)
        self.prefix = f"skb{secrets.token_hex(4)}"
        return REDIS_URL, {"key_prefix": self.prefix}

    def _mode_options(self) -> dict[str, dict[str, Any]]:
        return {"server": dict(self.opt_out)}

    def default_mode(self) -> SaveMode:
        return SaveMode(
            "server",
            "server-memory",
            "one Lua script per save; durability=full with allow_unsafe_durability=True, "
            "because the local server has no AOF: a save lives in server memory only",
        )

    async def _cleanup(self) -> None:
        import redis.asyncio as aioredis

        client = aioredis.from_url(REDIS_URL)
        try:
            batch: list[Any] = []
            # keys are "{prefix}:..." (a hash tag); braces are literal in a SCAN pattern
            async for key in client.scan_iter(match="{" + self.prefix + "}*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    await client.unlink(*batch)
                    batch = []
            if batch:
                await client.unlink(*batch)
        finally:
            await client.aclose()


ALL = [MemoryStore, FileStore, SqliteStore, PostgresStore, RedisStore]
