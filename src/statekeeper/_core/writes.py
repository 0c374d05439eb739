"""How the public write methods turn their arguments into records.

Everything here validates and encodes; nothing writes. ``save``, ``save_many``,
``import_checkpoint`` and ``update`` call these before they call a primitive, so a
bad argument or a state the store could not load raises with nothing written
(SPEC S5).

Each takes what it uses: the state codec, the JSON codec (which checks metadata),
the clock, and the TTL rule of the backend (:class:`TtlRule`), never the store.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from os import urandom as _urandom
from typing import Any

from .._runtime.context import note_bytes
from ..codec import Codec
from ..errors import InvalidQuery
from ..models import Checkpoint, CheckpointHeader, checkpoint_with_state
from ..rawcodec import RawCodec
from ..record import NewRecord, RecordEdits, Update, trusted_new_record
from .interface import TTL
from .primitives import StorePrimitives
from .validate import check_id, check_if_match, check_stream, check_tags, new_etag

__all__ = ["TtlRule", "check_ttl", "imported_record", "new_record", "record_edits", "update"]

Clock = Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class TtlRule:
    """Whether a backend takes ``ttl`` (``capabilities.ttl``), and its name for the
    refusal when it does not."""

    supported: bool
    backend_name: str


#: How many 24-byte tokens one read of the system's randomness gives a thread.
_TOKENS_PER_READ = 64


class _Tokens(threading.local):
    """Each thread's tokens read ahead: 48 hex digits each, from ``os.urandom``.

    One ``os.urandom`` call (a system call) per ``_TOKENS_PER_READ`` saves instead of
    one per save. Per thread, so no two threads can take the same token; a forked
    child starts with none (see ``_forget_tokens``), so it never repeats its parent's.
    """

    left: Iterator[str] = iter(())


_tokens = _Tokens()


def _forget_tokens() -> None:
    global _tokens
    _tokens = _Tokens()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork either
    os.register_at_fork(after_in_child=_forget_tokens)


def _refill_tokens() -> str:
    raw = _urandom(24 * _TOKENS_PER_READ).hex()
    left = _tokens.left = iter([raw[i : i + 48] for i in range(0, len(raw), 48)])
    return next(left)


def new_record(
    codec: Codec | RawCodec,
    json_codec: Codec,
    clock: Clock,
    ttl_rule: TtlRule,
    stream: str,
    state: Any,
    *,
    tags: Mapping[str, str] | None,
    metadata: Mapping[str, Any] | None,
    parent_id: str | None,
    ttl: TTL | None,
    id: str | None,
) -> NewRecord:
    """The record one ``save`` would insert."""
    check_stream(stream)
    if id is not None:
        check_id(id, what="id")
    if parent_id is not None:
        check_id(parent_id, what="parent_id")
    clean_tags: dict[str, str] = {} if tags is None else check_tags(tags)
    ttl_s = None if ttl is None else check_ttl(ttl_rule, ttl)
    clean_meta: dict[str, Any] = {} if metadata is None else _metadata(json_codec, metadata)
    state_bytes = codec.encode(state)
    note_bytes(len(state_bytes))  # telemetry's state size (S18): a no-op when off
    now = clock()
    # one token for both: the same as new_id() + new_etag() (secrets.token_hex(24)),
    # read ahead with other saves' tokens of this thread
    token = next(_tokens.left, None) or _refill_tokens()
    return trusted_new_record(
        id=id or token[:32],
        stream=stream,
        state=state_bytes,
        codec=codec.name,
        created_at=now,
        updated_at=now,
        etag=token[32:],
        parent_id=parent_id,
        tags=clean_tags,
        metadata=clean_meta,
        ttl=ttl_s,
        expires_at=None if ttl_s is None else now + timedelta(seconds=ttl_s),
        written_at=now,
    )


def imported_record(
    codec: Codec | RawCodec,
    json_codec: Codec,
    clock: Clock,
    checkpoint: CheckpointHeader,
    state: Any,
) -> NewRecord:
    """The record ``import_checkpoint`` inserts: the source's id, timestamps, etag,
    parent, tags, metadata and expiry, with this store's validation and codec."""
    check_stream(checkpoint.stream)
    check_id(checkpoint.id, what="id")
    if checkpoint.parent_id is not None:
        check_id(checkpoint.parent_id, what="parent_id")
    clean_tags = check_tags(checkpoint.tags)
    clean_meta = json_codec.check_metadata(dict(checkpoint.metadata))
    state_bytes = codec.encode(state)
    ttl_s = None
    if checkpoint.expires_at is not None:
        ttl_s = max((checkpoint.expires_at - checkpoint.updated_at).total_seconds(), 1e-6)
    return NewRecord(
        id=checkpoint.id,
        stream=checkpoint.stream,
        state=state_bytes,
        codec=codec.name,
        created_at=checkpoint.created_at,
        updated_at=checkpoint.updated_at,
        etag=checkpoint.etag,
        parent_id=checkpoint.parent_id,
        tags=clean_tags,
        metadata=clean_meta,
        ttl=ttl_s,
        expires_at=checkpoint.expires_at,
        written_at=clock(),
    )


async def update(
    primitives: StorePrimitives,
    codec: Codec | RawCodec,
    json_codec: Codec,
    clock: Clock,
    id: str,
    state: Any,
    *,
    if_match: str | None,
    tags: Mapping[str, str] | None,
    metadata: Mapping[str, Any] | None,
    parent_id: str | None,
) -> Checkpoint:
    """The body of ``update(id, state, if_match=, tags=, metadata=, parent_id=)``,
    written through ``primitives``: validated and encoded first (nothing written on
    a refusal), then one ``_update`` of the :class:`~statekeeper.record.Update`. The
    new state is always in this store's codec, whatever the old one was."""
    check_id(id, what="id")
    check_if_match(if_match)
    edits = record_edits(json_codec, tags, metadata, parent_id)
    state_bytes = codec.encode(state)
    note_bytes(len(state_bytes))
    header = await primitives._update(
        Update(
            id=id,
            state=state_bytes,
            codec=codec.name,
            now=clock(),
            etag=new_etag(),
            if_match=if_match,
            edits=edits,
        )
    )
    return checkpoint_with_state(header, state)


def record_edits(
    json_codec: Codec,
    tags: Mapping[str, str] | None,
    metadata: Mapping[str, Any] | None,
    parent_id: str | None,
) -> RecordEdits | None:
    """What ``update(tags=, metadata=, parent_id=)`` replaces (``None``: nothing)."""
    if tags is None and metadata is None and parent_id is None:
        return None
    if parent_id is not None:
        check_id(parent_id, what="parent_id")
    return RecordEdits(
        tags=None if tags is None else check_tags(tags),
        metadata=None if metadata is None else _metadata(json_codec, metadata),
        parent_id=parent_id,
    )


def _metadata(json_codec: Codec, metadata: Any) -> dict[str, Any]:
    # check_metadata refuses a non-mapping with CheckpointEncodeError; calling
    # dict() on it first would raise a bare TypeError, or accept a list of pairs.
    # type() first: the ABC isinstance check costs more than a save's whole metadata check
    if type(metadata) is dict or isinstance(metadata, Mapping):
        metadata = dict(metadata)
    return json_codec.check_metadata(metadata)


def check_ttl(rule: TtlRule, ttl: TTL | None) -> float | None:
    """``ttl`` in seconds, or :class:`InvalidQuery` for a bad one or a backend
    without TTL (``rule``)."""
    if ttl is None:
        return None
    if not rule.supported:
        raise InvalidQuery(f"the {rule.backend_name} backend does not support ttl")
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise InvalidQuery(f"ttl must be a positive number of seconds or timedelta, got {ttl!r}")
    return float(seconds)
