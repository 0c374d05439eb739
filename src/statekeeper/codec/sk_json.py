"""The :class:`Codec` ``sk-json/1``: one allowlist, one encoder, one decoder.

The format, the allowlist and the limits are documented in :mod:`statekeeper.codec`.
This module only puts the parts together: :class:`~statekeeper.codec.allowlist.Allowlist`
resolves ``allowed_types`` once, and the :class:`~statekeeper.codec.encode.Encoder`
and :class:`~statekeeper.codec.decode.Decoder` built from it and the limits do the
work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from statekeeper.codec.allowlist import Allowlist, type_name
from statekeeper.codec.decode import Decoder
from statekeeper.codec.encode import Encoder
from statekeeper.codec.limits import DEFAULT_LIMITS, CodecLimits
from statekeeper.errors import InvalidOptions

__all__ = ["Codec"]


class Codec:
    """JSON plus tagged values, restricted to ``allowed_types`` and ``limits``.

    Instances are immutable and safe to share between tasks and threads.
    """

    name: ClassVar[str] = "sk-json/1"

    def __init__(
        self, *, allowed_types: Iterable[type | str] = (), limits: CodecLimits | None = None
    ) -> None:
        self.limits = DEFAULT_LIMITS if limits is None else limits
        if not isinstance(self.limits, CodecLimits):
            raise InvalidOptions(f"limits must be a CodecLimits, not {type(limits).__name__}")
        allowlist = Allowlist(allowed_types)
        self.allowed_types: tuple[type, ...] = allowlist.types
        self._encoder = Encoder(self.limits, allowlist.by_type)
        self._decoder = Decoder(self.limits, allowlist.by_name)

    def __repr__(self) -> str:
        names = [type_name(cls) for cls in self.allowed_types]
        return f"Codec(allowed_types={names!r}, limits={self.limits!r})"

    def encode(self, value: Any) -> bytes:
        """Encode ``value`` to UTF-8 JSON, or raise ``CheckpointEncodeError``."""
        return self._encoder.encode(value, "state")

    def check_metadata(self, value: Any) -> dict[str, Any]:
        """Return ``value`` if it is valid metadata, else raise ``CheckpointEncodeError``.

        Metadata is a ``dict`` with ``str`` keys whose values are plain JSON (exact
        ``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``), under the
        same limits as state. Tuples are refused rather than turned into lists, and the
        reserved key ``"$sk"`` is refused, so metadata round-trips exactly both through
        this codec and through any plain JSON library.
        """
        return self._encoder.check_metadata(value)

    def is_plain(self, value: Any) -> bool:
        """Whether ``value`` is plain JSON of exact types, which this codec writes as
        it is: ``dict`` with ``str`` keys other than ``"$sk"``, ``list``, ``str``,
        ``bool``, ``None``, ``int`` within ``max_int_digits`` and finite ``float``,
        nested at most ``max_depth`` deep. Such a value is written by any JSON
        encoder without a conversion (an int over Python's own digit limit, if that
        is the tighter one, or a string with a lone surrogate, which is no UTF-8,
        still makes it raise) and parsed back equal, type for type. Checks only;
        raises nothing."""
        return self._encoder.is_plain(value)

    def decode(self, data: bytes | str) -> Any:
        """Decode what ``encode`` produced, or raise ``CheckpointDecodeError``."""
        return self._decoder.decode(data)
