"""How LangGraph's threads, namespaces, checkpoints and writes sit in a statekeeper store.

Streams. A (thread, namespace) pair owns two streams::

    langgraph/<thread>/<namespace>/checkpoints
    langgraph/<thread>/<namespace>/writes

``<thread>`` and ``<namespace>`` are percent-encoded with no safe characters, so
neither contains ``/`` and ``langgraph/<thread>/`` is a prefix of exactly that
thread's streams (``list_streams(prefix=)`` finds every namespace of a thread,
and thread ``a`` never matches thread ``ab``). A part whose encoding is longer
than 200 characters is ``#`` plus its SHA-256 instead; ``quote`` never emits
``#``, so the two forms cannot collide.

Ids. A LangGraph checkpoint id is unique only per (thread, namespace), and
``copy_thread`` keeps it, so the store id is a hash of all three:
``lg-<sha256>`` for the checkpoint, ``lgw-<same>`` for the record that holds its
pending writes. The original ids stay readable in the record's metadata under
the reserved key ``"langgraph"``.

Records. States are ``codec="raw"`` bytes in a small length-prefixed frame whose
fields are the saver's own ``serde.dumps_typed`` output: no JSON, no base64.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from statekeeper.errors import CheckpointDecodeError

#: The metadata key (and tag key) this integration reserves for its own bookkeeping.
RESERVED = "langgraph"
#: Tag values that tell checkpoint records from write records in store-wide listings.
KIND_CHECKPOINT = "checkpoint"
KIND_WRITES = "writes"
#: The tag that names a record's thread (so a thread's namespaces list together).
THREAD_TAG = "langgraph.thread"

_PART_MAX = 200
_TAG_MAX = 1000
_FILTER_KEY_MAX = 128
_FILTER_STR_MAX = 1024
_INT_BOUND = 2**63
_CHECKPOINT_MAGIC = b"SKLG1C"
_WRITES_MAGIC = b"SKLG1W"
_LEN = struct.Struct(">I")


def _digest(*parts: str) -> str:
    # JSON of the list is an unambiguous encoding of the parts (no separator games)
    return hashlib.sha256(json.dumps(parts).encode("utf-8", "surrogatepass")).hexdigest()


def _part(text: str) -> str:
    encoded = quote(text, safe="", errors="surrogatepass")
    if len(encoded) <= _PART_MAX:
        return encoded
    return "#" + _digest(text)


def thread_prefix(thread_id: str) -> str:
    """The prefix of every stream of ``thread_id`` (and of no other thread)."""
    return f"{RESERVED}/{_part(thread_id)}/"


def checkpoint_stream(thread_id: str, ns: str) -> str:
    return f"{thread_prefix(thread_id)}{_part(ns)}/checkpoints"


def writes_stream(thread_id: str, ns: str) -> str:
    return f"{thread_prefix(thread_id)}{_part(ns)}/writes"


def checkpoint_key(thread_id: str, ns: str, checkpoint_id: str) -> str:
    """The store id of LangGraph checkpoint ``checkpoint_id`` of (thread, ns)."""
    return "lg-" + _digest(thread_id, ns, checkpoint_id)[:48]


def writes_key(thread_id: str, ns: str, checkpoint_id: str) -> str:
    """The store id of the record holding that checkpoint's pending writes."""
    return "lgw-" + _digest(thread_id, ns, checkpoint_id)[:48]


def thread_tag(thread_id: str) -> str:
    """The ``langgraph.thread`` tag value: ``=thread`` when it fits, else ``#sha256``."""
    if len(thread_id) <= _TAG_MAX and "\x00" not in thread_id and _utf8_ok(thread_id):
        return "=" + thread_id
    return "#" + _digest(thread_id)


def checkpoint_tags(thread_id: str) -> dict[str, str]:
    """The tags of a checkpoint record (kind and thread, for store-wide listings)."""
    return {RESERVED: KIND_CHECKPOINT, THREAD_TAG: thread_tag(thread_id)}


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Ids:
    """The LangGraph identity of a checkpoint record, from its store metadata."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None


def ids_from_metadata(metadata: Mapping[str, Any], record_id: str) -> Ids:
    own = metadata.get(RESERVED)
    if not isinstance(own, Mapping):
        raise CheckpointDecodeError(
            f"record is not a LangGraph checkpoint (no {RESERVED!r} metadata)", id=record_id
        )
    try:
        parent = own.get("parent_checkpoint_id")
        return Ids(
            thread_id=str(own["thread_id"]),
            checkpoint_ns=str(own["checkpoint_ns"]),
            checkpoint_id=str(own["checkpoint_id"]),
            parent_checkpoint_id=None if parent is None else str(parent),
        )
    except KeyError as exc:
        raise CheckpointDecodeError(
            f"LangGraph metadata lacks {exc.args[0]!r}", id=record_id
        ) from None


def own_metadata(ids: Ids) -> dict[str, Any]:
    return {
        "thread_id": ids.thread_id,
        "checkpoint_ns": ids.checkpoint_ns,
        "checkpoint_id": ids.checkpoint_id,
        "parent_checkpoint_id": ids.parent_checkpoint_id,
    }


# -- metadata: what the store can filter on -------------------------------------------


def filterable(key: object, value: object) -> bool:
    """Whether ``{key: value}`` can be both stored and matched by the store's filter."""
    if not isinstance(key, str) or key == RESERVED or not key or "\x00" in key:
        return False
    if len(key) > _FILTER_KEY_MAX or not _utf8_ok(key):
        return False
    if value is None or type(value) is bool:
        return True
    if type(value) is int:
        return -_INT_BOUND < value < _INT_BOUND
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is str:
        return len(value) <= _FILTER_STR_MAX and "\x00" not in value and _utf8_ok(value)
    return False


def store_metadata(ids: Ids, lg_metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The store metadata of a checkpoint: LangGraph's scalar top-level keys as they
    are (so ``list(filter=)`` runs in the store) plus the reserved ids. The complete
    LangGraph metadata travels in the state, through the saver's serde."""
    out: dict[str, Any] = {k: v for k, v in lg_metadata.items() if filterable(k, v)}
    out[RESERVED] = own_metadata(ids)
    return out


def split_filter(
    query: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(for the store, checked here)``. ``None`` stays here: LangGraph's filter
    matches a missing key with ``None``, the store's only a stored ``null``. So does
    a dotted key, which is also a path into nested metadata (:mod:`._filters`)."""
    pushed: dict[str, Any] = {}
    local: dict[str, Any] = {}
    for key, value in (query or {}).items():
        dotted = isinstance(key, str) and "." in key
        if value is not None and not dotted and filterable(key, value) and len(pushed) < 16:
            pushed[key] = value
        else:
            local[key] = value
    return pushed, local


# -- frames -----------------------------------------------------------------------------


def _pack(magic: bytes, fields: list[bytes]) -> bytes:
    out = [magic, _LEN.pack(len(fields))]
    for field in fields:
        out.append(_LEN.pack(len(field)))
        out.append(field)
    return b"".join(out)


def _unpack(magic: bytes, data: object, record_id: str) -> list[bytes]:
    if not isinstance(data, bytes):
        raise CheckpointDecodeError(
            f"not a LangGraph record: its state is {type(data).__name__}, not raw bytes",
            id=record_id,
        )
    view = memoryview(data)
    if bytes(view[: len(magic)]) != magic:
        raise CheckpointDecodeError("not a LangGraph record (bad frame header)", id=record_id)
    try:
        pos = len(magic)
        (count,) = _LEN.unpack_from(view, pos)
        pos += _LEN.size
        fields = []
        for _ in range(count):
            (size,) = _LEN.unpack_from(view, pos)
            pos += _LEN.size
            if pos + size > len(view):
                raise struct.error("field runs past the end")
            fields.append(bytes(view[pos : pos + size]))
            pos += size
    except struct.error as exc:
        raise CheckpointDecodeError(f"truncated LangGraph record: {exc}", id=record_id) from None
    if pos != len(view):
        raise CheckpointDecodeError("trailing bytes after a LangGraph record", id=record_id)
    return fields


def pack_checkpoint(checkpoint: tuple[str, bytes], metadata: tuple[str, bytes]) -> bytes:
    return _pack(
        _CHECKPOINT_MAGIC,
        [checkpoint[0].encode(), checkpoint[1], metadata[0].encode(), metadata[1]],
    )


def unpack_checkpoint(data: object, record_id: str) -> tuple[tuple[str, bytes], tuple[str, bytes]]:
    fields = _unpack(_CHECKPOINT_MAGIC, data, record_id)
    if len(fields) != 4:
        raise CheckpointDecodeError("a LangGraph checkpoint record has 4 fields", id=record_id)
    try:
        return (fields[0].decode(), fields[1]), (fields[2].decode(), fields[3])
    except UnicodeDecodeError:
        raise CheckpointDecodeError("undecodable serde type name", id=record_id) from None


@dataclass(frozen=True, slots=True)
class Write:
    """One pending write as stored: the value is the serde's ``(type, bytes)``."""

    task_id: str
    idx: int
    channel: str
    task_path: str
    value: tuple[str, bytes]

    @property
    def key(self) -> tuple[str, int]:
        return (self.task_id, self.idx)


def pack_writes(writes: list[Write]) -> bytes:
    fields: list[bytes] = []
    for w in writes:
        fields += [
            w.task_id.encode("utf-8", "surrogatepass"),
            str(w.idx).encode(),
            w.channel.encode("utf-8", "surrogatepass"),
            w.task_path.encode("utf-8", "surrogatepass"),
            w.value[0].encode(),
            w.value[1],
        ]
    return _pack(_WRITES_MAGIC, fields)


def unpack_writes(data: object, record_id: str) -> list[Write]:
    fields = _unpack(_WRITES_MAGIC, data, record_id)
    if len(fields) % 6:
        raise CheckpointDecodeError("a LangGraph writes record has 6 fields a write", id=record_id)
    out = []
    try:
        for i in range(0, len(fields), 6):
            task_id, idx, channel, path, kind, value = fields[i : i + 6]
            out.append(
                Write(
                    task_id=task_id.decode("utf-8", "surrogatepass"),
                    idx=int(idx),
                    channel=channel.decode("utf-8", "surrogatepass"),
                    task_path=path.decode("utf-8", "surrogatepass"),
                    value=(kind.decode(), value),
                )
            )
    except (UnicodeDecodeError, ValueError):
        raise CheckpointDecodeError("undecodable LangGraph write", id=record_id) from None
    return out


def merge_writes(stored: list[Write], new: list[Write]) -> list[Write] | None:
    """``stored`` with ``new`` merged as LangGraph's savers do, or ``None`` if unchanged.

    A regular write (``idx >= 0``) is kept once per ``(task_id, idx)``: a retry of the
    same task does not duplicate it. A special write (error, interrupt, scheduled,
    resume: ``idx < 0``) replaces the one stored under its key.
    """
    merged = list(stored)
    where = {w.key: i for i, w in enumerate(merged)}
    changed = False
    for w in new:
        i = where.get(w.key)
        if i is None:
            where[w.key] = len(merged)
            merged.append(w)
            changed = True
        elif w.idx < 0 and merged[i] != w:
            merged[i] = w
            changed = True
    return merged if changed else None
