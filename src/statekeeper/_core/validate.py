"""Argument validation shared by every backend, and small helpers for backend authors."""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Mapping

from ..errors import CheckpointDecodeError, InvalidQuery
from ..models import Skipped

__all__ = [
    "check_id",
    "check_ids",
    "check_if_match",
    "check_keep_last",
    "check_limit",
    "check_metadata_filter",
    "check_prefix",
    "check_stream",
    "check_tags",
    "metadata_matches",
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
#: At most this many items in one save_many, load_many or delete_many call.
MAX_BATCH = 1000
MAX_FILTER_KEYS = 16

#: What a metadata filter value may be: a JSON scalar.
Scalar = str | int | float | bool | None


def check_stream(stream: object) -> None:
    """Raise :class:`InvalidQuery` unless ``stream`` is a valid stream name."""
    if not isinstance(stream, str) or not stream:
        raise InvalidQuery(f"stream must be a non-empty string, got {stream!r}")
    if len(stream) > MAX_STREAM_LEN:
        raise InvalidQuery(f"stream names are at most {MAX_STREAM_LEN} characters")
    if "\x00" in stream:
        raise InvalidQuery("stream names must not contain NUL")
    _check_utf8(stream, "stream")


def check_prefix(prefix: object) -> None:
    """Raise :class:`InvalidQuery` unless ``prefix`` is a string without NUL."""
    if not isinstance(prefix, str) or "\x00" in prefix:
        raise InvalidQuery(f"prefix must be a string without NUL, got {prefix!r}")


def check_keep_last(keep_last: object) -> None:
    """Raise :class:`InvalidQuery` unless ``keep_last`` is an int >= 0 (not a bool)."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise InvalidQuery(f"keep_last must be an int >= 0, got {keep_last!r}")


def check_if_match(if_match: object) -> None:
    """Raise :class:`InvalidQuery` unless ``if_match`` is an etag string or ``None``."""
    if if_match is not None and not isinstance(if_match, str):
        raise InvalidQuery("if_match must be an etag string or None")


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


def check_ids(ids: object, *, what: str = "ids") -> list[str]:
    """Validate a batch of ids (a list, tuple or set of valid ids, at most
    ``MAX_BATCH``) and return them in order, without duplicates."""
    if isinstance(ids, str | bytes) or not isinstance(ids, list | tuple | set | frozenset):
        raise InvalidQuery(f"{what} must be a list of ids, got {type(ids).__name__}")
    if len(ids) > MAX_BATCH:
        raise InvalidQuery(f"at most {MAX_BATCH} {what} per call, got {len(ids)}")
    clean: dict[str, None] = {}
    for value in ids:
        check_id(value, what="id")
        clean[value] = None
    return list(clean)


def check_metadata_filter(metadata: Mapping[str, Scalar] | None) -> dict[str, Scalar]:
    """Validate a ``list(metadata=...)`` filter: top-level keys to JSON scalars.

    Values are ``str``, ``int``, ``float`` (finite), ``bool`` or ``None``; they
    match by JSON type and value, so ``True`` is not ``1`` and ``1`` is not ``1.0``.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidQuery(
            f"metadata must be a mapping of str to JSON scalars, got {type(metadata).__name__}"
        )
    if len(metadata) > MAX_FILTER_KEYS:
        raise InvalidQuery(f"a metadata filter has at most {MAX_FILTER_KEYS} keys")
    clean: dict[str, Scalar] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not key or len(key) > MAX_TAG_KEY_LEN or "\x00" in key:
            raise InvalidQuery(
                f"metadata filter keys are 1..{MAX_TAG_KEY_LEN} characters without NUL, got {key!r}"
            )
        _check_utf8(key, "metadata key")
        if value is not None and type(value) not in (str, int, float, bool):
            raise InvalidQuery(
                f"metadata filter values are JSON scalars (str, int, float, bool, None), "
                f"got {type(value).__name__} for {key!r}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidQuery(f"metadata filter value for {key!r} must be finite")
        if isinstance(value, str):
            if len(value) > MAX_TAG_VALUE_LEN or "\x00" in value:
                raise InvalidQuery(
                    f"metadata filter string values are at most {MAX_TAG_VALUE_LEN} "
                    f"characters without NUL, for {key!r}"
                )
            _check_utf8(value, "metadata value")
        clean[key] = value
    return clean


def scalar_kind(value: object) -> str | None:
    """The JSON kind of a scalar for equality filters (``None`` if not a scalar):
    ``"null"``, ``"bool"``, ``"int"``, ``"float"`` or ``"str"``."""
    if value is None:
        return "null"
    kind = type(value)
    if kind is bool:
        return "bool"
    if kind is int:
        return "int"
    if kind is float:
        return "float"
    if kind is str:
        return "str"
    return None


def metadata_matches(metadata: Mapping[str, object], wanted: Mapping[str, Scalar]) -> bool:
    """Whether ``metadata`` has every key of ``wanted`` with an equal scalar of the
    same JSON kind (so ``True`` never matches ``1``). For backends that filter by
    scanning."""
    for key, value in wanted.items():
        if key not in metadata:
            return False
        have = metadata[key]
        if scalar_kind(have) != scalar_kind(value) or have != value:
            return False
    return True


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
