"""PostgreSQL and MySQL/MariaDB execution: a SQLAlchemy async engine and ``run_sync``.

Each operation is one checkout of a pooled connection and one ``run_sync`` call of
the backend's synchronous operation, so the operation's statements are written
once for every dialect. Writes run in ``engine.begin()`` (one transaction); reads
on PostgreSQL run in autocommit, where every statement is its own snapshot and no
``BEGIN``/``ROLLBACK`` round trips are spent.

Dead connections: a pooled connection whose socket the server closed while it was
idle (a restart, an idle kill) is discarded at checkout, without a round trip
(:func:`_drop_dead`); a read that meets a connection lost otherwise runs once more
on a fresh one (:func:`.faults.retry_read`).

Behind a pooler in transaction mode (PostgreSQL, ``pooler="transaction"``) every
statement runs inside a transaction, so the pooler keeps it on one server
connection: reads are not autocommit, no statement is prepared under a name
(asyncpg's statement caches are off), the session settings (``lock_timeout``,
``synchronous_commit``, read-only) are ``set_config(..., true)`` at the start of
each transaction (:func:`.postgres.dialect.local_settings`), and the migration lock is a
transaction lock (:meth:`.dialects.Dialect.migration_lock`).
"""

from __future__ import annotations

import importlib.util
import os
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy.pool import QueuePool
from sqlalchemy.sql import Executable

from ..._url import StoreURL
from ...errors import BackendNotFound
from ...telemetry._pools import PoolUsage
from .dialects import Dialect
from .faults import connection_fault, retry_read

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .options import SqlOptions

__all__ = [
    "SaSession",
    "ServerDialect",
    "ServerRuntime",
    "check_driver",
    "server_url",
]

T = TypeVar("T")


class ServerDialect(Dialect):
    """A :class:`~.dialects.Dialect` reached through a SQLAlchemy async engine, with
    what its connections differ in."""

    #: The driver a URL without one gets, and the extra that installs it.
    default_driver: ClassVar[str]
    extra: ClassVar[str]
    #: Query parameters of the SQLAlchemy URL.
    url_query: ClassVar[Mapping[str, str]] = {}
    #: Reads run in autocommit, each statement its own snapshot (no ``BEGIN``).
    autocommit_reads: ClassVar[bool] = False

    @abstractmethod
    def connect_args(self, options: SqlOptions, *, pooled: bool = False) -> dict[str, Any]:
        """Driver ``connect()`` arguments for ``options``: the lock timeout
        (``busy_timeout``) and commit durability, plus ``connect_args``; under
        ``read_only`` every transaction read-only from the start where the driver
        can say so; ``pooled``: behind a pooler in transaction mode (PostgreSQL),
        where session settings do not stay."""

    def snapshot_options(self) -> dict[str, Any]:
        """Execution options of a read-only snapshot transaction, beyond its isolation."""
        return {}

    def watch_engine(self, engine: sa.Engine, *, read_only: bool) -> None:
        """Add this dialect's listeners to a new engine (e.g. a read-only session)."""
        return None

    def on_connection(self, conn: sa.Connection) -> Dialect:
        """The dialect of the server ``conn`` reached (a variant: MariaDB's)."""
        return self


class SaSession:
    """:class:`~.dialects.Session` over a SQLAlchemy (sync-facing) connection."""

    def __init__(
        self, conn: sa.Connection, dialect: ServerDialect, *, xact_locks: bool = False
    ) -> None:
        self.conn = conn
        self.dialect = dialect.on_connection(conn)
        #: take the migration lock for the transaction, not the session (a pooler)
        self.xact_locks = xact_locks

    def rows(
        self, stmt: Executable, params: Mapping[str, Any] | None = None
    ) -> Sequence[Sequence[Any]]:
        return self.conn.execute(stmt, dict(params or {})).all()

    def first(
        self, stmt: Executable, params: Mapping[str, Any] | None = None
    ) -> Sequence[Any] | None:
        return self.conn.execute(stmt, dict(params or {})).first()

    def run(self, stmt: Executable, params: Mapping[str, Any] | None = None) -> int:
        return int(self.conn.execute(stmt, dict(params or {})).rowcount)

    def run_many(self, stmt: Executable, params: Sequence[Mapping[str, Any]]) -> None:
        self.conn.execute(stmt, [dict(p) for p in params])

    def lastrowid(self, stmt: Executable, params: Mapping[str, Any] | None = None) -> int:
        return int(self.conn.execute(stmt, dict(params or {})).lastrowid or 0)

    def ddl(self, element: Any) -> None:
        self.conn.execute(element)


def check_driver(url: StoreURL, dialect: ServerDialect) -> str:
    """The driver module for ``url``; :class:`BackendNotFound` if it is not installed."""
    driver = url.driver or dialect.default_driver
    if importlib.util.find_spec(driver) is None:
        raise BackendNotFound(
            f"the {driver} driver for {url.scheme}:// is not installed; "
            f"pip install 'statekeeper[{dialect.extra}]'"
        )
    return driver


def server_url(url: StoreURL, dialect: ServerDialect, driver: str) -> sa.URL:
    """The SQLAlchemy URL (with the password) for a server store URL."""
    return sa.URL.create(
        f"{dialect.name}+{driver}",
        username=url.username,
        password=url.password,
        host=url.host,
        port=url.port,
        database=url.path.lstrip("/") or None,
        query=dict(dialect.url_query),
    )


def _drop_socket(dbapi_conn: Any) -> None:
    """Close an aiomysql connection's socket without the goodbye it would send first
    (on a connection the server ended that fails, and leaves the socket open)."""
    raw = getattr(dbapi_conn, "_connection", None)
    if raw is not None and getattr(raw, "_writer", None) is not None:
        raw.close()


def _drop_dead(dbapi_conn: Any, record: Any, proxy: Any) -> None:
    """At checkout: refuse a connection whose socket the server has closed (a restart
    or an idle kill seen by the event loop), so the pool connects anew, where a
    ping would cost a round trip on every checkout."""
    raw = getattr(dbapi_conn, "_connection", None)
    if raw is None:
        return
    is_closed = getattr(raw, "is_closed", None)  # asyncpg
    if callable(is_closed) and is_closed():
        raise sa.exc.DisconnectionError("the server closed this pooled connection")
    reader = getattr(raw, "_reader", None)  # aiomysql: the server's EOF was read
    if reader is not None and getattr(reader, "_eof", False):
        _drop_socket(dbapi_conn)
        raise sa.exc.DisconnectionError("the server closed this pooled connection")


def _lost(ctx: Any) -> None:
    """On a driver error that means the connection is gone (:mod:`.faults`): have
    SQLAlchemy invalidate it (and the pool's older connections) at once, whatever
    the driver's own disconnect codes say, and close its socket."""
    if connection_fault(ctx.original_exception) != "lost":
        return
    ctx.is_disconnect = True
    try:
        fairy = ctx.connection.connection if ctx.connection is not None else None
    except sa.exc.SQLAlchemyError:
        return
    _drop_socket(getattr(fairy, "dbapi_connection", None))


class ServerRuntime:
    """The async engine of one PostgreSQL or MySQL store, recreated after ``fork``.

    With ``read_only`` every connection's transactions are read-only on the server
    (PostgreSQL ``default_transaction_read_only``, MySQL ``SET SESSION TRANSACTION
    READ ONLY``), so a write that slipped past the store would fail, not land.
    """

    def __init__(
        self,
        url: sa.URL,
        dialect: ServerDialect,
        *,
        pool_size: int,
        echo: bool,
        connect_args: dict[str, Any],
        read_only: bool = False,
        local: str | None = None,
    ) -> None:
        self.dialect = dialect
        self.read_only = read_only
        #: behind a pooler in transaction mode: each transaction's settings statement
        #: (:func:`.postgres.dialect.local_settings`), and every statement in a transaction
        self.local = local
        self._url = url
        if local is not None:
            # SQLAlchemy's own statement cache prepares under names: none through a pooler
            connect_args = {**connect_args, "prepared_statement_cache_size": 0}
        self._kwargs: dict[str, Any] = {
            "pool_size": pool_size,
            "max_overflow": pool_size,
            "echo": echo,
            "connect_args": connect_args,
            "pool_recycle": 1800,
        }
        self._pid = os.getpid()
        self._engine: AsyncEngine | None = None
        self._reader: AsyncEngine | None = None

    async def _engines(self) -> tuple[AsyncEngine, AsyncEngine]:
        if self._engine is not None and self._pid != os.getpid():
            # Forked: the pooled sockets belong to the parent; drop them unclosed.
            await self._engine.dispose(close=False)
            self._engine = self._reader = None
        if self._engine is None or self._reader is None:
            # Imported here: sqlalchemy.ext.asyncio (and the ORM it pulls in) is a
            # third of an SQLite store's import time, and only servers use it.
            from sqlalchemy.ext.asyncio import create_async_engine

            self._pid = os.getpid()
            self._engine = create_async_engine(self._url, **self._kwargs)
            sync_engine = self._engine.sync_engine
            sa.event.listen(sync_engine, "checkout", _drop_dead)
            sa.event.listen(sync_engine, "handle_error", _lost)
            self.dialect.watch_engine(sync_engine, read_only=self.read_only)
            local = self.local
            if local is not None:
                sa.event.listen(
                    sync_engine, "begin", lambda conn: conn.exec_driver_sql(local).all()
                )
            self._reader = (
                self._engine.execution_options(isolation_level="AUTOCOMMIT")
                if self.dialect.autocommit_reads and local is None
                else self._engine
            )
        return self._engine, self._reader

    async def drop_idle(self) -> None:
        """Discard every pooled connection (after one was found lost: a restart or an
        idle kill ends them all); those checked out are discarded when returned."""
        if self._engine is not None:
            await self._engine.dispose()

    def _session(self, conn: sa.Connection) -> SaSession:
        return SaSession(conn, self.dialect, xact_locks=self.local is not None)

    async def start(self) -> None:
        await self._engines()

    async def prepare(self) -> None:
        """Nothing: a server database needs no per-file settings."""

    async def reclaim(self, full: bool = False) -> int | None:
        """Nothing, and ``None``: PostgreSQL's autovacuum and InnoDB reuse freed
        space themselves (``VACUUM FULL`` and ``OPTIMIZE TABLE``, which lock the
        table while they rewrite it, are for an operator to run)."""
        return None

    async def snapshot(self, fn: Callable[[SaSession], T]) -> T:
        """``fn`` in one read-only REPEATABLE READ transaction (one snapshot), rolled
        back; once more on a fresh connection if the first was lost."""
        return await retry_read(lambda: self._snapshot(fn), self.drop_idle)

    async def _snapshot(self, fn: Callable[[SaSession], T]) -> T:
        engine, _ = await self._engines()
        options: dict[str, Any] = {
            "isolation_level": "REPEATABLE READ",
            **self.dialect.snapshot_options(),
        }
        async with engine.connect() as conn:
            await conn.execution_options(**options)
            try:
                return await conn.run_sync(lambda c: fn(self._session(c)))
            finally:
                await conn.rollback()

    async def read(self, fn: Callable[[SaSession], T]) -> T:
        """``fn`` on one connection, outside a transaction (behind a pooler: in one);
        once more on a fresh connection if the first was lost."""
        return await retry_read(lambda: self._read(fn), self.drop_idle)

    async def _read(self, fn: Callable[[SaSession], T]) -> T:
        _, reader = await self._engines()
        async with reader.connect() as conn:
            try:
                return await conn.run_sync(lambda c: fn(self._session(c)))
            finally:
                if self.local is not None:
                    await conn.rollback()

    async def point_read(self, fn: Callable[[SaSession], T]) -> T:
        """As :meth:`read`: a server's read is a network round trip however small."""
        return await self.read(fn)

    async def write(self, fn: Callable[[SaSession], T]) -> T:
        engine, _ = await self._engines()
        async with engine.begin() as conn:
            return await conn.run_sync(lambda c: fn(self._session(c)))

    async def point_write(self, fn: Callable[[SaSession], T]) -> T:
        """As :meth:`write`: a server's write is a network round trip however small."""
        return await self.write(fn)

    async def locked_write(
        self,
        lock: Callable[[SaSession], None],
        fn: Callable[[SaSession], T],
        unlock: Callable[[SaSession], None],
    ) -> T:
        engine, _ = await self._engines()
        if self.local is not None:
            # Behind a pooler the lock is the transaction's (pg_advisory_xact_lock),
            # and fn runs in that transaction; the lock ends with it.
            async with engine.begin() as conn:

                def locked(c: sa.Connection) -> T:
                    s = self._session(c)
                    lock(s)
                    return fn(s)

                return await conn.run_sync(locked)

        def body(conn: sa.Connection) -> T:
            s = self._session(conn)
            lock(s)
            conn.commit()  # the lock is the session's; fn's transaction starts after it
            try:
                result = fn(s)
                conn.commit()
                return result
            except BaseException:
                conn.rollback()
                raise
            finally:
                unlock(s)
                conn.commit()

        async with engine.connect() as conn:
            return await conn.run_sync(body)

    def pool_usage(self) -> list[PoolUsage]:
        """SQLAlchemy's pool (telemetry, S18): connections checked out and in, by its
        public ``QueuePool`` API (which does not count waiters)."""
        engine = self._engine
        pool = None if engine is None else engine.sync_engine.pool
        if not isinstance(pool, QueuePool):
            return []
        return [PoolUsage("sqlalchemy", pool.checkedout(), pool.checkedin())]

    async def close(self) -> None:
        engine, self._engine, self._reader = self._engine, None, None
        if engine is not None:
            await engine.dispose(close=self._pid == os.getpid())
