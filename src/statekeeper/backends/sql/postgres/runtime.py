"""PostgreSQL's runtime: the SQLAlchemy engine of :mod:`..server` for schema,
migrations, verify and repair, plus raw asyncpg connections for the lean path.

The lean path's statements (:mod:`.statements`) run as prepared statements that
asyncpg caches per connection, on connections of a small pool of the runtime's
own (:class:`Connections`), through asyncpg's public API only.

Behind a pooler in transaction mode (``pooler="transaction"``) asyncpg caches no
statement (a name prepared on one server connection would be another client's on
the next), and every call runs in a transaction that begins with the settings a
direct connection has for its session (:func:`.dialect.local_settings`), so the
pooler keeps the call on one server connection. A read that meets a lost
connection runs once more on a fresh one (:func:`..faults.retry_read`); a write is
never re-sent here (the store resolves its outcome, :mod:`..outcomes`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]

from ....errors import BackendError, StatekeeperError, StoreTimeout
from ....telemetry._pools import PoolUsage
from ..faults import connection_fault, retry_read
from ..server import ServerRuntime
from .statements import PgSql

__all__ = ["ACQUIRE_TIMEOUT", "CANCEL_WAIT", "Connections", "PgRuntime"]

T = TypeVar("T")

#: Seconds to wait for a free pooled connection (SQLAlchemy's default pool_timeout).
ACQUIRE_TIMEOUT = 30.0
#: Seconds to wait for the server to cancel the statement of a cancelled call.
CANCEL_WAIT = 10.0
#: Pools inherited through ``fork`` (see :meth:`PgRuntime.pool`).
_FORKED_POOLS: list[Any] = []


class Connections:
    """A small pool of asyncpg connections, cheaper per checkout than ``asyncpg.Pool``
    (no task, no timeout context per acquire and release: those were a third of the
    client's CPU for one ``get_latest``).

    Up to ``size`` connections, opened on demand, the most recently used first. A
    connection comes back idle unless its user was interrupted (cancelled) or failed
    other than by a database error, or it is still in a transaction; then it is
    closed, never reused in an unknown state.
    """

    def __init__(self, connect_args: Mapping[str, Any], size: int) -> None:
        self._args = dict(connect_args)
        self._size = size
        self._idle: list[asyncpg.Connection] = []
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    def usage(self) -> PoolUsage:
        """Connections in use and idle, and callers waiting (telemetry, S18)."""
        idle = len(self._idle)
        return PoolUsage("asyncpg", self._open - idle, idle, len(self._waiters))

    async def acquire(self, within: float) -> asyncpg.Connection:
        """A connection; :class:`TimeoutError` if none is free ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            if self._closed:
                raise BackendError("the store's connections are closed")
            while self._idle:
                con = self._idle.pop()
                if not con.is_closed():
                    return con
                self._open -= 1
            if self._open < self._size:
                self._open += 1
                try:
                    return await asyncpg.connect(**self._args)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(left):
                    await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the wake-up on to the next waiter
                raise
            finally:
                if not waiter.done():
                    self._waiters.remove(waiter)

    async def release(self, con: asyncpg.Connection, error: BaseException | None) -> None:
        # a server error leaves the connection usable, unless it ended the connection
        # (admin shutdown, crash shutdown): asyncpg may not have seen it close yet
        reusable = error is None or (
            isinstance(error, asyncpg.PostgresError | StatekeeperError)
            and connection_fault(error) is None
        )
        if reusable and not self._closed and not con.is_closed() and not con.is_in_transaction():
            self._idle.append(con)
            self._wake()
            return
        try:
            # Cancelled mid-statement: asyncpg is sending the server a cancel request.
            # A graceful close waits for it (and cancels a statement still running)
            # before it says goodbye, or the statement would run on (a save waiting
            # for its stream's lock would land after all): closing the socket alone
            # does not stop a backend that is not reading it.
            await asyncio.shield(con.close(timeout=CANCEL_WAIT))
        except (Exception, asyncio.CancelledError):
            pass  # the caller raises its own error; the connection goes regardless
        finally:
            self._open -= 1
            con.terminate()
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def drop_idle(self) -> None:
        """Close every idle connection (one was found lost: a restart or an idle kill
        ends them all), so the next calls connect anew."""
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        for con in idle:
            con.terminate()
        self._wake()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        for con in idle:
            try:
                await con.close(timeout=5)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                con.terminate()
        self._wake()


class PgRuntime(ServerRuntime):
    """:class:`ServerRuntime` plus asyncpg connections for the lean path."""

    def __init__(
        self, *args: Any, asyncpg_args: Mapping[str, Any], lock_timeout: str, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        #: the lock_timeout a direct connection asks for (milliseconds): one that the
        #: server does not report back was dropped by a pooler on the way
        self._lock_timeout = lock_timeout
        connect_args = dict(asyncpg_args)
        connect_args.pop("min_size", None)
        self._size = int(connect_args.pop("max_size", 5))
        self._asyncpg_args = connect_args
        self._pool: Connections | None = None
        self._pool_pid = os.getpid()

    async def start(self) -> None:
        await super().start()
        # Connect now, so that a wrong URL fails the open, not the first save.
        async with self.connection() as con:
            version = con.get_server_version()
            if self.local is None:
                got = await con.fetchval(
                    "SELECT setting FROM pg_settings WHERE name = 'lock_timeout'"
                )
            else:
                got = self._lock_timeout
        if version.major < 13:
            raise BackendError(
                f"PostgreSQL {version.major}.{version.minor} is too old: statekeeper needs "
                "PostgreSQL 13 or later (pg_current_xact_id, pg_current_snapshot)"
            )
        if self._lock_timeout.isdigit() and str(got) != self._lock_timeout:
            raise BackendError(
                f"the server reports lock_timeout={got}ms where this store's connections "
                f"asked for {self._lock_timeout}ms: something between them and PostgreSQL "
                "dropped the session settings, as a connection pooler (PgBouncer, "
                "pgcat, RDS Proxy, Supavisor) does, and would also hand this store's "
                "prepared statements and locks to other clients. Open the store with "
                "pooler='transaction' (docs/sql-backend.md, Poolers), or connect to "
                "PostgreSQL directly"
            )

    def pool_usage(self) -> list[PoolUsage]:
        """SQLAlchemy's pool and the lean path's connections (telemetry, S18)."""
        lean = self._pool
        return [*super().pool_usage(), *([] if lean is None else [lean.usage()])]

    def pool(self) -> Connections:
        if self._pool is not None and self._pool_pid != os.getpid():
            # Forked: the sockets are the parent's; forget them unclosed, and keep them
            # from the garbage collector, whose finaliser would abort them noisily.
            _FORKED_POOLS.append(self._pool)
            self._pool = None
        if self._pool is None:
            self._pool_pid = os.getpid()
            self._pool = Connections(self._asyncpg_args, self._size)
        return self._pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; :class:`StoreTimeout` if none frees up in time (as
        SQLAlchemy's pool does for the other operations)."""
        pool = self.pool()
        try:
            con = await pool.acquire(ACQUIRE_TIMEOUT)
        except TimeoutError as exc:
            raise StoreTimeout(
                f"no database connection became free within {ACQUIRE_TIMEOUT:g}s; raise pool_size",
                orig=exc,
            ) from exc
        try:
            yield con
        except BaseException as exc:
            await pool.release(con, exc)
            raise
        await pool.release(con, None)

    async def drop_idle(self) -> None:
        await super().drop_idle()
        if self._pool is not None:
            await self._pool.drop_idle()

    async def _run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``fn`` on a pooled connection; behind a pooler, in a transaction that
        starts with the session's settings."""
        async with self.connection() as con:
            if self.local is None:
                return await fn(con)
            async with con.transaction():
                await con.execute(self.local)
                return await fn(con)

    async def _pg_read(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        return await retry_read(lambda: self._run(fn), self.drop_idle)

    async def fetch(
        self, stmt: PgSql, values: Mapping[str, Any], *, write: bool = False
    ) -> list[asyncpg.Record]:
        """The rows of ``stmt``; a read runs once more if its connection was lost,
        a ``write`` never (its outcome is the caller's to find out)."""
        args = stmt.args(values)

        async def go(con: asyncpg.Connection) -> list[asyncpg.Record]:
            return list(await con.fetch(stmt.sql, *args))

        return await (self._run(go) if write else self._pg_read(go))

    async def fetchrow(self, stmt: PgSql, values: Mapping[str, Any]) -> asyncpg.Record | None:
        args = stmt.args(values)
        return await self._pg_read(lambda con: con.fetchrow(stmt.sql, *args))

    async def fetchrow_in_order(self, stmt: PgSql, *args: Any) -> asyncpg.Record | None:
        """``stmt`` with ``args`` in its parameters' order (a hot path; see
        :func:`.statements.compile_pg`, ``order``)."""
        return await self._pg_read(lambda con: con.fetchrow(stmt.sql, *args))

    async def in_transaction(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``fn`` in one transaction (a write: never re-sent)."""
        async with self.connection() as con, con.transaction():
            if self.local is not None:
                await con.execute(self.local)
            return await fn(con)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        try:
            if pool is not None and self._pool_pid == os.getpid():
                await pool.close()
        finally:
            await super().close()
