"""The SQL backend's options and URL schemes: :class:`SqlOptions` and which dialect
family (and driver) a URL names.

:class:`SqlOptions` holds what every SQL dialect takes; each dialect's store has
its own subclass for what only it takes (``SqliteOptions``, ``PostgresOptions``,
``MysqlOptions``, in the dialect packages). An option of another dialect is
refused by the type, naming the dialect that has it (:data:`DIALECT_OPTIONS`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from ..._url import StoreURL
from ...config import StoreOptions
from ...errors import InvalidURL
from .dialects import Family

__all__ = ["DIALECT_OPTIONS", "SqlOptions", "family_of"]

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


#: The options only one dialect declares: ``name -> (the dialect, what the option
#: is for there, why the others have none)``; ``{where}`` is the dialect refusing it.
#: A test holds this table to the dialects' options classes.
DIALECT_OPTIONS: dict[str, tuple[str, str, str]] = {
    "listing_wait": ("PostgreSQL", "its listing horizon", "{where} listings never wait"),
    "pooler": (
        "PostgreSQL",
        "a connection pooler in transaction mode, such as PgBouncer",
        "{where} is never reached through such a pooler",
    ),
    "inline_reads": (
        "SQLite",
        "point reads on the event loop's thread",
        "a server's reads are network round trips",
    ),
    "inline_writes": (
        "SQLite",
        "single-record writes on the event loop's thread under durability='fast'",
        "a server's writes are network round trips",
    ),
}


class SqlOptions(StoreOptions):
    """Options of the SQL backend (plus those every backend takes).

    Given as keywords or URL query parameters, e.g.
    ``sqlite:///state.db?busy_timeout=10&table_prefix=jobs_``. Each dialect's
    store takes a subclass, which adds what only that dialect has.
    """

    #: The dialect whose options these are, as messages name it.
    dialect: ClassVar[str] = "SQL"

    @model_validator(mode="before")
    @classmethod
    def _refuse_other_dialects_options(cls, values: Any) -> Any:
        """An option another dialect declares is refused naming that dialect."""
        if isinstance(values, dict):
            for name in values:
                owner = DIALECT_OPTIONS.get(name)
                if owner is not None and name not in cls.model_fields:
                    dialect, purpose, why = owner
                    raise ValueError(
                        f"the {name} option is {dialect}'s ({purpose}); "
                        f"{why.format(where=cls.dialect)}, so drop it"
                    )
        return values

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
    #: Log every SQL statement (logger ``sqlalchemy.engine`` / ``statekeeper.sql``).
    echo: bool = False
    #: Extra keyword arguments for the driver's ``connect()`` (e.g. ``ssl``);
    #: keywords only, never from the URL.
    connect_args: dict[str, Any] = Field(default_factory=dict)


def family_of(url: StoreURL, store: tuple[str, Family] | None = None) -> Family:
    """The dialect family of an SQL store URL; :class:`InvalidURL` for any other URL,
    an unsupported driver, or (``store``: a store class's name and its family) a URL
    of another family than that store's."""
    family = _FAMILIES.get(url.scheme)
    if family is None:
        raise InvalidURL(f"{url} is not an SQL store URL (sqlite, postgresql or mysql)")
    if store is not None and store[1] != family:
        raise InvalidURL(
            f"{store[0]} opens {store[1]} URLs, not {url.scheme}://; "
            "SqlCheckpointStore.from_url(url) opens any SQL URL"
        )
    if url.driver is not None and url.driver not in _DRIVERS[family]:
        raise InvalidURL(
            f"driver {url.driver!r} is not supported for {url.scheme}; use one of "
            f"{', '.join(_DRIVERS[family])} (or none for the default)"
        )
    return family
