"""Reads answered from the record files alone, when the indexes cannot be trusted.

A store whose stream index, id table or state is damaged or missing is read this
way until it is rebuilt: on a ``read_only`` open (which never writes, so never
rebuilds), and by any read that meets a damaged index. Each call walks the whole
store (:func:`.survey.take_survey`), so it is slow, but it gives the answers the
indexes would give once rebuilt: the newest record, or a
:class:`~statekeeper.errors.CheckpointDecodeError` naming a damaged one, never
``None``, ``CheckpointNotFound`` or an older checkpoint.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..._core.query import ScanQuery
from ..._core.validate import skipped_from
from ...errors import CheckpointDecodeError
from ...models import Skipped
from ...record import StoredRecord
from .survey import Entry, Survey

__all__ = ["orphan_error", "view_get", "view_info", "view_latest", "view_scan", "view_streams"]


def orphan_error(
    error: CheckpointDecodeError, stream: str, *, listed: bool = False
) -> CheckpointDecodeError:
    """The error ``get_latest(stream)`` raises for a newer damaged record whose
    stream cannot be told (it may be this stream's newest checkpoint); ``listed``:
    the one ``list(stream)`` reports it with, in ``skipped``, on every page of any
    stream whose range holds its sequence (it may be one of this stream's)."""
    may_be = (
        f"one of the checkpoints of {stream!r}"
        if listed
        else f"the newest checkpoint of {stream!r} and no older one is returned"
    )
    return CheckpointDecodeError(
        f"{error.reason}; its stream cannot be told from what is left of it, so it may be "
        f"{may_be}. Restore the file, or remove it with repair(drop_damaged=True) "
        "(statekeeper repair --drop-damaged)",
        id=error.id,
        location=error.location,
        sequence=error.sequence,
    )


def view_latest(s: Survey, stream: str, now: datetime) -> StoredRecord | None:
    for e in reversed(s.entries):
        if e.record is not None:
            if e.record.stream == stream and not e.record.is_expired(now):
                return e.record
            continue
        assert e.error is not None
        if e.stream == stream:
            raise e.error
        if e.stream is None:
            raise orphan_error(e.error, stream)
    return None


def view_get(s: Survey, cid: str, now: datetime) -> StoredRecord | None:
    for e in reversed(s.entries):
        if e.cid != cid:
            continue
        if e.record is None:
            assert e.error is not None
            raise e.error
        return None if e.record.is_expired(now) else e.record
    return None


def view_scan(s: Survey, q: ScanQuery) -> list[StoredRecord | Skipped]:
    """The entries of ``q``: the records of its stream and, as skipped, its damaged
    records and every damaged record whose stream cannot be told (an orphan, which
    ``get_latest`` also raises for: it may be one of this stream's)."""
    assert q.stream is not None
    entries: list[Entry] = [e for e in s.entries if e.stream in (q.stream, None)]
    if q.order == "desc":
        entries.reverse()
    out: list[StoredRecord | Skipped] = []
    for e in entries:
        if q.bound is not None and (e.seq <= q.bound if q.order == "asc" else e.seq >= q.bound):
            continue
        if e.record is None:
            assert e.error is not None
            error = (
                e.error if e.stream is not None else orphan_error(e.error, q.stream, listed=True)
            )
            out.append(skipped_from(error, e.cid, e.seq))
        elif not e.record.is_expired(q.now) and all(
            e.record.header.tags.get(k) == v for k, v in q.tags.items()
        ):
            out.append(e.record)
        if len(out) >= q.limit:
            break
    return out


def view_streams(s: Survey, now: datetime) -> list[str]:
    names = {
        e.stream
        for e in s.entries
        if e.stream is not None and (e.record is None or not e.record.is_expired(now))
    }
    return sorted(names)


def view_info(s: Survey, now: datetime) -> dict[str, Any]:
    """``info()`` from the records: live checkpoints and streams at ``now``, the
    expired ones apart (an unreadable record counts as live: it is not known to
    have expired)."""
    gone = [e for e in s.entries if e.record is not None and e.record.is_expired(now)]
    live = [e for e in s.entries if not (e.record is not None and e.record.is_expired(now))]
    return {
        "checkpoints": len(live),
        "streams": len({e.stream for e in live if e.stream is not None}),
        "high_water_mark": s.top,
        **({"expired": len(gone)} if gone else {}),
    }
