"""``list()`` of ``StatekeeperSaver``: a query planned once, then read page by page.

:func:`plan` turns LangGraph's ``config``, ``filter``, ``before`` and ``limit``
into a store query (the filter split into what the store matches and what is
checked here, ``before=`` resolved to a cursor or a sequence); :func:`next_page`
reads one page of it, with every pending-writes record of the page in one
``load_many``. Unreadable checkpoints are left out and logged (tolerant listing).
"""

from __future__ import annotations

import builtins
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)

from statekeeper.errors import CheckpointDecodeError, CheckpointNotFound

from . import _layout as lay
from ._filters import matches

if TYPE_CHECKING:
    from ._saver import StatekeeperSaver

logger = logging.getLogger("statekeeper.integrations.langgraph")

_PAGE = 250


@dataclass
class Query:
    """One ``list()`` in progress: the store query plus what is checked here."""

    stream: str | None
    tags: dict[str, str] | None
    pushed: dict[str, Any]
    local: dict[str, Any]
    remaining: int | None
    single: tuple[str, str, str] | None = None  # (thread, ns, checkpoint_id)
    cursor: str | None = None
    before_sequence: int | None = None
    before_id: str | None = None
    done: bool = False
    skipped: builtins.list[str] = field(default_factory=builtins.list)


async def plan(
    saver: StatekeeperSaver,
    config: RunnableConfig | None,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> Query:
    pushed, local = lay.split_filter(filter)
    thread: str | None = None
    ns: str | None = None
    if config is None:
        stream, tags = None, {lay.RESERVED: lay.KIND_CHECKPOINT}
    else:
        conf = config["configurable"]
        thread = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns")
        if ns is None:  # every namespace of the thread
            stream = None
            tags = {lay.RESERVED: lay.KIND_CHECKPOINT, lay.THREAD_TAG: lay.thread_tag(thread)}
        else:
            stream, tags = lay.checkpoint_stream(thread, ns), None
    query = Query(stream, tags, pushed, local, limit)
    if limit is not None and limit <= 0:
        query.done = True
        return query
    if config is not None and (checkpoint_id := get_checkpoint_id(config)):
        assert thread is not None
        query.single = (thread, ns or "", checkpoint_id)
    before_id = get_checkpoint_id(before) if before else None
    if before_id and before is not None:
        bconf = before["configurable"]
        raw_thread = bconf.get("thread_id", thread)
        bthread = None if raw_thread is None else str(raw_thread)
        bns = bconf.get("checkpoint_ns", ns) or ""
        key = None if bthread is None else lay.checkpoint_key(bthread, bns, before_id)
        try:
            if key is None:
                raise CheckpointNotFound(before_id)
            if stream is not None and query.single is None and (bthread, bns) == (thread, ns):
                # the position of `before` in this very listing: one lookup, any depth
                query.cursor = await saver.store.cursor_at(
                    key, order="desc", tags=tags, metadata=pushed or None
                )
            else:
                header = await saver.store.load(key, include_state=False)
                query.before_sequence = header.sequence
        except CheckpointNotFound:
            # not stored (deleted, or never here): LangGraph's own rule, id order
            query.before_id = before_id
    return query


async def next_page(saver: StatekeeperSaver, query: Query) -> builtins.list[CheckpointTuple]:
    if query.done:
        return []
    if query.single is not None:
        query.done = True
        return await _single(saver, query)
    size = _PAGE
    if query.remaining is not None and not query.local and query.before_sequence is None:
        size = max(1, min(query.remaining, 1000)) if query.before_id is None else _PAGE
    page = await saver.store.list(
        query.stream,
        limit=size,
        after=query.cursor,
        tags=query.tags,
        metadata=query.pushed or None,
    )
    for skipped in page.skipped:
        logger.warning(
            "LangGraph list() left out an unreadable checkpoint %s (%s): %s",
            skipped.id,
            skipped.location,
            skipped.reason,
        )
    query.cursor = page.next_cursor
    if page.next_cursor is None:
        query.done = True
    kept: builtins.list[tuple[lay.Ids, Checkpoint, CheckpointMetadata]] = []
    for item in page.items:
        if query.before_sequence is not None and item.sequence >= query.before_sequence:
            continue
        try:
            ids, checkpoint, metadata = saver._decode(item)
        except CheckpointDecodeError as exc:
            logger.warning("LangGraph list() left out an unreadable checkpoint: %s", exc)
            continue
        if query.before_id is not None and ids.checkpoint_id >= query.before_id:
            continue
        if not matches(metadata, query.local):
            continue
        kept.append((ids, checkpoint, metadata))
        if query.remaining is not None:
            query.remaining -= 1
            if query.remaining <= 0:
                query.done = True
                break
    return await _with_writes(saver, kept)


async def _with_writes(
    saver: StatekeeperSaver, kept: builtins.list[tuple[lay.Ids, Checkpoint, CheckpointMetadata]]
) -> builtins.list[CheckpointTuple]:
    if not kept:
        return []
    keys = [lay.writes_key(i.thread_id, i.checkpoint_ns, i.checkpoint_id) for i, _, _ in kept]
    writes = await saver.store.load_many(keys)  # the whole page's writes: one round trip
    return [
        saver._tuple(ids, ck, md, writes.get(key))
        for (ids, ck, md), key in zip(kept, keys, strict=True)
    ]


async def _single(saver: StatekeeperSaver, query: Query) -> builtins.list[CheckpointTuple]:
    assert query.single is not None
    thread, ns, checkpoint_id = query.single
    found = await saver._get_tuple(
        {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }
    )
    if found is None or not matches(found.metadata, {**query.pushed, **query.local}):
        return []
    if query.before_id is not None and checkpoint_id >= query.before_id:
        return []
    if query.before_sequence is not None:
        key = lay.checkpoint_key(thread, ns, checkpoint_id)
        header = await saver.store.load(key, include_state=False)
        if header.sequence >= query.before_sequence:
            return []
    return [found]
