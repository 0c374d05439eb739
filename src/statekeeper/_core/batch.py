"""Batch and positional access (SPEC S13, S14): the bodies of ``load_many``,
``cursor_at``, ``save_many`` and ``delete_many``.

``BaseCheckpointStore`` keeps the contract (signatures and docstrings) and calls
these; each validates everything before it touches the backend, then makes one
call of one primitive (``_get_many``, ``_get``, ``_insert_many``,
``_delete_many``), which is what lets a backend answer in one round trip or one
commit. Each takes what it uses: the primitives, the clock, and the strict
decoder, the cursor signer or the record maker where it needs them.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..cursor import CursorSigner, query_fingerprint
from ..errors import CheckpointNotFound, InvalidQuery, PreconditionFailed
from ..models import Checkpoint, CheckpointHeader, NewCheckpoint, checkpoint_with_state
from ..record import NewRecord, StoredRecord
from .primitives import StorePrimitives
from .validate import MAX_BATCH, Scalar, check_id, check_ids, check_metadata_filter, check_tags

__all__ = ["cursor_at", "delete_many", "load_many", "save_many"]

Clock = Callable[[], datetime]


def _id_list(ids: Iterable[str]) -> builtins.list[str]:
    if isinstance(ids, str | bytes):
        raise InvalidQuery("ids must be a list of ids, not a single string")
    try:
        as_list = builtins.list(ids)
    except TypeError:
        raise InvalidQuery(f"ids must be a list of ids, got {type(ids).__name__}") from None
    return check_ids(as_list)


async def load_many(
    primitives: StorePrimitives,
    clock: Clock,
    decode: Callable[[StoredRecord], Checkpoint],
    ids: Iterable[str],
    include_state: bool,
) -> dict[str, Checkpoint] | dict[str, CheckpointHeader]:
    """The live records among ``ids``, in the order asked: decoded checkpoints, or
    their headers alone (:class:`CheckpointHeader`, no ``state``) without the state."""
    wanted = _id_list(ids)
    if not wanted:
        return {}
    if len(wanted) == 1:  # what load reads (the LangGraph saver's writes lookup is this)
        one = await primitives._get(wanted[0], clock())
        records = {} if one is None else {wanted[0]: one}
    else:
        records = await primitives._get_many(wanted, clock())
    found: dict[str, Any] = {}
    for id in wanted:  # the caller's order, whatever order the backend answered in
        record = records.get(id)
        if record is None:
            continue
        found[id] = decode(record) if include_state else record.header
    return found


async def cursor_at(
    primitives: StorePrimitives,
    clock: Clock,
    signer: CursorSigner,
    id: str,
    order: str,
    tags: Mapping[str, str] | None,
    metadata: Mapping[str, Scalar] | None,
) -> str:
    check_id(id, what="id")
    if order not in ("asc", "desc"):
        raise InvalidQuery(f"order must be 'asc' or 'desc', got {order!r}")
    clean_tags = check_tags(tags)
    clean_meta = check_metadata_filter(metadata)
    record = await primitives._get(id, clock())
    if record is None:
        raise CheckpointNotFound(id)
    fingerprint = query_fingerprint(record.stream, order, clean_tags, clean_meta)
    return signer.make(record.sequence, fingerprint)


async def save_many(
    primitives: StorePrimitives,
    new_record: Callable[..., NewRecord],
    items: Sequence[NewCheckpoint],
) -> builtins.list[Checkpoint]:
    """``new_record`` is :func:`~.writes.new_record` bound to the store's codecs,
    clock and TTL rule: it validates and encodes one item, raising before anything
    is written."""
    if isinstance(items, NewCheckpoint) or not isinstance(items, Sequence):
        raise InvalidQuery("save_many takes a list of NewCheckpoint")
    if len(items) > MAX_BATCH:
        raise InvalidQuery(f"at most {MAX_BATCH} items per save_many, got {len(items)}")
    records = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, NewCheckpoint):
            raise InvalidQuery(f"save_many items are NewCheckpoint, got {type(item).__name__}")
        record = new_record(
            item.stream,
            item.state,
            tags=item.tags,
            metadata=item.metadata,
            parent_id=item.parent_id,
            ttl=item.ttl,
            id=item.id,
        )
        if record.id in seen:
            raise PreconditionFailed(f"id {record.id!r} appears twice in one save_many")
        seen.add(record.id)
        records.append(record)
    if not records:
        return []
    headers = await primitives._insert_many(records)
    return [
        checkpoint_with_state(header, item.state)
        for header, item in zip(headers, items, strict=True)
    ]


async def delete_many(primitives: StorePrimitives, clock: Clock, ids: Iterable[str]) -> int:
    wanted = _id_list(ids)
    if not wanted:
        return 0
    return await primitives._delete_many(wanted, clock())
