"""Whole-thread operations of ``StatekeeperSaver``: delete, delete for runs, copy, prune.

Each works from the store's indexes (``list_streams(prefix=)``, tag and metadata
filters) in pages of at most 1000 records, never one call per checkpoint.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING

from statekeeper.errors import CheckpointDecodeError, PreconditionFailed
from statekeeper.models import NewCheckpoint

from . import _layout as lay

if TYPE_CHECKING:
    from ._saver import StatekeeperSaver

_BATCH = 500  # a copy batch holds a checkpoint and its writes record: <= 1000 items


async def delete_thread(saver: StatekeeperSaver, thread_id: str) -> None:
    for stream in await saver.store.list_streams(prefix=lay.thread_prefix(thread_id)):
        await saver.store.delete_stream(stream)


async def delete_for_runs(saver: StatekeeperSaver, run_ids: Sequence[str]) -> None:
    doomed: builtins.list[str] = []
    for run_id in run_ids:
        query = await saver._plan(None, {"run_id": run_id}, None, None)
        if query.local:  # not a value the store filters on: decode and compare here
            while not query.done:
                for tup in await saver._page(query):
                    conf = tup.config["configurable"]
                    doomed += keys(conf["thread_id"], conf["checkpoint_ns"], conf["checkpoint_id"])
            continue
        cursor = None
        while True:
            page = await saver.store.list(
                None,
                limit=1000,
                after=cursor,
                tags=query.tags,
                metadata=query.pushed,
                include_state=False,
            )
            for item in page.items:
                ids = lay.ids_from_metadata(item.metadata, item.id)
                doomed += keys(ids.thread_id, ids.checkpoint_ns, ids.checkpoint_id)
            cursor = page.next_cursor
            if cursor is None:
                break
    for i in range(0, len(doomed), 1000):
        await saver.store.delete_many(doomed[i : i + 1000])


async def copy_thread(saver: StatekeeperSaver, source: str, target: str) -> None:
    tags = {lay.RESERVED: lay.KIND_CHECKPOINT, lay.THREAD_TAG: lay.thread_tag(source)}
    cursor = None
    while True:
        # every namespace at once, ascending: the copy keeps the sequence order
        page = await saver.store.list(None, limit=_BATCH, order="asc", after=cursor, tags=tags)
        if page.skipped:
            first = page.skipped[0]
            raise CheckpointDecodeError(
                f"copy_thread({source!r}) stopped: {first.reason}; nothing past it was copied",
                id=first.id,
                location=first.location,
            )
        sources = [lay.ids_from_metadata(item.metadata, item.id) for item in page.items]
        wkeys = [lay.writes_key(s.thread_id, s.checkpoint_ns, s.checkpoint_id) for s in sources]
        writes = await saver.store.load_many(wkeys) if wkeys else {}
        batch: builtins.list[NewCheckpoint] = []
        for item, src, wkey in zip(page.items, sources, wkeys, strict=True):
            ns, cid, parent = src.checkpoint_ns, src.checkpoint_id, src.parent_checkpoint_id
            ids = lay.Ids(target, ns, cid, parent)
            metadata = {k: v for k, v in item.metadata.items() if k != lay.RESERVED}
            batch.append(
                NewCheckpoint(
                    stream=lay.checkpoint_stream(target, ns),
                    state=item.state,
                    tags=lay.checkpoint_tags(target),
                    metadata={**metadata, lay.RESERVED: lay.own_metadata(ids)},
                    parent_id=lay.checkpoint_key(target, ns, parent) if parent else None,
                    id=lay.checkpoint_key(target, ns, cid),
                )
            )
            if (w := writes.get(wkey)) is not None:
                batch.append(
                    NewCheckpoint(
                        stream=lay.writes_stream(target, ns),
                        state=w.state,
                        tags={lay.RESERVED: lay.KIND_WRITES},
                        metadata={lay.RESERVED: lay.own_metadata(ids)},
                        parent_id=lay.checkpoint_key(target, ns, cid),
                        id=lay.writes_key(target, ns, cid),
                    )
                )
        if batch:
            try:
                await saver.store.save_many(batch)
            except PreconditionFailed:
                for one in batch:  # the target already had some: replace them
                    await saver._upsert(one)
        cursor = page.next_cursor
        if cursor is None:
            return


async def prune(saver: StatekeeperSaver, thread_ids: Sequence[str], strategy: str) -> None:
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"strategy must be 'keep_latest' or 'delete', got {strategy!r}")
    for thread_id in thread_ids:
        streams = await saver.store.list_streams(prefix=lay.thread_prefix(str(thread_id)))
        if strategy == "delete":
            for stream in streams:
                await saver.store.delete_stream(stream)
            continue
        for stream in streams:
            if stream.endswith("/checkpoints"):
                await keep_latest(saver, stream, stream[: -len("checkpoints")] + "writes")


async def keep_latest(saver: StatekeeperSaver, stream: str, wstream: str) -> None:
    await saver.store.prune(stream, keep_last=1)
    newest = await saver.store.list(stream, limit=1, include_state=False)
    if newest.skipped:
        raise CheckpointDecodeError(
            f"prune kept the newest checkpoint of {stream!r} but cannot read it: "
            f"{newest.skipped[0].reason}",
            id=newest.skipped[0].id,
        )
    keep = None
    if newest.items:
        ids = lay.ids_from_metadata(newest.items[0].metadata, newest.items[0].id)
        keep = lay.writes_key(ids.thread_id, ids.checkpoint_ns, ids.checkpoint_id)
    doomed: builtins.list[str] = []
    cursor = None
    while True:
        page = await saver.store.list(wstream, limit=1000, after=cursor, include_state=False)
        doomed += [item.id for item in page.items if item.id != keep]
        doomed += [s.id for s in page.skipped if s.id is not None and s.id != keep]
        cursor = page.next_cursor
        if cursor is None:
            break
    for i in range(0, len(doomed), 1000):
        await saver.store.delete_many(doomed[i : i + 1000])


def keys(thread: str, ns: str, checkpoint_id: str) -> builtins.list[str]:
    return [
        lay.checkpoint_key(thread, ns, checkpoint_id),
        lay.writes_key(thread, ns, checkpoint_id),
    ]
