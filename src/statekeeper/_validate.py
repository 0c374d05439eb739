"""Argument validation shared by every backend, and small helpers for backend authors."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping

from .errors import CheckpointDecodeError, InvalidQuery
from .models import Skipped

__all__ = [
    "check_id",
    "check_limit",
    "check_stream",
    "check_tags",
    "new_etag",
    "new_id",
    "skipped_from",
]

ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,200}")
MAX_STREAM_LEN = 512
MAX_TAG_KEY_LEN = 128
MAX_TAG_VALUE_LEN = 1024
MAX_TAGS = 64
MAX_LIMIT = 1000


def check_stream(stream: object) -> None:
    """Raise :class:`InvalidQuery` unless ``stream`` is a valid stream name."""
    if not isinstance(stream, str) or not stream:
        raise InvalidQuery(f"stream must be a non-empty string, got {stream!r}")
    if len(stream) > MAX_STREAM_LEN:
        raise InvalidQuery(f"stream names are at most {MAX_STREAM_LEN} characters")
    if "\x00" in stream:
        raise InvalidQuery("stream names must not contain NUL")
    _check_utf8(stream, "stream")


def check_id(value: object, *, what: str) -> None:
    """Raise :class:`InvalidQuery` unless ``value`` matches ``[A-Za-z0-9._:-]{1,200}``."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise InvalidQuery(f"{what} must match [A-Za-z0-9._:-]{{1,200}}, got {value!r}")


def check_limit(limit: object) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidQuery(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")


def check_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    """Validate tags (str -> str, no NUL, bounded) and return a plain dict copy."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise InvalidQuery(f"tags must be a mapping of str to str, got {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise InvalidQuery(f"at most {MAX_TAGS} tags are allowed")
    clean: dict[str, str] = {}
    for key, value in tags.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidQuery(f"tags must map str to str, got {key!r}: {value!r}")
        if not key or len(key) > MAX_TAG_KEY_LEN or len(value) > MAX_TAG_VALUE_LEN:
            raise InvalidQuery(
                f"tag keys are 1..{MAX_TAG_KEY_LEN} characters and values at most "
                f"{MAX_TAG_VALUE_LEN}, got {key[:40]!r}"
            )
        if "\x00" in key or "\x00" in value:
            raise InvalidQuery(f"tag {key[:40]!r} contains NUL, which no backend can store")
        _check_utf8(key, "tag key")
        _check_utf8(value, "tag value")
        clean[key] = value
    return clean


def _check_utf8(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidQuery(f"{what} is not valid Unicode (lone surrogate)") from None


def new_id() -> str:
    """A fresh opaque checkpoint id."""
    return secrets.token_hex(16)


def new_etag() -> str:
    """A fresh etag."""
    return secrets.token_hex(8)


def skipped_from(exc: CheckpointDecodeError, id: str | None, sequence: int | None) -> Skipped:
    """The :class:`Skipped` entry a tolerant listing reports for ``exc``."""
    return Skipped.model_construct(
        id=exc.id if exc.id is not None else id,
        sequence=exc.sequence if exc.sequence is not None else sequence,
        location=exc.location or (f"id {id}" if id else "unknown"),
        reason=exc.reason,
        error=type(exc).__name__,
    )
