"""Batches, edits and prefixes on Redis beyond the kit (SPEC S3a, S13, S14).

Every multi-id script checks every id before its first write, because a Redis
script that fails half-way keeps the writes it made: a damaged key refuses the
whole call and leaves every key as it was (compared by ``DUMP``). Races with
other connections are in ``test_redis_concurrency.py``, round trips in
``test_redis_store.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from statekeeper_redis import DamagedStoreError, RedisCheckpointStore

from statekeeper import Checkpoint, NewCheckpoint
from statekeeper.errors import CheckpointDecodeError, PreconditionFailed
from statekeeper.testing import FakeClock

Maker = Callable[..., RedisCheckpointStore]


async def _snapshot(store: RedisCheckpointStore) -> dict[bytes, bytes | None]:
    """Every key of the store with its serialized value (DUMP)."""
    keys = [k async for k in store.client.scan_iter(match=store.key_prefix + "*", count=1000)]
    return {k: await store.client.dump(k) for k in sorted(keys)}


async def _refused_untouched(
    store: RedisCheckpointStore, call: Awaitable[Any], error: type[Exception]
) -> None:
    before = await _snapshot(store)
    with pytest.raises(error):
        await call
    assert await _snapshot(store) == before, "a refused call wrote something"


async def _seed(store: RedisCheckpointStore) -> list[Checkpoint]:
    """Three checkpoints of ``job``; only the last one carries the tag ``late=yes``."""
    cps = [await store.save("job", {"n": i}, tags={"kind": "step"}) for i in range(2)]
    cps.append(await store.save("job", {"n": 2}, tags={"kind": "step", "late": "yes"}))
    return cps


# -- load_many keeps the damage detection -------------------------------------------------------


@pytest.mark.asyncio
async def test_load_many_raises_for_a_lost_record(make_store: Maker) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        await store.client.delete(f"{store.key_prefix}r:{cps[1].id}")
        with pytest.raises(CheckpointDecodeError) as info:
            await store.load_many([cp.id for cp in cps])
        assert info.value.id == cps[1].id and info.value.sequence == cps[1].sequence
        assert f"r:{cps[1].id}" in (info.value.location or "")
        got = await store.load_many([cps[0].id, cps[2].id, "never-saved"])
        assert [cp.state for cp in got.values()] == [{"n": 0}, {"n": 2}]


@pytest.mark.asyncio
async def test_load_many_reads_a_record_missing_from_the_global_index(make_store: Maker) -> None:
    """Records are the truth: an index entry gone does not hide a record (verify reports it)."""
    async with make_store() as store:
        cps = await _seed(store)
        await store.client.zrem(store.key_prefix + "all", cps[0].id)
        got = await store.load_many([cps[0].id])
        assert got[cps[0].id].state == {"n": 0} and got[cps[0].id].sequence == cps[0].sequence


# -- save_many: every check before the first write ------------------------------------------------


@pytest.mark.asyncio
async def test_save_many_with_a_wrong_typed_key_of_its_last_item_writes_nothing(
    make_store: Maker,
) -> None:
    async with make_store() as store:
        await _seed(store)
        await store.client.set(store.key_prefix + "t:bad\x00key", "not a zset")
        batch = [NewCheckpoint(stream="job", state={"i": i}) for i in range(3)]
        batch.append(NewCheckpoint(stream="new", tags={"bad": "key"}))
        await _refused_untouched(store, store.save_many(batch), DamagedStoreError)
        await store.client.delete(store.key_prefix + "t:bad\x00key")
        saved = await store.save_many(batch)
        assert [cp.sequence for cp in saved] == [4, 5, 6, 7]


@pytest.mark.asyncio
async def test_save_many_reusing_an_expired_id_with_a_broken_id_hash_entry_writes_nothing(
    make_store: Maker,
) -> None:
    clock = FakeClock()
    async with make_store(clock=clock) as store:
        await store.save("old", {}, id="reused", ttl=10)
        clock.advance(11)
        await store.client.hset(store.key_prefix + "i", "reused", "{not json")
        batch = [NewCheckpoint(stream="job"), NewCheckpoint(stream="job", id="reused")]
        await _refused_untouched(store, store.save_many(batch), DamagedStoreError)
        await store.repair()
        saved = await store.save_many(batch)
        assert [cp.sequence for cp in saved] == [2, 3]
        assert await store.list_streams() == ["job"]


@pytest.mark.asyncio
async def test_save_many_with_a_lost_id_last_writes_nothing(make_store: Maker) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        await store.client.delete(f"{store.key_prefix}r:{cps[0].id}")
        batch = [NewCheckpoint(stream="job"), NewCheckpoint(stream="x", id=cps[0].id)]
        await _refused_untouched(store, store.save_many(batch), PreconditionFailed)


# -- multi-id deletes: all checked first (regressions: a half-done script kept its writes) ----


@pytest.mark.asyncio
async def test_delete_many_refuses_a_damaged_id_and_deletes_none(make_store: Maker) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        await store.client.hset(store.key_prefix + "i", cps[2].id, '{"s": "job"}')
        ids = [cp.id for cp in cps]
        await _refused_untouched(store, store.delete_many(ids), DamagedStoreError)
        await store.repair()
        assert await store.delete_many(ids) == 3


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["tag key retyped", "id-hash entry malformed"])
@pytest.mark.parametrize("call", ["delete_stream", "prune", "purge_expired", "delete_many"])
async def test_damage_at_a_later_checkpoint_refuses_the_whole_call(
    make_store: Maker, how: str, call: str
) -> None:
    """The damage belongs to the last checkpoint only, so a script that unlinked
    one id after another would have removed the first ones before failing."""
    clock = FakeClock()
    async with make_store(clock=clock) as store:
        cps = [await store.save("job", {"n": i}, tags={"kind": "step"}, ttl=10) for i in range(2)]
        cps.append(await store.save("job", {"n": 2}, tags={"kind": "step", "late": "yes"}, ttl=10))
        await store.save("job", {"n": 3})  # the newest, which prune keeps
        if how == "tag key retyped":
            await store.client.delete(store.key_prefix + "t:late\x00yes")
            await store.client.set(store.key_prefix + "t:late\x00yes", "a string")
        else:
            await store.client.hset(store.key_prefix + "i", cps[2].id, "{not json")
        if call == "purge_expired":
            clock.advance(11)
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "delete_stream": lambda: store.delete_stream("job"),
            "prune": lambda: store.prune("job", keep_last=1),
            "purge_expired": store.purge_expired,
            "delete_many": lambda: store.delete_many([cp.id for cp in cps]),
        }
        await _refused_untouched(store, calls[call](), DamagedStoreError)
        await store.repair()
        assert await calls[call]() == (4 if call == "delete_stream" else 3)


# -- update with edits, codec="raw" -------------------------------------------------------------


@pytest.mark.asyncio
async def test_update_edits_live_in_the_record_and_raw_state_is_stored_verbatim(
    make_store: Maker,
) -> None:
    async with make_store(codec="raw") as store:
        parent = await store.save("job", b"\x00parent")
        cp = await store.save("job", b"\xff\x00v1", tags={"kind": "a"}, metadata={"m": 1})
        state = bytes(range(256))
        updated = await store.update(
            cp.id,
            state,
            if_match=cp.etag,
            tags={"kind": "b"},
            metadata={"m": True},
            parent_id=parent.id,
        )
        blob = await store.client.get(f"{store.key_prefix}r:{cp.id}")
        assert blob.endswith(state) and b"base64" not in blob and b'"codec":"raw"' in blob
        assert (updated.sequence, updated.created_at) == (cp.sequence, cp.created_at)
        again = await store.load(cp.id)
        assert (again.state, again.tags, again.metadata, again.parent_id) == (
            state,
            {"kind": "b"},
            {"m": True},
            parent.id,
        )
        assert [c.id for c in (await store.list("job", metadata={"m": True})).items] == [cp.id]
        assert (await store.list("job", metadata={"m": 1})).items == []
        assert [c.id for c in (await store.list("job", tags={"kind": "b"})).items] == [cp.id]
        assert (await store.list("job", tags={"kind": "a"})).items == []
        assert (await store.verify()).ok


# -- list_streams(prefix=): Redis glob characters are literal -------------------------------------

GLOB_STREAMS = ["a*b", "a?", "a[b]", "a[", "a]", "a\\*", "a\\", "*", "?x", "ab", "a-b", "[ab]"]
GLOB_PREFIXES = ["a*", "a?", "a[", "a[b", "[", "[ab]", "a\\", "a\\*", "*", "?", "a", "]", "a-"]


@pytest.mark.asyncio
async def test_list_streams_prefix_treats_glob_characters_literally(make_store: Maker) -> None:
    async with make_store() as store:
        for name in GLOB_STREAMS:
            await store.save(name, {})
        for prefix in GLOB_PREFIXES:
            want = sorted(n for n in GLOB_STREAMS if n.startswith(prefix))
            assert await store.list_streams(prefix=prefix) == want, prefix


@pytest.mark.asyncio
async def test_list_streams_prefix_over_an_empty_name_set_is_damage(make_store: Maker) -> None:
    async with make_store() as store:
        await _seed(store)
        assert await store.list_streams(prefix="nothing") == []
        await store.client.delete(store.key_prefix + "n")
        with pytest.raises(DamagedStoreError):
            await store.list_streams(prefix="nothing")
        await store.repair()
        assert await store.list_streams(prefix="j") == ["job"]
