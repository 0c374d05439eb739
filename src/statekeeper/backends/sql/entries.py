"""Scanned rows read back into a listing's entries: records, or a :class:`Skipped`
entry for a record that cannot be read (every dialect's pages)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..._core.validate import skipped_from
from ...errors import CheckpointDecodeError
from ...models import Checkpoint, Skipped
from ...record import StateDecoder, StoredRecord, read_checkpoint, read_record

__all__ = ["scanned_entries"]


def scanned_entries(
    rows: Iterable[Sequence[Any]],
    location_of: Callable[[int], str],
    store_id: str | None,
    decoders: Mapping[str, StateDecoder] | None,
) -> list[StoredRecord | Checkpoint | Skipped]:
    """The entries of scanned ``(seq, id, record)`` rows: each record read
    (:func:`~statekeeper.record.read_record`), or with ``decoders`` read and its
    state decoded where it decodes (:func:`~statekeeper.record.read_checkpoint`);
    a record that cannot be read is a :class:`Skipped` entry."""
    out: list[StoredRecord | Checkpoint | Skipped] = []
    append = out.append
    for seq, rid, blob in rows:
        try:
            if decoders is not None:
                got: StoredRecord | Checkpoint = read_checkpoint(
                    blob, location_of, store_id=store_id, id=rid, sequence=seq, decoders=decoders
                )
            else:
                got = read_record(blob, location_of, store_id=store_id, id=rid, sequence=seq)
        except CheckpointDecodeError as exc:
            append(skipped_from(exc, rid, seq))
        else:
            append(got)
    return out
