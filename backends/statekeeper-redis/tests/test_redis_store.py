"""Redis-specific behaviour: registration, key layout and isolation, TTL index cleanup,
format checks, scan budgets and round trips."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from statekeeper_redis import FORMAT_VERSION, RedisCheckpointStore

import statekeeper as sk
from statekeeper.errors import (
    CheckpointDecodeError,
    CheckpointNotFound,
    InvalidOptions,
    InvalidURL,
    StoreFormatError,
)
from statekeeper.testing import FakeClock

Maker = Callable[..., RedisCheckpointStore]


async def _keys(store: RedisCheckpointStore) -> set[str]:
    found: set[str] = set()
    async for key in store.client.scan_iter(match=store.key_prefix + "*", count=1000):
        found.add(key.decode() if isinstance(key, bytes) else key)
    return found


# -- registration and URLs ------------------------------------------------------------------


def test_schemes_are_registered_through_the_entry_point() -> None:
    backends = sk.available_backends()
    assert backends["redis"] == "statekeeper_redis:RedisCheckpointStore"
    assert backends["rediss"] == "statekeeper_redis:RedisCheckpointStore"


@pytest.mark.asyncio
async def test_open_store_by_url_with_query_options(redis_url: str, key_prefix: str) -> None:
    store = sk.open_store(
        f"{redis_url}?key_prefix={key_prefix}&allow_unsafe_durability=true&socket_timeout=5"
    )
    assert isinstance(store, RedisCheckpointStore)
    assert store.redis_options.key_prefix == key_prefix
    assert store.redis_options.socket_timeout == 5.0
    async with store:
        cp = await store.save("job", {"step": 1})
        assert (await store.load(cp.id)).state == {"step": 1}
    assert "allow_unsafe_durability" not in store.describe()
    assert store.describe().endswith(f"?key_prefix={key_prefix}")


def test_bad_urls_and_options_are_refused_at_once() -> None:
    with pytest.raises(InvalidURL):
        RedisCheckpointStore("redis://127.0.0.1:6379/notadb")
    with pytest.raises(InvalidURL):
        RedisCheckpointStore("memory://")
    with pytest.raises(InvalidOptions):
        RedisCheckpointStore("redis://127.0.0.1/0", key_prefix="has{brace}")
    with pytest.raises(InvalidOptions):
        RedisCheckpointStore("redis://127.0.0.1/0", no_such_option=1)
    with pytest.raises(InvalidOptions):
        RedisCheckpointStore("redis://127.0.0.1/0?key_prefix=a", key_prefix="b")


def test_password_is_not_printed() -> None:
    store = RedisCheckpointStore("redis://user:s3cret@127.0.0.1:6379/2")
    assert "s3cret" not in store.describe() and "s3cret" not in repr(store.url)
    assert store.db == 2


# -- key layout and isolation ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_key_prefixes_isolate_stores_in_one_database(
    make_store: Maker, key_prefix: str, other_prefix: str
) -> None:
    async with make_store() as a, make_store(key_prefix=other_prefix) as b:
        assert a.store_id != b.store_id
        cp_a = await a.save("job", {"who": "a"}, tags={"k": "v"}, id="same-id")
        cp_b = await b.save("job", {"who": "b"}, tags={"k": "v"}, id="same-id", ttl=60)
        assert cp_a.sequence == cp_b.sequence == 1
        assert (await a.load("same-id")).state == {"who": "a"}
        assert (await b.get_latest("job")).state == {"who": "b"}  # type: ignore[union-attr]
        assert await b.delete_stream("job") == 1
        await b.save("other", {})
        assert await b.purge_expired() == 0
        assert await a.list_streams() == ["job"]
        assert [cp.id for cp in (await a.list(tags={"k": "v"})).items] == ["same-id"]
        assert await b.list_streams() == ["other"]
        # every key of a store is under its own hash-tagged prefix, and no other
        keys_a, keys_b = await _keys(a), await _keys(b)
        assert keys_a and keys_b and not keys_a & keys_b
        assert all(k.startswith("{" + key_prefix + "}:") for k in keys_a)
        assert all(k.startswith("{" + other_prefix + "}:") for k in keys_b)


@pytest.mark.asyncio
async def test_stream_names_stay_inside_the_store(make_store: Maker) -> None:
    hostile = ["}:meta", "{x}:all", "s:job", "a\nb", "../../etc", "*", "é" * 512]
    async with make_store() as store:
        for name in hostile:
            await store.save(name, {"name": name})
        await store.save("job", {"name": "job"})
        assert sorted(await store.list_streams()) == sorted([*hostile, "job"])
        for name in hostile:
            latest = await store.get_latest(name)
            assert latest is not None and latest.state == {"name": name}
            assert await store.delete_stream(name) == 1
        assert await store.list_streams() == ["job"]
        assert (await store.info()).checkpoints == 1


@pytest.mark.asyncio
async def test_tags_of_any_text_are_indexed_and_unlinked_without_residue(
    make_store: Maker,
) -> None:
    tags = {"1": "a", "k:=x": 'v\u2028"\\/', "é🙂": "\x01\x7f", "t": ""}
    async with make_store() as store:
        cp = await store.save("s", {}, tags=tags)
        for key, value in tags.items():
            page = await store.list(tags={key: value})
            assert [c.id for c in page.items] == [cp.id], (key, value)
        assert (await store.load(cp.id)).tags == tags
        assert await store.delete(cp.id)
        # every index entry went with it: only the meta hash is left
        assert await _keys(store) == {store.key_prefix + "meta"}


# -- format ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_store_identity_and_format_persist_in_the_meta_hash(make_store: Maker) -> None:
    async with make_store() as store:
        store_id = store.store_id
        meta = await store.client.hgetall(store.key_prefix + "meta")
        await store.save("job", {})
    assert meta[b"kind"] == b"statekeeper-redis"
    assert int(meta[b"format"]) == FORMAT_VERSION
    async with make_store() as again:
        assert again.store_id == store_id
        assert (await again.info()).format_version == FORMAT_VERSION
        assert (await again.info()).high_water_mark == 1


@pytest.mark.asyncio
async def test_newer_format_and_foreign_keys_are_refused(make_store: Maker) -> None:
    async with make_store() as store:
        meta = store.key_prefix + "meta"
        await store.client.hset(meta, "format", str(FORMAT_VERSION + 1))
        with pytest.raises(StoreFormatError, match="newer"):
            await make_store().open()
        await store.client.hset(meta, "kind", "something-else")
        with pytest.raises(StoreFormatError, match="not a statekeeper-redis store"):
            await make_store().open()
        await store.client.delete(meta)
        await store.client.set(meta, "a string")
        with pytest.raises(StoreFormatError, match="holds a Redis string"):
            await make_store().open()


@pytest.mark.asyncio
async def test_save_refuses_when_the_meta_hash_vanished(make_store: Maker) -> None:
    async with make_store() as store:
        await store.save("job", {})
        await store.client.delete(store.key_prefix + "meta")
        # restarting the sequence at 1 would reuse sequences: refuse instead
        with pytest.raises(StoreFormatError, match="disappeared"):
            await store.save("job", {})


# -- TTL ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_expired_records_vanish_and_purge_cleans_their_index_entries(
    make_store: Maker,
) -> None:
    async with make_store() as store:
        p = store.key_prefix
        keep = await store.save("job", {"keep": True}, tags={"t": "1"})
        gone = await store.save("job", {"keep": False}, tags={"t": "1"}, ttl=0.3, id="short")
        assert 0 < await store.client.pttl(f"{p}r:short") <= 300
        # Redis expires the key by itself (real time; EXISTS expires a due key at
        # once); the 60 s are only a guard against a server that never does
        deadline = asyncio.get_running_loop().time() + 60
        while await store.client.exists(f"{p}r:short"):
            assert asyncio.get_running_loop().time() < deadline, "Redis never expired the key"
            await asyncio.sleep(0.05)
        # index entries are still there, and every read ignores them
        assert await store.client.zscore(f"{p}all", "short") == gone.sequence
        assert (await store.get_latest("job")).id == keep.id  # type: ignore[union-attr]
        assert [cp.id for cp in (await store.list("job", tags={"t": "1"})).items] == [keep.id]
        with pytest.raises(CheckpointNotFound):
            await store.load("short")
        assert await store.delete("short") is False
        assert await store.purge_expired() == 1
        assert await store.purge_expired() == 0
        for key, kind in [
            (f"{p}all", "z"),
            (f"{p}s:job", "z"),
            (f"{p}t:t\x001", "z"),
            (f"{p}x", "z"),
            (f"{p}i", "h"),
            (f"{p}e", "h"),
        ]:
            if kind == "z":
                assert await store.client.zscore(key, "short") is None, key
            else:
                assert not await store.client.hexists(key, "short"), key
        assert (await store.info()).checkpoints == 1


@pytest.mark.asyncio
async def test_store_clock_decides_expiry_and_purge_removes_the_record(make_store: Maker) -> None:
    clock = FakeClock()
    async with make_store(clock=clock) as store:
        await store.save("a", {}, ttl=timedelta(hours=1), id="x")
        await store.save("b", {}, ttl=10)
        clock.advance(3601)
        # Redis keeps the keys (its expiry is an hour away), the store's clock says expired
        assert await store.client.exists(store.key_prefix + "r:x")
        assert await store.list_streams() == []
        assert await store.get_latest("a") is None
        # an expired id may be saved again: new sequence, old index entries replaced
        again = await store.save("c", {"again": True}, id="x")
        assert again.sequence == 3
        assert await store.client.zscore(store.key_prefix + "s:a", "x") is None
        assert await store.list_streams() == ["c"]
        assert await store.purge_expired() == 1
        assert await _keys(store) >= {store.key_prefix + "r:x"}
        assert (await store.info()).checkpoints == 1


@pytest.mark.asyncio
async def test_update_slides_the_redis_expiry(make_store: Maker) -> None:
    async with make_store() as store:
        cp = await store.save("job", {}, ttl=60)
        key = f"{store.key_prefix}r:{cp.id}"
        await store.client.pexpire(key, 5000)
        await store.update(cp.id, {"n": 2})
        assert 55_000 < await store.client.pttl(key) <= 60_000
        plain = await store.save("job", {})
        await store.update(plain.id, {"n": 2})
        assert await store.client.pttl(f"{store.key_prefix}r:{plain.id}") == -1


# -- reads past many skipped entries --------------------------------------------------------


@pytest.mark.asyncio
async def test_reads_walk_past_more_expired_or_filtered_entries_than_one_script_examines(
    make_store: Maker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RedisCheckpointStore, "scan_budget", 16)
    clock = FakeClock()
    async with make_store(clock=clock) as store:
        first = await store.save("job", {"n": 0}, tags={"rare": "yes"})
        # several budgets' worth of entries on top, none live after the clock moves
        for i in range(100):
            await store.save("job", {"n": i + 1}, ttl=10)
        clock.advance(11)
        latest = await store.get_latest("job")
        assert latest is not None and latest.id == first.id
        page = await store.list("job", limit=5)
        assert [cp.id for cp in page.items] == [first.id] and not page.has_more
        found = await store.list(None, tags={"rare": "yes"}, order="asc")
        assert [cp.id for cp in found.items] == [first.id]
        assert await store.purge_expired() == 100


# -- strictness on corrupt bytes --------------------------------------------------------------


@pytest.mark.asyncio
async def test_corrupt_record_names_its_key(make_store: Maker) -> None:
    async with make_store() as store:
        older = await store.save("job", {"n": 1})
        cp = await store.save("job", {"n": 2})
        raw = await store.backdoor_read_raw(cp.id)
        await store.backdoor_write_raw(cp.id, raw[:-3])
        with pytest.raises(CheckpointDecodeError) as info:
            await store.get_latest("job")
        assert info.value.id == cp.id
        assert f"r:{cp.id}" in (info.value.location or "")
        page = await store.list("job")
        assert [c.id for c in page.items] == [older.id]
        assert [s.id for s in page.skipped] == [cp.id]


# -- round trips ------------------------------------------------------------------------------


class _CommandCounter:
    """Counts the commands a client sends (each ``execute_command`` is one round trip;
    the store uses no pipelines on these paths)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.commands: list[str] = []
        self._inner = client.execute_command

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.commands.append(str(args[0]))
            return await self._inner(*args, **kwargs)

        client.execute_command = counted  # type: ignore[method-assign]


@pytest.mark.asyncio
async def test_save_and_get_latest_each_take_one_round_trip(make_store: Maker) -> None:
    async with make_store() as store:
        for i in range(20):
            await store.save("job", {"n": i})
        counter = _CommandCounter(store.client)
        await store.save("job", {"n": 20}, tags={"k": "v"})
        save_cmds, counter.commands = counter.commands, []
        latest = await store.get_latest("job")
        latest_cmds, counter.commands = counter.commands, []
        await store.load(latest.id)  # type: ignore[union-attr]
        load_cmds, counter.commands = counter.commands, []
    assert latest is not None and latest.state == {"n": 20}
    assert save_cmds == ["EVALSHA"], save_cmds  # target: <= 3
    assert latest_cmds == ["EVALSHA"], latest_cmds  # target: <= 3
    assert load_cmds == ["EVALSHA"], load_cmds


@pytest.mark.asyncio
async def test_a_save_that_lost_the_sequence_race_costs_one_more_round_trip(
    make_store: Maker,
) -> None:
    async with make_store() as mine, make_store() as other:
        await mine.save("job", {})
        await other.save("job", {})  # mine's idea of the next sequence is now stale
        counter = _CommandCounter(mine.client)
        cp = await mine.save("job", {})
    assert cp.sequence == 3
    assert counter.commands == ["EVALSHA", "EVALSHA"]


@pytest.mark.asyncio
async def test_batches_each_take_one_round_trip(make_store: Maker) -> None:
    """save_many, load_many and delete_many are one script call each, whatever the
    number of ids; list_streams(prefix=) is one SSCAN plus one script per 500 names."""
    async with make_store() as store:
        await store.save("job", {})  # the store's idea of the next sequence is current
        counter = _CommandCounter(store.client)
        saved = await store.save_many(
            [
                sk.NewCheckpoint(stream=f"s{i % 7}", state={"i": i}, tags={"k": str(i % 2)})
                for i in range(200)
            ]
        )
        save_cmds, counter.commands = counter.commands, []
        loaded = await store.load_many([cp.id for cp in saved] + ["never-saved"])
        load_cmds, counter.commands = counter.commands, []
        names = await store.list_streams(prefix="s")
        names_cmds, counter.commands = counter.commands, []
        removed = await store.delete_many([cp.id for cp in saved[:150]])
        delete_cmds, counter.commands = counter.commands, []
    assert [cp.sequence for cp in saved] == list(range(2, 202))
    assert [cp.state for cp in loaded.values()] == [{"i": i} for i in range(200)]
    assert names == [f"s{i}" for i in range(7)] and removed == 150
    assert save_cmds == ["EVALSHA"], save_cmds
    assert load_cmds == ["EVALSHA"], load_cmds
    assert names_cmds == ["SSCAN", "EVALSHA"], names_cmds
    assert delete_cmds == ["EVALSHA"], delete_cmds


@pytest.mark.asyncio
async def test_a_save_many_that_lost_the_sequence_race_costs_one_more_round_trip(
    make_store: Maker,
) -> None:
    async with make_store() as mine, make_store() as other:
        await mine.save("job", {})
        await other.save("job", {})
        counter = _CommandCounter(mine.client)
        saved = await mine.save_many([sk.NewCheckpoint(stream="job") for _ in range(3)])
    assert [cp.sequence for cp in saved] == [3, 4, 5]
    assert counter.commands == ["EVALSHA", "EVALSHA"]


# -- the turn: a writer that keeps losing the sequence race is not starved ------------------


@pytest.mark.asyncio
async def test_a_held_turn_makes_other_saves_wait_until_it_lapses(make_store: Maker) -> None:
    """While another writer holds the turn, a save writes nothing and waits; when the
    turn lapses (its holder went away), the save goes through. verify() accepts the
    turn key, and repair() replaces one of the wrong type."""
    async with make_store() as store:
        await store.save("job", {"n": 0})
        turn = store.key_prefix + "turn"
        await store.client.set(turn, b"someone-else", px=300)
        assert (await store.verify()).ok
        loop = asyncio.get_running_loop()
        started = loop.time()
        cp = await store.save("job", {"n": 1})
        assert loop.time() - started >= 0.2
        assert cp.sequence == 2
        await store.client.set(turn, b"someone-else", px=200)
        batch = await store.save_many([sk.NewCheckpoint(stream="job") for _ in range(3)])
        assert [c.sequence for c in batch] == [3, 4, 5]
        assert not await store.client.exists(turn)
        await store.client.sadd(turn, b"junk")
        report = await store.verify()
        assert not report.ok
        assert (await store.repair()).rebuilt
        assert (await store.verify()).ok
        assert (await store.save("job", {})).sequence == 6


@pytest.mark.asyncio
async def test_a_writer_that_keeps_losing_takes_the_turn_and_wins(make_store: Maker) -> None:
    """Each time ``mine`` tries, ``other`` has just saved: after a few lost races mine
    asks for the turn, the script gives it, other's next save waits, and mine's next
    try wins, releasing the turn."""
    async with make_store() as mine, make_store() as other:
        await mine.save("job", {})
        turn = mine.key_prefix + "turn"
        link = mine._link  # every script call of the store goes through its link
        real_call = link.call
        outcomes: list[bytes] = []

        async def racing_call(name: str, *args: Any) -> Any:
            if name == "INSERT" and not await mine.client.exists(turn):
                await other.save("job", {"other": True})  # always one step ahead
            reply = await real_call(name, *args)
            if name == "INSERT":
                outcomes.append(reply[0])
            return reply

        link.call = racing_call  # type: ignore[method-assign]
        batch = await mine.save_many([sk.NewCheckpoint(stream="job") for _ in range(5)])
        assert outcomes[-1] == b"ok" and outcomes[:-1] == [b"seq"] * (len(outcomes) - 1)
        assert len(outcomes) <= 5, outcomes
        seqs = [c.sequence for c in batch]
        assert seqs == list(range(seqs[0], seqs[0] + 5))
        assert not await mine.client.exists(turn)
        # other was never refused for good: its saves went on, and it can save now
        assert (await other.save("job", {})).sequence == seqs[-1] + 1
