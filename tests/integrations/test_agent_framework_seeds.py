"""The Agent Framework bugs this adapter must not have, on every backend.

- A newest checkpoint that cannot be decoded makes ``get_latest`` raise; it never
  returns the previous one (agent-framework #7831).
- Saves in the same second (equal timestamps) come back in save order, and the
  newest is the last saved even when timestamps go backwards (the state-store
  ordering seed).
- ``save`` refuses, with nothing written, what ``load`` would refuse (#8181).
- ``get_latest`` costs one store read and one decode at 10 or 10,000 checkpoints
  (``FileCheckpointStorage`` decodes every file).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException
from agent_framework_stores import Backend, backend_fixture  # noqa: F401  (the fixture)

import statekeeper.integrations.agent_framework as adapter
from statekeeper.errors import CheckpointNotFound
from statekeeper.integrations.agent_framework import _codec

pytestmark = pytest.mark.asyncio

WF = "seed-wf"


@dataclass
class Secret:
    """Not registered with the framework: only an allowlisting storage may load it."""

    value: str


SECRET = f"{__name__}:Secret"


def cp(**fields: Any) -> WorkflowCheckpoint:
    fields.setdefault("workflow_name", WF)
    fields.setdefault("graph_signature_hash", "sig")
    return WorkflowCheckpoint(**fields)


async def test_newest_with_a_type_outside_the_allowlist_raises_never_stale(
    backend: Backend,
) -> None:
    writer = backend.storage(allowed_checkpoint_types=[SECRET])
    old = cp(state={"step": 1})
    new = cp(state={"step": 2, "secret": Secret("s")}, previous_checkpoint_id=old.checkpoint_id)
    await writer.save(old)
    await writer.save(new)
    latest = await writer.get_latest(workflow_name=WF)
    assert latest is not None and latest.checkpoint_id == new.checkpoint_id

    reader = backend.storage()  # a restarted process without the allowlist entry
    with pytest.raises(WorkflowCheckpointException, match="refusing to return an older one"):
        await reader.get_latest(workflow_name=WF)
    with pytest.raises(WorkflowCheckpointException, match="blocked"):
        await reader.load(new.checkpoint_id)
    assert (await reader.load(old.checkpoint_id)).state == {"step": 1}
    # listing stays tolerant, like the framework's: the old one alone is readable
    assert [c.checkpoint_id for c in await reader.list_checkpoints(workflow_name=WF)] == [
        old.checkpoint_id
    ]


UNDECODABLE = {
    "bad-pickle": b'{"state": {"__pickled__": "!!", "__type__": "x:y"}}',
    "not-json": b"{ invalid json }",
    "not-utf8": b'{"workflow_name": "\xff\xfe"}',
    "not-an-object": b"[]",
    "missing-fields": b'{"workflow_name": "seed-wf"}',
    "too-deep": b'{"state": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.mark.parametrize("payload", list(UNDECODABLE))
async def test_newest_with_undecodable_bytes_raises_never_stale(
    backend: Backend, payload: str
) -> None:
    storage = backend.storage()
    old = cp(state={"step": 1})
    await storage.save(old)
    raw = backend.raw_store()
    async with raw:  # a newest record the framework cannot decode, written behind its back
        await raw.save(
            storage.stream_for(WF),
            UNDECODABLE[payload],
            id=storage.store_id_for("newest"),
            metadata={"format": adapter.FORMAT, "checkpoint_id": "newest", "workflow_name": WF},
        )
    with pytest.raises(WorkflowCheckpointException, match="refusing to return an older one"):
        await storage.get_latest(workflow_name=WF)
    with pytest.raises(WorkflowCheckpointException):
        await storage.load("newest")
    listed = await storage.list_checkpoints(workflow_name=WF)
    assert [c.checkpoint_id for c in listed] == [old.checkpoint_id]


async def test_newest_record_damaged_in_storage_raises_never_stale(backend: Backend) -> None:
    storage = backend.storage()
    old, new = cp(state={"step": 1}), cp(state={"step": 2})
    await storage.save(old)
    await storage.save(new)
    raw = backend.raw_store()
    async with raw:
        sid = storage.store_id_for(new.checkpoint_id)
        try:
            data = await raw.backdoor_read_raw(sid)
        except NotImplementedError:
            pytest.skip(f"{backend.name} has no raw-record backdoor to damage a record with")
        await raw.backdoor_write_raw(sid, data[: len(data) // 2])
    with pytest.raises(WorkflowCheckpointException, match="refusing to return an older one"):
        await storage.get_latest(workflow_name=WF)
    with pytest.raises(WorkflowCheckpointException):
        await storage.load(new.checkpoint_id)


async def test_saves_in_the_same_second_come_back_in_save_order(backend: Backend) -> None:
    storage = backend.storage()
    stamp = "2026-01-01T00:00:00+00:00"
    saved = [cp(timestamp=stamp, state={"step": i}, iteration_count=i) for i in range(12)]
    for item in saved:
        await storage.save(item)
    latest = await storage.get_latest(workflow_name=WF)
    assert latest is not None and latest.state == {"step": 11}
    ids = [c.checkpoint_id for c in saved]
    assert [c.checkpoint_id for c in await storage.list_checkpoints(workflow_name=WF)] == ids
    assert await storage.list_checkpoint_ids(workflow_name=WF) == ids


async def test_newest_is_the_last_saved_even_when_its_timestamp_is_older(
    backend: Backend,
) -> None:
    storage = backend.storage()
    later = cp(timestamp="2030-01-01T00:00:00+00:00", state={"saved": "first"})
    earlier = cp(timestamp="2020-01-01T00:00:00+00:00", state={"saved": "second"})
    await storage.save(later)
    await storage.save(earlier)  # a clock stepped back between two saves
    latest = await storage.get_latest(workflow_name=WF)
    assert latest is not None and latest.state == {"saved": "second"}


async def test_concurrent_saves_are_all_kept_and_latest_is_the_last_listed(
    backend: Backend,
) -> None:
    storage = backend.storage()
    items = [cp(state={"n": i}) for i in range(20)]
    await asyncio.gather(*(storage.save(item) for item in items))
    ids = await storage.list_checkpoint_ids(workflow_name=WF)
    assert sorted(ids) == sorted(c.checkpoint_id for c in items)
    latest = await storage.get_latest(workflow_name=WF)
    assert latest is not None and latest.checkpoint_id == ids[-1]


async def _nothing_written(storage: adapter.StatekeeperCheckpointStorage, before: str) -> None:
    assert await storage.list_checkpoint_ids(workflow_name=WF) == [before]
    latest = await storage.get_latest(workflow_name=WF)
    assert latest is not None and latest.checkpoint_id == before


async def test_save_refuses_a_type_load_would_refuse_and_writes_nothing(
    backend: Backend,
) -> None:
    storage = backend.storage()
    first = cp()
    await storage.save(first)
    refused = cp(state={"secret": Secret("s")})
    with pytest.raises(WorkflowCheckpointException, match="refusing to save"):
        await storage.save(refused)
    await _nothing_written(storage, first.checkpoint_id)
    with pytest.raises(WorkflowCheckpointException):
        await storage.load(refused.checkpoint_id)


async def test_save_refuses_what_cannot_be_encoded_and_writes_nothing(backend: Backend) -> None:
    storage = backend.storage()
    first = cp()
    await storage.save(first)
    with pytest.raises(WorkflowCheckpointException, match="cannot be encoded"):
        await storage.save(cp(state={"fn": lambda: None}))
    await _nothing_written(storage, first.checkpoint_id)


async def test_save_refuses_what_is_over_the_stores_size_limit(backend: Backend) -> None:
    storage = backend.storage(store_options={"max_bytes": 4096})
    first = cp()
    await storage.save(first)
    with pytest.raises(WorkflowCheckpointException, match="max_bytes"):
        await storage.save(cp(state={"blob": "x" * 10_000}))
    await _nothing_written(storage, first.checkpoint_id)


async def test_resaving_an_id_replaces_it_in_place_and_keeps_its_position(
    backend: Backend,
) -> None:
    storage = backend.storage()
    first, second = cp(state={"v": 1}), cp(state={"v": 2})
    await storage.save(first)
    await storage.save(second)
    first.state["v"] = 10
    assert await storage.save(first) == first.checkpoint_id
    assert (await storage.load(first.checkpoint_id)).state == {"v": 10}
    assert await storage.list_checkpoint_ids(workflow_name=WF) == [
        first.checkpoint_id,
        second.checkpoint_id,
    ]
    moved = WorkflowCheckpoint(
        workflow_name="another-wf", graph_signature_hash="sig", checkpoint_id=first.checkpoint_id
    )
    with pytest.raises(WorkflowCheckpointException, match="already saved under workflow"):
        await storage.save(moved)


class Calls:
    """Counts calls of a real store's methods and of the framework's decoder."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: Any) -> None:
        self.counts: Counter[str] = Counter()
        for name in ("get_latest", "load", "load_many", "list", "_decode_strict", "_latest"):
            monkeypatch.setattr(store, name, self._wrap(name, getattr(store, name)))
        monkeypatch.setattr(  # where the storage's codec looks it up
            _codec,
            "decode_checkpoint_value",
            self._wrap("framework decode", _codec.decode_checkpoint_value),
        )

    def _wrap(self, name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            return fn(*args, **kwargs)

        return counted


async def test_get_latest_costs_the_same_at_10_and_10000_checkpoints(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = backend.storage()
    store = storage.store
    costs: dict[int, Counter[str]] = {}
    total = 0
    for size in (10, 10_000):
        while total < size:
            checkpoints = [
                cp(state={"n": total + i, "pad": "p" * 200}) for i in range(min(1000, size - total))
            ]
            batch = [storage.encode(c) for c in checkpoints]
            await storage.save(cp(state={"n": -1}))  # opens the store, and mixes in single saves
            await store.save_many(batch)
            total += len(batch) + 1
        last_id = checkpoints[-1].checkpoint_id
        with monkeypatch.context() as patch:
            calls = Calls(patch, store)
            latest = await storage.get_latest(workflow_name=WF)
            costs[size] = calls.counts
        assert latest is not None and latest.checkpoint_id == last_id
    assert costs[10] == costs[10_000], costs
    assert costs[10_000]["get_latest"] == 1
    assert costs[10_000]["framework decode"] == 1
    assert costs[10_000]["list"] == costs[10_000]["load"] == 0
    # the listings page through all of them, in save order
    ids = await storage.list_checkpoint_ids(workflow_name=WF)
    assert len(ids) == total and len(set(ids)) == total and ids[-1] == last_id


async def test_load_of_a_foreign_record_under_a_mapped_id_raises(backend: Backend) -> None:
    storage = backend.storage()
    raw = backend.raw_store()
    async with raw:
        await raw.save("someone-else", b"not ours", id=storage.store_id_for("theirs"))
    with pytest.raises(WorkflowCheckpointException, match="is not the Agent Framework checkpoint"):
        await storage.load("theirs")
    with pytest.raises(CheckpointNotFound):
        async with backend.raw_store() as again:
            await again.load(storage.store_id_for("never-saved"))


async def test_the_frameworks_file_storage_decodes_every_checkpoint_for_latest(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the docs say of FileCheckpointStorage, checked: its get_latest decodes
    every checkpoint (ours decodes one, above)."""
    import agent_framework._workflows._checkpoint_encoding as encoding
    from agent_framework import FileCheckpointStorage

    files = FileCheckpointStorage(tmp_path / "files")
    decodes: dict[int, int] = {}
    saved = 0
    for size in (10, 200):
        while saved < size:
            await files.save(cp(state={"n": saved}))
            saved += 1
        calls = Counter[str]()
        real = encoding.decode_checkpoint_value

        def counted(*args: Any, _real: Any = real, _calls: Any = calls, **kwargs: Any) -> Any:
            _calls["decode"] += 1
            return _real(*args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(encoding, "decode_checkpoint_value", counted)
            assert await files.get_latest(workflow_name=WF) is not None
        decodes[size] = calls["decode"]
    assert decodes == {10: 10, 200: 200}
