"""The SQL backend's updates and deletes: ``update``, ``delete``, ``delete_stream``,
``prune`` and ``purge_expired``.

Synchronous operations over one :class:`~.dialects.Session`, each inside the
caller's write transaction (inserts are in :mod:`.writes`). Index rows of a
deleted checkpoint go with it (``ON DELETE CASCADE``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ...errors import CheckpointNotFound, PreconditionFailed
from ...models import CheckpointHeader
from ...record import RecordEdits, StoredRecord
from . import writes
from .dialects import Session
from .schema import Statements
from .values import expires_micros, to_micros

__all__ = ["delete", "delete_stream", "locked_live", "prune", "purge", "update"]

#: ``(blob, id, seq) -> record``: the store's reader of a row's record.
Parse = Callable[[bytes, str, int], StoredRecord]


def locked_live(
    s: Session, st: Statements, parse: Parse, id: str, now: datetime
) -> tuple[int, StoredRecord]:
    """The live record ``id``, row-locked for the rest of the transaction."""
    row = s.first(st.get_for_update, {"id": id})
    if row is None or (row[2] is not None and row[2] <= to_micros(now)):
        raise CheckpointNotFound(id)
    return int(row[0]), parse(row[1], id, int(row[0]))


def check_etag(current: StoredRecord, if_match: str | None) -> None:
    if if_match is not None and current.header.etag != if_match:
        raise PreconditionFailed(
            f"checkpoint {current.id!r} has etag {current.header.etag!r}, not {if_match!r}"
        )


def update(
    s: Session,
    st: Statements,
    parse: Parse,
    store_id: str,
    id: str,
    *,
    state: bytes,
    if_match: str | None,
    now: datetime,
    etag: str,
    edits: RecordEdits | None,
    codec: str | None,
) -> CheckpointHeader:
    seq, current = locked_live(s, st, parse, id, now)
    check_etag(current, if_match)
    new = current.updated(state, now=now, etag=etag, edits=edits, codec=codec)
    params = {
        "at_seq": seq,
        "new_record": new.to_bytes(store_id),
        "new_expires_at": expires_micros(new.header.expires_at),
    }
    s.run(st.set_record, params)
    if edits is not None:
        # filters read the tags and fields tables: they change in the same
        # transaction as the record
        tags, fields = edits.tags is not None, edits.metadata is not None
        writes.reindex(s, st, new, tags=tags, fields=fields)
    return new.header


def delete(
    s: Session, st: Statements, parse: Parse, id: str, if_match: str | None, now: datetime
) -> bool:
    if if_match is None:
        return s.run(st.delete_live_id, {"id": id, "now": to_micros(now)}) > 0
    try:
        seq, current = locked_live(s, st, parse, id, now)
    except CheckpointNotFound:
        return False
    check_etag(current, if_match)
    return s.run(st.delete_seq, {"seq": seq}) > 0


def delete_stream(s: Session, st: Statements, stream: str, now: datetime) -> int:
    """Every row of ``stream``; the number of live checkpoints among them."""
    live = s.run(st.delete_stream_live, {"stream": stream, "now": to_micros(now)})
    s.run(st.delete_stream_all, {"stream": stream})
    return live


def prune(s: Session, st: Statements, stream: str, keep_last: int, now: datetime) -> int:
    base = {"stream": stream, "now": to_micros(now)}
    if keep_last == 0:
        return s.run(st.delete_stream_live, base)
    row = s.first(st.prune_cutoff, {**base, "skip": keep_last - 1})
    if row is None:
        return 0
    return s.run(st.prune_below, {**base, "cutoff": row[0]})


def purge(s: Session, st: Statements, now: datetime) -> int:
    return s.run(st.purge, {"now": to_micros(now)})
