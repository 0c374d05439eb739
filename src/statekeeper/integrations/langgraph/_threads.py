"""Whole-thread operations of ``StatekeeperSaver``: delete, delete for runs, copy,
and the upsert that ``put`` and ``copy_thread`` share.

Each works from the store's streams (``list_streams(prefix=)``, a listing per
stream) in pages of at most 1000 records, never one call per checkpoint. Each
takes the store, never the saver.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from statekeeper.errors import CheckpointDecodeError, PreconditionFailed
from statekeeper.models import NewCheckpoint

from . import _layout as lay
from ._filters import matches
from ._merge import Merge
from ._records import Records

if TYPE_CHECKING:
    from statekeeper._core.store import BaseCheckpointStore

_BATCH = 500  # a copy batch holds a checkpoint and its writes record: <= 1000 items


async def upsert(
    store: BaseCheckpointStore[Any], stream: str, state: bytes, parent_id: str | None, id: str
) -> None:
    """Save a record under ``id``, or replace the state (and parent) of the live one.

    LangGraph's savers upsert: a checkpoint id put again replaces the old one,
    keeping its position. The replaced record loses any tags and store metadata
    (records of the layout before ``SKLG2C`` had them)."""
    try:
        await store.save(stream, state, parent_id=parent_id, id=id)
    except PreconditionFailed:
        await store.update(id, state, tags={}, metadata={}, parent_id=parent_id)


async def delete_thread(store: BaseCheckpointStore[Any], thread_id: str) -> None:
    for stream in await store.list_streams(prefix=lay.thread_prefix(thread_id)):
        await store.delete_stream(stream)


async def delete_for_runs(
    store: BaseCheckpointStore[Any], records: Records, run_ids: Sequence[str]
) -> None:
    """Every checkpoint whose metadata ``run_id`` is one of ``run_ids``, and its
    writes: one pass over the store's checkpoints, matching as ``list(filter=)``
    matches ``{"run_id": ...}``."""
    wanted = [{"run_id": run_id} for run_id in run_ids]
    if not wanted:
        return
    doomed: builtins.list[str] = []
    cursor = None
    while True:
        page = await store.list(None, limit=1000, after=cursor)
        for item in page.items:
            if not lay.is_checkpoint_stream(item.stream):
                continue
            try:
                metadata = records.decode_metadata(item).metadata
            except CheckpointDecodeError:
                continue  # unreadable: not known to be of these runs
            if any(matches(metadata, query) for query in wanted):
                doomed += [item.id, lay.writes_key_of(item.id)]
        cursor = page.next_cursor
        if cursor is None:
            break
    for i in range(0, len(doomed), 1000):
        await store.delete_many(doomed[i : i + 1000])


async def copy_thread(store: BaseCheckpointStore[Any], source: str, target: str) -> None:
    names = await store.list_streams(prefix=lay.thread_prefix(source))
    # every namespace at once, ascending: the copy keeps the sequence order
    merge = Merge(store, [s for s in names if lay.is_checkpoint_stream(s)], "asc", page=_BATCH)
    while not merge.done:
        items, skipped = await merge.take(_BATCH)
        if skipped:
            first = skipped[0]
            raise CheckpointDecodeError(
                f"copy_thread({source!r}) stopped: {first.reason}; nothing past it was copied",
                id=first.id,
                location=first.location,
            )
        wkeys = [lay.writes_key_of(item.id) for item in items]
        writes = await store.load_many(wkeys) if wkeys else {}
        batch: builtins.list[NewCheckpoint] = []
        for item, wkey in zip(items, wkeys, strict=True):
            src, checkpoint, metadata = lay.unpack_checkpoint(item.state, item.id, item.metadata)
            ns, cid, parent = src.checkpoint_ns, src.checkpoint_id, src.parent_checkpoint_id
            ids = lay.Ids(target, ns, cid, parent)
            batch.append(
                NewCheckpoint(
                    stream=lay.checkpoint_stream(target, ns),
                    state=lay.pack_checkpoint(ids, checkpoint, metadata),
                    parent_id=lay.checkpoint_key(target, ns, parent) if parent else None,
                    id=lay.checkpoint_key(target, ns, cid),
                )
            )
            if (w := writes.get(wkey)) is not None:
                batch.append(
                    NewCheckpoint(
                        stream=lay.writes_stream(target, ns),
                        state=w.state,
                        parent_id=lay.checkpoint_key(target, ns, cid),
                        id=lay.writes_key(target, ns, cid),
                    )
                )
        if batch:
            try:
                await store.save_many(batch)
            except PreconditionFailed:
                for one in batch:  # the target already had some: replace them
                    assert one.id is not None and isinstance(one.state, bytes)
                    await upsert(store, one.stream, one.state, one.parent_id, one.id)
