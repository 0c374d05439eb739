"""The SQL backend's options and URL schemes: :class:`SqlOptions` and which dialect
family (and driver) a URL names."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ..._url import StoreURL
from ...config import StoreOptions
from ...errors import InvalidURL
from .dialects import Family

__all__ = ["SqlOptions", "family_of"]

_IDENT = r"^[a-z_][a-z0-9_]{0,39}$"
_FAMILIES: dict[str, Family] = {
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
}
_DRIVERS: dict[Family, tuple[str, ...]] = {
    "sqlite": ("aiosqlite", "pysqlite"),
    "postgresql": ("asyncpg",),
    "mysql": ("aiomysql", "asyncmy"),
}


class SqlOptions(StoreOptions):
    """Options of the SQL backend (plus those every backend takes).

    Given as keywords or URL query parameters, e.g.
    ``sqlite:///state.db?busy_timeout=10&table_prefix=jobs_``.
    """

    #: Prefix of this store's table and index names; two stores with different
    #: prefixes share one database without seeing each other.
    table_prefix: str = Field(default="statekeeper_", pattern=_IDENT)
    #: PostgreSQL schema (created if missing) or MySQL database for the tables;
    #: ``None`` uses the connection's default. Not available on SQLite.
    db_schema: str | None = Field(default=None, alias="schema", pattern=_IDENT)
    #: Seconds to wait for a lock held by another writer (SQLite busy timeout,
    #: PostgreSQL ``lock_timeout``, MySQL ``innodb_lock_wait_timeout``) before
    #: raising :class:`~statekeeper.errors.StoreTimeout`.
    busy_timeout: float = Field(default=5.0, gt=0, le=3600)
    #: Connections: SQLite reader threads (default 2; plus one writer), or the
    #: server connection pool size (default 5, overflow as much again).
    pool_size: int | None = Field(default=None, ge=1, le=64)
    #: PostgreSQL: seconds a listing of every stream (``list(None, ...)``) waits, at
    #: most, for this store's saves still in flight below a committed save it would
    #: show (the listing horizon, ``docs/sql-backend.md``); if they are still in
    #: flight then, it raises :class:`~statekeeper.errors.StoreTimeout` (retryable)
    #: rather than return a page that would look complete without them (``0``:
    #: raise at once). Transactions of other applications never make it wait.
    #: Listings of one stream, ``get_latest`` and ``load`` never wait.
    listing_wait: float = Field(default=0.1, ge=0, le=60)
    #: SQLite: run ``get_latest``, ``load``, ``load_many`` of up to 100 ids and
    #: listed pages of up to 100 items on the event loop's thread, on a connection
    #: of their own that never waits for a lock (a read that would wait goes to a
    #: reader thread instead); ``False`` runs them on the reader threads. Saves,
    #: larger pages and batches, and every other call always run on the store's
    #: threads.
    inline_reads: bool = True
    #: Log every SQL statement (logger ``sqlalchemy.engine`` / ``statekeeper.sql``).
    echo: bool = False
    #: Extra keyword arguments for the driver's ``connect()`` (e.g. ``ssl``);
    #: keywords only, never from the URL.
    connect_args: dict[str, Any] = Field(default_factory=dict)


def family_of(url: StoreURL) -> Family:
    """The dialect family of an SQL store URL; :class:`InvalidURL` for any other URL
    or an unsupported driver."""
    family = _FAMILIES.get(url.scheme)
    if family is None:
        raise InvalidURL(f"{url} is not an SQL store URL (sqlite, postgresql or mysql)")
    if url.driver is not None and url.driver not in _DRIVERS[family]:
        raise InvalidURL(
            f"driver {url.driver!r} is not supported for {url.scheme}; use one of "
            f"{', '.join(_DRIVERS[family])} (or none for the default)"
        )
    return family
