"""Index keys that make a Redis store answer "empty" or stale (SPEC S3, S3a).

The store derives its indexes from the records; the scripts also keep what the
indexes must hold: the number of entries of ``P all`` (field ``count`` of the
meta hash) and each stream's newest sequence and size (``P h``). A read
compares one with the other in the same script, so an index key that was
deleted (an operator's ``DEL``, eviction) or an entry removed or re-scored makes
``get_latest`` and ``list`` raise ``DamagedStoreError`` instead of answering
``None``, ``[]`` or an older checkpoint. ``verify`` (and ``statekeeper verify``,
exit 1) names the damage, ``repair()`` rebuilds it from the records, and
``repair(drop_damaged=True)`` removes no readable record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from statekeeper_redis import DamagedStoreError, RedisCheckpointStore

from statekeeper import Checkpoint, NewCheckpoint

Maker = Callable[..., RedisCheckpointStore]


async def _seed(store: RedisCheckpointStore) -> list[Checkpoint]:
    """Five checkpoints in ``job`` around one in ``other``: sequences 1..6."""
    cps = [await store.save("job", {"n": i}, tags={"kind": "step"}) for i in range(1, 4)]
    cps.append(await store.save("other", {"n": 0}))
    cps += [await store.save("job", {"n": i}, tags={"kind": "step"}) for i in range(4, 6)]
    return cps


def _job(cps: list[Checkpoint]) -> list[Checkpoint]:
    return [cp for cp in cps if cp.stream == "job"]


async def _refused(read: Awaitable[Any]) -> str:
    with pytest.raises(DamagedStoreError) as info:
        await read
    message = str(info.value)
    assert "repair()" in message and "Nothing was written" in message
    return message


def _cli_verify(redis_url: str, key_prefix: str) -> tuple[int, dict[str, Any]]:
    """``statekeeper verify --json`` in a real subprocess."""
    url = f"{redis_url}?key_prefix={key_prefix}"
    done = subprocess.run(
        [sys.executable, "-m", "statekeeper.cli.entry", "-u", url, "verify", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


async def _repaired_keeps_every_record(store: RedisCheckpointStore, cps: list[Checkpoint]) -> None:
    """repair() rebuilds; drop_damaged=True then drops nothing readable."""
    report = await store.repair()
    assert report.rebuilt and report.damaged == [], report
    assert (await store.verify()).ok, (await store.verify()).problems
    dropped = await store.repair(drop_damaged=True)
    assert dropped.dropped == []
    for cp in cps:
        assert (await store.load(cp.id)).state == cp.state
    assert (await store.get_latest("job")).id == _job(cps)[-1].id  # type: ignore[union-attr]
    page = await store.list("job", limit=100)
    assert [c.id for c in page.items] == [c.id for c in reversed(_job(cps))]
    assert page.skipped == []
    assert [c.id for c in (await store.list(None, limit=100)).items] == [
        c.id for c in reversed(cps)
    ]
    assert sorted(await store.list_streams()) == ["job", "other"]
    # never a reused sequence (a re-scored entry may have raised the counter further)
    assert (await store.save("job", {})).sequence > len(cps)


@pytest.mark.asyncio
async def test_every_index_key_deleted_is_damage_never_an_empty_store(
    make_store: Maker, redis_url: str, key_prefix: str
) -> None:
    """The records and the meta hash remain, every index key is gone (what an
    evicting server leaves): the meta hash says checkpoints exist."""
    async with make_store() as store:
        cps = await _seed(store)
        p = store.key_prefix
        keys = [k async for k in store.client.scan_iter(match=p + "*")]
        doomed = [
            k for k in keys if not k.startswith((p + "r:").encode()) and k != (p + "meta").encode()
        ]
        assert (p + "s:job").encode() in doomed and (p + "all").encode() in doomed
        await store.client.delete(*doomed)

        await _refused(store.get_latest("job"))
        await _refused(store.get_latest("other"))
        await _refused(store.list("job"))
        await _refused(store.list(None))
        await _refused(store.list_streams())
        await _refused(store.list_streams(prefix="jo"))
        await _refused(store.save("job", {}))  # nothing written on top of it
        assert (await store.load(cps[0].id)).state == cps[0].state  # records are the truth

        report = await store.verify()
        assert not report.ok
        assert any(p + "all" in x.location and "6" in x.reason for x in report.problems)
        code, out = _cli_verify(redis_url, key_prefix)
        assert code == 1 and out["ok"] is False
        assert any("all" in x["location"] for x in out["problems"])

        await _repaired_keeps_every_record(store, cps)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "damage", ["remove-newest", "rescore-newest-down", "rescore-older-up", "remove-middle"]
)
async def test_a_stream_index_entry_removed_or_rescored_is_never_read_stale(
    make_store: Maker, redis_url: str, key_prefix: str, damage: str
) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        job, sk = _job(cps), store.key_prefix + "s:job"
        if damage == "remove-newest":
            await store.client.zrem(sk, job[-1].id)
        elif damage == "rescore-newest-down":
            await store.client.zadd(sk, {job[-1].id: 0})
        elif damage == "rescore-older-up":  # an older checkpoint now looks newest
            await store.client.zadd(sk, {job[0].id: 100})
        else:
            await store.client.zrem(sk, job[1].id)

        message = await _refused(store.get_latest("job"))
        assert sk in message
        await _refused(store.list("job", limit=100))
        await _refused(store.list("job", limit=100, tags={"kind": "step"}))
        await _refused(store.list_streams())
        await _refused(store.save("job", {}))
        await _refused(store.delete(job[0].id))
        await _refused(store.prune("job", keep_last=1))
        # other streams and the global listing do not depend on this index
        assert (await store.get_latest("other")).id == cps[3].id  # type: ignore[union-attr]

        report = await store.verify()
        assert not report.ok
        assert any(sk in x.location for x in report.problems), report.problems
        code, out = _cli_verify(redis_url, key_prefix)
        assert code == 1 and any(sk in x["location"] for x in out["problems"]), out

        await _repaired_keeps_every_record(store, cps)


@pytest.mark.asyncio
async def test_an_entry_removed_from_the_global_index_is_never_left_out(
    make_store: Maker, redis_url: str, key_prefix: str
) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        await store.client.zrem(store.key_prefix + "all", cps[2].id)
        await _refused(store.list(None, limit=100))
        await _refused(store.save("job", {}))
        report = await store.verify()
        assert any(store.key_prefix + "all" in x.location for x in report.problems)
        code, _out = _cli_verify(redis_url, key_prefix)
        assert code == 1
        await _repaired_keeps_every_record(store, cps)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["delete", "wrongtype", "stale"])
async def test_damaged_tracking_is_reported_and_rebuilt(
    make_store: Maker, redis_url: str, key_prefix: str, how: str
) -> None:
    """The tracking itself can be damaged too: reads refuse, never answer wrong."""
    async with make_store() as store:
        cps = await _seed(store)
        h = store.key_prefix + "h"
        if how == "delete":
            await store.client.delete(h)
        elif how == "wrongtype":
            await store.client.delete(h)
            await store.client.set(h, b"junk")
        else:
            await store.client.hset(h, "job", "2 1")
        await _refused(store.get_latest("job"))
        await _refused(store.list("job"))
        assert not (await store.verify()).ok
        code, _out = _cli_verify(redis_url, key_prefix)
        assert code == 1
        await _repaired_keeps_every_record(store, cps)


@pytest.mark.asyncio
async def test_the_count_in_the_meta_hash_missing_is_damage(
    make_store: Maker, redis_url: str, key_prefix: str
) -> None:
    async with make_store() as store:
        cps = await _seed(store)
        await store.client.hdel(store.key_prefix + "meta", "count")
        await _refused(store.list(None))
        await _refused(store.get_latest("job"))
        assert not (await store.verify()).ok
        code, out = _cli_verify(redis_url, key_prefix)
        assert code == 1 and any("field count" in x["reason"] for x in out["problems"]), out
        await _repaired_keeps_every_record(store, cps)


@pytest.mark.asyncio
async def test_tracking_follows_every_write(make_store: Maker) -> None:
    """Saves, batches, updates, deletes, prune, purge and delete_stream keep the
    tracking exact: verify finds nothing, and every read answers."""
    async with make_store() as store:
        cps = await _seed(store)
        await store.save_many(
            [NewCheckpoint(stream="job", state={"b": 1}), NewCheckpoint(stream="new", state={})]
        )
        await store.update(cps[1].id, {"u": 1}, tags={"kind": "edited"})
        assert await store.delete(_job(cps)[-1].id) is True  # the newest of job
        await store.delete_many([cps[0].id, cps[3].id])  # empties stream "other"
        await store.prune("job", keep_last=2)
        await store.save("ttl", {"t": 1}, ttl=3600)
        await store.delete_stream("new")
        assert (await store.verify()).ok, (await store.verify()).problems
        assert sorted(await store.list_streams()) == ["job", "ttl"]
        assert len((await store.list("job", limit=100)).items) == 2
        assert await store.get_latest("other") is None
        assert await store.get_latest("new") is None


@pytest.mark.asyncio
async def test_a_format_1_store_is_read_as_is_and_upgraded_by_a_writable_open(
    make_store: Maker,
) -> None:
    """Format 1 had no tracking: a read-only open reads it without the checks and
    writes nothing; a writable open builds the tracking from its indexes."""
    async with make_store() as store:
        cps = await _seed(store)
        p = store.key_prefix
        await store.client.delete(p + "h")
        await store.client.hdel(p + "meta", "count")
        await store.client.hset(p + "meta", "format", "1")
    async with make_store(read_only=True) as ro:
        assert (await ro.get_latest("job")).id == cps[-1].id  # type: ignore[union-attr]
        assert (await ro.verify()).ok
        assert not await ro.client.exists(p + "h")
    async with make_store() as store:
        meta = await store.client.hgetall(p + "meta")
        assert meta[b"format"] == b"2" and meta[b"count"] == b"6"
        assert await store.client.hgetall(p + "h") == {b"job": b"6 5", b"other": b"4 1"}
        assert (await store.verify()).ok
        await store.client.zrem(p + "s:job", cps[-1].id)
        await _refused(store.get_latest("job"))  # the checks are on from now
