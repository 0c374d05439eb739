"""The data of an in-memory store: :class:`MemoryStorage` and its entries.

One :class:`Entry` per checkpoint (its index fields and envelope bytes, built on
first use when a save left them pending), the maps by id, by sequence and by
stream, and the store's lock. The store (``store.py``) holds one and reads and
writes it under that lock.
"""

from __future__ import annotations

import secrets
import threading
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from statekeeper import Problem
from statekeeper.record import NewRecord, StoredRecord

# private, for speed: see the package docstring
from ...record import header_values, verified_record

__all__ = ["Entry", "MemoryStorage", "fresh", "json_copy", "own_metadata", "remove_sorted"]


class Entry:
    """One checkpoint: its index fields and its envelope bytes.

    ``blob`` is built on first use when the save left it pending (see
    :meth:`~.store.MemoryCheckpointStore._insert_locked`): the same bytes, from the same
    values, that the save would have built. Every reader holds the store's lock.
    """

    __slots__ = (
        "_blob",
        "_pending",
        "_pending_metadata",
        "_store_id",
        "expires_at",
        "parsed",
        "sequence",
        "stream",
        "tags",
    )

    def __init__(
        self,
        sequence: int,
        stream: str,
        blob: bytes | None,
        tags: dict[str, str],
        expires_at: datetime | None,
        parsed: tuple[bytes | None, StoredRecord] | None = None,
        pending: NewRecord | None = None,
        store_id: str = "",
        pending_metadata: dict[str, Any] | None = None,
    ) -> None:
        self.sequence = sequence
        self.stream = stream
        self._blob = blob
        #: the record ``blob`` is built from (with ``store_id``), until it is built
        self._pending = pending
        #: the store's own copy of the pending record's metadata (``own_metadata``):
        #: what the caller passed may change after the save returns
        self._pending_metadata = pending_metadata
        self._store_id = store_id
        #: the store's own copy (the tag filter reads it): no caller holds it
        self.tags = tags
        self.expires_at = expires_at
        #: ``blob`` parsed and verified once (see ``_parse``), with the very bytes it
        #: came from (``None``: the pending envelope): it is reused only while
        #: ``blob`` is still those bytes
        self.parsed = parsed

    @property
    def blob(self) -> bytes:
        blob = self._blob
        if blob is None:
            stored = self._pending_record()
            assert stored is not None
            blob = self._blob = stored.to_bytes(self._store_id)
            self._pending = self._pending_metadata = None
        return blob

    @blob.setter
    def blob(self, value: bytes) -> None:
        self._blob = value
        self._pending = self._pending_metadata = None

    def _pending_record(self) -> StoredRecord | None:
        """The record a pending envelope is built from (``None`` when none is pending).

        The values the save saw: the entry's own tags and its own copy of the
        metadata (see ``_insert_locked``). This is what ``record.seal`` builds with
        those two fields (``dataclasses.replace`` would cost more than the envelope).
        """
        record = self._pending
        if record is None:
            return None
        values = record.header_values(self.sequence)
        values["tags"] = self.tags
        values["metadata"] = self._pending_metadata or {}
        return verified_record(values, record.state, record.codec, record.ttl)

    def read_pending(self) -> StoredRecord | None:
        """What parsing the pending envelope would give, without building it, or
        ``None`` when nothing is pending or the parse could differ.

        Every field round-trips through the envelope unchanged (strings without
        surrogates, ints, a float TTL, str tags, the metadata as
        :func:`own_metadata` read it back) except the timestamps:
        those are taken as they are only when each is an exact ``datetime`` in
        ``timezone.utc`` with ``fold`` 0 (the default clock's), which ``isoformat``
        and ``fromisoformat`` give back equal, in the same ``timezone.utc``. Any
        other clock (a ``ZoneInfo``, a naive time) is read from the bytes.
        """
        record = self._pending
        if record is None:
            return None
        for stamp in (record.created_at, record.updated_at, record.expires_at):
            if stamp is not None and (
                type(stamp) is not datetime or stamp.tzinfo is not UTC or stamp.fold
            ):
                return None
        return self._pending_record()

    @property
    def location(self) -> str:
        """Where the entry is, for problems and decode errors."""
        return f"memory:seq={self.sequence}"

    def live(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at > now


_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})
# the envelope's header is written and parsed by msgspec's JSON, as these are
_encode_json = msgspec.json.Encoder().encode
_decode_json = msgspec.json.Decoder().decode


def own_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The store's own copy of a save's ``metadata`` (which the codec's
    ``check_metadata`` took: plain, finite JSON): written and read back by msgspec,
    as the envelope's header is, so it is what parsing the envelope would give,
    value for value and type for type. Faster than :func:`json_copy` of the
    caller's dict, and no Python recursion however deep it nests."""
    copy: dict[str, Any] = _decode_json(_encode_json(metadata))
    return copy


def json_copy(value: Any) -> Any:
    """A deep copy of a parsed JSON value (containers new, scalars shared: immutable)."""
    t = type(value)
    if t is dict:
        if _SCALARS.issuperset(map(type, value.values())):
            return value.copy()
        return {k: json_copy(v) for k, v in value.items()}
    if t is list:
        if _SCALARS.issuperset(map(type, value)):
            return value.copy()
        return [json_copy(v) for v in value]
    return value


def fresh(record: StoredRecord) -> StoredRecord:
    """``record`` with a header of its own: the caller may mutate tags and metadata."""
    values = header_values(record).copy()
    values["tags"] = values["tags"].copy()
    values["metadata"] = json_copy(values["metadata"])
    return verified_record(values, record.state, record.codec, record.ttl)


@dataclass
class MemoryStorage:
    """The data of one in-memory store. Share it between instances to simulate reopen."""

    store_id: str = field(default_factory=lambda: secrets.token_hex(16))
    cursor_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    high_water_mark: int = 0
    by_id: dict[str, Entry] = field(default_factory=dict)
    by_seq: dict[int, str] = field(default_factory=dict)
    all_seqs: list[int] = field(default_factory=list)
    stream_seqs: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def problems(self) -> list[Problem]:
        """Where the id map, the sequence map and the sorted lists disagree
        (``MemoryCheckpointStore._verify``)."""
        data = self
        problems: list[Problem] = []
        with data.lock:
            by_stream = {s: set(seqs) for s, seqs in data.stream_seqs.items()}
            for id, entry in data.by_id.items():
                if (
                    data.by_seq.get(entry.sequence) != id
                    or entry.sequence not in by_stream.get(entry.stream, ())
                    or entry.sequence > data.high_water_mark
                ):
                    problems.append(
                        Problem(
                            kind="index",
                            location=entry.location,
                            reason="the in-memory maps disagree about this checkpoint",
                            id=id,
                            sequence=entry.sequence,
                            stream=entry.stream,
                        )
                    )
            if len(data.all_seqs) != len(data.by_id):
                problems.append(
                    Problem(
                        kind="index",
                        location="memory://",
                        reason=f"{len(data.all_seqs)} sequences are listed for "
                        f"{len(data.by_id)} checkpoints",
                    )
                )
        return problems


def remove_sorted(seqs: list[int], value: int) -> None:
    i = bisect_left(seqs, value)
    if i < len(seqs) and seqs[i] == value:
        del seqs[i]
