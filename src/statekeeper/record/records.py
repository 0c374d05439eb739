"""The record types: :class:`NewRecord` (about to be inserted), :class:`StoredRecord`
(as stored, with its bytes in :meth:`~StoredRecord.to_bytes` and back in
:meth:`~StoredRecord.from_bytes`) and :class:`RecordEdits` (what an update changes).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any

from statekeeper.models import (
    Checkpoint,
    CheckpointHeader,
    checkpoint_with_state,
    trusted_checkpoint,
    trusted_header,
)
from statekeeper.record import frame
from statekeeper.record.header import FORMAT_VERSION, encode_header
from statekeeper.record.verify import Where, verify

__all__ = [
    "NewRecord",
    "RecordEdits",
    "StoredRecord",
    "Update",
    "checkpoint_of",
    "header_values",
    "trusted_new_record",
    "trusted_stored_record",
    "verified_record",
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
        """The stored form of this record at ``sequence``.

        Its header model is built only if it is asked for (``to_bytes`` and the
        checkpoint a save returns need only its values)."""
        return verified_record(self.header_values(sequence), self.state, self.codec, self.ttl)

    def header_values(self, sequence: int) -> dict[str, Any]:
        """The header fields of this record stored at ``sequence`` (a new dict)."""
        return {
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
class Update:
    """One ``update``, as the core hands it to a backend's ``_update`` primitive:
    replace the state of live checkpoint ``id`` with ``state`` (encoded by the codec
    ``codec``), stamped ``now`` with the new ``etag``, if its etag is ``if_match``
    (``None``: whatever it is), and replace what ``edits`` names (``None``: only
    the state changes). Validated and encoded before it is built."""

    id: str
    state: bytes
    codec: str
    now: datetime
    etag: str
    if_match: str | None = None
    edits: RecordEdits | None = None

    def applied_to(self, current: StoredRecord) -> StoredRecord:
        """``current`` after this update: same id, sequence and created_at, the TTL
        slid from ``now`` (see :meth:`StoredRecord.updated`)."""
        return current.updated(
            self.state, now=self.now, etag=self.etag, edits=self.edits, codec=self.codec
        )


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A checkpoint as stored: its header, its encoded state and its TTL.

    Equal to another ``StoredRecord`` (of any subclass) with equal fields. A record
    that a read verified (:meth:`from_bytes`, :func:`~statekeeper.record.read_record`)
    builds its ``header`` model on first use, from the values it verified.
    """

    header: CheckpointHeader
    state: bytes
    codec: str
    ttl: float | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredRecord):
            return NotImplemented
        return (self.header, self.state, self.codec, self.ttl) == (
            other.header,
            other.state,
            other.codec,
            other.ttl,
        )

    def _fields(self) -> dict[str, Any]:
        """The header's fields by name (read-only), without building a header model."""
        return vars(self.header)

    @property
    def id(self) -> str:
        return self._fields()["id"]  # type: ignore[no-any-return]

    @property
    def sequence(self) -> int:
        return self._fields()["sequence"]  # type: ignore[no-any-return]

    @property
    def stream(self) -> str:
        return self._fields()["stream"]  # type: ignore[no-any-return]

    @property
    def updated_at(self) -> datetime:
        """When it was last written: what retention's ages count from (no header
        model is built for it)."""
        return self._fields()["updated_at"]  # type: ignore[no-any-return]

    def is_expired(self, now: datetime) -> bool:
        """Whether this record has expired at ``now`` (it then behaves as deleted)."""
        expires = self._fields()["expires_at"]
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
        if type(self) is _VerifiedRecord:
            values = {**self._fields(), **update}
            return verified_record(values, state, codec or self.codec, self.ttl)
        header = self.header.model_copy(update=update)
        return replace(self, header=header, state=state, codec=codec or self.codec)

    def to_bytes(self, store_id: str, *, positional: bool = False) -> bytes:
        """The envelope bytes, with length and checksum.

        ``positional`` leaves the sequence out (``"seq": null``): the backend stores
        it beside the bytes and passes it back as ``expect_sequence`` when reading.
        """
        h = self._fields()
        expires = h["expires_at"]
        created, updated = h["created_at"], h["updated_at"]
        created_text = created.isoformat()
        head = encode_header(
            {
                "v": FORMAT_VERSION,
                "store": store_id,
                "id": h["id"],
                "stream": h["stream"],
                "seq": None if positional else h["sequence"],
                "created": created_text,
                # a save's two stamps are one object: one isoformat
                "updated": created_text if updated is created else updated.isoformat(),
                "etag": h["etag"],
                "parent": h["parent_id"],
                "tags": h["tags"],
                "meta": h["metadata"],
                "expires": expires.isoformat() if expires else None,
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
            return verified_record(values, state, codec, ttl)
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


class _VerifiedRecord(StoredRecord):
    """A :class:`StoredRecord` made from checked header values, which builds its
    ``header`` model on first use: a read that returns a checkpoint (or a save that
    returns one) builds that one model from the values, and no header model beside
    it. Pickles and copies as a plain :class:`StoredRecord`."""

    __slots__ = ("_model", "_values")

    _model: CheckpointHeader | None
    _values: dict[str, Any]

    def __init__(
        self, header: CheckpointHeader, state: bytes, codec: str, ttl: float | None = None
    ) -> None:
        # what dataclasses.replace calls: the header is a model already
        _set_model(self, header)
        _set_values(self, _fields_of(header))
        _stored_state(self, state)
        _stored_codec(self, codec)
        _stored_ttl(self, ttl)

    @property
    def header(self) -> CheckpointHeader:
        model = self._model
        if model is None:
            model = trusted_header(self._values)
            _set_model(self, model)
        return model

    def _fields(self) -> dict[str, Any]:
        return self._values

    def __reduce__(self) -> tuple[Any, ...]:
        return (StoredRecord, (self.header, self.state, self.codec, self.ttl))

    def __repr__(self) -> str:
        return repr(StoredRecord(self.header, self.state, self.codec, self.ttl))


_set_model = _VerifiedRecord.__dict__["_model"].__set__
_set_values = _VerifiedRecord.__dict__["_values"].__set__


def verified_record(
    values: dict[str, Any], state: bytes, codec: str, ttl: float | None
) -> StoredRecord:
    """A record from checked header ``values`` (exactly the header fields, as
    :func:`~statekeeper.models.trusted_header` takes them), whose header model is
    built only when it is asked for. ``values`` is kept: the caller must not change
    it."""
    record: _VerifiedRecord = object.__new__(_VerifiedRecord)
    _set_model(record, None)
    _set_values(record, values)
    _stored_state(record, state)
    _stored_codec(record, codec)
    _stored_ttl(record, ttl)
    return record


def header_values(record: StoredRecord) -> dict[str, Any]:
    """``record``'s header fields by name, without building its header model where
    it has none yet. Read-only: the dict may be the record's own."""
    if type(record) is _VerifiedRecord:
        return record._values
    return _fields_of(record.header)


_HEADER_KEYS = tuple(CheckpointHeader.model_fields)


def _fields_of(header: CheckpointHeader) -> dict[str, Any]:
    """A header model's fields by name: its own ``vars`` when it is exactly a
    ``CheckpointHeader``, else (a ``Checkpoint``, a subclass) the header fields only."""
    values = vars(header)
    if type(header) is CheckpointHeader:
        return values
    return {k: values[k] for k in _HEADER_KEYS}


def checkpoint_of(record: StoredRecord, state: Any) -> Checkpoint:
    """The :class:`~statekeeper.models.Checkpoint` of ``record`` with ``state``:
    ``checkpoint_with_state(record.header, state)``, built without the header model
    where the record has none yet (one model per checkpoint a read returns)."""
    if type(record) is _VerifiedRecord:
        return trusted_checkpoint(record._values, state)
    return checkpoint_with_state(record.header, state)
