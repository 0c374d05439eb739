"""``list()`` of ``StatekeeperSaver``: a query planned once, then read page by page.

:func:`plan` turns LangGraph's ``config``, ``filter``, ``before`` and ``limit``
into a store query: one stream (a thread and namespace), every checkpoints
stream of a thread merged by sequence (:class:`._merge.Merge`, a thread without a
namespace), or every stream of the store (no config); ``before=`` resolved to a
cursor or a sequence. :func:`next_page` reads one page of it, matches the filter
on the decoded LangGraph metadata, and reads every pending-writes record of the
page in one ``load_many``. Unreadable checkpoints are left out and logged
(tolerant listing).

It takes what it uses explicitly: the store, the saver's
:class:`._records.Records` and its ``get_tuple``, never the saver itself.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, CheckpointTuple, get_checkpoint_id

from statekeeper.errors import CheckpointDecodeError, CheckpointNotFound
from statekeeper.models import Checkpoint as StoredCheckpoint
from statekeeper.models import Skipped

from . import _layout as lay
from ._filters import matches
from ._merge import Merge
from ._records import Records

if TYPE_CHECKING:
    from statekeeper._core.store import BaseCheckpointStore

logger = logging.getLogger("statekeeper.integrations.langgraph")

_PAGE = 250


#: ``get_tuple`` of the saver, for a listing of one checkpoint id.
GetTuple = Callable[[RunnableConfig], Awaitable[CheckpointTuple | None]]


@dataclass
class Query:
    """One ``list()`` in progress: the store query plus the filter matched here."""

    stream: str | None
    filter: dict[str, Any]
    remaining: int | None
    merge: Merge | None = None  # every namespace of a thread
    single: tuple[str, str, str] | None = None  # (thread, ns, checkpoint_id)
    cursor: str | None = None
    before_sequence: int | None = None
    before_id: str | None = None
    done: bool = False
    skipped: builtins.list[str] = field(default_factory=builtins.list)

    @property
    def filtered(self) -> bool:
        return bool(self.filter)


async def plan(
    store: BaseCheckpointStore[Any],
    config: RunnableConfig | None,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> Query:
    thread: str | None = None
    ns: str | None = None
    stream: str | None = None
    if config is not None:
        conf = config["configurable"]
        thread = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns")
        if ns is not None:
            stream = lay.checkpoint_stream(thread, ns)
    query = Query(stream, dict(filter or {}), limit)
    if limit is not None and limit <= 0:
        query.done = True
        return query
    if config is not None and (checkpoint_id := get_checkpoint_id(config)):
        assert thread is not None
        query.single = (thread, ns or "", checkpoint_id)
    elif thread is not None and ns is None:
        names = await store.list_streams(prefix=lay.thread_prefix(thread))
        query.merge = Merge(store, [s for s in names if lay.is_checkpoint_stream(s)], "desc")
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
                query.cursor = await store.cursor_at(key, order="desc")
            else:
                header = await store.load(key, include_state=False)
                query.before_sequence = header.sequence
        except CheckpointNotFound:
            # not stored (deleted, or never here): LangGraph's own rule, id order
            query.before_id = before_id
    return query


async def next_page(
    store: BaseCheckpointStore[Any], codec: Records, get_tuple: GetTuple, query: Query
) -> builtins.list[CheckpointTuple]:
    if query.done:
        return []
    if query.single is not None:
        query.done = True
        return await _single(store, get_tuple, query)
    size = _PAGE
    if query.remaining is not None and not query.filtered and query.before_sequence is None:
        size = max(1, min(query.remaining, 1000)) if query.before_id is None else _PAGE
    items = await _read(store, query, size)
    kept: builtins.list[tuple[lay.Decoded, Checkpoint]] = []
    for item in items:
        if query.before_sequence is not None and item.sequence >= query.before_sequence:
            continue
        try:
            decoded = codec.decode_metadata(item)
            if query.before_id is not None and decoded.ids.checkpoint_id >= query.before_id:
                continue
            if not matches(decoded.metadata, query.filter):
                continue
            # the checkpoint itself is decoded only once its metadata matched
            kept.append((decoded, codec.decode_checkpoint(decoded)))
        except CheckpointDecodeError as exc:
            logger.warning("LangGraph list() left out an unreadable checkpoint: %s", exc)
            continue
        if query.remaining is not None:
            query.remaining -= 1
            if query.remaining <= 0:
                query.done = True
                break
    return await _with_writes(store, codec, kept)


async def _read(
    store: BaseCheckpointStore[Any], query: Query, size: int
) -> builtins.list[StoredCheckpoint]:
    """The next ``size`` records of the listing, newest first; sets ``query.done``."""
    if query.merge is not None:
        items, skipped = await query.merge.take(size)
        _log_skipped(skipped)
        query.done = query.done or query.merge.done
        return items
    page = await store.list(query.stream, limit=size, after=query.cursor)
    query.cursor = page.next_cursor
    if page.next_cursor is None:
        query.done = True
    if query.stream is not None:
        _log_skipped(page.skipped)
        return builtins.list(page.items)
    # every stream of the store: only LangGraph's checkpoints are listed
    _log_skipped([s for s in page.skipped if (s.id or "").startswith("lg-")])
    return [item for item in page.items if lay.is_checkpoint_stream(item.stream)]


def _log_skipped(skipped: Sequence[Skipped]) -> None:
    for one in skipped:
        logger.warning(
            "LangGraph list() left out an unreadable checkpoint %s (%s): %s",
            one.id,
            one.location,
            one.reason,
        )


async def _with_writes(
    store: BaseCheckpointStore[Any],
    codec: Records,
    kept: builtins.list[tuple[lay.Decoded, Checkpoint]],
) -> builtins.list[CheckpointTuple]:
    if not kept:
        return []
    keys = [
        lay.writes_key(d.ids.thread_id, d.ids.checkpoint_ns, d.ids.checkpoint_id) for d, _ in kept
    ]
    writes = await store.load_many(keys)  # the whole page's writes: one round trip
    return [
        codec.tuple(d.ids, checkpoint, d.metadata, writes.get(key))
        for (d, checkpoint), key in zip(kept, keys, strict=True)
    ]


async def _single(
    store: BaseCheckpointStore[Any], get_tuple: GetTuple, query: Query
) -> builtins.list[CheckpointTuple]:
    assert query.single is not None
    thread, ns, checkpoint_id = query.single
    found = await get_tuple(
        {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }
    )
    if found is None:
        return []
    if not matches(found.metadata, query.filter):
        return []
    if query.before_id is not None and checkpoint_id >= query.before_id:
        return []
    if query.before_sequence is not None:
        key = lay.checkpoint_key(thread, ns, checkpoint_id)
        header = await store.load(key, include_state=False)
        if header.sequence >= query.before_sequence:
            return []
    return [found]
