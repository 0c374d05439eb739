"""The limits of ``sk-json/1`` (:class:`CodecLimits`), enforced alike both ways."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_LIMITS", "CodecLimits"]


class CodecLimits(BaseModel):
    """Limits that ``encode`` and ``decode`` enforce alike (see :mod:`statekeeper.codec`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_depth: int = Field(default=100, ge=1, le=500)
    max_bytes: int = Field(default=16 * 1024 * 1024, ge=1)
    max_int_digits: int = Field(default=4300, ge=1)
    allow_nan: bool = False


DEFAULT_LIMITS = CodecLimits()
"""The limits every store uses unless its options set others."""
