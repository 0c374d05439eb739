"""SQLite's sequences without a write per save: the highest stored sequence, and a
high-water mark that only a delete of the newest checkpoint moves.

A save takes ``1 + max(highest stored sequence, counter row)`` inside its ``BEGIN
IMMEDIATE`` transaction (:func:`next_sequence`), a read of two index ends, so the
counter row is written only when a delete takes away the newest checkpoint: the
trigger of :mod:`.high_water` (schema version 3) then raises the row to that
sequence, in the deleting transaction. Together:

- S1: a sequence is never reused. A sequence above every stored one was either
  never handed out or belonged to a checkpoint whose delete raised the row to it,
  whatever deleted it (``delete``, ``delete_stream``, ``prune``, ``purge``, a
  sweep, repair's drop, a ``DELETE`` by hand: the trigger sees every one);
- S10: sequence order is commit order. The write lock that ``BEGIN IMMEDIATE``
  takes serialises every writer of the file, across processes, so the reads and
  the insert of one save see every committed save and no other save between them;
  a save rolled back (or its group-commit savepoint) takes its sequence with it,
  as the counter bump it replaces did.

The row stays a guard, as before: a missing or non-integer row, or a missing
trigger, makes a save refuse (:class:`~statekeeper.errors.BackendError` saying to
repair), and ``verify`` reports it (:func:`check_counter`); ``repair`` rebuilds the
row from the highest stored sequence, never lowering it, and recreates the trigger
(:func:`rebuild_counter`). Unlike the bumped counter, the row may rightly be below
the stored sequences: ``info().high_water_mark`` is the larger of the two
(:func:`high_water`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect

from ....errors import BackendError
from ....models import Problem
from .. import dialects
from ..dialects import Session
from ..integrity import derived
from ..schema import COUNTER_NAME, Statements, Tables
from .high_water import create_trigger, trigger_name

__all__ = ["check_counter", "high_water", "next_sequence", "rebuild_counter"]


def _state_query(st: Statements) -> sa.TextClause:
    """One row: the highest stored sequence (0 if none), the counter row's value
    (``NULL`` without a row), and whether the trigger exists (1 or 0)."""
    q = sqlite_dialect.dialect().identifier_preparer
    tables = st.t
    cp, counter = q.format_table(tables.checkpoints), q.format_table(tables.counter)
    return sa.text(
        f"SELECT (SELECT coalesce(max(seq), 0) FROM {cp}), "
        f"(SELECT hwm FROM {counter} WHERE name = '{COUNTER_NAME}'), "
        "(SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name = :trigger)"
    ).bindparams(trigger=trigger_name(tables))


def _state(s: Session, st: Statements) -> tuple[int, Any, bool]:
    # built once per Statements (the trigger's name bound in it), run without params
    row = s.first(s.dialect.statement(st, "sequence_state", _state_query))
    assert row is not None
    return int(row[0]), row[1], bool(row[2])


def next_sequence(s: Session, st: Statements, count: int = 1) -> int:
    """The last of ``count`` new sequences, in the caller's write transaction: the
    transaction owns the ``count`` sequences up to and including it (see the
    module). Writes nothing.

    A missing or non-integer counter row, or a missing trigger, raises
    :class:`BackendError` saying to repair (nothing is saved): without them a delete
    of the newest checkpoint could let its sequence be handed out again.
    """
    top, hwm, trigger = _state(s, st)
    value = derived.counter_value((hwm,))
    if value is None:
        raise BackendError(dialects.counter_damage(s, st))
    if not trigger:
        raise BackendError(_trigger_missing(st.t))
    return max(top, value) + count


def _trigger_missing(tables: Tables) -> str:
    return (
        f"the trigger {trigger_name(tables)}, which keeps the sequence high-water mark of "
        f"{tables.counter.name} when the newest checkpoint is deleted, is missing, so "
        "saves could reuse the sequence of a deleted checkpoint and nothing was saved; "
        "run store.repair() (or 'statekeeper repair URL'), which recreates it"
    )


def high_water(s: Session, st: Statements) -> int | None:
    """The highest sequence handed out that is known: the larger of the counter row
    and the highest stored sequence; ``None`` for a missing or non-integer row."""
    if not s.dialect.table_exists(s, st.t.counter):
        return None
    top, hwm, _ = _state(s, st)
    value = derived.counter_value((hwm,))
    return None if value is None else max(top, value)


def check_counter(s: Session, st: Statements, where: str) -> list[Problem]:
    """``verify``: the counter row present and an integer, and the trigger there (the
    row below a stored sequence is no damage here, see the module)."""
    location = f"{st.t.counter.name}[name=sequence]"
    row = s.first(st.read_hwm)
    reason = None
    if row is None:
        reason = "the sequence counter row is missing"
    elif derived.counter_value(row) is None:
        reason = f"the sequence counter holds {row[0]!r}, not an integer"
    problems = []
    if reason is not None:
        problems.append(
            Problem(
                kind="state",
                location=location,
                reason=f"{reason}; saves refuse to run until repair() rebuilds it "
                "(never lowering it)",
            )
        )
    if not _state(s, st)[2]:
        problems.append(
            Problem(
                kind="state",
                location=trigger_name(st.t),
                reason="the trigger that keeps the sequence high-water mark when the newest "
                "checkpoint is deleted is missing; saves refuse to run until repair() "
                "recreates it",
            )
        )
    return problems


def rebuild_counter(s: Session, st: Statements) -> tuple[int, int] | None:
    """``repair``: recreate the trigger if it is missing, and a missing or
    non-integer counter row from every stored sequence; ``(old, new)`` if the row
    changed. A row below the stored sequences is left as it is (it is no damage);
    the row is never lowered."""
    create_trigger(s, st, {})
    row = s.first(st.read_hwm)
    if row is not None and derived.counter_value(row) is not None:
        return None
    top = derived.top_sequence(s, st)
    if row is None:
        s.run(st.insert_hwm, {"new_hwm": top})
        return (0, top)
    s.run(st.set_hwm, {"new_hwm": top})
    return (0, top)
