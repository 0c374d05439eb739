"""Damage to a Redis store: acknowledged means remembered (SPEC S3, S3a).

Every key of a store can be damaged or lost: overwritten by another program,
deleted by an operator, evicted under ``maxmemory``. A damage sweep over the
record keys, every index key and the meta hash asserts that no read answers with
older state or "empty", that ``verify()`` (read-only) reports it, that
``repair()`` rebuilds what the records hold and keeps each damaged checkpoint,
and that only ``repair(drop_damaged=True)`` makes one go away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis.asyncio as aioredis
from statekeeper_redis import DamagedStoreError, RedisCheckpointStore

from statekeeper import Checkpoint
from statekeeper.errors import (
    CheckpointDecodeError,
    ReadOnlyStore,
    StatekeeperError,
    StoreFormatError,
    StoreNotFound,
)

Maker = Callable[..., RedisCheckpointStore]
T = TypeVar("T")


async def _right_or_refused(read: Awaitable[T], right: Callable[[T], bool]) -> None:
    """A read over damaged metadata answers right, or raises saying how to repair."""
    try:
        value = await read
    except StatekeeperError as exc:
        refusal = str(exc)
    else:
        assert right(value), value
        return
    assert "repair" in refusal, refusal


async def _snapshot(client: aioredis.Redis, prefix: str) -> dict[bytes, bytes | None]:
    """Every key of the store with its serialized value (DUMP), to prove nothing changed."""
    keys = [k async for k in client.scan_iter(match=prefix + "*", count=1000)]
    return {k: await client.dump(k) for k in sorted(keys)}


async def _seed(store: RedisCheckpointStore) -> list[Checkpoint]:
    """Five checkpoints in ``job`` (tagged) around one in ``other``: sequences 1..6."""
    cps = [await store.save("job", {"n": i}, tags={"kind": "step"}) for i in range(1, 4)]
    cps.append(await store.save("other", {"n": 0}))
    cps += [await store.save("job", {"n": i}, tags={"kind": "step"}) for i in range(4, 6)]
    return cps


def _job(cps: list[Checkpoint]) -> list[Checkpoint]:
    return [cp for cp in cps if cp.stream == "job"]


async def _assert_damaged_is_remembered(
    store: RedisCheckpointStore, cps: list[Checkpoint], damaged: Checkpoint
) -> None:
    """S3a for one damaged checkpoint: strict reads raise naming it, listings report it."""
    newest = _job(cps)[-1]
    if damaged.id == newest.id:
        with pytest.raises(CheckpointDecodeError) as info:
            await store.get_latest("job")
        assert info.value.id == damaged.id
        assert f"r:{damaged.id}" in (info.value.location or "")
    else:
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == newest.id
    with pytest.raises(CheckpointDecodeError):
        await store.load(damaged.id)
    page = await store.list("job", limit=100)
    assert [s.id for s in page.skipped] == [damaged.id]
    assert [s.sequence for s in page.skipped] == [damaged.sequence]
    assert [c.id for c in page.items] == [c.id for c in reversed(_job(cps)) if c.id != damaged.id]
    everywhere = await store.list(None, limit=100, order="asc")
    assert [s.id for s in everywhere.skipped] == [damaged.id]
    assert "job" in await store.list_streams()
    for cp in cps:
        if cp.id != damaged.id:
            assert (await store.load(cp.id)).state == cp.state


# -- create=False and read_only=True --------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("options", [{"create": False}, {"read_only": True}])
async def test_opening_a_missing_store_without_create_raises_and_creates_no_key(
    make_store: Maker, key_prefix: str, options: dict[str, Any]
) -> None:
    store = make_store(**options)
    with pytest.raises(StoreNotFound) as info:
        await store.open()
    assert key_prefix in str(info.value)
    assert not store.is_open
    async with make_store() as probe:  # a normal open creates the store: look at it
        before = await _snapshot(probe.client, "{" + key_prefix + "}:")
    assert list(before) == [("{" + key_prefix + "}:meta").encode()]


@pytest.mark.asyncio
async def test_create_false_opens_an_existing_store(make_store: Maker) -> None:
    async with make_store() as store:
        cp = await store.save("job", {"n": 1})
    async with make_store(create=False) as store:
        assert (await store.load(cp.id)).state == {"n": 1}
        assert (await store.save("job", {"n": 2})).sequence == 2


@pytest.mark.asyncio
async def test_read_only_writes_no_key_even_on_a_damaged_store(make_store: Maker) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        prefix, client = store.key_prefix, store.client
        await client.hdel(prefix + "meta", "hwm")  # damage every repair would write to fix
        await client.delete(prefix + "s:other", prefix + "i")
        await client.delete(f"{prefix}r:{cps[1].id}")
        before = await _snapshot(client, prefix)
        # the read-only open also skips the durability refusal: it cannot lose a write
        ro = make_store(read_only=True, allow_unsafe_durability=False)
        async with ro:
            assert (await ro.get_latest("job")).id == cps[-1].id  # type: ignore[union-attr]
            await ro.list(None)
            report = await ro.verify()
            assert not report.ok
            with pytest.raises(ReadOnlyStore):
                await ro.save("job", {})
            with pytest.raises(ReadOnlyStore):
                await ro.repair()
            with pytest.raises(ReadOnlyStore):
                await ro.delete(cps[0].id)
        assert await _snapshot(client, prefix) == before


# -- damaged and lost record keys ---------------------------------------------------------


async def _damage_record(store: RedisCheckpointStore, cp: Checkpoint, how: str) -> None:
    key = f"{store.key_prefix}r:{cp.id}"
    raw = await store.backdoor_read_raw(cp.id)
    if how == "flip":
        await store.backdoor_write_raw(cp.id, raw[:-2] + bytes([raw[-2] ^ 0xFF]) + raw[-1:])
    elif how == "truncate":
        await store.backdoor_write_raw(cp.id, raw[: len(raw) // 2])
    elif how == "wrongtype":
        await store.client.delete(key)
        await store.client.hset(key, "x", "y")
    elif how == "delete":  # lost: deleted outside statekeeper, or evicted
        await store.client.delete(key)
    else:
        raise AssertionError(how)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["flip", "truncate", "wrongtype", "delete"])
@pytest.mark.parametrize("which", ["newest", "middle"])
async def test_damaged_record_is_remembered_until_dropped(
    make_store: Maker, how: str, which: str
) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        damaged = _job(cps)[-1] if which == "newest" else _job(cps)[1]
        await _damage_record(store, damaged, how)

        await _assert_damaged_is_remembered(store, cps, damaged)
        report = await store.verify()
        assert not report.ok and report.complete
        assert [(p.kind, p.id) for p in report.problems] == [("damaged-record", damaged.id)]

        repaired = await store.repair()
        assert [p.id for p in repaired.damaged] == [damaged.id]
        assert repaired.dropped == []
        assert repaired.records == len(cps)
        await _assert_damaged_is_remembered(store, cps, damaged)
        assert not (await store.verify()).ok
        # reopening keeps it too
        await store.close()
        await store.open()
        await _assert_damaged_is_remembered(store, cps, damaged)
        with pytest.raises(StatekeeperError):
            await store.save("job", {}, id=damaged.id)  # its id is still taken

        dropped = await store.repair(drop_damaged=True)
        assert [p.id for p in dropped.dropped] == [damaged.id]
        assert dropped.damaged == []
        survivors = [cp for cp in _job(cps) if cp.id != damaged.id]
        assert (await store.get_latest("job")).id == survivors[-1].id  # type: ignore[union-attr]
        page = await store.list("job", limit=100)
        assert page.skipped == [] and len(page.items) == len(survivors)
        assert (await store.verify()).ok
        # sequences go on from the high-water mark, not from what survived
        assert (await store.save("job", {})).sequence == len(cps) + 1
        assert [k async for k in store.client.scan_iter(match=f"*r:{damaged.id}")] == []


@pytest.mark.asyncio
async def test_delete_removes_a_lost_checkpoint(make_store: Maker) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        await store.client.delete(f"{store.key_prefix}r:{cps[-1].id}")
        assert await store.delete(cps[-1].id) is True
        assert (await store.get_latest("job")).id == cps[-2].id  # type: ignore[union-attr]
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_an_expired_record_is_not_damage(make_store: Maker) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        short = await store.save("job", {"short": True}, ttl=0.2)
        key = f"{store.key_prefix}r:{short.id}"
        # Redis expires the key by itself (EXISTS expires a due key at once); the
        # 60 s are only a guard against a server that never does
        deadline = asyncio.get_running_loop().time() + 60
        while await store.client.exists(key):
            assert asyncio.get_running_loop().time() < deadline, "Redis never expired the key"
            await asyncio.sleep(0.02)
        assert await store.client.zscore(store.key_prefix + "all", short.id) is not None
        assert (await store.get_latest("job")).id == cps[-1].id  # type: ignore[union-attr]
        assert (await store.list("job")).skipped == []
        assert (await store.verify()).ok
        report = await store.repair()
        assert report.damaged == [] and report.records == len(cps)


@pytest.mark.asyncio
async def test_a_ttl_record_gone_long_before_its_expiry_is_lost_not_expired(
    make_store: Maker,
) -> None:
    """Eviction (``volatile-*`` policies evict keys with a TTL) or a deletion before
    the checkpoint expires is a loss, not an expiry."""
    async with make_store() as store:
        cps = await _seed(store)
        doomed = await store.save("job", {"ttl": True}, ttl=3600)
        await store.client.delete(f"{store.key_prefix}r:{doomed.id}")
        with pytest.raises(CheckpointDecodeError) as info:
            await store.get_latest("job")
        assert info.value.id == doomed.id and "missing" in info.value.reason
        assert [(p.kind, p.id) for p in (await store.verify()).problems] == [
            ("damaged-record", doomed.id)
        ]
        assert len(cps) == 6


# -- index keys -------------------------------------------------------------------------------

INDEX_KEYS = ["s:job", "all", "i", "e", "x", "n", "h", "t:kind\x00step"]


@pytest.mark.asyncio
@pytest.mark.parametrize("key", INDEX_KEYS)
@pytest.mark.parametrize("how", ["delete", "wrongtype"])
async def test_damaged_index_key_is_detected_never_read_as_empty(
    make_store: Maker, key: str, how: str
) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        ttl = await store.save("job", {"ttl": True}, ttl=3600, tags={"kind": "step"})
        cps.append(ttl)
        full = store.key_prefix + key
        await store.client.delete(full)
        if how == "wrongtype":
            await store.client.set(full, b"junk")
        # no read answers older state or "nothing": each is right, or raises saying repair
        await _right_or_refused(
            store.get_latest("job"), lambda cp: cp is not None and cp.id == ttl.id
        )
        for cp in cps:
            await _right_or_refused(store.load(cp.id), lambda got, cp=cp: got.state == cp.state)
        await _right_or_refused(store.list_streams(), lambda got: sorted(got) == ["job", "other"])
        want = [c.id for c in reversed(cps)]
        await _right_or_refused(
            store.list(None, limit=100), lambda page: [c.id for c in page.items] == want
        )

        report = await store.verify()
        assert not report.ok
        assert {p.kind for p in report.problems} <= {"index", "state"}, report.problems

        repaired = await store.repair()
        assert repaired.rebuilt, repaired
        assert repaired.damaged == [] and repaired.records == len(cps)
        assert (await store.verify()).ok, (await store.verify()).problems
        assert (await store.get_latest("job")).id == ttl.id  # type: ignore[union-attr]
        tagged = await store.list(None, tags={"kind": "step"}, limit=100)
        assert len(tagged.items) == len(cps) - 1
        assert sorted(await store.list_streams()) == ["job", "other"]
        # writes work again on the rebuilt keys
        up = await store.update(ttl.id, {"ttl": 2})
        assert (await store.load(ttl.id)).etag == up.etag
        assert await store.delete(cps[0].id) is True
        assert (await store.save("job", {})).sequence == len(cps) + 1


@pytest.mark.asyncio
async def test_a_stream_index_missing_its_newest_entry_is_found_and_rebuilt(
    make_store: Maker,
) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        await store.client.zrem(store.key_prefix + "s:job", cps[-1].id)
        problems = (await store.verify()).problems
        assert problems and all(p.kind == "index" for p in problems)
        assert any(p.id == cps[-1].id for p in problems)
        report = await store.repair()
        assert report.rebuilt
        assert (await store.get_latest("job")).id == cps[-1].id  # type: ignore[union-attr]
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_a_lost_record_without_its_id_hash_entry_stays_reported(make_store: Maker) -> None:
    """Two faults at once: the record and its id-hash entry are gone; the stream
    index still says where the checkpoint was."""
    async with make_store() as store:
        cps = await _seed(store)
        lost = cps[-1]
        await store.client.delete(f"{store.key_prefix}r:{lost.id}")
        await store.client.hdel(store.key_prefix + "i", lost.id)
        with pytest.raises(CheckpointDecodeError):
            await store.get_latest("job")
        report = await store.repair()
        assert [p.id for p in report.damaged] == [lost.id]
        with pytest.raises(CheckpointDecodeError):
            await store.get_latest("job")
        await store.repair(drop_damaged=True)
        assert (await store.get_latest("job")).id == cps[-2].id  # type: ignore[union-attr]
        assert (await store.verify()).ok


# -- the sequence counter and the meta hash --------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("damage", ["hdel", "garbage", "lowered", "zero"])
async def test_a_damaged_counter_never_restarts_sequences(make_store: Maker, damage: str) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        meta = store.key_prefix + "meta"
        if damage == "hdel":
            await store.client.hdel(meta, "hwm")
        else:
            value = {"garbage": "12abc", "lowered": "2", "zero": "0"}[damage]
            await store.client.hset(meta, "hwm", value)
        with pytest.raises(StatekeeperError) as info:
            await store.save("job", {})
        assert "repair" in str(info.value)
        # a fresh instance (whose idea of the next sequence comes from the damaged key)
        async with make_store() as other:
            with pytest.raises(StatekeeperError):
                await other.save("job", {})
            assert (await other.get_latest("job")).id == cps[-1].id  # type: ignore[union-attr]
        assert (await store.list(None, limit=100)).items[0].id == cps[-1].id
        report = await store.verify()
        assert [p.kind for p in report.problems] == ["state"], report.problems
        repaired = await store.repair()
        assert repaired.rebuilt.get("high_water_mark") == 1
        assert (await store.verify()).ok
        assert (await store.save("job", {})).sequence == len(cps) + 1


@pytest.mark.asyncio
async def test_missing_meta_with_records_is_not_a_fresh_store(make_store: Maker) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        store_id = store.store_id
        await store.client.delete(store.key_prefix + "meta")
    with pytest.raises(StoreFormatError) as info:
        async with make_store(read_only=True):
            pass
    assert "repair" in str(info.value)
    # a writable open rebuilds the meta hash from the records: same store id, the
    # high-water mark from the highest sequence
    async with make_store(create=False) as store:
        assert store.store_id == store_id
        for cp in cps:
            assert (await store.load(cp.id)).state == cp.state
        report = await store.repair()
        assert any("meta" in action for action in report.actions), report.actions
        assert (await store.verify()).ok
        assert (await store.save("job", {})).sequence == len(cps) + 1


@pytest.mark.asyncio
async def test_records_alone_are_enough_to_rebuild_a_store(make_store: Maker) -> None:
    """Every key but the records is gone: the store is not new, and repair rebuilds
    every index from the records."""
    async with make_store() as store:
        cps = await _seed(store)
        prefix = store.key_prefix
        keys = [k async for k in store.client.scan_iter(match=prefix + "*")]
        await store.client.delete(*[k for k in keys if not k.startswith((prefix + "r:").encode())])
    with pytest.raises(StoreFormatError):  # a damaged store, never StoreNotFound
        async with make_store(read_only=True):
            pass
    async with make_store() as store:
        report = await store.repair()
        assert report.records == len(cps) and report.damaged == []
        assert (await store.get_latest("job")).id == cps[-1].id  # type: ignore[union-attr]
        assert sorted(await store.list_streams()) == ["job", "other"]
        assert (await store.verify()).ok
        assert (await store.save("job", {})).sequence == len(cps) + 1


@pytest.mark.asyncio
async def test_a_damaged_record_no_index_places_is_reported_and_dropped(make_store: Maker) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        p, stray = store.key_prefix, cps[-1]
        await store.backdoor_write_raw(stray.id, b"garbage")
        await store.client.zrem(p + "all", stray.id)
        await store.client.zrem(p + "s:job", stray.id)
        await store.client.hdel(p + "i", stray.id)
        with pytest.raises(CheckpointDecodeError):
            await store.load(stray.id)  # the record key is still the truth for its id
        report = await store.verify()
        assert ("damaged-record", stray.id) in [(x.kind, x.id) for x in report.problems]
        kept = await store.repair()
        assert [x.id for x in kept.damaged] == [stray.id]
        assert await store.client.exists(f"{p}r:{stray.id}")
        dropped = await store.repair(drop_damaged=True)
        assert [x.id for x in dropped.dropped] == [stray.id]
        assert not await store.client.exists(f"{p}r:{stray.id}")
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_a_foreign_key_under_the_prefix_is_reported_and_left_alone(make_store: Maker) -> None:
    async with make_store() as store:
        await _seed(store)
        junk = store.key_prefix + "somebody-elses"
        await store.client.set(junk, b"x")
        problems = (await store.verify()).problems
        assert [(x.kind, junk in x.location) for x in problems] == [("foreign", True)]
        await store.repair()
        assert await store.client.get(junk) == b"x"


@pytest.mark.asyncio
async def test_repair_never_undoes_a_write_made_while_it_ran(
    make_store: Maker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statekeeper_redis import _audit, _repair

    async with make_store() as store:
        cps = await _seed(store)
        target = cps[-1]
        await store.client.hdel(store.key_prefix + "i", target.id)
        real_walk = _audit.walk

        async def walk_then_write(*args: Any) -> _audit.Audit:
            audit = await real_walk(*args)
            await store.update(target.id, {"during": "repair"})  # the record changes
            return audit

        monkeypatch.setattr(_repair, "walk", walk_then_write)
        report = await store.repair()
        assert any("changed during the repair" in a for a in report.actions), report.actions
        monkeypatch.setattr(_repair, "walk", real_walk)
        assert (await store.load(target.id)).state == {"during": "repair"}
        await store.repair()
        assert (await store.verify()).ok
        assert await store.delete(target.id) is True


@pytest.mark.asyncio
async def test_verify_finds_no_damage_in_a_store_that_writers_change(make_store: Maker) -> None:
    """The key walk reads one index key after another, then the records: a save in
    between must not look like a missing index entry. (Saves only: the core's walk
    reports a stream emptied by a concurrent delete between its listing and its
    get_latest, which is the core's to fix.)"""
    async with make_store() as store, make_store() as writer:
        await _seed(store)

        async def churn() -> None:  # bounded: a listing must be able to catch up
            for _ in range(300):
                await writer.save("churn", {"x": 1}, tags={"k": "v"}, ttl=60)

        task = asyncio.create_task(churn())
        checked = 0
        while not task.done() or checked == 0:
            report = await store.verify()
            assert report.ok, report.problems
            checked += 1
        await task


@pytest.mark.asyncio
async def test_an_update_that_replaces_tags_moves_their_index_entries(make_store: Maker) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        cp = cps[1]
        await store.update(cp.id, {"n": 9}, tags={"kind": "edited"})
        assert [c.id for c in (await store.list(None, tags={"kind": "edited"})).items] == [cp.id]
        assert cp.id not in [c.id for c in (await store.list(None, tags={"kind": "step"})).items]
        assert (await store.verify()).ok  # the indexes agree with the record
        assert await store.delete(cp.id) is True
        assert await store.client.zscore(store.key_prefix + "t:kind\x00edited", cp.id) is None


@pytest.mark.asyncio
async def test_verify_reports_from_the_walk_when_the_read_paths_refuse(
    make_store: Maker,
) -> None:
    """An index key of the wrong Redis type makes the read paths refuse
    (DamagedStoreError); verify() then answers from its walk of the keys (the
    _verify_refused primitive): incomplete, the refusal first among the problems,
    and nothing written."""
    async with make_store() as store:
        await _seed(store)
        prefix, client = store.key_prefix, store.client
        await client.delete(prefix + "all")
        await client.set(prefix + "all", "not a sorted set")
        with pytest.raises(DamagedStoreError):
            await store.list(None)
        before = await _snapshot(client, prefix)
        report = await store.verify()
        assert not report.ok and not report.complete
        assert report.problems[0].kind == "index"
        assert "wrong Redis type" in report.problems[0].reason
        assert report.records == 6
        assert await _snapshot(client, prefix) == before
