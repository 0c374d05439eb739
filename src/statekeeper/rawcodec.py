"""``codec="raw"``: state is ``bytes``, stored verbatim and returned as ``bytes``.

For callers that bring their own serializer (LangGraph's and Agent Framework's
integrations store their framework's bytes this way): no base64, no JSON, no
tagged values. Records name their codec (``"raw"`` or ``"sk-json/1"``), so a
store reads records of either codec whatever its own ``codec`` option says; the
option only decides how new states are encoded.

Symmetry (S5) holds as for JSON: ``save`` refuses, with
:class:`~statekeeper.errors.CheckpointEncodeError` and nothing written, anything
that is not ``bytes`` and anything over ``max_bytes``, which is what ``load``
would refuse.
"""

from __future__ import annotations

from typing import ClassVar

from .errors import CheckpointDecodeError, CheckpointEncodeError

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
