"""The base of the stores on a database server (PostgreSQL, MySQL/MariaDB): their
capabilities, the driver check and the SQLAlchemy runtime of :mod:`.server`."""

from __future__ import annotations

from typing import Any, ClassVar

from ..._url import StoreURL
from ...config import Capabilities
from ...telemetry._pools import PoolUsage
from .dialects import Runtime
from .server import ServerDialect, ServerRuntime, check_driver, server_url
from .store import SqlCheckpointStore

__all__ = ["ServerSqlStore"]


class ServerSqlStore(SqlCheckpointStore):
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
    dialect: ClassVar[ServerDialect]

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        super().__init__(url, **options)
        self.driver = check_driver(self.url, self.dialect)

    def _connect_args(self, pooled: bool = False) -> dict[str, Any]:
        return self.dialect.connect_args(self.options, pooled=pooled)

    def _pool_usage(self) -> list[PoolUsage]:
        """How the store's connection pools stand, for telemetry (S18)."""
        runtime = self._runtime
        return runtime.pool_usage() if isinstance(runtime, ServerRuntime) else []

    def _make_runtime(self) -> Runtime:
        opts = self.options
        return ServerRuntime(
            server_url(self.url, self.dialect, self.driver),
            self.dialect,
            pool_size=opts.pool_size or 5,
            echo=opts.echo,
            connect_args=self._connect_args(),
            read_only=opts.read_only,
        )
