"""The SQLite store class: what the dialect declares, its options and its runtime.

(PostgreSQL's and MySQL's are in :mod:`.postgres` and :mod:`.mysql`.)
"""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

from ..._url import StoreURL
from ...config import Capabilities, StoreOptions
from ...errors import InvalidOptions
from .dialects import Runtime
from .options import SqlOptions
from .sqlite import OpenMode, SqliteRuntime, sqlite_path
from .store import SqlCheckpointStore

__all__ = ["SqliteCheckpointStore", "SqliteOptions"]


class SqliteOptions(SqlOptions):
    """Options of a SQLite store."""

    dialect: ClassVar[str] = "SQLite"

    #: SQLite: run ``get_latest``, ``load``, ``load_many`` of up to 100 ids and
    #: listed pages of up to 100 items on the event loop's thread, on a connection
    #: of their own that never waits for a lock (a read that would wait goes to a
    #: reader thread instead); ``False`` runs them on the reader threads. Saves,
    #: larger pages and batches, and every other call always run on the store's
    #: threads.
    inline_reads: bool = True


def _sqlite_mode(options: SqliteOptions) -> OpenMode:
    if options.read_only:
        return "ro"
    return "rwc" if options.create else "rw"


class SqliteCheckpointStore(SqlCheckpointStore):
    """``sqlite:///relative.db`` / ``sqlite:////absolute.db``: the embedded SQL store.

    WAL mode; ``synchronous=FULL`` under ``durability="full"`` (a save survives
    power loss) and ``NORMAL`` under ``"fast"`` (it survives a process crash).
    Writes take the lock up front (``BEGIN IMMEDIATE``) and wait up to
    ``busy_timeout`` for writers in other processes. ``get_latest``, ``load``,
    ``load_many`` of up to 100 ids and pages of up to 100 items run on the event
    loop's thread unless SQLite would make them wait (``inline_reads``, see
    :meth:`SqliteRuntime.point_read`); everything else runs on the store's writer
    and reader threads. Safe to share between processes on one
    host, and across ``fork``; not on a network file system.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        persistent=True,
        cross_process=True,
        cross_host=False,
        power_loss_durable=True,
        ttl=True,
        raw_access=True,
        atomic_batches=True,
        metadata_filter=True,
    )
    Options: ClassVar[type[StoreOptions]] = SqliteOptions
    backend_name: ClassVar[str] = "sqlite"
    options: SqliteOptions

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        super().__init__(url, **options)
        if self.options.db_schema is not None:
            raise InvalidOptions("the schema option is not available on SQLite; use table_prefix")
        self.path = sqlite_path(self.url)
        self._abandon: weakref.finalize[[], SqliteCheckpointStore] | None = None

    def describe(self) -> str:
        where = f"sqlite:///{self.path}"
        if self.table_prefix != "statekeeper_":
            where += f" (tables {self.table_prefix}*)"
        return where

    async def _start(self) -> None:
        await super()._start()
        runtime = self._runtime
        assert isinstance(runtime, SqliteRuntime)
        # Collected unclosed, the store's threads would wait forever, each holding a
        # connection (and the saves in the -wal file): close them then.
        self._abandon = weakref.finalize(self, runtime.abandon)

    async def _stop(self) -> None:
        abandon, self._abandon = self._abandon, None
        if abandon is not None:
            abandon.detach()
        await super()._stop()

    def _make_runtime(self) -> Runtime:
        return SqliteRuntime(
            self.path,
            compiler=self._compiler,
            synchronous="FULL" if self.options.durability == "full" else "NORMAL",
            busy_timeout=self.options.busy_timeout,
            readers=self.options.pool_size or 2,
            echo=self.options.echo,
            mode=_sqlite_mode(self.options),
            inline_reads=self.options.inline_reads,
        )
