"""Connection faults of the server dialects: what a driver error says about the
connection it came on, and the retry that reads make of it.

:func:`connection_fault` sorts an error (asyncpg's, aiomysql's, SQLAlchemy's or the
OS's) into ``"refused"`` (no connection was made: the server is down, starting up
or full; nothing was sent), ``"lost"`` (a connection broke: the server restarted or
shut down, an administrator or an idle timeout ended it, the network failed; a
statement in flight may or may not have run) or ``None`` (any other error). Both
faults are transient, so :func:`.dialects.translate_error` marks them retryable;
a read meets a lost connection at most once per call (:func:`retry_read`), and a
write whose outcome a lost connection hid is resolved by the store
(:mod:`.outcomes`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

import sqlalchemy as sa

__all__ = ["Fault", "connection_fault", "retry_read"]

T = TypeVar("T")
Fault = Literal["refused", "lost"]

# cannot_connect_now (starting up, shutting down), too_many_connections,
# sqlclient_unable_to_establish_sqlconnection, sqlserver_rejected_establishment
_PG_REFUSED = {"57P03", "53300", "08001", "08004"}
# admin_shutdown (pg_terminate_backend, -m fast), crash_shutdown (-m immediate), and
# class 08 (connection_exception, connection_does_not_exist, connection_failure, ...)
_PG_LOST = {"57P01", "57P02", "08000", "08003", "08006", "08007"}
# can't connect (TCP, socket), too many connections
_MYSQL_REFUSED = {2002, 2003, 1040}
# server shutdown in progress, server has gone away, lost connection during query,
# lost connection (reading), connection killed (MariaDB), disconnected for inactivity
_MYSQL_LOST = {1053, 2006, 2013, 2055, 1927, 4031}
# asyncpg's InterfaceError texts for a connection that is gone or was left mid-call
_LOST_TEXTS = ("connection is closed", "another operation", "connection was closed")


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, the driver error SQLAlchemy wraps, and their causes (at most a few)."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 8:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [getattr(e, "orig", None), e.__cause__, e.__context__]
    return seen


def _fault_of(e: BaseException) -> Fault | None:
    if isinstance(e, ConnectionRefusedError):
        return "refused"
    if isinstance(e, ConnectionError | BrokenPipeError | EOFError):
        return "lost"
    state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
    if isinstance(state, str):
        if state in _PG_REFUSED:
            return "refused"
        if state in _PG_LOST:
            return "lost"
    args = getattr(e, "args", ())
    if type(e).__module__.split(".")[0] in ("pymysql", "aiomysql", "asyncmy") and args:
        if args[0] in _MYSQL_REFUSED:
            return "refused"
        if args[0] in _MYSQL_LOST:
            return "lost"
    name = type(e).__name__
    if name == "ConnectionDoesNotExistError":
        return "lost"
    # InternalClientError: the protocol was left mid-operation by a connection that
    # broke under it (seen during a fast shutdown); the connection is unusable
    if name in ("InterfaceError", "InternalClientError") and any(t in str(e) for t in _LOST_TEXTS):
        return "lost"
    if isinstance(e, sa.exc.DBAPIError) and e.connection_invalidated:
        return "lost"
    if isinstance(e, OSError) and not isinstance(e, TimeoutError):
        return "lost"
    return None


def connection_fault(exc: BaseException) -> Fault | None:
    """``"refused"``, ``"lost"`` or ``None`` for ``exc`` (see the module docstring).

    ``"refused"`` wins over ``"lost"`` when the chain holds both (a reconnect that
    was refused after a connection was lost sent nothing more)."""
    faults = [f for f in map(_fault_of, _causes(exc)) if f is not None]
    if "refused" in faults:
        return "refused"
    return faults[0] if faults else None


async def retry_read(call: Callable[[], Awaitable[T]], drop: Callable[[], Awaitable[None]]) -> T:
    """``call()``, and once more if it met a lost connection: ``drop()`` first
    discards the pooled connections that may have died with it (a restart or an
    idle kill ends them all). A read changes nothing, so running it again is safe;
    a second fault, or a refused connection (the server is not back), is raised."""
    try:
        return await call()
    except Exception as exc:
        if connection_fault(exc) != "lost":
            raise
    await drop()
    return await call()
