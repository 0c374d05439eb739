"""SQLite's part of schema version 3: the high-water trigger (:mod:`.high_water`),
and the tags table rebuilt ``WITHOUT ROWID``, so that a tag row is one b-tree entry
(its primary key ``(seq, key)`` is the table) instead of a rowid row plus a
primary-key index entry: one b-tree fewer written per save that has tags, as the
fields table already was."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect

from ..dialects import Session
from ..schema import Statements, Tables
from .high_water import create_trigger

__all__ = ["migrate", "tags_have_rowid"]

_TABLE_SQL = sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name")


def tags_have_rowid(s: Session, tables: Tables) -> bool:
    """Whether the tags table is a rowid table (as schema versions 1 and 2 made it)."""
    row = s.first(_TABLE_SQL, {"name": tables.tags.name})
    return row is not None and "WITHOUT ROWID" not in str(row[0]).upper()


def migrate(s: Session, st: Statements, meta: dict[str, str]) -> None:
    """Schema version 3 (a migration's backfill, run in its transaction under the
    migration lock): on SQLite create the trigger, and rebuild a rowid tags table
    ``WITHOUT ROWID`` with the same rows; on other dialects nothing."""
    if s.dialect.name != "sqlite":
        return
    create_trigger(s, st, meta)
    tables = st.t
    if not tags_have_rowid(s, tables):
        return  # created at version 1 by this code: already without rowid
    q = sqlite_dialect.dialect().identifier_preparer
    tags = tables.tags
    old = f"{tags.name}_v2"
    for index in tags.indexes:  # index names are the file's: free them first
        s.ddl(sa.text(f"DROP INDEX IF EXISTS {q.quote(str(index.name))}"))
    s.ddl(sa.text(f"ALTER TABLE {q.format_table(tags)} RENAME TO {q.quote(old)}"))
    s.ddl(sa.schema.CreateTable(tags))
    columns = ", ".join(q.quote(c.name) for c in tags.columns)
    s.run(
        sa.text(
            f"INSERT INTO {q.format_table(tags)} ({columns}) SELECT {columns} FROM {q.quote(old)}"
        )
    )
    s.ddl(sa.text(f"DROP TABLE {q.quote(old)}"))
    for index in sorted(tags.indexes, key=lambda ix: str(ix.name)):
        s.ddl(sa.schema.CreateIndex(index))
