"""The record envelope: one checkpoint as checksummed bytes.

Backends persist a checkpoint as one opaque ``bytes`` value made by
:meth:`StoredRecord.to_bytes`, plus whatever index columns they need (stream,
sequence, id, tags, expiry). Reading goes through :meth:`StoredRecord.from_bytes`,
which verifies the length and checksum, so a torn or truncated record is a
:class:`~statekeeper.errors.CheckpointDecodeError`, never valid data.

Layout (format 1)::

    SK1 <header_len> <state_len> <crc32 hex>\\n
    <header JSON, header_len bytes>
    <state bytes, state_len bytes>

``crc32`` covers the header and the state. The header JSON holds the format
version, store id, id, stream, sequence, timestamps, etag, parent id, tags,
metadata, expiry, the TTL that slides on update, and the codec name. The state
bytes are the codec's output and are decoded only when asked for.

A *positional* record (``to_bytes(..., positional=True)``) has ``"seq": null``: its
sequence is where it is stored (a row's key), assigned after the bytes were built.
It is read only with ``expect_sequence``, which then supplies the sequence. A
backend whose sequence comes from the database in the inserting statement uses
it, so no lock is held while the envelope is built.

This package is public for backend authors: a third-party backend should store
these bytes rather than invent its own envelope.

Modules
=======

Data flows one way, each module importing only those listed before it:

- ``frame``: the byte frame (prefix line, lengths, checksum): ``join`` and ``split``.
- ``header``: the header JSON: one encoder, one parser (msgspec into a typed
  struct, then the checks no type can make), giving a header's field values.
- ``verify``: the one body every read of a record runs: frame, header, and the
  expected store id, id and sequence, with every error worded.
- ``records``: :class:`NewRecord`, :class:`StoredRecord` (``to_bytes``,
  ``from_bytes``), :class:`RecordEdits` and :class:`Update` (what ``_update``
  is asked to write); a record that a read verified builds
  its header model only when asked for it (``checkpoint_of`` builds the checkpoint
  a read returns straight from the verified values: one model per checkpoint).
- ``read``: a backend's reads, :func:`read_record` and :func:`read_checkpoint`.

Where encryption at rest goes: the state bytes a record carries are the codec's
output, opaque to this package, and under the checksum. An envelope that seals
them (bound to the store id, id and stream of the header) sits between the codec
and :class:`NewRecord` on the way in, and between :func:`~statekeeper.record.verify.verify`
and the codec on the way out (``read._open_state`` on the listing path); the frame
and the header need no change for it.
"""

from __future__ import annotations

from statekeeper.record.frame import MAGIC
from statekeeper.record.header import FORMAT_VERSION
from statekeeper.record.read import StateDecoder as StateDecoder
from statekeeper.record.read import read_checkpoint as read_checkpoint
from statekeeper.record.read import read_record
from statekeeper.record.records import NewRecord, RecordEdits, StoredRecord, Update

# the save and read paths' constructors of values already checked (exempt from the
# compatibility promise of the names above)
from statekeeper.record.records import checkpoint_of as checkpoint_of
from statekeeper.record.records import header_values as header_values
from statekeeper.record.records import trusted_new_record as trusted_new_record
from statekeeper.record.records import trusted_stored_record as trusted_stored_record
from statekeeper.record.records import verified_record as verified_record

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "NewRecord",
    "RecordEdits",
    "StoredRecord",
    "Update",
    "read_record",
]
