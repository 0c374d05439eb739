"""The saves of one event loop waiting for a group commit (see
:meth:`.store.FileCheckpointStore._insert`), moved here unchanged from
:mod:`.store`."""

from __future__ import annotations

import asyncio

from ...models import CheckpointHeader
from ...record import NewRecord

__all__ = ["_SaveQueue"]


class _SaveQueue:
    """The saves of one event loop waiting for a group commit."""

    __slots__ = ("busy", "drainer", "waiting")

    def __init__(self) -> None:
        #: A save or a group of this loop is in flight.
        self.busy = False
        self.waiting: list[tuple[NewRecord, asyncio.Future[CheckpointHeader]]] = []
        #: The task committing the waiting saves (a reference keeps it alive).
        self.drainer: asyncio.Task[None] | None = None
