"""The engine of the file backend: :class:`FileEngine`, the wiring of its parts.

The writes run under the write lock, through four classes (:class:`.engine.
EngineWrites`, :class:`.recovery.RecoveryMixin`, :class:`.rebuild.RebuildMixin`,
:class:`.core.EngineCore`); the rest are parts with their own state, each given
what it uses: the opening (:mod:`.opening`), the batches (:mod:`.batches`), and
the read side, which takes no lock: the listing (:mod:`.listing`), the strict
reads (:mod:`.reads`) and the pages (:mod:`.pages`). The descriptors kept across
calls are the core's one cache (:mod:`.descriptors`).
"""

from __future__ import annotations

from datetime import datetime

from ...errors import StatekeeperError
from ...models import CheckpointHeader
from ...record import NewRecord
from . import format as fmt
from .batches import Batches
from .core import BatchSync
from .engine import EngineWrites
from .io import FileIO
from .listing import Listing
from .opening import Opening
from .pages import Pages
from .reads import Reader

__all__ = ["FileEngine"]


class FileEngine(EngineWrites):
    """The synchronous engine behind :class:`~.file.FileCheckpointStore`."""

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
        self.opening = Opening(self)
        self.batches = Batches(self)
        self.listing = Listing(self)
        self.reader = Reader(self, self.listing, recover=self.recover_pending)
        self.pages = Pages(self, self.listing, self.reader)

    def open(self, now: datetime) -> fmt.Meta:
        """Open the store (see :meth:`.opening.Opening.open`)."""
        return self.opening.open(now)

    def insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        """``save_many`` (see :meth:`.batches.Batches.insert_many`)."""
        return self.batches.insert_many(records)

    def insert_group(self, records: list[NewRecord]) -> list[CheckpointHeader | StatekeeperError]:
        """A group commit (see :meth:`.batches.Batches.insert_group`)."""
        return self.batches.insert_group(records)

    def delete_many(self, cids: list[str], now: datetime) -> int:
        """``delete_many`` (see :meth:`.batches.Batches.delete_many`)."""
        return self.batches.delete_many(cids, now)
