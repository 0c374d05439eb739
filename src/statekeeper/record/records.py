"""The record types: :class:`NewRecord` (about to be inserted), :class:`StoredRecord`
(as stored, with its bytes in :meth:`~StoredRecord.to_bytes` and back in
:meth:`~StoredRecord.from_bytes`) and :class:`RecordEdits` (what an update changes).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any

from statekeeper.models import CheckpointHeader, trusted_header
from statekeeper.record import frame
from statekeeper.record.header import FORMAT_VERSION, encode_header
from statekeeper.record.verify import Where, verify

__all__ = [
    "NewRecord",
    "RecordEdits",
    "StoredRecord",
    "trusted_new_record",
    "trusted_stored_record",
]


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A checkpoint that is about to be inserted; the backend supplies the sequence.

    Backends call :meth:`seal` inside the critical section that assigns the sequence.
    """

    id: str
    stream: str
    state: bytes
    codec: str
    created_at: datetime
    updated_at: datetime
    etag: str
    parent_id: str | None
    tags: dict[str, str]
    metadata: dict[str, Any]
    ttl: float | None
    expires_at: datetime | None
    #: The store's clock when the write began. Backends judge whether an existing
    #: record with the same id is still live by this, never by ``created_at`` (which
    #: ``import_checkpoint`` copies from another store).
    written_at: datetime | None = None

    @property
    def now(self) -> datetime:
        """When the write began, by the store's clock."""
        return self.written_at if self.written_at is not None else self.updated_at

    def seal(self, sequence: int) -> StoredRecord:
        """The stored form of this record at ``sequence``."""
        # the fields were validated when the record was made; model_construct would
        # cost several times more for the same unvalidated model
        header = trusted_header(
            {
                "id": self.id,
                "stream": self.stream,
                "sequence": sequence,
                "created_at": self.created_at,
                "updated_at": self.updated_at,
                "etag": self.etag,
                "parent_id": self.parent_id,
                "tags": self.tags,
                "metadata": self.metadata,
                "expires_at": self.expires_at,
            }
        )
        return StoredRecord(header=header, state=self.state, codec=self.codec, ttl=self.ttl)


# NewRecord's slot setters, in field order: trusted_new_record sets each slot once,
# as the generated __init__ does, without its object.__setattr__ call per field
(
    _set_id,
    _set_stream,
    _set_state,
    _set_codec,
    _set_created_at,
    _set_updated_at,
    _set_etag,
    _set_parent_id,
    _set_tags,
    _set_metadata,
    _set_ttl,
    _set_expires_at,
    _set_written_at,
) = (NewRecord.__dict__[f.name].__set__ for f in fields(NewRecord))


def trusted_new_record(
    *,
    id: str,
    stream: str,
    state: bytes,
    codec: str,
    created_at: datetime,
    updated_at: datetime,
    etag: str,
    parent_id: str | None,
    tags: dict[str, str],
    metadata: dict[str, Any],
    ttl: float | None,
    expires_at: datetime | None,
    written_at: datetime | None,
) -> NewRecord:
    """``NewRecord(...)`` with the same fields, for the save path (less than half
    the cost of the frozen dataclass's ``__init__``; there is nothing to validate)."""
    record: NewRecord = object.__new__(NewRecord)
    _set_id(record, id)
    _set_stream(record, stream)
    _set_state(record, state)
    _set_codec(record, codec)
    _set_created_at(record, created_at)
    _set_updated_at(record, updated_at)
    _set_etag(record, etag)
    _set_parent_id(record, parent_id)
    _set_tags(record, tags)
    _set_metadata(record, metadata)
    _set_ttl(record, ttl)
    _set_expires_at(record, expires_at)
    _set_written_at(record, written_at)
    return record


@dataclass(frozen=True, slots=True)
class RecordEdits:
    """What an ``update`` replaces besides the state; ``None`` keeps the field."""

    tags: dict[str, str] | None = None
    metadata: dict[str, Any] | None = None
    parent_id: str | None = None

    @property
    def tags_changed(self) -> bool:
        return self.tags is not None


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A checkpoint as stored: its header, its encoded state and its TTL."""

    header: CheckpointHeader
    state: bytes
    codec: str
    ttl: float | None = None

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def sequence(self) -> int:
        return self.header.sequence

    @property
    def stream(self) -> str:
        return self.header.stream

    def is_expired(self, now: datetime) -> bool:
        """Whether this record has expired at ``now`` (it then behaves as deleted)."""
        expires = self.header.expires_at
        return expires is not None and expires <= now

    def updated(
        self,
        state: bytes,
        *,
        now: datetime,
        etag: str,
        edits: RecordEdits | None = None,
        codec: str | None = None,
    ) -> StoredRecord:
        """This record with a new state: same id, sequence and created_at; TTL slides.

        ``edits`` replaces tags, metadata and the parent link where it says so;
        ``codec`` names the codec of the new state (default: unchanged).
        """
        expires_at = now + timedelta(seconds=self.ttl) if self.ttl is not None else None
        update: dict[str, Any] = {"updated_at": now, "etag": etag, "expires_at": expires_at}
        if edits is not None:
            if edits.tags is not None:
                update["tags"] = edits.tags
            if edits.metadata is not None:
                update["metadata"] = edits.metadata
            if edits.parent_id is not None:
                update["parent_id"] = edits.parent_id
        header = self.header.model_copy(update=update)
        return replace(self, header=header, state=state, codec=codec or self.codec)

    def to_bytes(self, store_id: str, *, positional: bool = False) -> bytes:
        """The envelope bytes, with length and checksum.

        ``positional`` leaves the sequence out (``"seq": null``): the backend stores
        it beside the bytes and passes it back as ``expect_sequence`` when reading.
        """
        h = self.header
        head = encode_header(
            {
                "v": FORMAT_VERSION,
                "store": store_id,
                "id": h.id,
                "stream": h.stream,
                "seq": None if positional else h.sequence,
                "created": h.created_at.isoformat(),
                "updated": h.updated_at.isoformat(),
                "etag": h.etag,
                "parent": h.parent_id,
                "tags": h.tags,
                "meta": h.metadata,
                "expires": h.expires_at.isoformat() if h.expires_at else None,
                "ttl": self.ttl,
                "codec": self.codec,
            }
        )
        return frame.join(head, self.state)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        location: Where,
        expect_store_id: str | None = None,
        expect_id: str | None = None,
        expect_sequence: int | None = None,
    ) -> StoredRecord:
        """Parse and verify envelope bytes.

        Raises :class:`CheckpointDecodeError` (with ``location`` and whatever id and
        sequence are known) if the bytes are torn, truncated, fail the checksum,
        carry an unknown format version, or disagree with the expected store id,
        id or sequence (for example a file whose name says sequence 10 but whose
        content says 1). A positional record (``"seq": null``) takes its sequence
        from ``expect_sequence``, and without one it is a decode error.

        ``location`` may also be a function of the sequence that gives it, called
        only for an error (:func:`~statekeeper.record.read_record` passes one).
        """
        values, state, codec, ttl = verify(
            data,
            location,
            expect_store_id=expect_store_id,
            expect_id=expect_id,
            expect_sequence=expect_sequence,
        )
        if cls is StoredRecord:
            return trusted_stored_record(trusted_header(values), state, codec, ttl)
        return cls(header=trusted_header(values), state=state, codec=codec, ttl=ttl)


_stored_header, _stored_state, _stored_codec, _stored_ttl = (
    StoredRecord.__dict__[f.name].__set__ for f in fields(StoredRecord)
)


def trusted_stored_record(
    header: CheckpointHeader, state: bytes, codec: str, ttl: float | None
) -> StoredRecord:
    """``StoredRecord(header=header, state=state, codec=codec, ttl=ttl)`` through its
    slot setters, for read paths whose values are already checked (about half the
    cost of the frozen dataclass's ``__init__``)."""
    record: StoredRecord = object.__new__(StoredRecord)
    _stored_header(record, header)
    _stored_state(record, state)
    _stored_codec(record, codec)
    _stored_ttl(record, ttl)
    return record
