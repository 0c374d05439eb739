"""The SQL backend's dialect interface: :class:`Dialect`, what differs per database.

Everything else is dialect-neutral SQLAlchemy Core (:mod:`.schema`), run as
synchronous operations over a :class:`Session` on a :class:`Runtime`. As
SQLAlchemy's own ``Dialect`` does, one object per database carries what
differs, as methods the operations call on ``s.dialect``: column types and table
options, the counter's guard and the stream order of the statements, the next
sequence, insert-or-skip, the migration lock, schema creation, table existence,
idempotent DDL, the catalog of indexes and keys, and the driver's error codes.
The implementations are :mod:`.sqlite.dialect`, :mod:`.postgres.dialect` and
:mod:`.mysql.dialect` (MariaDB a variant there); the server dialects' connection
settings are :class:`.server.ServerDialect`'s.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.sql import Executable

from ...errors import (
    BackendError,
    ConcurrentModificationError,
    StatekeeperError,
    StoreTimeout,
)
from .faults import connection_fault

if TYPE_CHECKING:
    from .schema import Statements, Tables

__all__ = [
    "INLINE_WRITE_BYTES",
    "Dialect",
    "Family",
    "Runtime",
    "Session",
    "collision",
    "counter_damage",
    "lock_key",
    "lock_timeout",
]

Family = Literal["sqlite", "postgresql", "mysql"]


class Session(Protocol):
    """One connection inside one transaction (or one autocommit read), synchronously.

    The backend's operations are written once against this: on SQLite they run in
    the connection's worker thread, on PostgreSQL and MySQL inside SQLAlchemy's
    ``AsyncConnection.run_sync``.
    """

    @property
    def dialect(self) -> Dialect:
        """What differs on this connection's database."""

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


class Dialect(ABC):
    """What one database does differently, as methods over a :class:`Session`.

    One instance per dialect, shared and stateless; a store holds its dialect and
    every session carries the one of its connection (:attr:`Session.dialect`).
    The defaults are what most dialects share; each dialect package overrides
    what it does differently.
    """

    #: The dialect family, as ``info()["dialect"]`` and messages name it.
    name: ClassVar[Family]

    # -- column types and table options (:func:`.schema.build_tables`) ------------------

    def text(self, chars: int) -> sa.types.TypeEngine[str]:
        """A string column of at most ``chars`` characters, compared byte for byte."""
        return sa.String(chars)

    def key(self) -> sa.types.TypeEngine[int]:
        """The type of the ``seq`` columns (the checkpoints table's primary key)."""
        return sa.BigInteger()

    def blob(self) -> sa.types.TypeEngine[bytes]:
        """The type of the ``record`` column."""
        return sa.LargeBinary()

    def table_options(self) -> dict[str, Any]:
        """SQLAlchemy dialect options (``mysql_engine=...``) of every table."""
        return {}

    def keyed_table_options(self) -> dict[str, Any]:
        """Options of a table read only through its primary key (the tags and fields
        tables)."""
        return {}

    def partial_index(self, where: sa.ColumnElement[bool]) -> dict[str, Any]:
        """Options of an index over the rows ``where`` holds (where supported)."""
        return {}

    # -- statements (:class:`.schema.Statements`) ----------------------------------------

    def code_point_order(self, column: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
        """``column`` as it compares in code point order."""
        return column

    def insert_or_skip(self, st: Statements) -> Executable:
        """An insert of a checkpoint row that does nothing where its id is taken."""
        raise NotImplementedError(f"{self.name} inserts checkpoints with insert_checkpoint")

    # -- sequences and inserts -----------------------------------------------------------

    def next_sequence(self, s: Session, st: Statements, count: int = 1) -> int:
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
        row = s.first(st.bump, {"step": count})
        if row is None:
            raise BackendError(counter_damage(s, st))
        return int(row[0])

    def insert_checkpoint(self, s: Session, st: Statements, row: Mapping[str, Any]) -> bool:
        """Insert a checkpoint row; ``False`` (transaction intact) if its id is taken."""
        return s.run(self.statement(st, "insert_or_skip", self.insert_or_skip), row) == 1

    def statement(
        self, st: Statements, name: str, build: Callable[[Statements], Executable]
    ) -> Executable:
        """This dialect's own statement ``name`` over ``st``'s tables, built once.

        Cached in ``st`` under the dialect's name as well: a statement built for one
        dialect must never reach another, even through a shared ``Statements``
        (a PostgreSQL compiler handed SQLite's ``ON CONFLICT`` fails, issue 11)."""
        key = f"{name}:{self.name}"
        stmt = st.dialect_cache.get(key)
        if stmt is None:
            stmt = st.dialect_cache[key] = build(st)
        return stmt

    # -- migrations and the catalog -----------------------------------------------------

    def migration_lock(self, s: Session, tables: Tables, timeout: float) -> None:
        """Serialise migrations of one store across processes and hosts (session lock).

        Run before the migration's own transaction, which must start after the lock
        is held. The default takes none: the migration's transaction takes the
        database's write lock itself (SQLite's ``BEGIN IMMEDIATE``). Released by
        :meth:`migration_unlock`; a dropped connection releases it too.
        """
        return None

    def migration_unlock(self, s: Session, tables: Tables) -> None:
        """Release what :meth:`migration_lock` took."""
        return None

    def create_schema(self, s: Session, tables: Tables) -> None:
        """Create the store's schema (namespace) if it is missing, under the migration
        lock; by default there is none to create."""
        return None

    @abstractmethod
    def table_exists(self, s: Session, table: sa.Table) -> bool:
        """Whether ``table`` exists, as the catalog says now."""

    def run_ddl(self, s: Session, element: Any) -> None:
        """Run one DDL element; idempotent (``IF NOT EXISTS``). An index whose
        ``info["dialect"]`` names another dialect is that dialect's and is skipped."""
        if isinstance(element, sa.schema.CreateIndex):
            only = element.element.info.get("dialect")
            if only is not None and only != self.name:
                return
        s.ddl(element)

    def extra_indexes(self, table: sa.Table, tables: Tables, version: int) -> list[sa.Index]:
        """Indexes of ``table`` at schema ``version`` that only this dialect has (not in
        ``table.indexes``)."""
        return []

    @abstractmethod
    def catalog(self, s: Session, table: sa.Table) -> tuple[dict[str, bool], set[str]]:
        """``{index name: unique}`` of ``table`` (primary key left out) and the
        primary key's columns, as the catalog says."""

    # -- errors --------------------------------------------------------------------------

    def is_driver_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a driver error this dialect's driver raises unwrapped
        (SQLAlchemy's, the OS's and connection errors always are)."""
        return False

    def own_error(
        self, orig: BaseException, where: str, detail: str, busy_timeout: float
    ) -> StatekeeperError | None:
        """The statekeeper error the driver's error ``orig`` (its text ``detail``) is by
        this dialect's codes, or ``None`` to judge it as every dialect does."""
        return None

    def translate_error(
        self, exc: BaseException, where: str, busy_timeout: float
    ) -> StatekeeperError | None:
        """The statekeeper error for a driver/SQLAlchemy/OS error, or ``None`` to re-raise.

        Lock and busy timeouts become :class:`StoreTimeout`, deadlocks and
        serialization failures :class:`ConcurrentModificationError`, a file that is
        not a database :class:`StoreFormatError` (the dialect's codes say which:
        :meth:`own_error`), a refused or lost connection a retryable
        :class:`BackendError` (:func:`.faults.connection_fault`), everything else a
        :class:`BackendError` that is not retryable; each keeps the driver's
        exception in ``.orig``.
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
            exc, sa.exc.SQLAlchemyError | OSError | ConnectionError
        ) and not self.is_driver_error(exc):
            return None
        detail = str(orig).strip() or type(orig).__name__
        own = self.own_error(orig, where, detail, busy_timeout)
        if own is not None:
            return own
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


def lock_timeout(where: str, detail: str, busy_timeout: float, orig: BaseException) -> StoreTimeout:
    """A server's lock timeout: a lock another transaction held past ``busy_timeout``."""
    return StoreTimeout(
        f"{where} waited longer than busy_timeout={busy_timeout:g}s for a lock held by "
        f"another transaction ({detail}); retry, or raise busy_timeout",
        orig=orig,
    )


def collision(where: str, detail: str) -> ConcurrentModificationError:
    """A deadlock or serialization failure: the call may simply be retried."""
    return ConcurrentModificationError(
        f"{where} collided with a concurrent transaction ({detail}); retry the call"
    )


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


def lock_key(tables: Tables) -> tuple[int, str]:
    """A PostgreSQL advisory lock key and a MySQL lock name for one store."""
    ident = f"statekeeper:{tables.metadata.schema or ''}:{tables.meta.name}"
    digest = hashlib.blake2b(ident.encode("utf-8"), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True), "statekeeper:" + digest.hexdigest()
