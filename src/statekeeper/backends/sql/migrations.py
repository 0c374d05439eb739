"""Versioned schema migrations of the SQL backend, applied when a store opens.

``MIGRATIONS`` lists every step; the last one's version is the schema version
this code writes (:data:`.schema.SCHEMA_VERSION`). Opening a store:

1. reads the meta table without any lock (the common case: already current);
2. for each missing version, takes the store's migration lock (see
   :meth:`.dialects.Dialect.migration_lock`), re-reads the version in a new
   transaction, and applies the step and records its version in that same
   transaction, unless another process got there first;
3. refuses a store whose version is newer than ``MIGRATIONS`` knows
   (:class:`~statekeeper.errors.StoreFormatError`).

PostgreSQL and SQLite run DDL inside the transaction, so a step is all or
nothing. MySQL commits around each DDL statement; there a step is written to be
re-run safely (``IF NOT EXISTS``), and an interrupted creation (tables but an
empty meta table) is completed by the next open.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from ...errors import CheckpointDecodeError, StoreFormatError
from ...record import StoredRecord
from .dialects import Session
from .schema import SCHEMA_VERSION, Statements, Tables
from .writes import index_rows

__all__ = [
    "MIGRATIONS",
    "Migration",
    "apply_migration",
    "parse_version",
    "read_meta",
    "tables_version",
]


@dataclass(frozen=True)
class Migration:
    """One schema step: ``apply`` takes the store from ``version - 1`` to ``version``.

    ``apply(tables, ddl)`` receives a callable that executes one DDL element; it
    runs inside the migration's transaction, under the migration lock. Then
    ``backfill(session, statements, meta)``, if any, derives the new tables' rows
    from the records, in the transaction that records the new version.
    """

    version: int
    description: str
    apply: Callable[[Tables, Callable[[Any], None]], None]
    backfill: Callable[[Session, Statements, dict[str, str]], None] | None = None


def _create(tables: Sequence[sa.Table], ddl: Callable[[Any], None]) -> None:
    for table in tables:
        ddl(sa.schema.CreateTable(table, if_not_exists=True))
        for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
            ddl(sa.schema.CreateIndex(index, if_not_exists=True))


def _create_v1(tables: Tables, ddl: Callable[[Any], None]) -> None:
    _create((tables.meta, tables.counter, tables.checkpoints, tables.tags), ddl)


def _create_v2(tables: Tables, ddl: Callable[[Any], None]) -> None:
    _create((tables.fields,), ddl)
    # PostgreSQL only (run_ddl skips it elsewhere): prefix ranges of stream names
    # compare in "C" order, which the (stream, seq) index in the database's
    # collation cannot answer unless that collation is "C".
    ddl(sa.schema.CreateIndex(tables.pg_stream_c, if_not_exists=True))


def _backfill_v2(s: Session, st: Statements, meta: dict[str, str]) -> None:
    """The fields rows of every readable record (a damaged record gets none; verify
    reports it, and repair indexes it if it ever reads again)."""
    s.run(st.delete_all_fields)  # MySQL: a re-run after its DDL committed alone
    store_id = meta.get("store_id")
    after = 0
    while True:
        rows = s.rows(st.rows_after, {"after": after, "limit": _BACKFILL_PAGE})
        stored = []
        for seq, _, _, _, blob in rows:
            try:
                record = StoredRecord.from_bytes(
                    blob,  # not bytes(): a text cell is a damaged record, not a TypeError
                    location=f"{st.t.checkpoints.name}[seq={seq}]",
                    expect_store_id=store_id,
                    expect_sequence=int(seq),
                )
            except CheckpointDecodeError:
                continue
            stored.append(record)
        _, fields = index_rows(stored)
        if fields:
            s.run_many(st.insert_field, fields)
        if len(rows) < _BACKFILL_PAGE:
            return
        after = int(rows[-1][0])


_BACKFILL_PAGE = 500

#: Every migration, in order.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "create the meta, counter, checkpoints and tags tables", _create_v1),
    Migration(
        2,
        "create the fields table (metadata filters) and fill it from the records",
        _create_v2,
        _backfill_v2,
    ),
)
assert MIGRATIONS[-1].version == SCHEMA_VERSION


def tables_version(s: Session, tables: Tables) -> int:
    """The schema version the store's tables are at, for a meta table that lost its
    ``schema_version`` row: 2 once the fields table exists."""
    return 2 if s.dialect.table_exists(s, tables.fields) else 1


def read_meta(s: Session, st: Statements) -> dict[str, str] | None:
    """The meta table as a dict, or ``None`` if there is no meta table."""
    if not s.dialect.table_exists(s, st.t.meta):
        return None
    return {str(name): str(value) for name, value in s.rows(st.read_meta)}


def parse_version(
    meta: dict[str, str] | None, where: str, damaged: int | None = None
) -> int | None:
    """The schema version; ``None`` without a meta table, 0 if it is empty.

    An empty meta table is a creation that was interrupted after its DDL, which
    on MySQL commits by itself; version 1 is then applied again (idempotently).
    ``damaged`` is the version to read when the row is missing or unreadable in a
    meta table that has other rows (see :func:`.integrity.derived.probe_meta`).
    """
    if meta is None:
        return None
    if not meta:
        return 0
    raw = meta.get("schema_version")
    if (raw is None or not raw.isdigit()) and damaged is not None:
        return damaged
    if raw is None or not raw.isdigit():
        raise StoreFormatError(
            f"{where}: the meta table has no valid schema_version; it is not a "
            "statekeeper store (choose another table_prefix)"
        )
    return int(raw)


def apply_migration(s: Session, st: Statements, migration: Migration, where: str) -> None:
    """Apply one migration in the current transaction, under the migration lock."""
    tables = st.t
    s.dialect.create_schema(s, tables)
    meta = read_meta(s, st)
    # A store whose schema_version row was damaged (store_id or cursor_key are
    # there; probe_meta refused anything else) is at the version its tables say.
    ours = meta is not None and bool({"store_id", "cursor_key"} & meta.keys())
    current = parse_version(meta, where, damaged=tables_version(s, tables) if ours else None)
    if current is not None and current >= migration.version:
        return  # another process got here first
    if current is None:
        taken = [t.name for t in tables.all if s.dialect.table_exists(s, t)]
        if taken:
            raise StoreFormatError(
                f"{where}: table(s) {', '.join(taken)} exist but are not a "
                "statekeeper store (no meta table); choose another table_prefix"
            )
    if (current or 0) != migration.version - 1:
        raise StoreFormatError(
            f"{where}: cannot migrate from version {current} to {migration.version}"
        )
    migration.apply(tables, lambda element: s.dialect.run_ddl(s, element))
    if migration.backfill is not None:
        migration.backfill(s, st, meta or {})
    if migration.version == 1:
        s.run_many(
            st.insert_meta,
            [
                {"name": "schema_version", "value": "1"},
                {"name": "store_id", "value": secrets.token_hex(16)},
                {"name": "cursor_key", "value": secrets.token_hex(32)},
                {"name": "created_at", "value": datetime.now(UTC).isoformat()},
            ],
        )
        s.run(st.insert_counter)
    else:
        s.run(
            tables.meta.update()
            .where(tables.meta.c.name == "schema_version")
            .values(value=str(migration.version))
        )
