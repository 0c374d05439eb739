"""LangGraph's values in and out of store records, through the saver's serde.

:class:`Records` encodes a checkpoint's state (:func:`._layout.pack_checkpoint`)
and a task's pending writes, and decodes records back into LangGraph's
``Checkpoint``, metadata and ``CheckpointTuple``, in two steps so that a listing
can match the (small) metadata before it decodes the (large) checkpoint. What the
serde cannot decode is a :class:`~statekeeper.errors.CheckpointDecodeError`.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, cast

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from statekeeper.errors import CheckpointDecodeError
from statekeeper.models import Checkpoint as StoredCheckpoint

from . import _layout as lay


class Records:
    """The saver's serde applied to store records (see the module docstring)."""

    __slots__ = ("serde",)

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde

    # -- writing --------------------------------------------------------------------

    def checkpoint_state(
        self, ids: lay.Ids, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> bytes:
        """The state of a checkpoint record (``metadata``: as LangGraph completed it)."""
        stored = dict(checkpoint)
        versions = checkpoint["channel_versions"]
        # like InMemorySaver: only channels that have a version are part of the state
        stored["channel_values"] = {
            k: v for k, v in checkpoint["channel_values"].items() if k in versions
        }
        return lay.pack_checkpoint(
            ids, self.serde.dumps_typed(stored), self.serde.dumps_typed(metadata)
        )

    def writes(
        self, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> builtins.list[lay.Write]:
        return [
            lay.Write(
                task_id=task_id,
                idx=WRITES_IDX_MAP.get(channel, idx),
                channel=channel,
                task_path=task_path,
                value=self.serde.dumps_typed(value),
            )
            for idx, (channel, value) in enumerate(writes)
        ]

    # -- reading --------------------------------------------------------------------

    def _error(self, what: str, exc: Exception, record_id: str, sequence: int | None) -> Exception:
        return CheckpointDecodeError(
            f"LangGraph's serializer cannot decode {what}: {type(exc).__name__}: {exc}",
            id=record_id,
            sequence=sequence,
        )

    def decode_metadata(self, record: StoredCheckpoint) -> lay.Decoded:
        """The record's ids and LangGraph metadata; its checkpoint left encoded."""
        ids, checkpoint, metadata = lay.unpack_checkpoint(record.state, record.id, record.metadata)
        try:
            decoded = self.serde.loads_typed(metadata)
        except Exception as exc:  # the serde raises whatever its format raises
            raise self._error("it", exc, record.id, record.sequence) from exc
        return lay.Decoded(record.id, record.sequence, ids, checkpoint, decoded)

    def decode_checkpoint(self, decoded: lay.Decoded) -> Checkpoint:
        try:
            return cast(Checkpoint, self.serde.loads_typed(decoded.checkpoint))
        except Exception as exc:
            raise self._error("it", exc, decoded.record_id, decoded.sequence) from exc

    def decode(self, record: StoredCheckpoint) -> tuple[lay.Ids, Checkpoint, CheckpointMetadata]:
        decoded = self.decode_metadata(record)
        checkpoint = self.decode_checkpoint(decoded)
        return decoded.ids, checkpoint, cast(CheckpointMetadata, decoded.metadata)

    def tuple(
        self,
        ids: lay.Ids,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        writes: StoredCheckpoint | None,
    ) -> CheckpointTuple:
        pending: builtins.list[tuple[str, str, Any]] = []
        if writes is not None:
            stored = lay.unpack_writes(writes.state, writes.id)
            stored.sort(key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
            try:
                pending = [(w.task_id, w.channel, self.serde.loads_typed(w.value)) for w in stored]
            except Exception as exc:
                raise CheckpointDecodeError(
                    f"LangGraph's serializer cannot decode a pending write: {exc}",
                    id=writes.id,
                ) from exc
        base = {"thread_id": ids.thread_id, "checkpoint_ns": ids.checkpoint_ns}
        parent = ids.parent_checkpoint_id
        return CheckpointTuple(
            config={"configurable": {**base, "checkpoint_id": ids.checkpoint_id}},
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=({"configurable": {**base, "checkpoint_id": parent}} if parent else None),
            pending_writes=pending,
        )
