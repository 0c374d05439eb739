"""``codec="raw"``: :class:`RawCodec`, bytes stored verbatim (see :mod:`statekeeper.rawcodec`)."""

from __future__ import annotations

from typing import ClassVar

from statekeeper.errors import CheckpointDecodeError, CheckpointEncodeError

__all__ = ["RawCodec"]


class RawCodec:
    """Bytes in, the same bytes out, up to ``max_bytes``. Immutable and thread-safe."""

    name: ClassVar[str] = "raw"

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def __repr__(self) -> str:
        return f"RawCodec(max_bytes={self.max_bytes})"

    def encode(self, value: object) -> bytes:
        """``value`` itself if it is ``bytes`` within the size limit, else raise
        :class:`CheckpointEncodeError`. ``bytearray`` and ``memoryview`` are refused
        too: ``load`` returns ``bytes``, so accepting them would not round-trip."""
        if type(value) is not bytes:
            raise CheckpointEncodeError(
                f"codec='raw' stores bytes only, not {type(value).__name__}; "
                "serialize the state yourself or use the default codec='json'"
            )
        if len(value) > self.max_bytes:
            raise CheckpointEncodeError(
                f"state is {len(value)} bytes, over this store's max_bytes={self.max_bytes}"
            )
        return value

    def decode(self, data: bytes | str) -> bytes:
        """The stored bytes, or :class:`CheckpointDecodeError` if over the limit."""
        if isinstance(data, str):
            raise CheckpointDecodeError("a raw state must be bytes, not text")
        if len(data) > self.max_bytes:
            raise CheckpointDecodeError(
                f"state is {len(data)} bytes, over this store's max_bytes={self.max_bytes}"
            )
        return bytes(data)
