"""The few things the SQL backend does differently per dialect.

Everything else is dialect-neutral SQLAlchemy Core in :mod:`.schema`. What
differs:

- taking the next sequence from the counter row (``UPDATE ... RETURNING``,
  ``LAST_INSERT_ID(expr)`` on MySQL/MariaDB; SQLite writes no counter per save,
  :mod:`.sqlite.sequence`, and PostgreSQL takes transaction ids, :mod:`.postgres`);
- inserting a checkpoint whose id may be taken, without aborting the transaction
  (``ON CONFLICT (id) DO NOTHING`` on PostgreSQL and SQLite; MySQL keeps the
  transaction alive after a duplicate-key error);
- the migration lock (SQLite's write lock, a PostgreSQL transaction-level advisory
  lock, a MySQL ``GET_LOCK``) and "does this table exist";
- connection settings (lock timeouts, synchronous commit) and error codes.
"""

from __future__ import annotations

import hashlib
import math
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.sql import Executable

from ...errors import (
    BackendError,
    ConcurrentModificationError,
    StatekeeperError,
    StoreFormatError,
    StoreTimeout,
)
from .faults import connection_fault
from .schema import Statements, Tables

__all__ = [
    "Family",
    "Runtime",
    "Session",
    "insert_checkpoint",
    "migration_lock",
    "migration_unlock",
    "next_sequence",
    "table_exists",
    "translate_error",
]

Family = Literal["sqlite", "postgresql", "mysql"]


class Session(Protocol):
    """One connection inside one transaction (or one autocommit read), synchronously.

    The backend's operations are written once against this: on SQLite they run in
    the connection's worker thread, on PostgreSQL and MySQL inside SQLAlchemy's
    ``AsyncConnection.run_sync``.
    """

    family: Family
    mariadb: bool

    def rows(
        self, stmt: Executable, params: Mapping[str, Any] | None = None
    ) -> Sequence[Sequence[Any]]: ...
    def first(
        self, stmt: Executable, params: Mapping[str, Any] | None = None
    ) -> Sequence[Any] | None: ...
    def run(self, stmt: Executable, params: Mapping[str, Any] | None = None) -> int: ...
    def run_many(self, stmt: Executable, params: Sequence[Mapping[str, Any]]) -> None: ...
    def lastrowid(self, stmt: Executable, params: Mapping[str, Any] | None = None) -> int: ...
    def ddl(self, element: Any) -> None: ...


T = TypeVar("T")

#: The largest state a single-record write hands to :meth:`Runtime.point_write`.
INLINE_WRITE_BYTES = 64 * 1024


class Runtime(Protocol):
    """Where a store's operations run: connections, threads or an async engine."""

    async def start(self) -> None:
        """Connect (raises if the database cannot be reached); create nothing."""

    async def prepare(self) -> None:
        """Make a writable store ready for writes (SQLite: WAL mode); never on read-only."""

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` outside a transaction: each statement is its own snapshot."""

    async def point_read(self, fn: Callable[[Session], T]) -> T:
        """As :meth:`read`, for ``fn`` that reads a bounded index range: one row by an
        index, up to ``INLINE_PAGE_ROWS`` ids, or a page of at most
        ``INLINE_PAGE_ROWS`` rows and its probe (where the runtime may run it without
        a thread hop: SQLite)."""

    async def snapshot(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one read-only transaction: every statement sees one snapshot."""

    async def write(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one write transaction, committed if ``fn`` returns."""

    async def point_write(self, fn: Callable[[Session], T]) -> T:
        """As :meth:`write`, for ``fn`` that writes one record (where the runtime may
        run it without a thread hop: SQLite under ``durability="fast"``)."""

    async def locked_write(
        self,
        lock: Callable[[Session], None],
        fn: Callable[[Session], T],
        unlock: Callable[[Session], None],
    ) -> T:
        """``lock``, then ``fn`` in a transaction that starts after it, then ``unlock``."""

    async def reclaim(self, full: bool = False) -> int | None:
        """Return space freed by deletions to the OS where the dialect needs asking
        (``full``: as thoroughly as it can, e.g. SQLite's ``VACUUM``); the bytes
        given back, or ``None`` where the dialect cannot tell."""

    async def close(self) -> None:
        """Release every connection (and thread)."""


# -- sequences and inserts ----------------------------------------------------------


def next_sequence(s: Session, st: Statements, count: int = 1) -> int:
    """Bump the counter row by ``count`` and return the new high-water mark (so the
    transaction owns the ``count`` sequences up to and including it).

    The row lock taken here is held until the transaction ends, so a second writer
    waits for the first to commit before it gets the next sequence: sequence order
    is commit order, and a reader that sees sequence n sees every committed n' < n.

    A missing counter row, or one that is not above every stored sequence, raises
    :class:`BackendError` saying how to repair (and the transaction rolls back):
    restarting at 1, or below an existing sequence, would reuse sequences and put
    the new checkpoint behind older ones.
    """
    if s.family == "mysql":
        # LAST_INSERT_ID(expr) makes the server report expr as the statement's
        # insert id, so the new value comes back in the same round trip.
        value = s.lastrowid(st.bump_mysql, {"step": count})
        # A separate check here: a subquery inside the UPDATE would take InnoDB
        # next-key locks on the checkpoints table and deadlock concurrent savers.
        # This plain read runs after the counter lock is ours, so it sees every
        # committed save.
        top = s.first(st.max_seq)
        if not value or (top is not None and int(value) <= int(top[0])):
            raise BackendError(counter_damage(s, st))
        return int(value)
    row = s.first(st.bump, {"step": count})
    if row is None:
        raise BackendError(counter_damage(s, st))
    return int(row[0])


def counter_damage(s: Session, st: Statements) -> str:
    """Why the counter row cannot give the next sequence, and how to repair it."""
    row = s.first(st.read_hwm)
    top = s.first(st.max_seq)
    highest = int(top[0]) if top is not None else 0
    table = st.t.counter.name
    if row is None:
        what = f"the sequence counter row of {table} is missing"
    elif not isinstance(row[0], int) or isinstance(row[0], bool):
        what = f"the sequence counter of {table} holds {row[0]!r}, not an integer"
    else:
        what = (
            f"the sequence counter of {table} is {row[0]}, not above sequence {highest}, "
            "which exists"
        )
    return (
        f"{what}, so the next sequence cannot be known and nothing was saved; run "
        "store.repair() (or 'statekeeper repair URL'), which rebuilds it from the "
        f"highest sequence stored ({highest}) without ever lowering it"
    )


def _insert_or_skip(st: Statements, family: Family) -> Executable:
    # Keyed by family as well: a PostgreSQL compiler handed SQLite's ON CONFLICT
    # clause fails with an AttributeError (issue 11), so a Statements built for
    # one dialect must never answer for another, even if shared by mistake.
    key = f"insert_or_skip:{family}"
    stmt = st.dialect_cache.get(key)
    if stmt is None:
        cp = st.t.checkpoints
        if family == "postgresql":
            # here, not at the top: a SQLite store imports no PostgreSQL code
            from sqlalchemy.dialects import postgresql

            stmt = postgresql.insert(cp).on_conflict_do_nothing(index_elements=[cp.c.id])
        else:
            stmt = sqlite_dialect.insert(cp).on_conflict_do_nothing(index_elements=[cp.c.id])
        st.dialect_cache[key] = stmt
    return stmt


def insert_checkpoint(s: Session, st: Statements, row: Mapping[str, Any]) -> bool:
    """Insert a checkpoint row; ``False`` (transaction intact) if its id is taken."""
    if s.family == "mysql":
        try:
            s.run(st.insert_cp, row)
        except sa.exc.IntegrityError as exc:
            # 1062: duplicate entry. InnoDB rolls back the statement only.
            if _mysql_errno(exc.orig) == 1062 and s.first(st.raw_read, {"id": row["id"]}):
                return False
            raise
        return True
    return s.run(_insert_or_skip(st, s.family), row) == 1


# -- migrations ----------------------------------------------------------------------


def lock_key(tables: Tables) -> tuple[int, str]:
    """A PostgreSQL advisory lock key and a MySQL lock name for one store."""
    ident = f"statekeeper:{tables.metadata.schema or ''}:{tables.meta.name}"
    digest = hashlib.blake2b(ident.encode("utf-8"), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True), "statekeeper:" + digest.hexdigest()


def migration_lock(s: Session, tables: Tables, timeout: float) -> None:
    """Serialise migrations of one store across processes and hosts (session lock).

    Run before the migration's own transaction, which must start after the lock is
    held: on PostgreSQL only a new transaction is sure to see catalog changes that
    another process committed while this one waited. SQLite needs nothing here,
    since its migration transaction starts with ``BEGIN IMMEDIATE``. Release with
    :func:`migration_unlock`; a dropped connection releases it too.
    """
    key, name = lock_key(tables)
    if s.family == "postgresql":
        # Waits at most lock_timeout (busy_timeout), then raises 55P03: StoreTimeout.
        # Behind a pooler in transaction mode a session lock would stay on a server
        # connection other clients get: there the lock is the transaction's, and the
        # migration runs in that transaction (ServerRuntime.locked_write).
        fn = "pg_advisory_xact_lock" if getattr(s, "xact_locks", False) else "pg_advisory_lock"
        s.rows(sa.text(f"SELECT {fn}(:key)"), {"key": key})
    elif s.family == "mysql":
        row = s.first(
            sa.text("SELECT GET_LOCK(:name, :timeout)"),
            {"name": name, "timeout": max(1, math.ceil(timeout))},
        )
        if row is None or row[0] != 1:
            raise StoreTimeout(
                f"another process held the migration lock {name!r} for more than "
                f"{timeout:g}s; retry, or raise busy_timeout"
            )


def migration_unlock(s: Session, tables: Tables) -> None:
    key, name = lock_key(tables)
    if s.family == "postgresql" and not getattr(s, "xact_locks", False):
        s.rows(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
    elif s.family == "mysql":
        s.rows(sa.text("SELECT RELEASE_LOCK(:name)"), {"name": name})


def create_schema(s: Session, tables: Tables) -> None:
    """Create the store's PostgreSQL schema if it is missing (under the migration lock)."""
    schema = tables.metadata.schema
    if s.family == "postgresql" and schema is not None:
        s.ddl(sa.schema.CreateSchema(schema, if_not_exists=True))


_SQLITE_HAS_TABLE = sa.text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :name")
# A catalog scan, not to_regclass(): a by-name lookup can leave this backend a
# cached "no such table" that outlives the transaction that learned it.
_PG_HAS_TABLE = sa.text(
    "SELECT 1 FROM pg_catalog.pg_tables "
    "WHERE schemaname = COALESCE(:schema, current_schema()) AND tablename = :name"
)
_MYSQL_HAS_TABLE = sa.text(
    "SELECT 1 FROM information_schema.tables "
    "WHERE table_schema = COALESCE(:schema, DATABASE()) AND table_name = :name"
)
_MYSQL_HAS_INDEX = sa.text(
    "SELECT 1 FROM information_schema.statistics WHERE table_schema = "
    "COALESCE(:schema, DATABASE()) AND table_name = :table AND index_name = :name LIMIT 1"
)


def table_exists(s: Session, table: sa.Table) -> bool:
    if s.family == "sqlite":
        return bool(s.rows(_SQLITE_HAS_TABLE, {"name": table.name}))
    query = _PG_HAS_TABLE if s.family == "postgresql" else _MYSQL_HAS_TABLE
    return bool(s.rows(query, {"schema": table.schema, "name": table.name}))


def run_ddl(s: Session, element: Any) -> None:
    """Run one DDL element; idempotent (``IF NOT EXISTS``) on every dialect. An index
    marked ``info={"postgresql_only": True}`` is skipped on the other dialects."""
    if (
        isinstance(element, sa.schema.CreateIndex)
        and s.family != "postgresql"
        and element.element.info.get("postgresql_only")
    ):
        return
    if s.family == "mysql" and not s.mariadb and isinstance(element, sa.schema.CreateIndex):
        # MySQL (unlike MariaDB) has no CREATE INDEX IF NOT EXISTS.
        index = element.element
        table = index.table
        assert table is not None
        params = {"schema": table.schema, "table": table.name, "name": index.name}
        if s.rows(_MYSQL_HAS_INDEX, params):
            return
        element = sa.schema.CreateIndex(index)
    s.ddl(element)


# -- errors ----------------------------------------------------------------------------

_PG_TIMEOUT = {"55P03", "57014"}  # lock_not_available, query_canceled (statement_timeout)
_PG_CONFLICT = {"40P01", "40001"}  # deadlock_detected, serialization_failure
_MYSQL_TIMEOUT = {1205, 3024}  # lock wait timeout, max_execution_time exceeded
# deadlock; a table created after this transaction's snapshot ("please retry")
_MYSQL_CONFLICT = {1213, 1412}
_SQLITE_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED
_SQLITE_NOTADB = 26


def _mysql_errno(orig: BaseException | None) -> int | None:
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _pg_sqlstate(orig: BaseException | None) -> str | None:
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if state is None and orig is not None:
        state = getattr(orig.__cause__, "sqlstate", None)
    return state if isinstance(state, str) else None


def _from_asyncpg(exc: BaseException) -> bool:
    """An asyncpg error, raised on PostgreSQL's lean path (:mod:`.postgres`) without SQLAlchemy."""
    return type(exc).__module__.split(".")[0] == "asyncpg"


def translate_error(exc: BaseException, where: str, busy_timeout: float) -> StatekeeperError | None:
    """The statekeeper error for a driver/SQLAlchemy/OS error, or ``None`` to re-raise.

    Lock and busy timeouts become :class:`StoreTimeout`, deadlocks and serialization
    failures :class:`ConcurrentModificationError`, a file that is not a database
    :class:`StoreFormatError`, a refused or lost connection a retryable
    :class:`BackendError` (:func:`.faults.connection_fault`), everything else a
    :class:`BackendError` that is not retryable; each keeps the driver's exception
    in ``.orig``.
    """
    if isinstance(exc, StatekeeperError):
        return None
    if isinstance(exc, sa.exc.TimeoutError):
        return StoreTimeout(
            f"no database connection became free in time for {where}; raise pool_size",
            orig=exc,
        )
    orig: BaseException = exc
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        orig = exc.orig
    elif not isinstance(
        exc, sa.exc.SQLAlchemyError | sqlite3.Error | OSError | ConnectionError
    ) and not _from_asyncpg(exc):
        return None
    detail = str(orig).strip() or type(orig).__name__
    if isinstance(orig, sqlite3.Error):
        code = (getattr(orig, "sqlite_errorcode", 0) or 0) & 0xFF
        if code in _SQLITE_BUSY:
            return StoreTimeout(
                f"{where} waited {busy_timeout:g}s (busy_timeout) for another writer to "
                f"release the database lock ({detail}); retry, or raise busy_timeout",
                orig=orig,
            )
        if code == _SQLITE_NOTADB:
            return StoreFormatError(f"{where}: the file is not an SQLite database ({detail})")
    state = _pg_sqlstate(orig)
    errno = _mysql_errno(orig)
    if state in _PG_TIMEOUT or errno in _MYSQL_TIMEOUT:
        return StoreTimeout(
            f"{where} waited longer than busy_timeout={busy_timeout:g}s for a lock held by "
            f"another transaction ({detail}); retry, or raise busy_timeout",
            orig=orig,
        )
    if state in _PG_CONFLICT or errno in _MYSQL_CONFLICT:
        return ConcurrentModificationError(
            f"{where} collided with a concurrent transaction ({detail}); retry the call"
        )
    if "unsupported startup parameter" in detail:
        return BackendError(
            f"{where} failed: a connection pooler refused a session setting ({detail}); "
            "behind PgBouncer or another pooler, open the store with pooler='transaction' "
            "(docs/sql-backend.md, Poolers)",
            orig=orig,
        )
    fault = connection_fault(exc)
    if fault == "refused":
        return BackendError(
            f"{where} could not connect ({type(orig).__name__}: {detail}): the server is "
            "down, starting up, shutting down or full, and nothing was sent; retry once "
            "it accepts connections",
            orig=orig,
            retryable=True,
        )
    if fault == "lost":
        return BackendError(
            f"{where} lost its connection to the server ({type(orig).__name__}: {detail}); "
            "retry once the server is back",
            orig=orig,
            retryable=True,
        )
    return BackendError(f"{where} failed: {type(orig).__name__}: {detail}", orig=orig)
