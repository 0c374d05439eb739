"""Damage in the SQL backend's tables: finding it on open, in ``verify``, and repairing it.

The ``record`` column of the checkpoints table is the truth (SPEC S3a). Everything
else is derived from it and may be rebuilt:

- the **meta** rows (``schema_version``, ``store_id``, ``cursor_key``): the store id
  is in every record (a ``store_id`` row naming an id that the records do not
  carry is the damage, see :mod:`.store_ids`), the schema version follows from the
  tables, and a lost cursor key only invalidates cursors handed out before;
- the **counter** row: the high-water mark, rebuilt as the highest of its own
  value and every sequence in the checkpoints and tags tables, never lowered;
- the ``id``, ``stream`` and ``expires_at`` **columns** of a checkpoint row (but a
  row whose record is another row's, its id the other row's id column, holds a
  replayed or swapped record: a damaged record, not a damaged column);
- the **tag rows** and the **fields rows** (its filterable metadata) of a checkpoint.

A row whose record cannot be read stays: strict reads keep raising
:class:`~statekeeper.errors.CheckpointDecodeError` for it until
``repair(drop_damaged=True)``. Every function here is a synchronous operation over
one :class:`~..dialects.Session`; the ``check_*`` ones only read.
"""

from __future__ import annotations

import re
import secrets
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ....errors import CheckpointDecodeError, StoreFormatError
from ....models import Problem
from ....record import StoredRecord
from .. import writes
from ..dialects import Session
from ..migrations import read_meta, tables_version
from ..schema import Statements
from ..values import expires_micros, field_rows, tag_rows
from .store_ids import STORE_ID as _STORE_ID
from .store_ids import store_id_on_record

__all__ = [
    "PAGE",
    "MetaProbe",
    "PageStep",
    "check_counter",
    "check_orphan_rows",
    "check_rows",
    "counter_value",
    "probe_meta",
    "read_counter",
    "rebuild_counter",
    "rebuild_meta",
    "rebuild_rows",
    "top_sequence",
]

#: Checkpoint rows per verify or repair step (one snapshot or transaction each).
PAGE = 500

_CURSOR_KEY = re.compile(r"(?:[0-9a-f]{2}){16,}")

Locate = Callable[[int], str]
T_co = TypeVar("T_co", covariant=True)


class PageStep(Protocol[T_co]):
    """One page of a walk over the checkpoint rows: a result and where to continue."""

    def __call__(
        self, s: Session, *, st: Statements, after: int, store_id: str, locate: Locate
    ) -> tuple[T_co, int | None]: ...


@dataclass
class MetaProbe:
    """What the meta table says, and what an open should do about it.

    ``absent`` names why there is no store here (no meta table, or a creation
    interrupted before its first commit); ``damage`` lists meta rows that are
    missing or unreadable, each with the value used instead (``identity`` then
    holds the recovered store id and a stand-in cursor key).
    """

    meta: dict[str, str] | None
    absent: str | None = None
    version: int | None = None
    store_id: str = ""
    cursor_key: bytes = b""
    damage: list[str] = field(default_factory=list)


def probe_meta(s: Session, st: Statements, where: str) -> MetaProbe:
    """Read the meta table and tell a fresh, an intact and a damaged store apart.

    The store id is checked against the records (:func:`.store_ids.store_id_on_record`):
    a meta row that names an id no readable record carries, while records agree on
    another, is damaged, and the records' id is used.
    """
    tables = st.t
    meta = read_meta(s, st)
    if meta is None:
        return MetaProbe(None, absent="it has no meta table")
    raw_version = meta.get("schema_version")
    version = int(raw_version) if raw_version is not None and raw_version.isdigit() else None
    store_id = meta.get("store_id", "")
    key = meta.get("cursor_key", "")
    verdict = None
    if version is not None and _STORE_ID.fullmatch(store_id) and _CURSOR_KEY.fullmatch(key):
        verdict = store_id_on_record(s, st, where, store_id)
        if verdict.damage is None:
            return MetaProbe(
                meta, version=version, store_id=store_id, cursor_key=bytes.fromhex(key)
            )
    missing = [
        t.name for t in (tables.counter, tables.checkpoints) if not s.dialect.table_exists(s, t)
    ]
    counter = None if missing else s.first(st.read_hwm)
    rows = None if missing else s.first(st.newest_records, {"limit": 1})
    if not meta and counter is None and rows is None:
        # Meta rows and the counter row are written in one transaction; with none of
        # them and no checkpoints, the creation stopped after its DDL (MySQL commits
        # DDL by itself). Nothing was ever stored.
        return MetaProbe(meta, absent="its creation was interrupted before it committed")
    ours = {"schema_version", "store_id", "cursor_key"} & meta.keys()
    if missing or not (ours or counter is not None):
        raise StoreFormatError(
            f"{where}: the meta table has no valid schema_version and the store's other "
            "tables do not look like a statekeeper store; it is not a statekeeper store "
            "(choose another table_prefix)"
        )
    probe = MetaProbe(meta, version=version)
    if version is None:
        probe.version = tables_version(s, tables)
        probe.damage.append(
            f"the schema_version row is missing or unreadable ({raw_version!r}); read as "
            f"version {probe.version}, the version its tables are at"
        )
    if verdict is None:
        verdict = store_id_on_record(s, st, where, store_id)
    if verdict.store_id is None:
        probe.store_id = secrets.token_hex(16)
        probe.damage.append("the store_id row is missing or unreadable (no record is readable)")
    else:
        probe.store_id = verdict.store_id
        if verdict.damage is not None:
            probe.damage.append(verdict.damage)
    if _CURSOR_KEY.fullmatch(key):
        probe.cursor_key = bytes.fromhex(key)
    else:
        probe.cursor_key = secrets.token_bytes(32)
        probe.damage.append(
            "the cursor_key row is missing or unreadable (cursors handed out before "
            "cannot be honoured; a new key is used)"
        )
    return probe


def rebuild_meta(s: Session, st: Statements, probe: MetaProbe) -> list[str]:
    """Write the meta rows a damaged probe stood in for; return what was written."""
    if not probe.damage:
        return []
    wanted = {
        "schema_version": str(probe.version),
        "store_id": probe.store_id,
        "cursor_key": probe.cursor_key.hex(),
    }
    meta = probe.meta or {}
    written = []
    for name, value in wanted.items():
        if meta.get(name) != value:
            s.run(st.delete_meta_name, {"at_name": name})
            s.run(st.insert_meta, {"name": name, "value": value})
            written.append(name)
    return written


# -- the counter ------------------------------------------------------------------------


def read_counter(s: Session, st: Statements) -> int | None:
    """The counter's value; ``None`` if its row or its table is missing, or it is not
    an integer (``verify`` says which)."""
    if not s.dialect.table_exists(s, st.t.counter):
        return None
    return counter_value(s.first(st.read_hwm))


def counter_value(row: Any) -> int | None:
    """The counter row's value, or ``None`` if the row is missing or not an integer."""
    value = None if row is None else row[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def top_sequence(s: Session, st: Statements) -> int:
    """The highest sequence any table still holds (index rows outlive a lost row)."""
    tops = [s.first(stmt) for stmt in (st.max_seq, st.max_tag_seq, st.max_field_seq)]
    return max(int(row[0]) if row is not None else 0 for row in tops)


def check_counter(s: Session, st: Statements, where: str) -> list[Problem]:
    """The counter row: present, an integer, and not below any stored sequence.

    PostgreSQL takes sequences from transaction ids: its store checks its
    ``seq_base`` meta row instead (:mod:`.postgres.seq_base`).
    """
    location = f"{st.t.counter.name}[name=sequence]"
    row = s.first(st.read_hwm)
    top = top_sequence(s, st)
    hwm = counter_value(row)
    if row is None:
        reason = "the sequence counter row is missing"
    elif hwm is None:
        reason = f"the sequence counter holds {row[0]!r}, not an integer"
    elif hwm < top:
        reason = f"the sequence counter is {hwm}, below sequence {top}, which exists"
    else:
        return []
    return [
        Problem(
            kind="state",
            location=location,
            reason=f"{reason}; saves refuse to run until repair() rebuilds it (never lowering it)",
        )
    ]


def rebuild_counter(s: Session, st: Statements) -> tuple[int, int] | None:
    """Raise the counter to every stored sequence; ``(old, new)`` if it changed.

    Never lowers it: the counter may rightly be above every stored sequence (the
    newest checkpoints were deleted), and those sequences must not come back.
    PostgreSQL: its store raises the ``seq_base`` meta row instead.
    """
    row = s.first(st.read_hwm)
    top = top_sequence(s, st)
    hwm = counter_value(row)
    if row is None:
        s.run(st.insert_hwm, {"new_hwm": top})
        return (0, top)
    if hwm is None or hwm < top:
        # Saves fail while the counter is below a stored sequence, so no saver
        # can have moved it between the read above and this write.
        s.run(st.set_hwm, {"new_hwm": top})
        return (hwm or 0, top)
    return None


# -- checkpoint rows and their tag rows ---------------------------------------------------


@dataclass
class _Row:
    seq: int
    id: str
    stream: str
    expires_at: int | None
    record: StoredRecord | None  # None: unreadable (a damaged record, reported elsewhere)


def _rows(
    s: Session, st: Statements, after: int, store_id: str, locate: Locate, locked: bool
) -> list[_Row]:
    stmt = st.rows_after_locked if locked else st.rows_after
    out = []
    for seq, rid, stream, expires_at, blob in s.rows(stmt, {"after": after, "limit": PAGE}):
        seq = int(seq)
        try:
            # No expect_id: a row whose id column disagrees with its record is a
            # damaged column, which repair() can fix, not a damaged record. The
            # cell as read: from_bytes refuses a type that is not bytes (SQLite
            # keeps whatever is written, text included).
            record: StoredRecord | None = StoredRecord.from_bytes(
                blob, location=locate(seq), expect_store_id=store_id, expect_sequence=seq
            )
        except CheckpointDecodeError:
            record = None
        out.append(_Row(seq, str(rid), str(stream), expires_at, record))
    _unclaim_borrowed(s, st, out)
    return out


def _unclaim_borrowed(s: Session, st: Statements, rows: list[_Row]) -> None:
    """Mark unreadable the rows that hold another row's record.

    A record names its id; when that id is another row's id column, this row holds a
    copy of that row's record (replayed, swapped, or copied from another stream),
    which nothing can tell apart from the original where records do not carry their
    sequence (PostgreSQL); so is each of several rows of the page that hold one
    record. Strict reads already refuse it (its id column is not its
    record's id), the listings report it as damaged, and repair must not give it the
    other row's id. A row whose record's id no other row has only lost its id column.
    """
    differ: dict[str, list[_Row]] = defaultdict(list)
    for row in rows:
        if row.record is not None and row.record.id != row.id:
            differ[row.record.id].append(row)
    if not differ:
        return
    for seq, rid, _ in s.rows(st.ids_taken, {"ids": list(differ)}):
        for row in differ[str(rid)]:
            if int(seq) != row.seq:
                row.record = None
    for claimants in differ.values():
        if len(claimants) > 1:  # one record in several rows: which is the original?
            for row in claimants:
                row.record = None


#: The index rows of one checkpoint, by key: the columns a record determines.
_Index = dict[str, tuple[Any, ...]]


def _tags_by_seq(s: Session, st: Statements, rows: list[_Row]) -> dict[int, _Index]:
    found: dict[int, _Index] = defaultdict(dict)
    if rows:
        bounds = {"lo": rows[0].seq, "hi": rows[-1].seq}
        for seq, key, vkey, value, shash in s.rows(st.tags_between, bounds):
            found[int(seq)][str(key)] = (str(vkey), str(value), int(shash))
    return found


def _fields_by_seq(s: Session, st: Statements, rows: list[_Row]) -> dict[int, _Index]:
    found: dict[int, _Index] = defaultdict(dict)
    if rows:
        bounds = {"lo": rows[0].seq, "hi": rows[-1].seq}
        for seq, key, kind, vkey, value, shash in s.rows(st.fields_between, bounds):
            found[int(seq)][str(key)] = (str(kind), str(vkey), str(value), int(shash))
    return found


def _expected_tags(row: _Row) -> _Index:
    assert row.record is not None
    rows = tag_rows(row.seq, row.record.stream, dict(row.record.header.tags))
    return {r["key"]: (r["vkey"], r["value"], r["shash"]) for r in rows}


def _expected_fields(row: _Row) -> _Index:
    assert row.record is not None
    rows = field_rows(row.seq, row.record.stream, dict(row.record.header.metadata))
    return {r["key"]: (r["kind"], r["vkey"], r["value"], r["shash"]) for r in rows}


def _compare(what: str, expected: _Index, actual: _Index) -> list[str]:
    if actual == expected:
        return []
    missing = sorted(expected.keys() - actual.keys())
    extra = sorted(actual.keys() - expected.keys())
    wrong = sorted(k for k in expected.keys() & actual.keys() if expected[k] != actual[k])
    parts = [
        f"{label} {', '.join(map(repr, keys))}"
        for label, keys in (("missing", missing), ("extra", extra), ("wrong", wrong))
        if keys
    ]
    return [f"its {what} disagree with its record's {_WHOSE[what]} ({'; '.join(parts)})"]


_WHOSE = {"tag rows": "tags", "fields rows": "metadata"}


def _disagreements(row: _Row, tags: _Index, fields: _Index) -> list[str]:
    """How the row's columns, tag rows and fields rows disagree with its record."""
    record = row.record
    assert record is not None
    out = []
    if row.id != record.id:
        out.append(f"its id column says {row.id!r} but its record says {record.id!r}")
    if row.stream != record.stream:
        out.append(f"its stream column says {row.stream!r} but its record says {record.stream!r}")
    if row.expires_at != expires_micros(record.header.expires_at):
        out.append("its expires_at column disagrees with its record")
    out += _compare("tag rows", _expected_tags(row), tags)
    out += _compare("fields rows", _expected_fields(row), fields)
    return out


def check_rows(
    s: Session, *, st: Statements, after: int, store_id: str, locate: Locate
) -> tuple[list[Problem], int | None]:
    """Check one page of rows after sequence ``after``; return the problems and the
    sequence to continue after (``None`` at the end)."""
    rows = _rows(s, st, after, store_id, locate, locked=False)
    tags, fields = _tags_by_seq(s, st, rows), _fields_by_seq(s, st, rows)
    problems = []
    for row in rows:
        if row.record is None:
            continue
        for reason in _disagreements(row, tags.get(row.seq, {}), fields.get(row.seq, {})):
            problems.append(
                Problem(
                    kind="index",
                    location=locate(row.seq),
                    reason=f"{reason}; repair() rebuilds it from the record",
                    id=row.record.id,
                    sequence=row.seq,
                    stream=row.record.stream,
                )
            )
    return problems, (rows[-1].seq if len(rows) == PAGE else None)


def rebuild_rows(
    s: Session, *, st: Statements, after: int, store_id: str, locate: Locate
) -> tuple[dict[str, int], int | None]:
    """Rewrite, from the records, the columns and tag rows of one page of rows that
    disagree with them (rows locked); return counts and where to continue."""
    rows = _rows(s, st, after, store_id, locate, locked=True)
    tags, fields = _tags_by_seq(s, st, rows), _fields_by_seq(s, st, rows)
    counts = {"columns": 0, "tag_rows": 0, "field_rows": 0}
    for row in rows:
        record = row.record
        if record is None:
            continue
        if (row.id, row.stream, row.expires_at) != (
            record.id,
            record.stream,
            expires_micros(record.header.expires_at),
        ):
            params = {
                "at_seq": row.seq,
                "new_id": record.id,
                "new_stream": record.stream,
                "new_expires_at": expires_micros(record.header.expires_at),
            }
            s.run(st.set_columns, params)
            counts["columns"] += 1
        redo_tags = tags.get(row.seq, {}) != _expected_tags(row)
        redo_fields = fields.get(row.seq, {}) != _expected_fields(row)
        writes.reindex(s, st, record, tags=redo_tags, fields=redo_fields)
        counts["tag_rows"] += redo_tags
        counts["field_rows"] += redo_fields
    return counts, (rows[-1].seq if len(rows) == PAGE else None)


def check_orphan_rows(s: Session, st: Statements) -> list[Problem]:
    """Tag rows and fields rows of sequences that have no checkpoint row."""
    problems = []
    for what, table, stmt in (
        ("tag rows", st.t.tags, st.orphan_tags),
        ("fields rows", st.t.fields, st.orphan_fields),
    ):
        seqs = [int(r[0]) for r in s.rows(stmt)]
        if not seqs:
            continue
        shown = ", ".join(map(str, seqs[:10])) + (" ..." if len(seqs) > 10 else "")
        problems.append(
            Problem(
                kind="index",
                location=table.name,
                reason=f"{what} of {len(seqs)} sequence(s) with no checkpoint row ({shown}); "
                "repair() deletes them",
            )
        )
    return problems
