"""Encryption at rest (SPEC S16) for every backend: the primitives, sealed.

:class:`SealedPrimitives` stands between the public methods of an encrypted store
and its backend. It has the backend's primitives and delegates each of them; those
that carry records seal them on the way in (:class:`~statekeeper.encryption.envelope.Sealer`)
and open them on the way out, so the backend stores and returns envelopes it cannot
read, and the codec sees plaintext only after the tag was checked. A record that
does not open is a :class:`~statekeeper.errors.RecordNotEncrypted` or
:class:`~statekeeper.errors.RecordUndecryptable` (both
:class:`~statekeeper.errors.CheckpointDecodeError`): strict reads raise it, and a
listing reports it in ``skipped``. Nothing falls back to another record.

Every primitive is overridden here, so a new primitive cannot silently bypass the
envelope through a default (a test holds that). Plaintext stores never construct it.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol, TypeVar

from ..config import StoreOptions
from ..encryption.envelope import Refused, Sealer, inner_codec
from ..encryption.keys import Keyring, aesgcm
from ..encryption.providers import resolve_keyring
from ..errors import (
    CheckpointDecodeError,
    CheckpointNotFound,
    ConcurrentModificationError,
    InvalidOptions,
    InvalidQuery,
    PreconditionFailed,
    RecordNotEncrypted,
    RecordUndecryptable,
    StoreFormatError,
)
from ..models import Checkpoint, CheckpointHeader, Problem, RepairReport, Skipped, VerifyReport
from ..record import (
    NewRecord,
    RecordEdits,
    StoredRecord,
    Update,
    header_values,
    trusted_new_record,
    verified_record,
)
from .primitives import StoreIdentity, StorePrimitives
from .query import PageScan, ScanQuery
from .validate import skipped_from

__all__ = ["Encryption", "SealedPrimitives"]

#: How often an update without ``if_match`` re-reads a record that a concurrent
#: writer changed between its read (for the stream the tag binds) and its write.
_UPDATE_TRIES = 8

#: What a write returns (a header, or a checkpoint), with its tags and metadata.
H = TypeVar("H", bound=CheckpointHeader)


class SealedPrimitives(StorePrimitives):
    """The primitives of ``inner`` with every record sealed by ``sealer``;
    ``where(id)`` names a record's location in errors."""

    def __init__(self, inner: StorePrimitives, sealer: Sealer, where: Callable[[str], str]) -> None:
        self._inner = inner
        self._sealer = sealer
        self._where = where

    @property
    def sealer(self) -> Sealer:
        return self._sealer

    @property
    def inner(self) -> StorePrimitives:
        """The backend's own primitives (records as stored, sealed)."""
        return self._inner

    def where(self, id: str) -> str:
        """Where record ``id`` lives, for messages."""
        return self._where(id)

    # -- the envelope -------------------------------------------------------------------

    def seal_new(self, record: NewRecord) -> NewRecord:
        """``record`` with its state sealed (and its tags and metadata, where the
        store encrypts them)."""
        codec, envelope = self._sealer.seal(
            record.id, record.stream, record.codec, record.state, record.tags, record.metadata
        )
        inside = self._sealer.seals_metadata
        # every field as ``dataclasses.replace`` would copy it, through the save path's
        # own constructor: ``replace`` is most of what encryption adds to a 1 KB save
        return trusted_new_record(
            id=record.id,
            stream=record.stream,
            state=envelope,
            codec=codec,
            created_at=record.created_at,
            updated_at=record.updated_at,
            etag=record.etag,
            parent_id=record.parent_id,
            tags={} if inside else record.tags,
            metadata={} if inside else record.metadata,
            ttl=record.ttl,
            expires_at=record.expires_at,
            written_at=record.written_at,
        )

    def open_record(self, record: StoredRecord) -> StoredRecord:
        """``record`` with its state opened (plaintext, in its inner codec), or the
        decode error that says why it does not open."""
        values = header_values(record)
        try:
            opened = self._sealer.open(values["id"], values["stream"], record.codec, record.state)
        except Refused as refused:
            error = RecordNotEncrypted if refused.kind == "plaintext" else RecordUndecryptable
            rid = values["id"]
            raise error(
                refused.reason, id=rid, location=self._where(rid), sequence=values["sequence"]
            ) from None
        if opened.tags is not None:
            values = {**values, "tags": opened.tags, "metadata": opened.metadata}
        return verified_record(values, opened.state, opened.codec, record.ttl)

    def _entries(
        self, entries: builtins.list[StoredRecord | Skipped]
    ) -> builtins.list[StoredRecord | Skipped]:
        out: builtins.list[StoredRecord | Skipped] = []
        for entry in entries:
            if isinstance(entry, Skipped):
                out.append(entry)
                continue
            try:
                out.append(self.open_record(entry))
            except CheckpointDecodeError as exc:
                out.append(skipped_from(exc, entry.id, entry.sequence))
        return out

    def _reveal(self, header: H, tags: dict[str, str], metadata: dict[str, Any]) -> H:
        """What a write returns: with the tags and metadata the caller gave, where the
        backend saw only empty ones."""
        if not self._sealer.seals_metadata:
            return header
        return header.model_copy(update={"tags": tags, "metadata": metadata})

    def check_filters(self, tags: Any, metadata: Any) -> None:
        """Refuse filters on tags or metadata where the envelope seals them. The store
        calls it before a listing: a backend without a native metadata filter is
        scanned with the filter left out, which must not answer it either."""
        if self._sealer.seals_metadata and (tags or metadata):
            raise InvalidQuery(
                "this store encrypts tags and metadata (encrypt_metadata=True), so it "
                "cannot filter on them: filter the listed items yourself, or keep the "
                "fields you filter on out of encrypted metadata"
            )

    def _query(self, query: ScanQuery) -> ScanQuery:
        """The scan the backend runs: always with the states (every listed record is
        opened, so none is returned unauthenticated), and no filter on what the
        backend cannot see."""
        self.check_filters(query.tags, query.metadata)
        return query if query.include_state else replace(query, include_state=True)

    # -- records in -------------------------------------------------------------------

    async def _insert(self, record: NewRecord) -> CheckpointHeader:
        header = await self._inner._insert(self.seal_new(record))
        return self._reveal(header, record.tags, record.metadata)

    async def _insert_checkpoint(self, record: NewRecord, state: Any) -> Checkpoint:
        checkpoint = await self._inner._insert_checkpoint(self.seal_new(record), state)
        return self._reveal(checkpoint, record.tags, record.metadata)

    async def _insert_many(
        self, records: builtins.list[NewRecord]
    ) -> builtins.list[CheckpointHeader]:
        headers = await self._inner._insert_many([self.seal_new(r) for r in records])
        return [self._reveal(h, r.tags, r.metadata) for h, r in zip(headers, records, strict=True)]

    async def _update(self, update: Update) -> CheckpointHeader:
        """Read the record for the stream its tag binds, seal, then write under the
        etag read (a compare-and-set), so a record re-created elsewhere meanwhile
        never gets a state sealed for another stream; without ``if_match``, a
        concurrent change is re-read (bounded), as an unconditional update."""
        id, edits, if_match = update.id, update.edits, update.if_match
        for _ in range(_UPDATE_TRIES):
            current = await self._inner._get(id, update.now)
            if current is None:
                raise CheckpointNotFound(id)
            values = header_values(current)
            tags, metadata, carried = self._current_fields(current, values)
            if edits is not None:
                tags = tags if edits.tags is None else edits.tags
                metadata = metadata if edits.metadata is None else edits.metadata
            sealed_codec, envelope = self._sealer.seal(
                id, values["stream"], update.codec, update.state, tags, metadata
            )
            sealed = replace(
                update,
                state=envelope,
                codec=sealed_codec,
                if_match=values["etag"] if if_match is None else if_match,
                edits=self.edits_for(edits, carried, tags, metadata),
            )
            try:
                header = await self._inner._update(sealed)
            except PreconditionFailed:
                if if_match is not None:
                    raise
                continue
            return self._reveal(header, tags, metadata)
        raise ConcurrentModificationError(
            f"checkpoint {id!r} kept changing while it was updated; retry the update"
        )

    def _current_fields(
        self, current: StoredRecord, values: dict[str, Any]
    ) -> tuple[dict[str, str], dict[str, Any], bool]:
        """The tags and metadata of ``current``, and whether its envelope carries
        them (then it must open to give them) rather than its header. A plaintext
        record is refused (:class:`~statekeeper.errors.RecordNotEncrypted`), as every
        read refuses it: its header's tags and metadata are never sealed as real."""
        if inner_codec(current.codec) is None or self._sealer.carries_metadata(current.state):
            opened = header_values(self.open_record(current))
            return opened["tags"], opened["metadata"], True
        return values["tags"], values["metadata"], False

    def edits_for(
        self,
        edits: RecordEdits | None,
        carried: bool,
        tags: dict[str, str],
        metadata: dict[str, Any],
    ) -> RecordEdits | None:
        """What the backend's update replaces in the header: empty tags and metadata
        where the envelope now carries them, the real ones where it no longer does."""
        parent = None if edits is None else edits.parent_id
        if self._sealer.seals_metadata:
            if carried:  # the header is empty already
                return None if parent is None else RecordEdits(parent_id=parent)
            return RecordEdits(tags={}, metadata={}, parent_id=parent)
        if carried:  # out of the envelope, back into the header
            return RecordEdits(tags=tags, metadata=metadata, parent_id=parent)
        return edits

    # -- records out ------------------------------------------------------------------

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        record = await self._inner._get(id, now)
        return None if record is None else self.open_record(record)

    async def _get_many(self, ids: builtins.list[str], now: datetime) -> dict[str, StoredRecord]:
        found = await self._inner._get_many(ids, now)
        return {rid: self.open_record(record) for rid, record in found.items()}

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        record = await self._inner._latest(stream, now)
        return None if record is None else self.open_record(record)

    async def _scan(self, query: ScanQuery) -> builtins.list[StoredRecord | Skipped]:
        return self._entries(await self._inner._scan(self._query(query)))

    async def _scan_page(self, query: ScanQuery, probe: bool) -> PageScan:
        got = await self._inner._scan_page(self._query(query), probe)
        return PageScan(self._entries(got.entries), got.neighbour)

    # -- the rest, as the backend does it ------------------------------------------------

    async def _open(self) -> StoreIdentity:
        raise AssertionError("the store opens its backend itself")

    async def _close(self) -> None:
        raise AssertionError("the store closes its backend itself")

    async def backdoor_read_raw(self, id: str) -> bytes:
        return await self._inner.backdoor_read_raw(id)

    async def backdoor_write_raw(self, id: str, data: bytes) -> None:
        await self._inner.backdoor_write_raw(id, data)

    async def _delete(self, id: str, *, if_match: str | None, now: datetime) -> bool:
        return await self._inner._delete(id, if_match=if_match, now=now)

    async def _delete_many(self, ids: builtins.list[str], now: datetime) -> int:
        return await self._inner._delete_many(ids, now)

    async def _delete_stream(self, stream: str, now: datetime) -> int:
        return await self._inner._delete_stream(stream, now)

    async def _prune(self, stream: str, keep_last: int, now: datetime) -> int:
        return await self._inner._prune(stream, keep_last, now)

    async def _purge_expired(self, now: datetime) -> int:
        return await self._inner._purge_expired(now)

    async def _reclaim(self, full: bool) -> int | None:
        return await self._inner._reclaim(full)

    async def _list_streams(self, now: datetime) -> builtins.list[str]:
        return await self._inner._list_streams(now)

    async def _list_streams_prefixed(self, now: datetime, prefix: str) -> builtins.list[str]:
        return await self._inner._list_streams_prefixed(now, prefix)

    async def _info(self) -> dict[str, Any]:
        return await self._inner._info()

    async def _verify(self) -> builtins.list[Problem] | None:
        return await self._inner._verify()

    async def _verify_refused(self, error: StoreFormatError) -> VerifyReport | None:
        return await self._inner._verify_refused(error)

    async def _repair(self, drop_damaged: bool) -> RepairReport:
        return await self._inner._repair(drop_damaged)


class _OpenedStore(Protocol):
    """What :meth:`Encryption.check` needs of the store it checks."""

    async def _scan(self, query: ScanQuery) -> builtins.list[StoredRecord | Skipped]: ...

    async def close(self) -> None: ...


class Encryption:
    """A store's ``encryption=`` option, resolved at construction: its keyring and
    whether it seals metadata; :meth:`seal` gives the sealed primitives of the
    opened store, and :meth:`check` refuses a plaintext one. ``rekeying`` is set by
    ``statekeeper rekey`` only."""

    __slots__ = ("keyring", "metadata", "rekeying")

    def __init__(self, keyring: Keyring, metadata: bool) -> None:
        self.keyring = keyring
        self.metadata = metadata
        self.rekeying = False

    @classmethod
    def of(cls, options: StoreOptions) -> Encryption | None:
        """The encryption ``options`` ask for (``None``: plaintext), or
        :class:`~statekeeper.errors.InvalidOptions` saying why they name no keys."""
        if options.encryption is None:
            if options.encrypt_metadata:
                raise InvalidOptions(
                    "encrypt_metadata=True needs encryption= (a Keyring, or 'env')"
                )
            return None
        aesgcm()  # the extra is installed, or say so now rather than at the first save
        return cls(resolve_keyring(options.encryption), options.encrypt_metadata)

    def seal(self, store: StorePrimitives, store_id: str, describe: str) -> SealedPrimitives:
        """The sealed primitives of ``store``, which just opened as ``store_id``
        (``describe`` says where it lives)."""
        sealer = Sealer(self.keyring, store_id, metadata=self.metadata)
        return SealedPrimitives(store, sealer, lambda rid: f"{describe} checkpoint {rid}")

    async def check(self, store: _OpenedStore, describe: str, now: datetime) -> None:
        """Refuse (:class:`~statekeeper.errors.StoreFormatError`, the store closed
        again) a store whose newest record is plaintext, which encryption would make
        unreadable, unless this is ``statekeeper rekey``, which encrypts it. One
        record is read, through the backend, once the store is open (with its sealed
        primitives in place): a backend's reads may need its ``store_id``. ``now`` is
        the store's clock's time."""
        try:
            if not self.rekeying:
                top = await store._scan(ScanQuery(None, "desc", None, 1, {}, now, True))
                if top and isinstance(top[0], StoredRecord) and inner_codec(top[0].codec) is None:
                    raise StoreFormatError(
                        f"{describe} holds plaintext records (the newest, {top[0].id!r}, is "
                        "not encrypted), which a store opened with encryption never reads: "
                        "encrypt the store first with 'statekeeper rekey --url <url>' (with "
                        "STATEKEEPER_KEYS set), or open it without encryption"
                    )
        except BaseException:
            await store.close()
            raise
