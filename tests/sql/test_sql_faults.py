"""Issue 36: which driver errors are retryable (``Dialect.translate_error`` and
``faults.connection_fault``), without a server: the errors are built as the drivers
raise them, and translated by the dialect whose driver raises them."""

from __future__ import annotations

import asyncpg
import pymysql
import pytest
import sqlalchemy as sa

from statekeeper.backends.sql.faults import connection_fault
from statekeeper.backends.sql.mysql.dialect import MYSQL
from statekeeper.backends.sql.postgres.dialect import POSTGRES
from statekeeper.errors import (
    BackendError,
    ConcurrentModificationError,
    StatekeeperError,
    StoreTimeout,
)


def translate_error(exc: BaseException, where: str, busy: float) -> StatekeeperError | None:
    """``exc`` translated by the dialect whose driver raised it (an OS error: both
    server dialects, which must agree)."""
    if isinstance(exc, sa.exc.DBAPIError):
        return MYSQL.translate_error(exc, where, busy)
    err = POSTGRES.translate_error(exc, where, busy)
    if isinstance(exc, OSError):
        other = MYSQL.translate_error(exc, where, busy)
        assert type(other) is type(err) and str(other) == str(err)
    return err


def wrapped(orig: Exception) -> sa.exc.DBAPIError:
    """``orig`` as SQLAlchemy raises a MySQL driver's error (the store never sees it bare)."""
    return sa.exc.OperationalError("SELECT 1", {}, orig)


REFUSED = [
    ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)"),
    asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
    asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already"),
    wrapped(pymysql.err.OperationalError(2003, "Can't connect to MySQL server")),
]
LOST = [
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.exceptions.CrashShutdownError("terminating connection because of crash"),
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle"),
    asyncpg.exceptions.InterfaceError("connection is closed"),
    asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation (2)"),
    ConnectionResetError(104, "Connection reset by peer"),
    wrapped(pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")),
    wrapped(pymysql.err.OperationalError(1927, "Connection was killed")),
]  # fmt: skip


@pytest.mark.parametrize("exc", REFUSED, ids=lambda e: type(e).__name__ + str(e)[:20])
def test_a_refused_connection_is_retryable_and_says_nothing_was_sent(exc: BaseException) -> None:
    assert connection_fault(exc) == "refused"
    err = translate_error(exc, "saving on db", 5.0)
    assert isinstance(err, BackendError) and err.retryable
    assert "nothing was sent" in str(err) and "retry" in str(err)
    assert err.orig is getattr(exc, "orig", exc)


@pytest.mark.parametrize("exc", LOST, ids=lambda e: type(e).__name__ + str(e)[:20])
def test_a_lost_connection_is_retryable(exc: BaseException) -> None:
    assert connection_fault(exc) == "lost"
    err = translate_error(exc, "loading on db", 5.0)
    assert isinstance(err, BackendError) and err.retryable
    assert "lost its connection" in str(err)


def test_conflicts_and_timeouts_stay_what_they_were() -> None:
    serialization = asyncpg.exceptions.SerializationError("could not serialize access")
    deadlock = asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
    lock = asyncpg.exceptions.LockNotAvailableError("canceling statement due to lock timeout")
    for exc in (serialization, deadlock):
        err = translate_error(exc, "saving", 5.0)
        assert isinstance(err, ConcurrentModificationError) and err.retryable
    err = translate_error(lock, "saving", 5.0)
    assert isinstance(err, StoreTimeout) and err.retryable


def test_other_errors_are_not_retryable() -> None:
    for exc in (
        asyncpg.exceptions.UndefinedTableError('relation "x" does not exist'),
        wrapped(pymysql.err.ProgrammingError(1146, "Table 'x' doesn't exist")),
        asyncpg.exceptions.InterfaceError("cannot perform operation: another thing"),
    ):
        assert connection_fault(exc) is None
        err = translate_error(exc, "saving", 5.0)
        assert isinstance(err, BackendError) and not err.retryable


def test_a_pooler_refusing_a_session_setting_names_the_option() -> None:
    exc = asyncpg.exceptions.ProtocolViolationError("unsupported startup parameter: lock_timeout")
    err = translate_error(exc, "opening", 5.0)
    assert isinstance(err, BackendError) and "pooler='transaction'" in str(err)
