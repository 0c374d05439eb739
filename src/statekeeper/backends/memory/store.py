"""``MemoryCheckpointStore``: the primitives over a :class:`~.storage.MemoryStorage`.

What it imports and why, and what each operation costs, is in the package
docstring (:mod:`statekeeper.backends.memory`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from datetime import datetime
from typing import Any, ClassVar

from statekeeper import (
    BaseCheckpointStore,
    Capabilities,
    Checkpoint,
    CheckpointHeader,
    Problem,
    ScanQuery,
    Skipped,
    StoreIdentity,
    skipped_from,
)
from statekeeper.errors import (
    CheckpointDecodeError,
    CheckpointNotFound,
    PreconditionFailed,
    StoreNotFound,
)
from statekeeper.record import NewRecord, StoredRecord, Update

# private, for speed: see the package docstring
from ...models import trusted_checkpoint, trusted_header
from .storage import Entry, MemoryStorage, fresh, own_metadata, remove_sorted

__all__ = ["MemoryCheckpointStore"]


class MemoryCheckpointStore(BaseCheckpointStore):
    """A :class:`~statekeeper.CheckpointStore` held in process memory.

    Not durable and not shared across processes (see :attr:`capabilities`). All
    operations are atomic with respect to each other, across tasks and threads.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(
        persistent=False,
        cross_process=False,
        power_loss_durable=False,
        ttl=True,
        raw_access=True,
        atomic_batches=True,
    )
    backend_name: ClassVar[str] = "memory"

    def __init__(self, *, storage: MemoryStorage | None = None, **options: Any) -> None:
        super().__init__(**options)
        #: ``memory://`` with ``create=False`` names no existing store unless a
        #: ``storage=`` of an earlier store is passed.
        self._exists = storage is not None
        self.storage = storage if storage is not None else MemoryStorage()

    async def _open(self) -> StoreIdentity:
        if not self._exists and not self.options.create:
            raise StoreNotFound(
                "memory:// with create=False names no existing store; pass the storage= "
                "of an earlier store to reopen it"
            )
        self._exists = True
        return StoreIdentity(self.storage.store_id, self.storage.cursor_key, 1)

    async def _verify(self) -> list[Problem]:
        """Check that the id map, the sequence map and the sorted lists agree."""
        return self.storage.problems()

    async def _close(self) -> None:
        return None

    # -- helpers ---------------------------------------------------------------------

    def _location(self, entry: Entry) -> str:
        return entry.location

    def _parse(self, id: str, entry: Entry) -> StoredRecord:
        """The verified record of ``entry``'s bytes (call with the lock held).

        The bytes are parsed and verified through the envelope once, as any backend
        reads them, and the result is kept beside them; a pending envelope is not
        built for this when its values are known to round-trip (see
        :meth:`Entry.read_pending`). It is reused only while the entry holds those
        very bytes, or still none (an update or a backdoor write replaces them),
        and every read gets a header of its own, so what a caller does with a
        returned checkpoint never reaches the store. States are decoded per read.
        """
        blob = entry._blob  # None while the envelope is pending
        parsed = entry.parsed
        if parsed is None or parsed[0] is not blob:
            record = None if blob is not None else entry.read_pending()
            if record is None:
                blob = entry.blob
                record = self._read(id, entry)
            entry.parsed = parsed = (blob, record)
        try:
            return fresh(parsed[1])
        except RecursionError:  # metadata nested too deep to copy: a parse of its own
            return self._read(id, entry)

    def _read(self, id: str, entry: Entry) -> StoredRecord:
        return StoredRecord.from_bytes(
            entry.blob,
            location=self._location(entry),
            expect_store_id=self.storage.store_id,
            expect_id=id,
            expect_sequence=entry.sequence,
        )

    def _live_entry(self, id: str, now: datetime) -> Entry | None:
        entry = self.storage.by_id.get(id)
        return entry if entry is not None and entry.live(now) else None

    def _unlink(self, id: str, entry: Entry) -> None:
        data = self.storage
        del data.by_id[id]
        del data.by_seq[entry.sequence]
        remove_sorted(data.all_seqs, entry.sequence)
        seqs = data.stream_seqs[entry.stream]
        remove_sorted(seqs, entry.sequence)
        if not seqs:
            del data.stream_seqs[entry.stream]

    # -- primitives ------------------------------------------------------------------

    async def _insert(self, record: NewRecord) -> CheckpointHeader:
        with self.storage.lock:
            self._check_free(record)
            return trusted_header(record.header_values(self._insert_locked(record)))

    async def _insert_checkpoint(self, record: NewRecord, state: Any) -> Checkpoint:
        # save's path: the checkpoint it returns is the one model built
        if type(self)._insert is not MemoryCheckpointStore._insert:
            # a subclass's own _insert (a test's mutant) still decides every save
            return await super()._insert_checkpoint(record, state)
        data = self.storage
        with data.lock:
            # _check_free, inline: one call less on every save
            existing = data.by_id.get(record.id)
            if existing is not None and existing.live(record.now):
                raise PreconditionFailed(f"checkpoint id {record.id!r} already exists")
            seq = self._insert_locked(record)
        return trusted_checkpoint(record.header_values(seq), state)

    async def _insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        # one hold of the lock: consecutive sequences, and no reader sees half
        with self.storage.lock:
            for record in records:
                self._check_free(record)
            seqs = [self._insert_locked(record) for record in records]
        return [trusted_header(r.header_values(s)) for r, s in zip(records, seqs, strict=True)]

    def _check_free(self, record: NewRecord) -> None:
        existing = self.storage.by_id.get(record.id)
        if existing is not None and existing.live(record.now):
            raise PreconditionFailed(f"checkpoint id {record.id!r} already exists")

    def _insert_locked(self, record: NewRecord) -> int:
        """Insert ``record`` at the next sequence and return it; the caller holds the
        lock.

        The envelope is left pending and built on first use (a read,
        ``backdoor_read_raw``): it would be built from the same immutable values,
        the entry's own tags and its own copy of the metadata (see
        :func:`~.storage.own_metadata`), so the bytes are the same, and the caller's
        later changes to the tags or metadata it passed never reach the store.
        """
        data = self.storage
        by_id = data.by_id
        rid = record.id
        existing = by_id.get(rid)
        if existing is not None:  # expired: _check_free let it through
            self._unlink(rid, existing)
        seq = data.high_water_mark + 1
        stream = record.stream
        metadata = record.metadata
        entry = Entry(
            seq,
            stream,
            None,
            record.tags.copy(),
            record.expires_at,
            None,
            record,
            data.store_id,
            own_metadata(metadata) if metadata else None,
        )
        data.high_water_mark = seq
        by_id[rid] = entry
        data.by_seq[seq] = rid
        data.all_seqs.append(seq)
        seqs = data.stream_seqs.get(stream)
        if seqs is None:
            data.stream_seqs[stream] = [seq]
        else:
            seqs.append(seq)
        return seq

    async def _get_many(self, ids: list[str], now: datetime) -> dict[str, StoredRecord]:
        with self.storage.lock:
            found = {id: self._live_entry(id, now) for id in ids}
            return {id: self._parse(id, e) for id, e in found.items() if e is not None}

    async def _delete_many(self, ids: list[str], now: datetime) -> int:
        data = self.storage
        with data.lock:
            removed = 0
            for id in ids:
                entry = self._live_entry(id, now)
                if entry is not None:
                    self._unlink(id, entry)
                    removed += 1
            return removed

    async def _update(self, update: Update) -> CheckpointHeader:
        data = self.storage
        id, if_match = update.id, update.if_match
        with data.lock:
            entry = self._live_entry(id, update.now)
            if entry is None:
                raise CheckpointNotFound(id)
            current = self._parse(id, entry)
            if if_match is not None and current.header.etag != if_match:
                raise PreconditionFailed(
                    f"checkpoint {id!r} has etag {current.header.etag!r}, not {if_match!r}"
                )
            new = update.applied_to(current)
            entry.blob = new.to_bytes(data.store_id)
            entry.expires_at = new.header.expires_at
            entry.tags = dict(new.header.tags)
            return new.header

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        with self.storage.lock:
            entry = self._live_entry(id, now)
            return None if entry is None else self._parse(id, entry)

    def _iter(self, query: ScanQuery) -> Iterator[tuple[str, Entry]]:
        data = self.storage
        seqs = data.all_seqs if query.stream is None else data.stream_seqs.get(query.stream, [])
        if query.order == "asc":
            start = 0 if query.bound is None else bisect_right(seqs, query.bound)
            indices: range = range(start, len(seqs))
        else:
            stop = len(seqs) if query.bound is None else bisect_left(seqs, query.bound)
            indices = range(stop - 1, -1, -1)
        by_seq, by_id = data.by_seq, data.by_id
        for i in indices:
            rid = by_seq[seqs[i]]
            yield rid, by_id[rid]

    async def _scan(self, query: ScanQuery) -> list[StoredRecord | Skipped]:
        out: list[StoredRecord | Skipped] = []
        now, tags, limit = query.now, query.tags, query.limit
        with self.storage.lock:
            for rid, entry in self._iter(query):
                expires = entry.expires_at  # entry.live(now), inline: once per entry
                if expires is not None and expires <= now:
                    continue
                if tags and any(entry.tags.get(k) != v for k, v in tags.items()):
                    continue
                try:
                    out.append(self._parse(rid, entry))
                except CheckpointDecodeError as exc:
                    out.append(skipped_from(exc, rid, entry.sequence))
                if len(out) >= limit:
                    break
        return out

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        # the newest live entry of the stream: _iter's descending walk, without a query
        data = self.storage
        with data.lock:
            seqs = data.stream_seqs.get(stream)
            if seqs:
                by_seq, by_id = data.by_seq, data.by_id
                for i in range(len(seqs) - 1, -1, -1):
                    rid = by_seq[seqs[i]]
                    entry = by_id[rid]
                    if entry.live(now):
                        return self._parse(rid, entry)
        return None

    async def _delete(self, id: str, *, if_match: str | None, now: datetime) -> bool:
        data = self.storage
        with data.lock:
            entry = self._live_entry(id, now)
            if entry is None:
                return False
            if if_match is not None:
                current = self._parse(id, entry)
                if current.header.etag != if_match:
                    raise PreconditionFailed(
                        f"checkpoint {id!r} has etag {current.header.etag!r}, not {if_match!r}"
                    )
            self._unlink(id, entry)
            return True

    async def _delete_stream(self, stream: str, now: datetime) -> int:
        data = self.storage
        with data.lock:
            seqs = list(data.stream_seqs.get(stream, []))
            removed = 0
            for seq in seqs:
                rid = data.by_seq[seq]
                entry = data.by_id[rid]
                removed += entry.live(now)
                self._unlink(rid, entry)
            return removed

    async def _prune(self, stream: str, keep_last: int, now: datetime) -> int:
        data = self.storage
        with data.lock:
            seqs = data.stream_seqs.get(stream, [])
            live = [s for s in seqs if data.by_id[data.by_seq[s]].live(now)]
            doomed = live[: max(len(live) - keep_last, 0)]
            for seq in doomed:
                rid = data.by_seq[seq]
                self._unlink(rid, data.by_id[rid])
            return len(doomed)

    async def _purge_expired(self, now: datetime) -> int:
        data = self.storage
        with data.lock:
            doomed = [(rid, e) for rid, e in data.by_id.items() if not e.live(now)]
            for rid, entry in doomed:
                self._unlink(rid, entry)
            return len(doomed)

    async def _list_streams(self, now: datetime) -> list[str]:
        data = self.storage
        with data.lock:
            return [
                name
                for name, seqs in data.stream_seqs.items()
                if any(data.by_id[data.by_seq[s]].live(now) for s in reversed(seqs))
            ]

    async def _info(self) -> dict[str, Any]:
        data, now = self.storage, self.now()
        with data.lock:
            live = [e for e in data.by_id.values() if e.live(now)]
            expired = len(data.by_id) - len(live)
            return {
                "checkpoints": len(live),
                "streams": len({e.stream for e in live}),
                "high_water_mark": data.high_water_mark,
                **({"expired": expired} if expired else {}),
            }

    # -- backdoor --------------------------------------------------------------------

    async def backdoor_read_raw(self, id: str) -> bytes:
        with self.storage.lock:
            entry = self.storage.by_id.get(id)
            if entry is None:
                raise CheckpointNotFound(id)
            return entry.blob

    async def backdoor_write_raw(self, id: str, data: bytes) -> None:
        with self.storage.lock:
            entry = self.storage.by_id.get(id)
            if entry is None:
                raise CheckpointNotFound(id)
            entry.blob = bytes(data)
