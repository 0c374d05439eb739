"""``SealedPrimitives.seal_new`` builds the sealed record field by field (the save
path's constructor, not ``dataclasses.replace``): every field of the record is
carried over as ``replace`` would, and the envelope opens to the state."""

from __future__ import annotations

import dataclasses
import inspect
import os
from datetime import UTC, datetime, timedelta

import pytest

import statekeeper as sk
from statekeeper._core.sealing import SealedPrimitives
from statekeeper.encryption.envelope import Sealer
from statekeeper.record import NewRecord, trusted_new_record

NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def _record() -> NewRecord:
    return trusted_new_record(
        id="0193f0c2a1b27c3d9e4f5a6b7c8d9e0f",
        stream="runs/42",
        state=b'{"step":1}',
        codec="sk-json/1",
        created_at=NOW - timedelta(seconds=5),
        updated_at=NOW,
        etag="e" * 16,
        parent_id="0193f0c2a1b27c3d9e4f5a6b7c8d9e0e",
        tags={"run": "a"},
        metadata={"step": 1},
        ttl=60.0,
        expires_at=NOW + timedelta(seconds=60),
        written_at=NOW + timedelta(microseconds=1),
    )


def test_the_save_path_constructor_takes_every_field_of_a_record() -> None:
    fields = [f.name for f in dataclasses.fields(NewRecord)]
    assert list(inspect.signature(trusted_new_record).parameters) == fields


@pytest.mark.parametrize("metadata", [False, True])
def test_seal_new_carries_every_field_as_replace_would(metadata: bool) -> None:
    keyring = sk.Keyring({"k1": os.urandom(32)}, active="k1")
    sealer = Sealer(keyring, "store-1", metadata=metadata)
    primitives = SealedPrimitives(sk.open_store("memory://"), sealer, lambda rid: rid)
    record = _record()
    sealed = primitives.seal_new(record)
    changes: dict[str, object] = {"state": sealed.state, "codec": sealed.codec}
    if metadata:
        changes.update(tags={}, metadata={})
    assert type(sealed) is NewRecord
    assert sealed == dataclasses.replace(record, **changes)  # type: ignore[arg-type]
    assert sealed.codec == "aes256gcm:sk-json/1" and sealed.state != record.state
    opened = sealer.open(record.id, record.stream, sealed.codec, sealed.state)
    assert opened.state == record.state and opened.codec == record.codec
    if metadata:
        assert (opened.tags, opened.metadata) == (record.tags, record.metadata)
