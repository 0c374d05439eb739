"""A backend's reads of a record: :func:`read_record` and :func:`read_checkpoint`.

:func:`read_record` is :meth:`~statekeeper.record.records.StoredRecord.from_bytes`
with the location given as a function of the sequence, called only when a read
fails; :func:`read_checkpoint` runs the same body,
:func:`~statekeeper.record.verify.verify`, so a record reads the same, or fails with
the same words, whichever a backend calls.

:func:`read_checkpoint` is also the one place a record's state bytes meet a codec
on the listing paths (``_open_state``): a layer that unwraps state bytes (an
encryption envelope bound to the header's store id, id and stream) belongs there,
between the verified frame and the codec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from statekeeper.errors import CheckpointDecodeError
from statekeeper.models import Checkpoint, trusted_checkpoint
from statekeeper.record.records import StoredRecord, verified_record
from statekeeper.record.verify import verify

__all__ = ["StateDecoder", "read_checkpoint", "read_record"]


class StateDecoder(Protocol):
    """What :func:`read_checkpoint` decodes a state with (a store's codecs)."""

    def decode(self, data: bytes) -> Any: ...


def read_record(
    data: bytes,
    location_of: Callable[[int], str],
    *,
    store_id: str | None,
    id: str,
    sequence: int,
) -> StoredRecord:
    """``StoredRecord.from_bytes(data, location=location_of(sequence),
    expect_store_id=store_id, expect_id=id, expect_sequence=sequence)``, for a
    backend's reads: that very call, with the location built only for an error."""
    return StoredRecord.from_bytes(
        data,
        location=location_of,
        expect_store_id=store_id,
        expect_id=id,
        expect_sequence=sequence,
    )


def read_checkpoint(
    data: bytes,
    location_of: Callable[[int], str],
    *,
    store_id: str | None,
    id: str,
    sequence: int,
    decoders: Mapping[str, StateDecoder],
) -> Checkpoint | StoredRecord:
    """:func:`read_record`, then its state decoded by ``decoders[codec]``: the
    :class:`~statekeeper.models.Checkpoint` that
    ``BaseCheckpointStore._decode_strict`` gives for that record, built without the
    record and header in between (a listed page's hot path).

    A record whose codec is not in ``decoders``, or whose state its codec refuses,
    is returned as the record :func:`read_record` gives, and the caller decodes it
    the usual way, which words the error; a record that does not verify raises as
    :func:`read_record` does.
    """
    values, state, codec, ttl = verify(
        data, location_of, expect_store_id=store_id, expect_id=id, expect_sequence=sequence
    )
    decoder = decoders.get(codec)
    if decoder is not None:
        decoded = _open_state(decoder, state)
        if decoded is not _REFUSED:
            return trusted_checkpoint(values, decoded)
    return verified_record(values, state, codec, ttl)


_REFUSED: Any = object()


def _open_state(decoder: StateDecoder, state: bytes) -> Any:
    """The decoded state, or ``_REFUSED`` when its codec refuses it (the caller's
    decode raises that error again, with the record named)."""
    try:
        return decoder.decode(state)
    except CheckpointDecodeError:
        return _REFUSED
