"""The values the SQL tables hold, computed from a checkpoint: expiry in
microseconds, the stream hash and the value keys of the tag and fields index
rows, the bound parameters of a filtered scan, and the bounds of a stream prefix.

:mod:`.schema` describes the columns these fill.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from ..._core.validate import scalar_kind

__all__ = [
    "VKEY_INLINE",
    "expires_micros",
    "field_rows",
    "field_value",
    "filter_params",
    "prefix_bounds",
    "stream_hash",
    "tag_rows",
    "to_micros",
    "value_key",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: Tag values up to this many characters are their own index key.
VKEY_INLINE = 64
#: The longest metadata key and string value a filter may name (``_validate``).
FIELD_KEY_MAX = 128
FIELD_VALUE_MAX = 1024


def to_micros(moment: datetime) -> int:
    """``moment`` as integer microseconds since the Unix epoch (exact)."""
    return (moment - _EPOCH) // _US


def expires_micros(moment: datetime | None) -> int | None:
    return None if moment is None else to_micros(moment)


@lru_cache(maxsize=4096)  # saves to one stream come in runs; a hash is ~1 us
def stream_hash(stream: str) -> int:
    """A stable signed 64-bit hash of a stream name (an index key, never trusted alone)."""
    digest = hashlib.blake2b(stream.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def value_key(value: str) -> str:
    if len(value) <= VKEY_INLINE:
        return value
    # 64 hex digits: the same width as the longest inline key.
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def tag_rows(seq: int, stream: str, tags: dict[str, str]) -> list[dict[str, Any]]:
    """The rows of the tags table for one checkpoint."""
    shash = stream_hash(stream)
    return [
        {"seq": seq, "key": k, "vkey": value_key(v), "value": v, "shash": shash}
        for k, v in tags.items()
    ]


def field_value(value: object) -> tuple[str, str] | None:
    """``(kind, text)`` of a metadata value as the fields table holds it, or ``None``
    for a value no filter can ask for (not a scalar, or a string over 1024
    characters or with NUL, which ``list(metadata=)`` refuses).

    ``text`` is one canonical spelling per value of its kind, so that equal values
    of one kind have equal text and unequal ones never do: ``repr`` for floats
    (with ``-0.0`` spelled as ``0.0``, which it equals), decimal for ints (hashed
    when longer than the column), ``true``/``false``, ``""`` for null.
    """
    if type(value) is str:  # the common case first: this runs per key per save
        if len(value) > FIELD_VALUE_MAX or "\x00" in value:
            return None
        return "str", value
    kind = scalar_kind(value)
    if kind is None:
        return None
    if kind == "int":
        text = str(value)
        if len(text) > FIELD_VALUE_MAX:
            # "sha256:" never starts a decimal, so no int spells another's hash
            text = "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()
        return kind, text
    if kind == "float":
        assert isinstance(value, float)
        return kind, repr(value + 0.0)  # -0.0 + 0.0 is 0.0
    if kind == "bool":
        return kind, "true" if value else "false"
    return kind, ""


def field_rows(seq: int, stream: str, metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the fields table for one checkpoint: its filterable metadata."""
    shash = stream_hash(stream)
    rows = []
    for key, value in metadata.items():
        if not key or len(key) > FIELD_KEY_MAX or "\x00" in key:
            continue  # no filter can name this key
        kv = field_value(value)
        if kv is not None:
            kind, text = kv
            vkey = text if len(text) <= VKEY_INLINE else value_key(text)
            rows.append(
                {"seq": seq, "key": key, "kind": kind, "vkey": vkey, "value": text, "shash": shash}
            )
    return rows


def filter_params(
    tags: dict[str, str], metadata: Mapping[str, Any], stream: str | None
) -> dict[str, Any]:
    """Bound parameters for a filtered scan (see :meth:`Statements.scan`)."""
    params: dict[str, Any] = {}
    for i, (k, v) in enumerate(tags.items()):
        params[f"k{i}"] = k
        params[f"vk{i}"] = value_key(v)
        params[f"v{i}"] = v
    for i, (k, value) in enumerate(metadata.items()):
        kv = field_value(value)
        assert kv is not None, "check_metadata_filter admits scalars only"
        params[f"mk{i}"], params[f"mt{i}"], params[f"mv{i}"] = k, kv[0], kv[1]
        params[f"mvk{i}"] = value_key(kv[1])
    if stream is not None and (tags or metadata):
        params["shash"] = stream_hash(stream)
    return params


def prefix_bounds(prefix: str) -> tuple[str, str | None]:
    """``[lo, hi)``: the names that start with ``prefix``, in code point order (which
    is UTF-8 byte order), ``hi`` ``None`` when nothing sorts after them all."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            nxt = last + 1 if last + 1 != 0xD800 else 0xE000  # no surrogate is a name
            return prefix, "".join(chars) + chr(nxt)
    return prefix, None
