"""The trigger that keeps SQLite's sequence high-water mark: a delete of the newest
checkpoint raises the counter row to its sequence (schema version 3; the saves that
rely on it are :mod:`.sequence`'s)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect

from ..dialects import Session
from ..schema import COUNTER_NAME, Statements, Tables

__all__ = ["create_trigger", "lacks_trigger", "trigger_ddl", "trigger_name"]


def trigger_name(tables: Tables) -> str:
    """The name of the trigger that keeps the high-water mark of ``tables``."""
    return f"{tables.checkpoints.name}_top_deleted"


def trigger_ddl(tables: Tables) -> str:
    """``CREATE TRIGGER IF NOT EXISTS``: a delete that leaves no sequence above its
    row's raises the counter row to that sequence (never lowers it; a non-integer
    row, which saves refuse, stays as it is: in SQLite an integer is below any text)."""
    q = sqlite_dialect.dialect().identifier_preparer
    cp, counter = q.format_table(tables.checkpoints), q.format_table(tables.counter)
    return (
        f"CREATE TRIGGER IF NOT EXISTS {q.quote(trigger_name(tables))} AFTER DELETE ON {cp} "
        f"WHEN NOT EXISTS (SELECT 1 FROM {cp} WHERE seq > OLD.seq) "
        f"BEGIN UPDATE {counter} SET hwm = OLD.seq "
        f"WHERE name = '{COUNTER_NAME}' AND hwm < OLD.seq; END"
    )


def create_trigger(s: Session, st: Statements, meta: dict[str, str]) -> None:
    """Create the trigger if it is missing (schema version 3, and ``repair``); other
    dialects: nothing."""
    if s.dialect.name == "sqlite":
        s.ddl(sa.text(trigger_ddl(st.t)))


_HAS_TRIGGER = sa.text("SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = :name")


def lacks_trigger(s: Session, tables: Tables) -> bool:
    """Whether an SQLite store's tables lack the trigger (never on other dialects,
    which have none to lack)."""
    return s.dialect.name == "sqlite" and not s.rows(_HAS_TRIGGER, {"name": trigger_name(tables)})
