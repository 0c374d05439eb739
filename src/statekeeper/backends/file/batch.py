"""The engine of the file backend: :class:`FileEngine`, the wiring of its parts.

The engine is its core (:class:`.core.EngineCore`: the files, the state, the write
lock of :mod:`.lock` and the one descriptor cache of :mod:`.descriptors`) and
parts with their own state, each given the parts it uses in its constructor, so
data flows one way: the write side, under the lock (the rebuild, the recovery,
the one-record writes, the batches, the opening) and the read side, which takes
no lock (the listing, the strict reads, the pages).
"""

from __future__ import annotations

from datetime import datetime

from ..._runtime.inline import WORKER, Budget
from ...errors import StatekeeperError
from ...models import CheckpointHeader
from ...record import NewRecord
from . import layout as fmt
from .batches import Batches
from .core import BatchSync, EngineCore
from .engine import Writes
from .io import FileIO
from .listing import Listing
from .opening import Opening
from .pages import Pages
from .reads import Reader
from .rebuild import Rebuild
from .recovery import Recovery

__all__ = ["FileEngine"]


class FileEngine(EngineCore):
    """The synchronous engine behind :class:`~.file.FileCheckpointStore`: the core
    (the files, the state, the lock and the descriptor cache) and its parts."""

    def __init__(
        self,
        root: str,
        io: FileIO,
        *,
        durable: bool,
        lock_timeout: float,
        max_record_bytes: int,
        sync_interval: int,
        batch_sync: BatchSync = "auto",
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        super().__init__(
            root,
            io,
            durable=durable,
            lock_timeout=lock_timeout,
            max_record_bytes=max_record_bytes,
            sync_interval=sync_interval,
            batch_sync=batch_sync,
            create=create,
            read_only=read_only,
        )
        # the write side, under the lock
        self.rebuild = Rebuild(self)
        self.recovery = Recovery(self, self.rebuild)
        self.writes = Writes(self, self.rebuild, self.recovery)
        self.batches = Batches(self, self.rebuild, self.recovery, self.writes)
        self.opening = Opening(self, self.rebuild, self.recovery)
        # the read side, which takes no lock
        self.listing = Listing(self)
        self.reader = Reader(self, self.listing, recover=self.recovery.recover_pending)
        self.pages = Pages(self, self.listing, self.reader)

    def open(self, now: datetime) -> fmt.Meta:
        """Open the store (see :meth:`.opening.Opening.open`)."""
        return self.opening.open(now)

    # the save path's calls (the store's group commit makes them)

    def insert(self, record: NewRecord, budget: Budget = WORKER) -> CheckpointHeader:
        """One save (see :meth:`.engine.Writes.insert`)."""
        return self.writes.insert(record, budget)

    def insert_group(self, records: list[NewRecord]) -> list[CheckpointHeader | StatekeeperError]:
        """A group commit (see :meth:`.batches.Batches.insert_group`)."""
        return self.batches.insert_group(records)
