"""SQLite's sequences without a counter write per save (issue 35): S1 after every kind
of delete, S10 under concurrent savers, and stores made by the counter-bumping code
(schema version 2) migrated without losing anything or reusing a sequence."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest

import statekeeper
from statekeeper import CheckpointStore, NewCheckpoint, Retention
from statekeeper.backends.sql.schema import SCHEMA_VERSION
from statekeeper.testing import FakeClock

pytestmark = pytest.mark.asyncio


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _hwm(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT hwm FROM statekeeper_counter").fetchone()[0])


async def test_saves_write_no_counter_row(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with statekeeper.open_store(_url(path)) as store:
        seqs = [(await store.save("s", i)).sequence for i in range(3)]
        seqs += [
            c.sequence for c in await store.save_many([NewCheckpoint(stream="s", state=9)] * 2)
        ]
        assert seqs == [1, 2, 3, 4, 5]
        assert (await store.info()).high_water_mark == 5
    assert _hwm(path) == 0  # nothing deleted: the row never moved


async def _delete_newest(store: CheckpointStore, clock: FakeClock) -> None:
    newest = await store.get_latest("s")
    assert newest is not None
    assert await store.delete(newest.id)


async def _delete_many(store: CheckpointStore, clock: FakeClock) -> None:
    page = await store.list("s", limit=2)
    assert await store.delete_many([c.id for c in page.items]) == 2


async def _delete_stream(store: CheckpointStore, clock: FakeClock) -> None:
    assert await store.delete_stream("s") == 4


async def _prune_then_delete(store: CheckpointStore, clock: FakeClock) -> None:
    assert await store.prune("s", keep_last=1) == 3
    await _delete_newest(store, clock)


async def _purge(store: CheckpointStore, clock: FakeClock) -> None:
    clock.advance(3600)
    assert await store.purge_expired() == 1  # the newest, saved with a TTL


async def _sweep(store: CheckpointStore, clock: FakeClock) -> None:
    clock.advance(7 * 86400)
    report = await store.sweep(policy=Retention(idle=timedelta(hours=1)))
    assert report.streams_removed == 1  # (the newest, expired, is purged, not counted)


DELETES: dict[str, Callable[[CheckpointStore, FakeClock], Awaitable[None]]] = {
    "delete-newest": _delete_newest,
    "delete-many": _delete_many,
    "delete-stream": _delete_stream,
    "prune-then-delete": _prune_then_delete,
    "purge-expired": _purge,
    "sweep-idle": _sweep,
}


@pytest.mark.parametrize("how", DELETES)
async def test_a_deleted_newest_sequence_is_never_handed_out_again(
    tmp_path: Path, how: str
) -> None:
    clock = FakeClock()
    path = tmp_path / "s.db"
    async with statekeeper.open_store(_url(path), clock=clock) as store:
        for i in range(3):
            await store.save("s", i)
        await store.save("s", 3, ttl=60)  # sequence 4, the newest
        await DELETES[how](store, clock)
        assert (await store.info()).high_water_mark == 4
    async with statekeeper.open_store(_url(path), clock=clock) as store:  # and after a reopen
        assert (await store.save("s", "next")).sequence == 5
        assert [
            c.sequence for c in await store.save_many([NewCheckpoint(stream="t", state=1)] * 2)
        ] == [
            6,
            7,
        ]


async def test_a_failed_save_in_a_group_gives_its_sequence_to_the_next(tmp_path: Path) -> None:
    """A save rolled back (here: a live id, in a group commit) takes no sequence, as
    the counter bump it replaces did not; the sequences stay in commit order."""
    async with statekeeper.open_store(_url(tmp_path / "s.db")) as store:
        taken = await store.save("s", 0, id="taken")
        results = await asyncio.gather(
            *(store.save("s", i, id="taken" if i == 2 else None) for i in range(1, 6)),
            return_exceptions=True,
        )
        saved = [r.sequence for r in results if not isinstance(r, BaseException)]
        assert sorted(saved) == [2, 3, 4, 5]
        assert sum(isinstance(r, statekeeper.errors.PreconditionFailed) for r in results) == 1
        page = await store.list("s", limit=10)
        assert [c.sequence for c in page.items] == [5, 4, 3, 2, taken.sequence]


#: The tags table as schema versions 1 and 2 made it: a rowid table.
_V2_TAGS = """
CREATE TABLE statekeeper_tags (
    seq INTEGER NOT NULL, "key" VARCHAR(128) NOT NULL, vkey VARCHAR(64) NOT NULL,
    value VARCHAR(1024) NOT NULL, shash BIGINT NOT NULL, PRIMARY KEY (seq, "key"),
    FOREIGN KEY(seq) REFERENCES statekeeper_checkpoints (seq) ON DELETE CASCADE
);
INSERT INTO statekeeper_tags SELECT seq, "key", vkey, value, shash FROM tags_now;
DROP TABLE tags_now;
CREATE INDEX statekeeper_tags_global ON statekeeper_tags ("key", vkey, seq);
CREATE INDEX statekeeper_tags_stream ON statekeeper_tags ("key", vkey, shash, seq);
"""


def _downgrade_to_v2(path: Path, hwm: int) -> None:
    """What the counter-bumping code (schema version 2) left: no trigger, a rowid
    tags table, version 2, and the counter row at the last sequence it handed out."""
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX statekeeper_tags_global")
        db.execute("DROP INDEX statekeeper_tags_stream")
        db.execute("ALTER TABLE statekeeper_tags RENAME TO tags_now")
        db.executescript(_V2_TAGS)
        assert (
            "WITHOUT ROWID"
            not in db.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'statekeeper_tags'"
            ).fetchone()[0]
        )
        db.execute("DROP TRIGGER statekeeper_checkpoints_top_deleted")
        db.execute("UPDATE statekeeper_meta SET value = '2' WHERE name = 'schema_version'")
        db.execute("UPDATE statekeeper_counter SET hwm = ?", (hwm,))


async def test_a_version_2_store_is_migrated_and_keeps_its_sequences(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with statekeeper.open_store(_url(path)) as store:
        kept = [await store.save("s", i, tags={"k": "v"}, metadata={"i": i}) for i in range(5)]
    # The old code bumped the counter on every save: 7 saves, the newest two deleted.
    _downgrade_to_v2(path, hwm=7)
    with pytest.raises(statekeeper.errors.StoreFormatError, match="without read_only"):
        await statekeeper.open_store(_url(path), read_only=True).open()
    async with statekeeper.open_store(_url(path)) as store:
        info = await store.info()
        assert (info.format_version, info.high_water_mark) == (SCHEMA_VERSION, 7)
        assert [await store.load(c.id) for c in kept] == kept
        page = await store.list("s", tags={"k": "v"}, metadata={"i": 3}, limit=10)
        assert [c.id for c in page.items] == [kept[3].id]
        assert (await store.verify()).ok
        new = await store.save("s", "after")
        assert new.sequence == 8  # above every sequence the old code handed out
        assert await store.delete(new.id)
        assert (await store.save("s", "again")).sequence == 9  # the trigger is there now
    assert _hwm(path) == 8
    with sqlite3.connect(path) as db:  # the tags table rebuilt without rowid, rows kept
        (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'statekeeper_tags'")
        assert "WITHOUT ROWID" in sql[0].upper()
        assert db.execute("SELECT count(*) FROM statekeeper_tags").fetchone()[0] == 5
        indexes = {r[1] for r in db.execute("PRAGMA index_list('statekeeper_tags')")}
        assert {"statekeeper_tags_global", "statekeeper_tags_stream"} <= indexes


async def test_a_version_2_store_whose_counter_equals_its_newest_migrates(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with statekeeper.open_store(_url(path)) as store:
        for i in range(3):
            await store.save("s", i)
    _downgrade_to_v2(path, hwm=3)
    async with statekeeper.open_store(_url(path)) as store:
        newest = await store.get_latest("s")
        assert newest is not None
        assert await store.delete(newest.id)
        assert (await store.save("s", "next")).sequence == 4
