"""The SQL backend's inserts and index rows: ``save``, ``save_many`` and re-indexing.

Synchronous operations over one :class:`~.dialects.Session`, each inside the
caller's write transaction. A checkpoint is its row in the checkpoints table plus
its derived rows: one tags row per tag, one fields row per filterable metadata
value (:func:`.schema.field_rows`). Every insert takes its sequences from the
counter row first (:meth:`.dialects.Dialect.next_sequence`), so the row lock it takes
orders all inserts: a batch's sequences are consecutive, no other insert lands
between them, and an id checked here cannot be taken by another insert before
this transaction ends.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

from ...errors import BackendError, PreconditionFailed
from ...record import NewRecord, StoredRecord, header_values
from .dialects import Session
from .integrity import schema_check
from .schema import SCHEMA_VERSION, Statements
from .values import expires_micros, field_rows, tag_rows, to_micros

__all__ = ["index_rows", "insert_many", "insert_one", "reindex"]


def _row(stored: StoredRecord, store_id: str) -> dict[str, Any]:
    h = header_values(stored)  # no header model is built for the row
    return {
        "seq": h["sequence"],
        "id": h["id"],
        "stream": h["stream"],
        "expires_at": expires_micros(h["expires_at"]),
        "record": stored.to_bytes(store_id),
    }


def index_rows(
    stored: Sequence[StoredRecord],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The tags rows and the fields rows of ``stored``."""
    tags: list[dict[str, Any]] = []
    fields: list[dict[str, Any]] = []
    for record in stored:
        h = header_values(record)
        if h["tags"]:
            tags += tag_rows(h["sequence"], h["stream"], h["tags"])
        if h["metadata"]:
            fields += field_rows(h["sequence"], h["stream"], h["metadata"])
    return tags, fields


def _insert_index_rows(s: Session, st: Statements, stored: Sequence[StoredRecord]) -> None:
    tags, fields = index_rows(stored)
    if tags:
        s.run_many(st.insert_tag, tags)
    if fields:
        s.run_many(st.insert_field, fields)


R = TypeVar("R")
T = TypeVar("T")


def _schema_checked(
    op: Callable[[Session, Statements, R, str], T], s: Session, st: Statements, what: R, sid: str
) -> T:
    """``op(s, st, what, sid)``, a save. If it fails in the database and a table or
    index it needs is gone (the counter table, SQLite's unique index on ``id`` that
    ``ON CONFLICT`` names), a :class:`BackendError` that says which and to run
    ``repair()``; else the error as it was. Costs nothing until a save fails."""
    try:
        return op(s, st, what, sid)
    except (sa.exc.DBAPIError, sqlite3.Error) as exc:
        why = schema_check.schema_damage(s, st, SCHEMA_VERSION)
        if why is None:
            raise
        raise BackendError(why, orig=exc) from exc


def insert_one(s: Session, st: Statements, record: NewRecord, store_id: str) -> StoredRecord:
    """``save``: the next sequence, the row (replacing an expired one with its id), and
    its index rows; the record as stored. :class:`PreconditionFailed` if the id is
    live."""
    return _schema_checked(_insert_one, s, st, record, store_id)


def _insert_one(s: Session, st: Statements, record: NewRecord, store_id: str) -> StoredRecord:
    stored = record.seal(s.dialect.next_sequence(s, st))
    row = _row(stored, store_id)
    if not s.dialect.insert_checkpoint(s, st, row):
        # The id is taken; an expired checkpoint may be replaced, a live one not.
        now = to_micros(record.now)
        if not s.run(st.delete_expired_id, {"id": record.id, "now": now}) or (
            not s.dialect.insert_checkpoint(s, st, row)
        ):
            raise PreconditionFailed(f"checkpoint id {record.id!r} already exists")
    _insert_index_rows(s, st, [stored])
    return stored


def insert_many(
    s: Session, st: Statements, records: Sequence[NewRecord], store_id: str
) -> list[StoredRecord]:
    """``save_many``: ``len(records)`` consecutive sequences from one counter bump, in
    the order given, every id checked before anything is inserted, then one
    multi-row insert per table; the records as stored. Raises
    :class:`PreconditionFailed` (the caller's transaction then rolls back, so nothing
    is written) if any id is live."""
    return _schema_checked(_insert_many, s, st, records, store_id)


def _insert_many(
    s: Session, st: Statements, records: Sequence[NewRecord], store_id: str
) -> list[StoredRecord]:
    last = s.dialect.next_sequence(s, st, len(records))
    first = last - len(records) + 1
    by_id = {record.id: record for record in records}
    expired: list[int] = []
    # After the counter bump: every insert waits for that row lock, so no id seen
    # free here can be taken before this transaction ends.
    for seq, rid, expires_at in s.rows(st.ids_taken, {"ids": list(by_id)}):
        record = by_id[str(rid)]
        if expires_at is None or expires_at > to_micros(record.now):
            raise PreconditionFailed(f"checkpoint id {record.id!r} already exists")
        expired.append(int(seq))
    if expired:
        s.run(st.delete_seqs, {"seqs": expired})
    stored = [record.seal(first + i) for i, record in enumerate(records)]
    try:
        s.run_many(st.insert_cp, [_row(record, store_id) for record in stored])
    except (sa.exc.IntegrityError, sqlite3.IntegrityError) as exc:
        # Only a writer that bypasses the counter (an older statekeeper) gets here.
        raise PreconditionFailed(f"an id of this save_many was taken meanwhile: {exc}") from exc
    _insert_index_rows(s, st, stored)
    return stored


def reindex(s: Session, st: Statements, new: StoredRecord, *, tags: bool, fields: bool) -> None:
    """Rewrite the tags rows and/or the fields rows of ``new`` (an update that edits
    them), in the update's transaction, so filters see the edit when it commits."""
    h = new.header
    if tags:
        s.run(st.delete_tags_seq, {"at_seq": h.sequence})
        if h.tags:
            s.run_many(st.insert_tag, tag_rows(h.sequence, h.stream, dict(h.tags)))
    if fields:
        s.run(st.delete_fields_seq, {"at_seq": h.sequence})
        rows = field_rows(h.sequence, h.stream, dict(h.metadata))
        if rows:
            s.run_many(st.insert_field, rows)
