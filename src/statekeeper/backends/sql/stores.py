"""The per-dialect store classes: what each dialect declares and where it runs.

``SqlCheckpointStore(url)`` returns one of these (see :mod:`.store`); each one
builds its dialect's runtime (:mod:`.sqlite` or :mod:`.server`) with the store's
options, ``create`` and ``read_only`` included.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..._url import StoreURL
from ...config import Capabilities
from ...errors import InvalidOptions
from .dialects import Family, Runtime
from .options import SqlOptions
from .server import ServerRuntime, check_driver, server_connect_args, server_url
from .sqlite import OpenMode, SqliteRuntime, sqlite_path
from .store import SqlCheckpointStore

__all__ = [
    "STORE_CLASSES",
    "MysqlCheckpointStore",
    "PostgresCheckpointStore",
    "SqliteCheckpointStore",
]


def _sqlite_mode(options: SqlOptions) -> OpenMode:
    if options.read_only:
        return "ro"
    return "rwc" if options.create else "rw"


class SqliteCheckpointStore(SqlCheckpointStore):
    """``sqlite:///relative.db`` / ``sqlite:////absolute.db``: the embedded SQL store.

    WAL mode; ``synchronous=FULL`` under ``durability="full"`` (a save survives
    power loss) and ``NORMAL`` under ``"fast"`` (it survives a process crash).
    Writes take the lock up front (``BEGIN IMMEDIATE``) and wait up to
    ``busy_timeout`` for writers in other processes. Safe to share between
    processes on one host, and across ``fork``; not on a network file system.
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
    backend_name: ClassVar[str] = "sqlite"

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        super().__init__(url, **options)
        if self.options.db_schema is not None:
            raise InvalidOptions("the schema option is not available on SQLite; use table_prefix")
        self.path = sqlite_path(self.url)

    def describe(self) -> str:
        where = f"sqlite:///{self.path}"
        if self.table_prefix != "statekeeper_":
            where += f" (tables {self.table_prefix}*)"
        return where

    def _make_runtime(self) -> Runtime:
        return SqliteRuntime(
            self.path,
            compiler=self._compiler,
            synchronous="FULL" if self.options.durability == "full" else "NORMAL",
            busy_timeout=self.options.busy_timeout,
            readers=self.options.pool_size or 2,
            echo=self.options.echo,
            mode=_sqlite_mode(self.options),
        )


class _ServerSqlStore(SqlCheckpointStore):
    """A store on a database server, through a SQLAlchemy async engine."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        persistent=True,
        cross_process=True,
        cross_host=True,
        power_loss_durable=True,
        ttl=True,
        raw_access=True,
        atomic_batches=True,
        metadata_filter=True,
    )

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        super().__init__(url, **options)
        self.driver = check_driver(self.url, self.family)

    def _make_runtime(self) -> Runtime:
        opts = self.options
        return ServerRuntime(
            server_url(self.url, self.family, self.driver),
            self.family,
            pool_size=opts.pool_size or 5,
            echo=opts.echo,
            connect_args=server_connect_args(
                self.family,
                busy_timeout=opts.busy_timeout,
                fast=opts.durability == "fast",
                extra=opts.connect_args,
                read_only=opts.read_only,
            ),
            read_only=opts.read_only,
        )


class PostgresCheckpointStore(_ServerSqlStore):
    """``postgresql://`` (asyncpg): the store to share between hosts.

    ``durability="fast"`` sets ``synchronous_commit=off``. Power-loss durability
    under ``"full"`` is the server's (``fsync=on``, the default).
    """

    backend_name: ClassVar[str] = "postgresql"


class MysqlCheckpointStore(_ServerSqlStore):
    """``mysql://`` / ``mariadb://`` (aiomysql), InnoDB.

    Durability is the server's (``innodb_flush_log_at_trx_commit=1``, the
    default); ``durability="fast"`` changes nothing here, since that setting is
    global.
    """

    backend_name: ClassVar[str] = "mysql"


STORE_CLASSES: dict[Family, type[SqlCheckpointStore]] = {
    "sqlite": SqliteCheckpointStore,
    "postgresql": PostgresCheckpointStore,
    "mysql": MysqlCheckpointStore,
}
