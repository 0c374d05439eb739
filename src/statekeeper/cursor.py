"""Opaque, signed, store-bound cursors.

A cursor marks a *position* in sequence order, not an item, so it stays valid
after its item is deleted, expired or filtered out. It is URL-safe base64 of::

    version (1 byte) | position (8 bytes, big-endian) | MAC (12 bytes)

The MAC is HMAC-SHA256 under the store's secret cursor key, over the version, the
position and a fingerprint of the query (stream, order, tags, metadata filter). A cursor from
another store, from a different query, or edited by hand fails the MAC and raises
:class:`~statekeeper.errors.InvalidCursor`. Cursors carry no data beyond the
position: they are tamper-evident, not encrypted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import struct
from collections.abc import Mapping
from functools import lru_cache

from .errors import InvalidCursor

__all__ = ["MAX_POSITION", "CursorSigner", "query_fingerprint"]

_VERSION = 1
_MAC_LEN = 12
_PACK = struct.Struct(">BQ")
#: The largest position a cursor holds (positions are unsigned 64-bit).
MAX_POSITION = (1 << 64) - 1
_TOKEN_LEN = _PACK.size + _MAC_LEN
_MAX_TEXT = 64


def query_fingerprint(
    stream: str | None,
    order: str,
    tags: Mapping[str, str] | None,
    metadata: Mapping[str, object] | None = None,
) -> bytes:
    """A stable digest of the parts of a query that a cursor is bound to: the
    stream, the order, the tag filter and the metadata filter (each value with its
    JSON kind, so a cursor for ``{"a": True}`` is not one for ``{"a": 1}``).

    Without a metadata filter (every key and value a ``str``), the digest of a query
    seen before is remembered; metadata values (``0.0`` and ``-0.0`` are equal keys
    but different JSON) are digested every time."""
    if not metadata:
        return _plain_fingerprint(stream, order, tuple(sorted(tags.items())) if tags else ())
    return _digest(stream, order, sorted((tags or {}).items()), metadata)


@lru_cache(maxsize=256)
def _plain_fingerprint(stream: str | None, order: str, tags: tuple[tuple[str, str], ...]) -> bytes:
    return _digest(stream, order, list(tags), None)


def _digest(
    stream: str | None,
    order: str,
    tags: list[tuple[str, str]],
    metadata: Mapping[str, object] | None,
) -> bytes:
    parts: list[object] = [stream, order, tags]
    if metadata:
        parts.append(sorted((k, type(v).__name__, v) for k, v in metadata.items()))
    canonical = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest()


class CursorSigner:
    """Makes and checks cursors under one store's secret key."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a cursor key needs at least 16 bytes")
        self._key = key

    def _mac(self, packed: bytes, fingerprint: bytes) -> bytes:
        # the one-shot form (OpenSSL's HMAC in one call) of hmac.new(...).digest()
        return hmac.digest(self._key, packed + fingerprint, "sha256")[:_MAC_LEN]

    def make(self, position: int, fingerprint: bytes) -> str:
        """A cursor for ``position`` in the query with ``fingerprint``."""
        packed = _PACK.pack(_VERSION, position)
        raw = packed + self._mac(packed, fingerprint)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def position(self, cursor: object, fingerprint: bytes) -> int:
        """The position ``cursor`` marks; raise :class:`InvalidCursor` if it is not ours."""
        if not isinstance(cursor, str) or not cursor or len(cursor) > _MAX_TEXT:
            raise InvalidCursor(f"{_show(cursor)} is not a cursor issued by this store")
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (binascii.Error, ValueError):
            raise InvalidCursor(f"{_show(cursor)} is not a cursor (bad encoding)") from None
        if len(raw) != _TOKEN_LEN:
            raise InvalidCursor(f"{_show(cursor)} is not a cursor (wrong length)")
        packed, mac = raw[: _PACK.size], raw[_PACK.size :]
        version, position = _PACK.unpack(packed)
        if version != _VERSION:
            raise InvalidCursor(f"cursor version {version} is not supported")
        if not hmac.compare_digest(mac, self._mac(packed, fingerprint)):
            raise InvalidCursor(
                f"{_show(cursor)} was not issued by this store for this query "
                "(cursors are bound to the store, the stream, the order and the tags)"
            )
        return int(position)


def _show(cursor: object) -> str:
    text = repr(cursor)
    return text if len(text) <= 40 else text[:37] + "..."
