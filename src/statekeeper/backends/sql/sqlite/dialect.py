"""SQLite's :class:`~..dialects.Dialect`: :data:`SQLITE`."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.sql import Executable

from ....errors import StatekeeperError, StoreFormatError, StoreTimeout
from ..dialects import Dialect, Family, Session
from . import sequence

if TYPE_CHECKING:
    from ..schema import Statements

__all__ = ["SQLITE", "SqliteDialect"]

_HAS_TABLE = sa.text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :name")
_INDEXES = sa.text('SELECT name, "unique" FROM pragma_index_list(:table)')
_PK = sa.text("SELECT name FROM pragma_table_info(:table) WHERE pk > 0")
_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED
_NOTADB = 26


class SqliteDialect(Dialect):
    """SQLite: the database's write lock serialises migrations, ``ON CONFLICT`` skips
    a taken id, and the checkpoints table is clustered on its rowid."""

    name: ClassVar[Family] = "sqlite"

    def key(self) -> sa.types.TypeEngine[int]:
        # SQLite makes "INTEGER PRIMARY KEY" (exactly that spelling) the rowid, so the
        # checkpoints table is clustered on the sequence there, as InnoDB is on MySQL.
        return sa.Integer()

    def keyed_table_options(self) -> dict[str, Any]:
        # the primary key is the table (no rowid b-tree beside it), one b-tree fewer
        # to write per save
        return {"sqlite_with_rowid": False}

    def partial_index(self, where: sa.ColumnElement[bool]) -> dict[str, Any]:
        return {"sqlite_where": where}

    def insert_or_skip(self, st: Statements) -> Executable:
        cp = st.t.checkpoints
        return sqlite_dialect.insert(cp).on_conflict_do_nothing(index_elements=[cp.c.id])

    def next_sequence(self, s: Session, st: Statements, count: int = 1) -> int:
        # No counter write per save: one above the highest stored sequence and the
        # high-water mark of deleted ones (.sequence).
        return sequence.next_sequence(s, st, count)

    def table_exists(self, s: Session, table: sa.Table) -> bool:
        return bool(s.rows(_HAS_TABLE, {"name": table.name}))

    def catalog(self, s: Session, table: sa.Table) -> tuple[dict[str, bool], set[str]]:
        params = {"table": table.name}
        found = {str(name): bool(unique) for name, unique in s.rows(_INDEXES, params)}
        return found, {str(r[0]) for r in s.rows(_PK, params)}

    def is_driver_error(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.Error)

    def own_error(
        self, orig: BaseException, where: str, detail: str, busy_timeout: float
    ) -> StatekeeperError | None:
        if not isinstance(orig, sqlite3.Error):
            return None
        code = (getattr(orig, "sqlite_errorcode", 0) or 0) & 0xFF
        if code in _BUSY:
            return StoreTimeout(
                f"{where} waited {busy_timeout:g}s (busy_timeout) for another writer to "
                f"release the database lock ({detail}); retry, or raise busy_timeout",
                orig=orig,
            )
        if code == _NOTADB:
            return StoreFormatError(f"{where}: the file is not an SQLite database ({detail})")
        return None


#: The one SQLite dialect object.
SQLITE = SqliteDialect()
