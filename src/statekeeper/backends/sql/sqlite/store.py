"""The SQLite store class: :class:`SqliteCheckpointStore`, what SQLite declares and
how its runtime (:mod:`.runtime`) is built from the store's options."""

from __future__ import annotations

import weakref
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

from ...._runtime.finalizer import when_collected
from ...._url import StoreURL
from ....config import Capabilities, StoreOptions
from ..schema import Statements
from ..store import SqlCheckpointStore
from .compiler import Compiler
from .connect import OpenMode, sqlite_path
from .dialect import SQLITE, SqliteDialect
from .options import SqliteOptions, refuse_foreign_driver, refuse_foreign_options
from .runtime import SqliteRuntime

if TYPE_CHECKING:
    from ..dialects import Runtime

__all__ = ["SqliteCheckpointStore"]


@lru_cache(maxsize=64)
def _compiler(st: Statements) -> Compiler:
    """One compiler per set of statements (they are shared by every store with these
    tables), so each statement compiles once per process."""
    return Compiler()


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
    host, and across ``fork``; not on a network file system. The driver is always
    the stdlib ``sqlite3`` (``sqlite+aiosqlite://`` is refused).
    """

    Options: ClassVar[type[StoreOptions]] = SqliteOptions
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
    backend_name: ClassVar[str] = "sqlite"
    dialect: ClassVar[SqliteDialect] = SQLITE

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        parsed = StoreURL.parse(url)
        refuse_foreign_driver(parsed)
        refuse_foreign_options([*parsed.query, *options])
        super().__init__(parsed, **options)
        self.path = sqlite_path(self.url)
        self._compiler = _compiler(self._st)
        self._abandon: weakref.finalize[[], object] | None = None

    def _sqlite_options(self) -> SqliteOptions:
        """:attr:`options`, typed as the SQLite store's (:attr:`Options`); the SQL
        core types ``self.options`` as the shared :class:`SqlOptions`."""
        options = self.options
        assert isinstance(options, SqliteOptions)
        return options

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
        self._abandon = when_collected(self, runtime.abandon)

    async def _stop(self) -> None:
        abandon, self._abandon = self._abandon, None
        if abandon is not None:
            abandon.detach()
        await super()._stop()

    def _make_runtime(self) -> Runtime:
        options = self._sqlite_options()
        return SqliteRuntime(
            self.path,
            compiler=self._compiler,
            synchronous="FULL" if options.durability == "full" else "NORMAL",
            busy_timeout=options.busy_timeout,
            readers=options.pool_size or 2,
            echo=options.echo,
            mode=_sqlite_mode(options),
            inline_reads=options.inline_reads,
            inline_writes=options.inline_writes,
        )
