"""``memory://``: the in-memory backend, and the official fake for application tests.

Data lives in a :class:`MemoryStorage` owned by the store instance, never in a
module global, so two stores never see each other's data. Pass the same
``storage=`` to a second store to simulate a restart of the same process.

It is faithful rather than lenient: states go through the same codec and the same
record envelope as the persistent backends, so a test that passes here does not
fail in production because of state production cannot store.

Costs: ``get_latest`` is O(1) amortised, a page is O(log n + page), ``save`` is
O(1) amortised, ``delete`` is O(n) in the worst case (a list removal). A save
without metadata leaves its envelope bytes to be built on first use (a read, a raw
read), from the very values the save saw, so that cost moves from the save to the
first read. A record's envelope is parsed and verified on its first read and kept
beside its bytes (so a checkpoint that was read takes about twice its size); states
are decoded on every read, through the store's codec.

**For backend authors reading this as an example:** it imports what a plugin may
(the exports of ``statekeeper``, ``statekeeper.errors`` and ``statekeeper.record``)
with two exceptions, private constructors that skip validation of values already
checked: ``statekeeper.models.trusted_header`` (instead of
``CheckpointHeader.model_construct``, about 9x its cost) and
``statekeeper.record.trusted_stored_record`` (instead of ``StoredRecord(...)``,
about 1.5x). With the public forms this store's ``save`` took 1.8x, ``get_latest``
1.7x and a page of 20 2.0x as long (medians of 7 interleaved rounds of 2000 calls on
one stream). They are exempt from the compatibility promise of the public API, so a
plugin should not use them; the from-scratch backend of the backend author guide
needs neither.
"""

from __future__ import annotations

import secrets
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from statekeeper import (
    BaseCheckpointStore,
    Capabilities,
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
from statekeeper.record import NewRecord, RecordEdits, StoredRecord

# private, for speed: see the module docstring
from ..models import trusted_header
from ..record import trusted_stored_record

__all__ = ["MemoryCheckpointStore", "MemoryStorage"]


class _Entry:
    """One checkpoint: its index fields and its envelope bytes.

    ``blob`` is built on first use when the save left it pending (see
    :meth:`MemoryCheckpointStore._insert_locked`): the same bytes, from the same
    values, that the save would have built. Every reader holds the store's lock.
    """

    __slots__ = (
        "_blob",
        "_pending",
        "_store_id",
        "expires_at",
        "parsed",
        "sequence",
        "stream",
        "tags",
    )

    def __init__(
        self,
        sequence: int,
        stream: str,
        blob: bytes | None,
        tags: dict[str, str],
        expires_at: datetime | None,
        parsed: tuple[bytes | None, StoredRecord] | None = None,
        pending: NewRecord | None = None,
        store_id: str = "",
    ) -> None:
        self.sequence = sequence
        self.stream = stream
        self._blob = blob
        #: the record ``blob`` is built from (with ``store_id``), until it is built
        self._pending = pending
        self._store_id = store_id
        #: the store's own copy (the tag filter reads it): no caller holds it
        self.tags = tags
        self.expires_at = expires_at
        #: ``blob`` parsed and verified once (see ``_parse``), with the very bytes it
        #: came from (``None``: the pending envelope): it is reused only while
        #: ``blob`` is still those bytes
        self.parsed = parsed

    @property
    def blob(self) -> bytes:
        blob = self._blob
        if blob is None:
            stored = self._pending_record()
            assert stored is not None
            blob = self._blob = stored.to_bytes(self._store_id)
            self._pending = None
        return blob

    @blob.setter
    def blob(self, value: bytes) -> None:
        self._blob = value
        self._pending = None

    def _pending_record(self) -> StoredRecord | None:
        """The record a pending envelope is built from (``None`` when none is pending).

        The values the save saw: the entry's own tags, and the metadata that made
        the save leave the envelope pending (none: see ``_insert_locked``). This is
        what ``record.seal`` builds with those two fields (``dataclasses.replace``
        would cost more than the envelope).
        """
        record = self._pending
        if record is None:
            return None
        header = trusted_header(
            {
                "id": record.id,
                "stream": record.stream,
                "sequence": self.sequence,
                "created_at": record.created_at,
                "updated_at": record.updated_at,
                "etag": record.etag,
                "parent_id": record.parent_id,
                "tags": self.tags,
                "metadata": {},
                "expires_at": record.expires_at,
            }
        )
        return StoredRecord(header=header, state=record.state, codec=record.codec, ttl=record.ttl)

    def read_pending(self) -> StoredRecord | None:
        """What parsing the pending envelope would give, without building it, or
        ``None`` when nothing is pending or the parse could differ.

        Every field round-trips through the envelope unchanged (strings without
        surrogates, ints, a float TTL, str tags, no metadata) except the timestamps:
        those are taken as they are only when each is an exact ``datetime`` in
        ``timezone.utc`` with ``fold`` 0 (the default clock's), which ``isoformat``
        and ``fromisoformat`` give back equal, in the same ``timezone.utc``. Any
        other clock (a ``ZoneInfo``, a naive time) is read from the bytes.
        """
        record = self._pending
        if record is None:
            return None
        for stamp in (record.created_at, record.updated_at, record.expires_at):
            if stamp is not None and (
                type(stamp) is not datetime or stamp.tzinfo is not UTC or stamp.fold
            ):
                return None
        return self._pending_record()

    def live(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at > now


_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})


def _json_copy(value: Any) -> Any:
    """A deep copy of a parsed JSON value (containers new, scalars shared: immutable)."""
    t = type(value)
    if t is dict:
        if _SCALARS.issuperset(map(type, value.values())):
            return value.copy()
        return {k: _json_copy(v) for k, v in value.items()}
    if t is list:
        if _SCALARS.issuperset(map(type, value)):
            return value.copy()
        return [_json_copy(v) for v in value]
    return value


def _fresh(record: StoredRecord) -> StoredRecord:
    """``record`` with a header of its own: the caller may mutate tags and metadata."""
    values = record.header.__dict__.copy()
    values["tags"] = values["tags"].copy()
    values["metadata"] = _json_copy(values["metadata"])
    return trusted_stored_record(trusted_header(values), record.state, record.codec, record.ttl)


@dataclass
class MemoryStorage:
    """The data of one in-memory store. Share it between instances to simulate reopen."""

    store_id: str = field(default_factory=lambda: secrets.token_hex(16))
    cursor_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    high_water_mark: int = 0
    by_id: dict[str, _Entry] = field(default_factory=dict)
    by_seq: dict[int, str] = field(default_factory=dict)
    all_seqs: list[int] = field(default_factory=list)
    stream_seqs: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)


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
        data = self.storage
        problems: list[Problem] = []
        with data.lock:
            by_stream = {s: set(seqs) for s, seqs in data.stream_seqs.items()}
            for id, entry in data.by_id.items():
                if (
                    data.by_seq.get(entry.sequence) != id
                    or entry.sequence not in by_stream.get(entry.stream, ())
                    or entry.sequence > data.high_water_mark
                ):
                    problems.append(
                        Problem(
                            kind="index",
                            location=self._location(entry),
                            reason="the in-memory maps disagree about this checkpoint",
                            id=id,
                            sequence=entry.sequence,
                            stream=entry.stream,
                        )
                    )
            if len(data.all_seqs) != len(data.by_id):
                problems.append(
                    Problem(
                        kind="index",
                        location="memory://",
                        reason=f"{len(data.all_seqs)} sequences are listed for "
                        f"{len(data.by_id)} checkpoints",
                    )
                )
        return problems

    async def _close(self) -> None:
        return None

    # -- helpers ---------------------------------------------------------------------

    def _location(self, entry: _Entry) -> str:
        return f"memory:seq={entry.sequence}"

    def _parse(self, id: str, entry: _Entry) -> StoredRecord:
        """The verified record of ``entry``'s bytes (call with the lock held).

        The bytes are parsed and verified through the envelope once, as any backend
        reads them, and the result is kept beside them; a pending envelope is not
        built for this when its values are known to round-trip (see
        :meth:`_Entry.read_pending`). It is reused only while the entry holds those
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
            return _fresh(parsed[1])
        except RecursionError:  # metadata nested too deep to copy: a parse of its own
            return self._read(id, entry)

    def _read(self, id: str, entry: _Entry) -> StoredRecord:
        return StoredRecord.from_bytes(
            entry.blob,
            location=self._location(entry),
            expect_store_id=self.storage.store_id,
            expect_id=id,
            expect_sequence=entry.sequence,
        )

    def _live_entry(self, id: str, now: datetime) -> _Entry | None:
        entry = self.storage.by_id.get(id)
        return entry if entry is not None and entry.live(now) else None

    def _unlink(self, id: str, entry: _Entry) -> None:
        data = self.storage
        del data.by_id[id]
        del data.by_seq[entry.sequence]
        _remove_sorted(data.all_seqs, entry.sequence)
        seqs = data.stream_seqs[entry.stream]
        _remove_sorted(seqs, entry.sequence)
        if not seqs:
            del data.stream_seqs[entry.stream]

    # -- primitives ------------------------------------------------------------------

    async def _insert(self, record: NewRecord) -> CheckpointHeader:
        data = self.storage
        with data.lock:
            # _check_free, inline: one call less on every save
            existing = data.by_id.get(record.id)
            if existing is not None and existing.live(record.now):
                raise PreconditionFailed(f"checkpoint id {record.id!r} already exists")
            return self._insert_locked(record)

    async def _insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        # one hold of the lock: consecutive sequences, and no reader sees half
        with self.storage.lock:
            for record in records:
                self._check_free(record)
            return [self._insert_locked(record) for record in records]

    def _check_free(self, record: NewRecord) -> None:
        existing = self.storage.by_id.get(record.id)
        if existing is not None and existing.live(record.now):
            raise PreconditionFailed(f"checkpoint id {record.id!r} already exists")

    def _insert_locked(self, record: NewRecord) -> CheckpointHeader:
        """Insert ``record`` at the next sequence; the caller holds the lock.

        Without metadata the envelope is left pending and built on first use (a
        read, ``backdoor_read_raw``): it would be built from the same immutable
        values and the entry's own tags, so the bytes are the same, and with no
        metadata nothing in it can fail to encode. With metadata it is built now,
        so an error raises here, and the caller's later changes to the metadata it
        passed never reach the store.
        """
        data = self.storage
        by_id = data.by_id
        rid = record.id
        existing = by_id.get(rid)
        if existing is not None:  # expired: _check_free let it through
            self._unlink(rid, existing)
        seq = data.high_water_mark + 1
        stream = record.stream
        if record.metadata:
            blob = record.seal(seq).to_bytes(data.store_id)
            entry = _Entry(seq, stream, blob, record.tags.copy(), record.expires_at)
        else:
            entry = _Entry(
                seq,
                stream,
                None,
                record.tags.copy(),
                record.expires_at,
                None,
                record,
                data.store_id,
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
        return trusted_header(
            {
                "id": rid,
                "stream": stream,
                "sequence": seq,
                "created_at": record.created_at,
                "updated_at": record.updated_at,
                "etag": record.etag,
                "parent_id": record.parent_id,
                "tags": record.tags,
                "metadata": record.metadata,
                "expires_at": record.expires_at,
            }
        )

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

    async def _update(
        self,
        id: str,
        *,
        state: bytes,
        if_match: str | None,
        now: datetime,
        etag: str,
        edits: RecordEdits | None = None,
        codec: str | None = None,
    ) -> CheckpointHeader:
        data = self.storage
        with data.lock:
            entry = self._live_entry(id, now)
            if entry is None:
                raise CheckpointNotFound(id)
            current = self._parse(id, entry)
            if if_match is not None and current.header.etag != if_match:
                raise PreconditionFailed(
                    f"checkpoint {id!r} has etag {current.header.etag!r}, not {if_match!r}"
                )
            new = current.updated(state, now=now, etag=etag, edits=edits, codec=codec)
            entry.blob = new.to_bytes(data.store_id)
            entry.expires_at = new.header.expires_at
            entry.tags = dict(new.header.tags)
            return new.header

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        with self.storage.lock:
            entry = self._live_entry(id, now)
            return None if entry is None else self._parse(id, entry)

    def _iter(self, query: ScanQuery) -> Iterator[tuple[str, _Entry]]:
        data = self.storage
        seqs = data.all_seqs if query.stream is None else data.stream_seqs.get(query.stream, [])
        if query.order == "asc":
            start = 0 if query.bound is None else bisect_right(seqs, query.bound)
            indices: range = range(start, len(seqs))
        else:
            stop = len(seqs) if query.bound is None else bisect_left(seqs, query.bound)
            indices = range(stop - 1, -1, -1)
        for i in indices:
            rid = data.by_seq[seqs[i]]
            yield rid, data.by_id[rid]

    async def _scan(self, query: ScanQuery) -> list[StoredRecord | Skipped]:
        out: list[StoredRecord | Skipped] = []
        with self.storage.lock:
            for rid, entry in self._iter(query):
                if not entry.live(query.now):
                    continue
                if query.tags and any(entry.tags.get(k) != v for k, v in query.tags.items()):
                    continue
                try:
                    out.append(self._parse(rid, entry))
                except CheckpointDecodeError as exc:
                    out.append(skipped_from(exc, rid, entry.sequence))
                if len(out) >= query.limit:
                    break
        return out

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        with self.storage.lock:
            for rid, entry in self._iter(ScanQuery(stream, "desc", None, 1, {}, now)):
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
        data = self.storage
        with data.lock:
            return {
                "checkpoints": len(data.by_id),
                "streams": len(data.stream_seqs),
                "high_water_mark": data.high_water_mark,
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


def _remove_sorted(seqs: list[int], value: int) -> None:
    i = bisect_left(seqs, value)
    if i < len(seqs) and seqs[i] == value:
        del seqs[i]
