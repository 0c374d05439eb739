"""``put_writes`` of ``StatekeeperSaver``: one record of pending writes per checkpoint.

The writes of every task of a checkpoint merge into one record
(:func:`._layout.merge_writes`) through an etag compare-and-set, so concurrent
writers, in this process or another sharing the backend, never lose a write.

A graph's super-step writes to the checkpoint it just put: the first task's
writes create the record, and the tasks after it add theirs. So the first try is
a plain ``save`` (the record is usually new), and the record this saver wrote
last for a key is remembered with its etag, so the next task's writes are one
``update(if_match=)``: one store call for each ``put_writes`` in the common case.
Whenever the remembered record is not the stored one (another writer, a delete),
the store says so (``PreconditionFailed``, ``CheckpointNotFound``) and the
writes are merged into what is stored, read again.
"""

from __future__ import annotations

import builtins
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from statekeeper.errors import CheckpointNotFound, PreconditionFailed

from . import _layout as lay

if TYPE_CHECKING:
    from statekeeper._core.store import BaseCheckpointStore

_CAS_ATTEMPTS = 50
#: Writes records remembered (a super-step writes to one checkpoint of each thread
#: running, so this covers that many threads running at once in this saver).
_REMEMBERED = 64


class PendingWrites:
    """The writes records of one saver, with the last ones it wrote remembered."""

    def __init__(self, store: BaseCheckpointStore[Any]) -> None:
        self._store = store
        self._known: OrderedDict[str, tuple[str, builtins.list[lay.Write]]] = OrderedDict()

    def _remember(self, key: str, etag: str, writes: builtins.list[lay.Write]) -> None:
        self._known[key] = (etag, writes)
        self._known.move_to_end(key)
        while len(self._known) > _REMEMBERED:
            self._known.popitem(last=False)

    async def merge(
        self, key: str, stream: str, parent_id: str, new: builtins.list[lay.Write]
    ) -> None:
        """Merge ``new`` into the writes record ``key`` (of checkpoint ``parent_id``)."""
        known = self._known.pop(key, None)
        if known is not None:
            merged = lay.merge_writes(known[1], new)
            if merged is not None:
                try:
                    done = await self._store.update(key, lay.pack_writes(merged), if_match=known[0])
                except (PreconditionFailed, CheckpointNotFound):
                    pass  # not what this saver wrote last: merge into what is there
                else:
                    self._remember(key, done.etag, merged)
                    return
        else:
            merged = lay.merge_writes([], new) or []
            try:
                done = await self._store.save(
                    stream, lay.pack_writes(merged), parent_id=parent_id, id=key
                )
            except PreconditionFailed:
                pass  # another task or process wrote first: merge into theirs
            else:
                self._remember(key, done.etag, merged)
                return
        await self._merge_stored(key, stream, parent_id, new)

    async def _merge_stored(
        self, key: str, stream: str, parent_id: str, new: builtins.list[lay.Write]
    ) -> None:
        for _ in range(_CAS_ATTEMPTS):
            current = (await self._store.load_many([key])).get(key)
            if current is None:
                merged = lay.merge_writes([], new) or []
                try:
                    done = await self._store.save(
                        stream, lay.pack_writes(merged), parent_id=parent_id, id=key
                    )
                except PreconditionFailed:
                    continue  # another writer created it first: merge into theirs
                self._remember(key, done.etag, merged)
                return
            stored = lay.unpack_writes(current.state, key)
            changed = lay.merge_writes(stored, new)
            if changed is None:
                self._remember(key, current.etag, stored)
                return
            try:
                done = await self._store.update(
                    key, lay.pack_writes(changed), if_match=current.etag
                )
            except (PreconditionFailed, CheckpointNotFound):
                continue  # changed or deleted under us: read again
            self._remember(key, done.etag, changed)
            return
        raise PreconditionFailed(
            f"put_writes lost {_CAS_ATTEMPTS} compare-and-set races on {key!r}; "
            "too many concurrent writers to one checkpoint"
        )
