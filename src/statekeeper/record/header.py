"""The header of a record: one JSON object, written by one encoder, read by one parser.

Fields, in the order they are written: ``v`` (the format version), ``store``,
``id``, ``stream``, ``seq`` (``null`` in a positional record), ``created``,
``updated`` (ISO timestamps with an offset), ``etag``, ``parent``, ``tags``,
``meta``, ``expires``, ``ttl`` and ``codec``.

:func:`encode_header` writes strict JSON (a NaN or infinity in the metadata or the TTL is
a ``ValueError``, never a ``null``). :func:`parse_header` reads with msgspec into
:class:`_Head`, which checks every field's JSON type without coercion (``true`` is
not an int, ``"7"`` is not an int), then checks what a type cannot say (the
version, a positive sequence, timezone-aware timestamps) and returns the values of
a :class:`~statekeeper.models.CheckpointHeader`. Anything else raises
:class:`~statekeeper.record.frame.Malformed` with the reason.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from statekeeper.record.frame import Malformed

__all__ = ["FORMAT_VERSION", "HeaderValues", "encode_header", "parse_header"]

FORMAT_VERSION = 1

#: ``(values, store id, codec name, ttl, the stored seq)``: ``values`` are the
#: fields of a ``CheckpointHeader`` in field order; the stored seq is ``None`` in a
#: positional record, whose sequence in ``values`` is the one it is stored at.
HeaderValues = tuple[dict[str, Any], str, str, float | None, int | None]


class _Head(msgspec.Struct, gc=False):
    """The header JSON. ``gc=False``: it lives for one parse and holds no cycle, so
    the collector need not track it (one tracked allocation less per record read)."""

    v: Any  # checked by value, so that any other version says so
    store: str
    id: str
    stream: str
    seq: int | None
    created: str
    updated: str
    etag: str
    parent: str | None
    tags: dict[str, str]
    meta: dict[str, Any]
    expires: str | None
    ttl: int | float | None
    codec: str


class _Version(msgspec.Struct, gc=False):
    v: Any


# built once: msgspec.json.decode(..., type=_Head) and encode look theirs up per call
_decode_head = msgspec.json.Decoder(_Head).decode
_decode_version = msgspec.json.Decoder(_Version).decode
_encode_json = msgspec.json.Encoder().encode
_fromiso = datetime.fromisoformat
_NO_FLOAT: frozenset[type] = frozenset({str, int, bool, type(None)})


def encode_header(fields: dict[str, Any]) -> bytes:
    """The header bytes of ``fields`` (the keys above, in that order).

    msgspec would write a non-finite float as ``null``, so one in the metadata or
    the TTL is refused here instead, as strict JSON requires.
    """
    ttl = fields["ttl"]
    if (ttl is not None and ttl - ttl != 0.0) or not _finite(fields["meta"]):
        raise ValueError("Out of range float values are not JSON compliant")
    return _encode_json(fields)


def parse_header(head: bytes, expect_sequence: int | None) -> HeaderValues:
    """The checked values of the header ``head``, or :class:`Malformed`.

    A positional record (``"seq": null``) takes ``expect_sequence`` as its sequence.
    """
    try:
        h = _decode_head(head)
    except (ValueError, RecursionError) as exc:  # msgspec's errors are ValueErrors
        raise Malformed(_version_error(head) or f"malformed record header: {exc}") from None
    if h.v != FORMAT_VERSION:
        raise Malformed(f"unsupported record format version {h.v!r}")
    seq = h.seq
    if seq is None:
        if expect_sequence is None:
            raise Malformed(
                "malformed record header: a positional record (seq null) needs the "
                "sequence it is stored at"
            )
        seq = expect_sequence
    if type(seq) is not int or seq < 1:
        raise Malformed("malformed record header: seq must be a positive integer")
    created = _stamp(h.created, "created")
    updated = created if h.updated == h.created else _stamp(h.updated, "updated")
    values = {
        "id": h.id,
        "stream": h.stream,
        "sequence": seq,
        "created_at": created,
        "updated_at": updated,
        "etag": h.etag,
        "parent_id": h.parent,
        "tags": h.tags,
        "metadata": h.meta,
        "expires_at": None if h.expires is None else _stamp(h.expires, "expires"),
    }
    return values, h.store, h.codec, h.ttl, h.seq


def _version_error(head: bytes) -> str | None:
    """For a header that fails its types: say so if it is another format version."""
    try:
        v = _decode_version(head).v
    except (ValueError, RecursionError):
        return None
    return None if v == FORMAT_VERSION else f"unsupported record format version {v!r}"


def _stamp(text: str, name: str) -> datetime:
    try:
        value = _fromiso(text)
    except ValueError as exc:
        raise Malformed(f"malformed record header: {exc}") from None
    # fromisoformat gives a naive datetime or one with a fixed-offset timezone, whose
    # utcoffset() is never None: a tzinfo is exactly what "aware" requires
    if value.tzinfo is None:
        raise Malformed(f"malformed record header: {name} must be timezone-aware")
    return value


def _finite(obj: Any) -> bool:
    """Whether a plain JSON tree holds no NaN or infinity."""
    t = type(obj)
    if t is dict:
        children: Any = obj.values()
    elif t is list or t is tuple:
        children = obj
    elif t is float:
        return bool(obj - obj == 0.0)
    else:
        return True
    if _NO_FLOAT.issuperset(map(type, children)):
        return True
    return all(_finite(x) for x in children)
