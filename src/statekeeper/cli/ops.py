"""The long-running work behind ``statekeeper streams`` and ``copy``. (``verify``
and ``repair`` are the store's own :meth:`~statekeeper.BaseCheckpointStore.verify`
and :meth:`~statekeeper.BaseCheckpointStore.repair`.)

These functions only use the public store API, so they work on every backend,
plugins included. They report progress through a callback and return plain
results; rendering is the command's business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._core.store import BaseCheckpointStore
from ..errors import (
    CheckpointDecodeError,
    CheckpointEncodeError,
    CheckpointNotFound,
    PreconditionFailed,
)
from ..models import Checkpoint, Skipped

__all__ = [
    "CopyResult",
    "Problem",
    "StreamSummary",
    "copy_store",
    "summarise_stream",
]

PAGE = 500
Advance = Callable[[int], None]


@dataclass(frozen=True)
class Problem:
    """One record that a copy could not read or could not place."""

    check: str
    id: str | None
    sequence: int | None
    location: str
    reason: str
    error: str
    stream: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "id": self.id,
            "stream": self.stream,
            "sequence": self.sequence,
            "location": self.location,
            "reason": self.reason,
            "error": self.error,
        }


def _from_skipped(check: str, entry: Skipped) -> Problem:
    return Problem(check, entry.id, entry.sequence, entry.location, entry.reason, entry.error)


# -- streams --------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamSummary:
    """Counts for one stream; ``exact`` is false when counting stopped at the cap."""

    name: str
    checkpoints: int
    exact: bool
    unreadable: int
    latest_sequence: int | None
    latest_created_at: str | None
    latest_readable: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "checkpoints": self.checkpoints,
            "checkpoints_exact": self.exact,
            "unreadable": self.unreadable,
            "latest_sequence": self.latest_sequence,
            "latest_created_at": self.latest_created_at,
            "latest_readable": self.latest_readable,
        }


async def summarise_stream(store: BaseCheckpointStore, name: str, cap: int) -> StreamSummary:
    """Count the live checkpoints of ``name`` (up to ``cap``) and find its newest.

    Reads headers only (``include_state=False``), newest first, page by page, so
    the cost is bounded by ``cap`` whatever the stream's size.
    """
    count = unreadable = 0
    newest: tuple[int, str | None, bool] | None = None
    cursor: str | None = None
    while True:
        page = await store.list(
            name,
            limit=min(1000, max(cap - count, 1)),
            order="desc",
            after=cursor,
            include_state=False,
        )
        if newest is None:
            candidates: list[tuple[int, str | None, bool]] = [
                (cp.sequence, cp.created_at.isoformat(), True) for cp in page.items[:1]
            ]
            candidates += [(s.sequence, None, False) for s in page.skipped if s.sequence]
            newest = max(candidates, default=None, key=lambda c: c[0])
        count += len(page.items) + len(page.skipped)
        unreadable += len(page.skipped)
        cursor = page.next_cursor
        if cursor is None or count >= cap:
            break
    seq, created, readable = newest if newest is not None else (None, None, True)
    return StreamSummary(name, count, cursor is None, unreadable, seq, created, readable)


# -- copy -----------------------------------------------------------------------------


@dataclass
class CopyResult:
    seen: int = 0
    copied: int = 0
    already_present: int = 0
    problems: list[Problem] = field(default_factory=list)


async def copy_store(
    source: BaseCheckpointStore,
    target: BaseCheckpointStore,
    advance: Advance,
    result: CopyResult | None = None,
) -> CopyResult:
    """Copy every live checkpoint of ``source`` into ``target``, oldest first.

    Each checkpoint keeps its id, stream, timestamps, etag, parent link, tags,
    metadata and expiry (:meth:`BaseCheckpointStore.import_checkpoint`); it gets a
    new sequence in ``target``, and because the source is read in ascending global
    sequence order, relative order is kept within and across streams.

    Idempotent: a checkpoint whose id is already live in ``target`` with the same
    stream and etag was copied before and is counted in ``already_present``; one
    with a different stream or etag is a conflict and is left alone. Records the
    source cannot read and states the target refuses are reported, not copied.

    The counts go into ``result`` (a new one by default) as each checkpoint is
    settled, so a caller that is interrupted still knows how far the copy got.
    ``seen`` counts the entries settled: copied, already present, or reported.
    """
    result = CopyResult() if result is None else result
    cursor: str | None = None
    while True:
        page = await source.list(None, limit=PAGE, order="asc", after=cursor)
        # The page's items and skipped entries are in one sequence range; go
        # through them in order so problems are reported where they occurred.
        entries: list[Checkpoint | Skipped] = [*page.items, *page.skipped]
        entries.sort(key=lambda e: e.sequence or 0)
        for entry in entries:
            if isinstance(entry, Skipped):
                result.problems.append(_from_skipped("source", entry))
            else:
                await _copy_one(target, entry, result)
            result.seen += 1
            advance(1)
        cursor = page.next_cursor
        if cursor is None:
            return result


async def _copy_one(target: BaseCheckpointStore, item: Checkpoint, result: CopyResult) -> None:
    header = item.header()
    where = f"source sequence {item.sequence}"
    try:
        await target.import_checkpoint(header, item.state)
        result.copied += 1
        return
    except CheckpointEncodeError as exc:
        reason = f"the destination refuses its state: {exc}"
        result.problems.append(
            Problem(
                "destination",
                item.id,
                item.sequence,
                where,
                reason,
                type(exc).__name__,
                item.stream,
            )
        )
        return
    except PreconditionFailed:
        pass
    try:
        existing = await target.load(item.id)
    except CheckpointNotFound:
        # It expired between the insert and this load; one more try settles it.
        await target.import_checkpoint(header, item.state)
        result.copied += 1
        return
    except CheckpointDecodeError as exc:
        reason = f"the id exists in the destination but cannot be read there: {exc.reason}"
        result.problems.append(
            Problem(
                "conflict", item.id, item.sequence, where, reason, type(exc).__name__, item.stream
            )
        )
        return
    if existing.etag == item.etag and existing.stream == item.stream:
        result.already_present += 1
        return
    reason = (
        f"the id exists in the destination as stream {existing.stream!r} etag {existing.etag}, "
        f"the source has stream {item.stream!r} etag {item.etag}"
    )
    result.problems.append(
        Problem(
            "conflict", item.id, item.sequence, where, reason, "PreconditionFailed", item.stream
        )
    )
