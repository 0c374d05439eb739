"""The SQL backend's tables, indexes and keys against what its schema version needs.

A store's tables can lose an index or a table behind its back (a ``DROP INDEX`` by
hand, a restore that left one out). Nothing about the records is wrong then, but
saves fail (SQLite's ``ON CONFLICT (id)`` needs the unique index on ``id``; every
save needs the counter table) or, worse, stop being checked (MySQL takes a
duplicate id for a free one without that index). So ``verify`` compares the
catalog with :func:`..schema.build_tables` for the store's version
(:func:`check_schema`), ``repair()`` recreates what is missing
(:func:`rebuild_schema`, the migrations' own ``IF NOT EXISTS`` DDL), and a save that
fails on a damaged schema says so and says to repair (:func:`schema_damage`).

Checked per table: it exists, its primary key has the right columns, and every
index exists by name with the right uniqueness. Not checked: column types and
foreign keys (a lost ``ON DELETE CASCADE`` leaves orphan tag and fields rows,
which ``verify`` reports and ``repair()`` deletes).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from ....models import Problem
from ..dialects import Session
from ..schema import Statements, Tables

__all__ = ["SchemaDamage", "check_schema", "rebuild_schema", "schema_damage"]


@dataclass(frozen=True)
class SchemaDamage:
    """One thing missing or wrong in the catalog."""

    table: sa.Table
    #: The index that is missing or has the wrong uniqueness (``None``: the table).
    index: sa.Index | None
    reason: str
    #: ``repair()`` can recreate it (a lost primary key it cannot).
    rebuildable: bool = True


def _tables_of(tables: Tables, version: int) -> tuple[sa.Table, ...]:
    # Version 2 added the fields table (see .migrations).
    return tables.all if version >= 2 else tables.all[:-1]


def _indexes_of(s: Session, table: sa.Table, tables: Tables, version: int) -> list[sa.Index]:
    indexes = sorted(table.indexes, key=lambda ix: str(ix.name))
    return indexes + s.dialect.extra_indexes(table, tables, version)


def _damage(s: Session, tables: Tables, version: int) -> list[SchemaDamage]:
    out = []
    for table in _tables_of(tables, version):
        if not s.dialect.table_exists(s, table):
            out.append(SchemaDamage(table, None, f"the table {table.name} is missing"))
            continue
        found, pk = s.dialect.catalog(s, table)
        want_pk = {c.name for c in table.primary_key.columns}
        if pk != want_pk:
            has = ", ".join(sorted(pk)) or "nothing"
            reason = (
                f"the primary key of {table.name} is on ({has}), not ({', '.join(sorted(want_pk))})"
            )
            out.append(SchemaDamage(table, None, reason, rebuildable=False))
        for index in _indexes_of(s, table, tables, version):
            name = str(index.name)
            if name not in found:
                out.append(SchemaDamage(table, index, f"the index {name} is missing"))
            elif found[name] != bool(index.unique):
                want = "unique" if index.unique else "not unique"
                out.append(SchemaDamage(table, index, f"the index {name} is not {want}"))
    return out


def _what_it_does(table: sa.Table, tables: Tables) -> str:
    if table is tables.checkpoints:
        return "it holds the records: they are lost, and repair() can only recreate it empty"
    if table is tables.counter:
        return "saves cannot take a sequence until repair() recreates it from the highest stored"
    if table is tables.meta:
        return "the store cannot be opened"
    return "filtered listings cannot run until repair() recreates it and its rows from the records"


def check_schema(s: Session, st: Statements, version: int) -> tuple[list[Problem], bool]:
    """What the catalog lacks for schema ``version``, as ``verify`` problems, and
    whether a table is missing (then the checks of rows cannot run)."""
    problems = []
    damage = _damage(s, st.t, version)
    for d in damage:
        if d.index is not None:
            kind, advice = "index", "repair() recreates it"
        elif not d.rebuildable:
            kind, advice = "state", "repair() cannot rebuild it: recreate the table by hand"
        else:
            kind, advice = "state", _what_it_does(d.table, st.t)
        problems.append(Problem(kind=kind, location=d.table.name, reason=f"{d.reason}; {advice}"))
    return problems, any(d.index is None and d.rebuildable for d in damage)


def rebuild_schema(s: Session, st: Statements, version: int) -> tuple[list[str], list[str]]:
    """Recreate the missing tables and indexes of schema ``version`` (the migrations'
    ``IF NOT EXISTS`` DDL), and an index of the wrong uniqueness; return what was
    recreated and what could not be (each a sentence).

    A recreated counter table is empty: :func:`.derived.rebuild_counter`, which
    runs after this, fills it from the highest stored sequence. A recreated tags or
    fields table is filled by :func:`.derived.rebuild_rows`. The unique index on
    ``id`` is not created over ids that several rows hold; that is reported instead.
    """
    done: list[str] = []
    left: list[str] = []
    tables = st.t
    for d in _damage(s, tables, version):
        if not d.rebuildable:
            left.append(f"{d.reason} (repair() cannot rebuild a primary key)")
            continue
        if d.index is None:
            s.dialect.run_ddl(s, sa.schema.CreateTable(d.table, if_not_exists=True))
            for index in _indexes_of(s, d.table, tables, version):
                s.dialect.run_ddl(s, sa.schema.CreateIndex(index, if_not_exists=True))
            done.append(f"recreated the table {d.table.name} and its indexes")
            continue
        if d.index.unique and d.table is tables.checkpoints:
            shared = _shared_ids(s, st)
            if shared:
                left.append(
                    f"{d.reason}, and it cannot be recreated: ids are held by more than "
                    f"one row ({'; '.join(shared)}); keep one row of each (delete the "
                    "others by sequence, by hand), then run repair() again"
                )
                continue
        if "missing" not in d.reason:
            s.ddl(sa.schema.DropIndex(d.index))
        s.dialect.run_ddl(s, sa.schema.CreateIndex(d.index, if_not_exists=True))
        done.append(f"recreated the index {d.index.name}")
    return done, left


def _shared_ids(s: Session, st: Statements) -> list[str]:
    """Up to 10 ids that several rows hold, each with the sequences of those rows."""
    cp = st.t.checkpoints
    stmt = (
        sa.select(cp.c.id).group_by(cp.c.id).having(sa.func.count() > 1).order_by(cp.c.id).limit(10)
    )
    ids = [str(r[0]) for r in s.rows(stmt)]
    if not ids:
        return []
    seqs: dict[str, list[int]] = {i: [] for i in ids}
    for seq, rid, _ in s.rows(st.ids_taken, {"ids": ids}):
        seqs[str(rid)].append(int(seq))
    return [f"{i!r} at sequences {', '.join(map(str, sorted(seqs[i])))}" for i in ids]


def schema_damage(s: Session, st: Statements, version: int) -> str | None:
    """For a save that failed: why, if the schema is damaged (``None`` if it is not)."""
    found = _damage(s, st.t, version)
    if not found:
        return None
    counter = any(d.table is st.t.counter and d.index is None for d in found)
    how = ", the sequence counter from the highest sequence stored" if counter else ""
    return (
        f"the store's tables are damaged ({'; '.join(d.reason for d in found)}), so "
        "nothing was saved; run store.repair() (or 'statekeeper repair URL'), which "
        f"recreates them{how}"
    )
