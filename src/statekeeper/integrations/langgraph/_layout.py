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
pending writes.

Records. States are ``codec="raw"`` bytes in a small length-prefixed frame whose
fields are the saver's own ``serde.dumps_typed`` output: no JSON, no base64. A
checkpoint frame (``SKLG2C``) starts with the LangGraph ids (thread, namespace,
checkpoint, parent), so a record carries no tags and no store metadata: a save is
one row, with nothing to index but its id and stream. Records written before
(``SKLG1C`` frames, ids in the store metadata under ``"langgraph"``, two tags and
indexed copies of LangGraph's scalar metadata) are read the same way; a record
put again is rewritten in the current layout.

Compression. A frame of at least :data:`_DEFLATE_MIN` bytes is stored deflated
(``SKLGZ1`` then the whole frame as raw DEFLATE, stdlib :mod:`zlib`) when that
saves a tenth of it or more: a checkpoint's channel values and pending writes are
mostly repetitive text, and a 1.4 KB checkpoint frame deflates to about 540 bytes
in about 9 µs (inflating takes about 3 µs). Frames written before are read as
they are. The store still checksums, and may encrypt, what is stored: the deflated
bytes.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from statekeeper.errors import CheckpointDecodeError

#: The metadata key under which records written before the ``SKLG2C`` frame keep
#: their LangGraph ids (read, never written).
RESERVED = "langgraph"
#: The prefix of every stream this integration writes.
ROOT = RESERVED + "/"
CHECKPOINTS_SUFFIX = "/checkpoints"

_PART_MAX = 200
_CHECKPOINT_MAGIC = b"SKLG2C"
_CHECKPOINT_MAGIC_1 = b"SKLG1C"  # ids in the store metadata (read only)
_WRITES_MAGIC = b"SKLG1W"
_DEFLATED_MAGIC = b"SKLGZ1"  # then a whole frame above as raw DEFLATE
_LEN = struct.Struct(">I")
#: The smallest frame worth deflating (smaller ones save too few bytes for the time).
_DEFLATE_MIN = 512
#: DEFLATE's window and memory level when writing: a 4 KiB window allocates little
#: (the default 32 KiB one took 59 µs for a 1.4 KB frame, this one 9 µs) and finds
#: the repeats of a checkpoint as well. Reading takes any window (``-15``).
_DEFLATE_WBITS = -12
_DEFLATE_MEMLEVEL = 4
#: An inflated frame larger than this is refused as damaged rather than allocated.
_INFLATE_MAX = 1 << 31


def _digest(*parts: str) -> str:
    # JSON of the list is an unambiguous encoding of the parts (no separator games)
    return hashlib.sha256(json.dumps(parts).encode("utf-8", "surrogatepass")).hexdigest()


@lru_cache(maxsize=4096)
def _key_digest(thread_id: str, ns: str, checkpoint_id: str) -> str:
    # a put names its parent, which the put before it named as itself, and
    # put_writes names the checkpoint just put: most keys are asked for twice
    return _digest(thread_id, ns, checkpoint_id)[:48]


def _part(text: str) -> str:
    encoded = quote(text, safe="", errors="surrogatepass")
    if len(encoded) <= _PART_MAX:
        return encoded
    return "#" + _digest(text)


def thread_prefix(thread_id: str) -> str:
    """The prefix of every stream of ``thread_id`` (and of no other thread)."""
    return f"{RESERVED}/{_part(thread_id)}/"


@lru_cache(maxsize=1024)
def _streams_prefix(thread_id: str, ns: str) -> str:
    # every call of a graph step names the same (thread, namespace)
    return f"{thread_prefix(thread_id)}{_part(ns)}/"


def checkpoint_stream(thread_id: str, ns: str) -> str:
    return _streams_prefix(thread_id, ns) + "checkpoints"


def writes_stream(thread_id: str, ns: str) -> str:
    return _streams_prefix(thread_id, ns) + "writes"


def checkpoint_key(thread_id: str, ns: str, checkpoint_id: str) -> str:
    """The store id of LangGraph checkpoint ``checkpoint_id`` of (thread, ns)."""
    return "lg-" + _key_digest(thread_id, ns, checkpoint_id)


def writes_key(thread_id: str, ns: str, checkpoint_id: str) -> str:
    """The store id of the record holding that checkpoint's pending writes."""
    return "lgw-" + _key_digest(thread_id, ns, checkpoint_id)


def writes_key_of(checkpoint_record_id: str) -> str:
    """The writes record's id of the checkpoint record ``lg-<hash>``: ``lgw-<hash>``."""
    return "lgw-" + checkpoint_record_id.removeprefix("lg-")


def is_checkpoint_stream(stream: str) -> bool:
    """Whether ``stream`` is the checkpoints stream of some (thread, namespace)."""
    return stream.startswith(ROOT) and stream.endswith(CHECKPOINTS_SUFFIX)


@dataclass(frozen=True, slots=True)
class Ids:
    """The LangGraph identity of a checkpoint record, from its store metadata."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None


@dataclass(frozen=True, slots=True)
class Decoded:
    """A checkpoint record with its ids and LangGraph metadata decoded, its
    checkpoint still the serde's ``(type, bytes)``."""

    record_id: str
    sequence: int
    ids: Ids
    checkpoint: tuple[str, bytes]
    metadata: Any


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


# -- frames -----------------------------------------------------------------------------


def _pack(magic: bytes, fields: list[bytes]) -> bytes:
    out = [magic, _LEN.pack(len(fields))]
    for field in fields:
        out.append(_LEN.pack(len(field)))
        out.append(field)
    return _deflated(b"".join(out))


def _deflated(frame: bytes) -> bytes:
    """``frame``, or ``SKLGZ1`` + its raw DEFLATE where that saves a tenth or more."""
    if len(frame) < _DEFLATE_MIN:
        return frame
    deflate = zlib.compressobj(1, zlib.DEFLATED, _DEFLATE_WBITS, _DEFLATE_MEMLEVEL)
    packed = b"".join((_DEFLATED_MAGIC, deflate.compress(frame), deflate.flush()))
    return packed if len(packed) * 10 <= len(frame) * 9 else frame


def _inflated(data: object, record_id: str) -> bytes:
    """A record's frame: ``data`` itself, or inflated if it is deflated."""
    if not isinstance(data, bytes):
        raise CheckpointDecodeError(
            f"not a LangGraph record: its state is {type(data).__name__}, not raw bytes",
            id=record_id,
        )
    if not data.startswith(_DEFLATED_MAGIC):
        return data
    inflate = zlib.decompressobj(-15)
    try:
        frame = inflate.decompress(memoryview(data)[len(_DEFLATED_MAGIC) :], _INFLATE_MAX)
    except zlib.error as exc:
        raise CheckpointDecodeError(f"damaged LangGraph record: {exc}", id=record_id) from None
    if not inflate.eof or inflate.unused_data or inflate.unconsumed_tail:
        raise CheckpointDecodeError(
            "damaged LangGraph record: its deflated frame is truncated, too large, or "
            "followed by trailing bytes",
            id=record_id,
        )
    if frame.startswith(_DEFLATED_MAGIC):
        raise CheckpointDecodeError("a LangGraph record deflated twice", id=record_id)
    return frame


def _unpack(magic: bytes, data: bytes, record_id: str) -> list[bytes]:
    if not data.startswith(magic):
        raise CheckpointDecodeError("not a LangGraph record (bad frame header)", id=record_id)
    end = len(data)
    unpack = _LEN.unpack_from
    try:
        pos = len(magic)
        (count,) = unpack(data, pos)
        pos += 4
        fields = []
        for _ in range(count):
            (size,) = unpack(data, pos)
            pos += 4
            if pos + size > end:
                raise struct.error("field runs past the end")
            fields.append(data[pos : pos + size])
            pos += size
    except struct.error as exc:
        raise CheckpointDecodeError(f"truncated LangGraph record: {exc}", id=record_id) from None
    if pos != end:
        raise CheckpointDecodeError("trailing bytes after a LangGraph record", id=record_id)
    return fields


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


def pack_checkpoint(ids: Ids, checkpoint: tuple[str, bytes], metadata: tuple[str, bytes]) -> bytes:
    """The state of a checkpoint record: its ids, then the serde's checkpoint and
    metadata. A parent of ``None`` is stored as no field bytes (LangGraph never
    names an empty parent id: a falsy one means none)."""
    return _pack(
        _CHECKPOINT_MAGIC,
        [
            _text(ids.thread_id),
            _text(ids.checkpoint_ns),
            _text(ids.checkpoint_id),
            _text(ids.parent_checkpoint_id or ""),
            checkpoint[0].encode(),
            checkpoint[1],
            metadata[0].encode(),
            metadata[1],
        ],
    )


Serialized = tuple[str, bytes]


def unpack_checkpoint(
    data: object, record_id: str, metadata: Mapping[str, Any]
) -> tuple[Ids, Serialized, Serialized]:
    """``(ids, checkpoint, metadata)`` of a checkpoint record of either frame
    (``metadata``: the record's store metadata, where ``SKLG1C`` records keep the ids)."""
    data = _inflated(data, record_id)
    if data.startswith(_CHECKPOINT_MAGIC_1):
        fields = _unpack(_CHECKPOINT_MAGIC_1, data, record_id)
        if len(fields) != 4:
            raise CheckpointDecodeError("a LangGraph checkpoint record has 4 fields", id=record_id)
        ids = ids_from_metadata(metadata, record_id)
    else:
        fields = _unpack(_CHECKPOINT_MAGIC, data, record_id)
        if len(fields) != 8:
            raise CheckpointDecodeError("a LangGraph checkpoint record has 8 fields", id=record_id)
        try:
            thread, ns, checkpoint_id, parent = (
                f.decode("utf-8", "surrogatepass") for f in fields[:4]
            )
        except UnicodeDecodeError:
            raise CheckpointDecodeError("undecodable LangGraph ids", id=record_id) from None
        ids = Ids(thread, ns, checkpoint_id, parent or None)
        fields = fields[4:]
    try:
        return ids, (fields[0].decode(), fields[1]), (fields[2].decode(), fields[3])
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
            _text(w.task_id),
            str(w.idx).encode(),
            _text(w.channel),
            _text(w.task_path),
            w.value[0].encode(),
            w.value[1],
        ]
    return _pack(_WRITES_MAGIC, fields)


def unpack_writes(data: object, record_id: str) -> list[Write]:
    fields = _unpack(_WRITES_MAGIC, _inflated(data, record_id), record_id)
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
