"""LangGraph's checkpointers, driven the way a compiled graph drives them.

A graph step calls ``put(config, checkpoint, metadata, new_versions)`` with the
parent's id in ``config``, a ``Checkpoint`` dict whose id is a time-ordered
``uuid6``, and the versions of the channels it wrote. Here the graph has one
channel, ``state``, holding the whole ~1 KB state, so each put writes one blob:
the cheapest shape for every LangGraph saver (a StateGraph with one channel per
key would write one blob per changed key).

Reads use the documented API: ``get_tuple`` without a checkpoint id for the latest,
with one to load by id, ``list(config, limit=20)`` for a page, and
``list(config, before=<checkpoint config>, limit=20)`` to page from a position.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import AsyncExitStack, ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from ..payload import make_state
from .base import (
    Adapter,
    Durability,
    Kind,
    SaveMode,
    StoreUnavailable,
    WriterSpec,
)
from .statekeeper_stores import POSTGRES_URL, _reachable

_ORDER_NOTE = "orders by the client-generated uuid6 id (a timestamp), not a store sequence"


def _config(stream: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": stream, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def graph_put(
    stream: str, step: int, parent: str | None, version: str | None, new_version: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, str]]:
    """The ``put`` arguments of checkpoint ``step`` of ``stream``, as a graph step makes
    them: its parent checkpoint ``parent``, a time-ordered ``uuid6`` id, one channel
    ``state`` holding the ~1 KB state of ``step``, its version bumped from ``version``
    to ``new_version``."""
    from langgraph.checkpoint.base import LATEST_VERSION
    from langgraph.checkpoint.base.id import uuid6

    checkpoint = {
        "v": LATEST_VERSION,
        "id": str(uuid6(clock_seq=step)),
        "ts": datetime.now(UTC).isoformat(),
        "channel_values": {"state": make_state(step)},
        "channel_versions": {"state": new_version},
        "versions_seen": {"step": {"state": version}} if version else {},
        "pending_sends": [],
        "updated_channels": ["state"],
    }
    metadata = {"source": "loop", "step": step, "parents": {}}
    return _config(stream, parent), checkpoint, metadata, {"state": new_version}


def next_put(
    saver: Any, heads: dict[str, tuple[str, str | None]], stream: str, step: int
) -> tuple[dict[str, Any], Any, Any, Any]:
    """The ``put`` arguments of the next checkpoint of ``stream`` (see
    :func:`graph_put`): its parent the stream's head in ``heads`` (updated), its
    version the saver's next."""
    parent, version = heads.get(stream, (None, None))
    new_version = saver.get_next_version(version, None)
    put = graph_put(stream, step, parent, version, new_version)
    heads[stream] = (put[1]["id"], new_version)
    return put


class _LangGraph(Adapter):
    family: ClassVar[str] = "LangGraph"
    distribution: ClassVar[str] = "langgraph-checkpoint"
    notes: ClassVar[dict[str, str]] = {
        "get_latest": "get_tuple(thread config); " + _ORDER_NOTE,
        "middle_page": "list(before=<checkpoint config>, limit=20): the id acts as the cursor",
    }

    def __init__(self) -> None:
        super().__init__()
        self.saver: Any = None
        self._heads: dict[str, tuple[str, str | None]] = {}  # stream -> (checkpoint id, version)

    def _checkpoint(self, stream: str, step: int) -> tuple[dict[str, Any], Any, Any, Any]:
        return next_put(self.saver, self._heads, stream, step)

    def export_state(self) -> dict[str, Any]:
        return {"heads": dict(self._heads)}

    def import_state(self, state: dict[str, Any]) -> None:
        heads = state.get("heads")
        if heads is not None:
            self._heads = {k: tuple(v) if isinstance(v, list) else v for k, v in heads.items()}

    def middle_target(self) -> str:
        # ``before=X`` returns ids strictly older than X: skip the newest count//2
        return self.ids[len(self.ids) - self.count // 2]

    async def prepare_middle(self, stream: str) -> Any:
        return _config(stream, self.middle_target())


class _SyncLangGraph(_LangGraph):
    """Savers with a synchronous API (called directly, as a sync graph would)."""

    async def _save(self, stream: str, step: int, mode: str) -> str:
        config, checkpoint, metadata, versions = self._checkpoint(stream, step)
        self.saver.put(config, checkpoint, metadata, versions)
        return str(checkpoint["id"])

    async def get_latest(self, stream: str) -> Any:
        return self.saver.get_tuple(_config(stream))

    async def load(self, stream: str, ident: str) -> Any:
        return self.saver.get_tuple(_config(stream, ident))

    async def first_page(self, stream: str) -> int:
        return len(list(self.saver.list(_config(stream), limit=20)))

    async def middle_page(self, stream: str, token: Any) -> int:
        return len(list(self.saver.list(_config(stream), before=token, limit=20)))

    async def list_all(self, stream: str) -> int:
        return sum(1 for _ in self.saver.list(_config(stream)))


class InMemorySaverStore(_SyncLangGraph):
    name = "LangGraph InMemorySaver"
    kind: ClassVar[Kind] = "memory"
    notes: ClassVar[dict[str, str]] = {
        **_LangGraph.notes,
        "get_latest": "get_tuple: max() over the thread's ids; " + _ORDER_NOTE,
        "first_page": "list(limit=20) sorts the whole thread first",
    }

    async def open(self, workdir: Path) -> None:
        from langgraph.checkpoint.memory import InMemorySaver

        self.saver = InMemorySaver()

    async def close(self) -> None:
        self.saver = None

    def default_mode(self) -> SaveMode:
        return SaveMode("memory", "process-memory", "in-process memory, nothing persisted")


def _sqlite_durability(value: int) -> tuple[Durability, str]:
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    name = names.get(value, str(value))
    durability: Durability = "power-loss" if value >= 2 else "process-crash"
    return durability, f"WAL, synchronous={name} (SQLite's default), one commit per put"


class SqliteSaverStore(_SyncLangGraph):
    name = "LangGraph SqliteSaver"
    kind: ClassVar[Kind] = "embedded"
    distribution: ClassVar[str] = "langgraph-checkpoint-sqlite"
    cross_process = True

    def __init__(self) -> None:
        super().__init__()
        self._stack = ExitStack()
        self.path = ""
        self._sync = 2

    async def open(self, workdir: Path) -> None:
        self.path = str(workdir / "lg-sqlite.db")
        await self.attach()
        self._sync = self.saver.conn.execute("PRAGMA synchronous").fetchone()[0]

    async def attach(self, mode: str | None = None) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.saver = self._stack.enter_context(SqliteSaver.from_conn_string(self.path))
        self.saver.setup()

    async def detach(self) -> None:
        self._stack.close()

    async def close(self) -> None:
        self._stack.close()

    async def populate(self, plan: Iterator[tuple[str, int]]) -> None:
        # the bulk load is untimed; measured puts run at the saver's own setting
        self.saver.conn.execute("PRAGMA synchronous=OFF")
        try:
            await super().populate(plan)
        finally:
            self.saver.conn.execute(f"PRAGMA synchronous={self._sync}")

    def default_mode(self) -> SaveMode:
        durability, detail = _sqlite_durability(self._sync)
        return SaveMode("default", durability, detail)

    def writer_spec(self) -> WriterSpec | None:
        params = {"cls": type(self).__name__, "path": self.path}
        return WriterSpec(f"{__name__}:attach_peer", params)


class AsyncSqliteSaverStore(_LangGraph):
    name = "LangGraph AsyncSqliteSaver"
    kind: ClassVar[Kind] = "embedded"
    distribution: ClassVar[str] = "langgraph-checkpoint-sqlite"
    cross_process = True
    notes: ClassVar[dict[str, str]] = {
        **_LangGraph.notes,
        "list_all": "alist: one extra query per row for pending writes",
    }

    def __init__(self) -> None:
        super().__init__()
        self._stack = AsyncExitStack()
        self.path = ""
        self._sync = 2

    async def open(self, workdir: Path) -> None:
        self.path = str(workdir / "lg-async-sqlite.db")
        await self.attach()
        async with self.saver.conn.execute("PRAGMA synchronous") as cur:
            self._sync = (await cur.fetchone())[0]

    async def attach(self, mode: str | None = None) -> None:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        self.saver = await self._stack.enter_async_context(
            AsyncSqliteSaver.from_conn_string(self.path)
        )
        await self.saver.setup()

    async def detach(self) -> None:
        await self._stack.aclose()

    async def close(self) -> None:
        await self._stack.aclose()

    async def populate(self, plan: Iterator[tuple[str, int]]) -> None:
        # Untimed bulk load through the sync SqliteSaver on the same file: the same
        # schema and rows (LangGraph shares them between the two), without a thread
        # hop per put.
        from langgraph.checkpoint.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(self.path) as bulk:
            bulk.setup()
            bulk.conn.execute("PRAGMA synchronous=OFF")
            for stream, step in plan:
                config, checkpoint, metadata, versions = self._checkpoint(stream, step)
                bulk.put(config, checkpoint, metadata, versions)
                self.track(stream, str(checkpoint["id"]))

    def default_mode(self) -> SaveMode:
        durability, detail = _sqlite_durability(self._sync)
        return SaveMode("default", durability, detail)

    async def _save(self, stream: str, step: int, mode: str) -> str:
        config, checkpoint, metadata, versions = self._checkpoint(stream, step)
        await self.saver.aput(config, checkpoint, metadata, versions)
        return str(checkpoint["id"])

    async def get_latest(self, stream: str) -> Any:
        return await self.saver.aget_tuple(_config(stream))

    async def load(self, stream: str, ident: str) -> Any:
        return await self.saver.aget_tuple(_config(stream, ident))

    async def first_page(self, stream: str) -> int:
        return len([t async for t in self.saver.alist(_config(stream), limit=20)])

    async def middle_page(self, stream: str, token: Any) -> int:
        return len([t async for t in self.saver.alist(_config(stream), before=token, limit=20)])

    async def list_all(self, stream: str) -> int:
        seen = 0
        async for _ in self.saver.alist(_config(stream)):
            seen += 1
        return seen

    def writer_spec(self) -> WriterSpec | None:
        params = {"cls": type(self).__name__, "path": self.path}
        return WriterSpec(f"{__name__}:attach_peer", params)


def _libpq_url() -> str:
    return POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://", 1)


class PostgresSaverStore(_SyncLangGraph):
    """PostgresSaver in its own schema (its table names are fixed, so a schema isolates it)."""

    name = "LangGraph PostgresSaver"
    kind: ClassVar[Kind] = "server"
    distribution: ClassVar[str] = "langgraph-checkpoint-postgres"
    cross_process = True

    def __init__(self) -> None:
        super().__init__()
        self._stack = ExitStack()
        self.schema = ""
        self.settings: dict[str, str] = {}

    def _conninfo(self) -> str:
        return f"{_libpq_url()}?options=-csearch_path%3D{self.schema}"

    async def open(self, workdir: Path) -> None:
        _reachable(POSTGRES_URL)
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - bench env always has it
            raise StoreUnavailable(f"psycopg is not installed: {exc}") from exc
        self.schema = f"lgbench_{secrets.token_hex(4)}"
        with psycopg.connect(_libpq_url(), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.schema}"')
            for name in ("fsync", "synchronous_commit"):
                row = conn.execute(f"SHOW {name}").fetchone()
                self.settings[name] = str(row[0]) if row else "?"
        await self.attach()

    async def attach(self, mode: str | None = None) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver

        self.saver = self._stack.enter_context(PostgresSaver.from_conn_string(self._conninfo()))
        self.saver.setup()

    async def detach(self) -> None:
        self._stack.close()

    async def close(self) -> None:
        import psycopg

        self._stack.close()
        if self.schema:
            with psycopg.connect(_libpq_url(), autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    async def populate(self, plan: Iterator[tuple[str, int]]) -> None:
        # the bulk load is untimed: skip the per-commit WAL flush for it only
        self.saver.conn.execute("SET synchronous_commit TO off")
        try:
            await super().populate(plan)
        finally:
            self.saver.conn.execute("RESET synchronous_commit")

    async def after_populate(self) -> None:
        # autovacuum would have analyzed the bulk-loaded tables in steady state
        self.saver.conn.execute("ANALYZE checkpoints, checkpoint_blobs, checkpoint_writes")

    def default_mode(self) -> SaveMode:
        durable = self.settings.get("fsync") == "on" and self.settings.get(
            "synchronous_commit", "on"
        ) in ("on", "remote_apply", "remote_write", "local")
        return SaveMode(
            "default",
            "power-loss" if durable else "process-crash",
            "autocommit, pipeline: blob upsert + checkpoint upsert; server "
            + ", ".join(f"{k}={v}" for k, v in self.settings.items()),
        )

    def writer_spec(self) -> WriterSpec | None:
        return WriterSpec(
            f"{__name__}:attach_peer", {"cls": type(self).__name__, "schema": self.schema}
        )


def attach_peer(cls: str, **params: Any) -> Adapter:
    """Child-process factory for the 4-writer workload."""
    adapter = globals()[cls]()
    for key, value in params.items():
        setattr(adapter, key, value)
    return adapter


ALL = [InMemorySaverStore, SqliteSaverStore, AsyncSqliteSaverStore, PostgresSaverStore]
