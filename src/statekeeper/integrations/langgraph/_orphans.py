"""Pending-writes records whose checkpoint is gone, found and removed.

The saver keeps a checkpoint's pending writes in a record of their own
(``lgw-<hash>`` in the thread's ``.../writes`` stream, :mod:`._layout`), and its own
deletes and prunes remove both. A prune or delete through the store itself
(``statekeeper prune``, ``store.prune``, ``store.delete``) knows nothing of that
layout and leaves the writes record behind: nothing reads it again (a writes
record is read only with its checkpoint), but it takes space, and ``statekeeper
verify`` reports it (:func:`orphaned_writes`, kind ``"orphan"``) and ``statekeeper
repair`` removes it (:func:`remove_orphaned_writes`).

Only the layout's names are used: no LangGraph object is decoded.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from statekeeper.errors import CheckpointDecodeError, CheckpointNotFound
from statekeeper.models import Problem

from . import _layout as lay

if TYPE_CHECKING:
    from statekeeper._core.store import BaseCheckpointStore

__all__ = ["orphaned_writes", "remove_orphaned_writes"]

_BATCH = 1000


def _checkpoint_key_of(writes_record_id: str) -> str | None:
    """``lg-<hash>`` for the writes record ``lgw-<hash>``; None for another id."""
    if not writes_record_id.startswith("lgw-"):
        return None
    return "lg-" + writes_record_id.removeprefix("lgw-")


async def _writes_streams(store: BaseCheckpointStore[Any]) -> builtins.list[str]:
    # langgraph/<thread>/<namespace>/writes: neither part holds a "/" (_layout)
    streams = await store.list_streams(prefix=lay.ROOT)
    return [s for s in streams if s.endswith("/writes") and s.count("/") == 3]


async def _live(store: BaseCheckpointStore[Any], ids: builtins.list[str]) -> set[str]:
    """Which of ``ids`` have a record: a damaged checkpoint record is still there
    (its writes are not orphaned; verify reports the damage itself)."""
    try:
        return set(await store.load_many(ids, include_state=False))
    except CheckpointDecodeError:
        present: set[str] = set()
        for id in ids:
            try:
                await store.load(id, include_state=False)
            except CheckpointDecodeError:
                present.add(id)
            except CheckpointNotFound:
                continue
            else:
                present.add(id)
        return present


async def orphaned_writes(store: BaseCheckpointStore[Any]) -> builtins.list[Problem]:
    """One ``"orphan"`` problem per writes record whose checkpoint record is not
    live, in every LangGraph thread of ``store``. Reads headers only."""
    found: builtins.list[Problem] = []
    for stream in await _writes_streams(store):
        cursor: str | None = None
        while True:
            page = await store.list(
                stream, limit=_BATCH, order="asc", after=cursor, include_state=False
            )
            pairs = [(item.id, _checkpoint_key_of(item.id)) for item in page.items]
            wanted = [key for _, key in pairs if key is not None]
            live = await _live(store, wanted) if wanted else set()
            found += [
                Problem(
                    kind="orphan",
                    location=f"stream {stream!r}",
                    reason=(
                        f"pending writes of a LangGraph checkpoint that is gone ({key}): "
                        "left by a prune or delete through the store, not the saver; "
                        "repair removes them"
                    ),
                    id=id,
                    stream=stream,
                )
                for id, key in pairs
                if key is not None and key not in live
            ]
            cursor = page.next_cursor
            if cursor is None:
                break
    return found


async def remove_orphaned_writes(store: BaseCheckpointStore[Any]) -> int:
    """Delete the writes records :func:`orphaned_writes` finds; return how many.

    Each batch is checked again just before it is deleted, so a checkpoint put
    meanwhile keeps its writes."""
    doomed = [p.id for p in await orphaned_writes(store) if p.id is not None]
    removed = 0
    for i in range(0, len(doomed), _BATCH):
        batch = doomed[i : i + _BATCH]
        keys = {id: _checkpoint_key_of(id) for id in batch}
        live = await _live(store, [k for k in keys.values() if k is not None])
        removed += await store.delete_many([id for id, key in keys.items() if key not in live])
    return removed
