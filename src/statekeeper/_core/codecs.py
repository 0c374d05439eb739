"""A store's codecs, built from its options, and the strict decode of a record.

Every store encodes metadata with the JSON codec and new states with the codec its
``codec`` option names; it decodes a record with the codec the record names, so a
store reads records of either codec whatever it writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._runtime.context import note_bytes
from ..codec import Codec, CodecLimits
from ..config import StoreOptions
from ..encryption.envelope import SEALED_PREFIX, key_id_of
from ..errors import CheckpointDecodeError, InvalidOptions
from ..models import Checkpoint
from ..rawcodec import RawCodec
from ..record import StoredRecord, checkpoint_of

__all__ = ["StoreCodecs", "decode_strict", "store_codecs"]

StateCodec = Codec | RawCodec


@dataclass(frozen=True, slots=True)
class StoreCodecs:
    """``json``: metadata always, and states when ``codec="json"``; ``state``: what
    new states are encoded with; ``decoders``: every codec by the name records carry."""

    json: Codec
    state: StateCodec
    decoders: dict[str, StateCodec]


def store_codecs(options: StoreOptions) -> StoreCodecs:
    """The codecs ``options`` ask for; a bad codec option raises :class:`InvalidOptions`."""
    limits = CodecLimits(
        max_depth=options.max_depth,
        max_bytes=options.max_bytes,
        max_int_digits=options.max_int_digits,
        allow_nan=options.allow_nan,
    )
    try:
        json_codec = Codec(allowed_types=options.allowed_types, limits=limits)
    except ValueError as exc:
        if isinstance(exc, InvalidOptions):
            raise
        raise InvalidOptions(str(exc)) from exc
    raw = RawCodec(max_bytes=options.max_bytes)
    state: StateCodec = raw if options.codec == "raw" else json_codec
    return StoreCodecs(json_codec, state, {Codec.name: json_codec, raw.name: raw})


def decode_strict(decoders: dict[str, StateCodec], record: StoredRecord) -> Checkpoint:
    """Decode ``record``'s state with the codec it names, or raise
    :class:`CheckpointDecodeError` naming the record."""
    note_bytes(len(record.state))  # telemetry's state size (S18): a no-op when off
    decoder = decoders.get(record.codec)
    if decoder is None:
        reason = f"unknown codec {record.codec!r}"
        if record.codec.startswith(SEALED_PREFIX):
            kid = key_id_of(record.codec, record.state)
            reason = (
                f"record is encrypted (key id {kid!r}) and this store was opened without "
                "encryption: open it with encryption= (a Keyring, or 'env')"
            )
        raise CheckpointDecodeError(reason, id=record.id, sequence=record.sequence)
    try:
        state = decoder.decode(record.state)
    except CheckpointDecodeError as exc:
        raise CheckpointDecodeError(
            exc.reason, id=record.id, location=exc.location, sequence=record.sequence
        ) from exc
    return checkpoint_of(record, state)
