"""The damage sweep of the SQL backend (SPEC S3, S3a; issue 11).

Each case damages one kind of row behind the store's back, then checks, on SQLite
and (when their URL variables are set) PostgreSQL and MariaDB/MySQL:

1. S3/S3a after a reopen: every intact acknowledged checkpoint still loads, lists
   and wins ``get_latest`` of its stream; a damaged record makes ``get_latest``
   raise naming it (never an older answer), ``load`` raise and ``list`` report it
   in ``skipped``; a damaged counter or meta row makes saves refuse with a message
   that says to repair, and is never read as 0 or "empty";
2. ``verify()`` on a ``read_only`` open is not ok and names the damage;
3. ``repair()`` rebuilds what is derived and keeps damaged records; S3/S3a hold
   again and ``verify()`` only reports what stays damaged;
4. ``repair(drop_damaged=True)`` drops those, and ``verify()`` is ok.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from sql_helpers import Target
from statekeeper import Checkpoint
from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.backends.sql.values import stream_hash
from statekeeper.errors import (
    BackendError,
    CheckpointDecodeError,
    CheckpointNotFound,
    StoreFormatError,
)
from statekeeper.record import StoredRecord

# -- the store before damage -------------------------------------------------------------


@dataclass
class Saved:
    """What was acknowledged: every live checkpoint, and the highest sequence ever given."""

    cps: dict[int, Checkpoint] = field(default_factory=dict)
    hwm: int = 0
    store_id: str = ""
    #: The sequence of the n-th save (``order[n - 1]``): 1..8 where a counter assigns
    #: them, transaction-id based on PostgreSQL. Damage cases name saves by ordinal.
    order: list[int] = field(default_factory=list)

    def seqs(self, ordinals: frozenset[int]) -> set[int]:
        return {self.order[n - 1] for n in ordinals}

    def newest(self, stream: str) -> Checkpoint:
        return max((c for c in self.cps.values() if c.stream == stream), key=lambda c: c.sequence)


async def populate(target: Target) -> Saved:
    saved = Saved()
    async with target.store() as store:
        for i in range(5):  # job: sequences 1..5
            cp = await store.save(
                "job", {"i": i}, tags={"k": f"v{i}", "all": "yes"}, metadata={"i": i, "all": True}
            )
            saved.cps[cp.sequence] = cp
            saved.order.append(cp.sequence)
        for i in range(2):  # other: 6, 7
            cp = await store.save("other", {"o": i}, tags={"all": "yes"}, metadata={"all": True})
            saved.cps[cp.sequence] = cp
            saved.order.append(cp.sequence)
        gone = await store.save("job", "deleted")  # 8: the high-water mark stays 8
        saved.order.append(gone.sequence)
        assert await store.delete(gone.id)
        saved.hwm = gone.sequence
        saved.store_id = store.store_id
    return saved


# -- the damage ------------------------------------------------------------------------


@dataclass(frozen=True)
class Damage:
    """One way to damage the tables; ``records`` are the saves (by ordinal, see
    :class:`Saved`) left unreadable."""

    name: str
    apply: Callable[[Target, SqlCheckpointStore, Saved], Awaitable[None]]
    records: frozenset[int] = frozenset()
    counter: bool = False  # saves must refuse until repair
    schema: bool = False  # a table or index is gone: saves must refuse until repair
    meta: bool = False  # saves must refuse until repair
    kind: str = "index"  # the verify problem kind it must cause
    only: str | None = None  # dialect it applies to
    #: Not on PostgreSQL, whose sequences come from transaction ids: the counter row
    #: is not read there (its seq_base row is tested in test_sql_pg_sequences.py).
    counter_row: bool = False


def _flip(ordinal: int) -> Callable[[Target, SqlCheckpointStore, Saved], Awaitable[None]]:
    async def apply(target: Target, store: SqlCheckpointStore, saved: Saved) -> None:
        seq = saved.order[ordinal - 1]
        page = await store.list(None, limit=100)
        (cp,) = [c for c in page.items if c.sequence == seq]
        raw = bytearray(await store.backdoor_read_raw(cp.id))
        raw[-2] ^= 0x40  # a byte of the state: only the checksum can tell
        await store.backdoor_write_raw(cp.id, bytes(raw))

    return apply


def _sql(
    statement: str, **params: Any
) -> Callable[[Target, SqlCheckpointStore, Saved], Awaitable[None]]:
    """``statement`` with ``{s<n>}`` for the sequence of the n-th save."""

    async def apply(target: Target, store: SqlCheckpointStore, saved: Saved) -> None:
        t = store.tables
        names = {"meta": t.meta.name, "counter": t.counter.name, "tags": t.tags.name}
        names.update({f"s{n}": str(seq) for n, seq in enumerate(saved.order, 1)})
        names["fields"] = t.fields.name
        names["checkpoints"] = t.checkpoints.name
        names["id_index"] = f"{target.prefix}checkpoints_id"
        names["trigger"] = f"{t.checkpoints.name}_top_deleted"
        names["key"] = "`key`" if target.name == "mysql" else '"key"'  # a reserved word
        await target.sql(statement.format(**names), params)

    return apply


def _copy_record(
    pairs: dict[int, int],
) -> Callable[[Target, SqlCheckpointStore, Saved], Awaitable[None]]:
    """Each ``{to: from}``: the row of save ``to`` gets the record of save ``from`` (a
    replayed or swapped write; all records are read before any is written)."""

    async def apply(target: Target, store: SqlCheckpointStore, saved: Saved) -> None:
        page = await store.list(None, limit=100)
        ids = {c.sequence: c.id for c in page.items}
        raw = {n: await store.backdoor_read_raw(ids[saved.order[n - 1]]) for n in pairs.values()}
        for to, src in pairs.items():
            await store.backdoor_write_raw(ids[saved.order[to - 1]], raw[src])

    return apply


def _foreign(ordinal: int) -> Callable[[Target, SqlCheckpointStore, Saved], Awaitable[None]]:
    """The row of save ``ordinal`` gets an intact record of another store."""

    async def apply(target: Target, store: SqlCheckpointStore, saved: Saved) -> None:
        seq = saved.order[ordinal - 1]
        page = await store.list(None, limit=100)
        (cp,) = [c for c in page.items if c.sequence == seq]
        raw = await store.backdoor_read_raw(cp.id)
        record = StoredRecord.from_bytes(raw, location="test", expect_sequence=seq)
        positional = target.name == "postgres"  # as pg.py writes them
        await store.backdoor_write_raw(
            cp.id, record.to_bytes("another-store", positional=positional)
        )

    return apply


def _both(
    *steps: Callable[[Target, SqlCheckpointStore, Saved], Awaitable[None]],
) -> Callable[[Target, SqlCheckpointStore, Saved], Awaitable[None]]:
    async def apply(target: Target, store: SqlCheckpointStore, saved: Saved) -> None:
        for step in steps:
            await step(target, store, saved)

    return apply


DAMAGE = [
    Damage("newest record corrupt", _flip(5), records=frozenset({5}), kind="damaged-record"),
    Damage("middle record corrupt", _flip(3), records=frozenset({3}), kind="damaged-record"),
    Damage(
        "two records corrupt",
        _both(_flip(7), _flip(2)),
        records=frozenset({2, 7}),
        kind="damaged-record",
    ),
    Damage(
        "counter row deleted",
        _sql("DELETE FROM {counter}"),
        counter=True,
        kind="state",
        counter_row=True,
    ),
    Damage(
        "counter lowered",
        _sql("UPDATE {counter} SET hwm = 2"),
        counter=True,
        kind="state",
        counter_row=True,
        # SQLite's row is the high-water mark of deleted checkpoints only, rightly
        # below stored sequences (docs/sql-backend.md): no value of it is damage.
        only="mysql",
    ),
    Damage(
        "high-water trigger dropped",
        _sql("DROP TRIGGER {trigger}"),
        schema=True,
        kind="state",
        only="sqlite",
    ),
    Damage(
        "counter not a number",
        _sql("UPDATE {counter} SET hwm = 'garbage'"),
        counter=True,
        kind="state",
        only="sqlite",
    ),
    Damage("tag rows deleted", _sql("DELETE FROM {tags} WHERE seq = {s4}")),
    Damage(
        "tag row planted",
        _sql(
            "INSERT INTO {tags} (seq, {key}, vkey, value, shash) "
            "VALUES ({s2}, 'planted', 'x', 'x', :h)",
            h=stream_hash("job"),
        ),
    ),
    Damage(
        "tag value forged", _sql("UPDATE {tags} SET vkey = 'v0', value = 'v0' WHERE seq = {s3}")
    ),
    Damage("fields rows deleted", _sql("DELETE FROM {fields} WHERE seq = {s4}")),
    Damage(
        "fields row planted",
        _sql(
            "INSERT INTO {fields} (seq, {key}, kind, vkey, value, shash) "
            "VALUES ({s6}, 'i', 'int', '0', '0', :h)",
            h=stream_hash("other"),
        ),
    ),
    Damage(
        "fields value forged",
        _sql("UPDATE {fields} SET vkey = '0', value = '0' WHERE seq = {s3} AND {key} = 'i'"),
    ),
    Damage(
        "fields kind forged (1 for True)",
        _sql(
            "UPDATE {fields} SET kind = 'int', vkey = '1', value = '1' "
            "WHERE seq = {s2} AND {key} = 'all'"
        ),
    ),
    Damage(
        "fields rows of a deleted checkpoint",
        _sql(
            "INSERT INTO {fields} (seq, {key}, kind, vkey, value, shash) "
            "VALUES ({s8}, 'all', 'bool', 'true', 'true', :h)",
            h=stream_hash("job"),
        ),
        only="sqlite",
    ),
    *(
        Damage(
            f"meta row {name} deleted",
            _sql("DELETE FROM {meta} WHERE name = :n", n=name),
            meta=True,
            kind="state",
        )
        for name in ("store_id", "cursor_key", "schema_version")
    ),
    Damage("meta rows all deleted", _sql("DELETE FROM {meta}"), meta=True, kind="state"),
    # Records are the truth: when every record names one store id, a meta row that
    # names another is the damage, never the three records (issue 25).
    Damage(
        "meta row store_id overwritten",
        _sql("UPDATE {meta} SET value = :v WHERE name = 'store_id'", v="f" * 32),
        meta=True,
        kind="state",
    ),
    Damage(
        "newest record is another store's",
        _foreign(7),
        records=frozenset({7}),
        kind="damaged-record",
    ),
    Damage(
        "meta row store_id overwritten, newest record another store's",
        _both(
            _sql("UPDATE {meta} SET value = :v WHERE name = 'store_id'", v="f" * 32),
            _foreign(7),
        ),
        records=frozenset({7}),
        meta=True,
        kind="state",
    ),
    Damage(
        "record cell holds text",
        _sql("UPDATE {checkpoints} SET record = 'garbage' WHERE seq = {s3}"),
        records=frozenset({3}),
        kind="damaged-record",
        only="sqlite",  # the other dialects' column types refuse text
    ),
    Damage(
        "unique index on id dropped",
        _sql("DROP INDEX {id_index}"),
        schema=True,
        only="sqlite",  # saves need it there (ON CONFLICT (id)); see test_sql_schema_damage
    ),
    Damage(
        "counter table dropped",
        _sql("DROP TABLE {counter}"),
        counter=True,
        kind="state",
        counter_row=True,
    ),
    Damage(
        "row holds another row's record",
        _copy_record({3: 2}),
        records=frozenset({3}),
        kind="damaged-record",
    ),
    Damage(
        "two rows' records swapped",
        _copy_record({3: 2, 2: 3}),
        records=frozenset({2, 3}),
        kind="damaged-record",
    ),
    Damage(
        "row holds a record of another stream",
        _copy_record({6: 4}),
        records=frozenset({6}),
        kind="damaged-record",
    ),
]


# -- what must hold --------------------------------------------------------------------


async def assert_remembered(
    store: SqlCheckpointStore, saved: Saved, damaged: set[int], *, tag_rows_intact: bool = True
) -> None:
    """S3 and S3a: every acknowledged checkpoint is answered for, none silently lost.

    A tag-filtered listing answers from the tag rows (docs/sql-backend.md): with
    those damaged, only verify() notices, so that part waits for the repair.
    """
    for seq, cp in saved.cps.items():
        if seq in damaged:
            with pytest.raises(CheckpointDecodeError) as caught:
                await store.load(cp.id)
            assert caught.value.id == cp.id
        else:
            assert await store.load(cp.id) == cp
    for stream in ("job", "other"):
        newest = saved.newest(stream)
        if newest.sequence in damaged:
            with pytest.raises(CheckpointDecodeError) as caught:
                await store.get_latest(stream)
            assert caught.value.id == newest.id  # named, and no older answer
        else:
            assert await store.get_latest(stream) == newest
        page = await store.list(stream, limit=100)
        mine = {s for s, c in saved.cps.items() if c.stream == stream}
        assert [c.sequence for c in page.items] == sorted(mine - damaged, reverse=True)
        assert [(s.id, s.sequence) for s in page.skipped] == [
            (saved.cps[s].id, s) for s in sorted(mine & damaged, reverse=True)
        ]
    if not tag_rows_intact:
        return
    tagged = await store.list(None, tags={"all": "yes"}, limit=100)
    assert {c.sequence for c in tagged.items} == set(saved.cps) - damaged
    with_meta = {s for s, c in saved.cps.items() if c.metadata.get("all") is True}
    filtered = await store.list(None, metadata={"all": True}, limit=100)
    assert {c.sequence for c in filtered.items} == with_meta - damaged
    assert not (await store.list(None, metadata={"all": 1}, limit=100)).items
    for seq in set(saved.cps) - damaged:
        cp = saved.cps[seq]
        if "k" in cp.tags:  # unique per checkpoint
            page = await store.list(cp.stream, tags=dict(cp.tags), limit=100)
            assert [c.id for c in page.items] == [cp.id]
            page = await store.list(cp.stream, metadata={"i": cp.metadata["i"]}, limit=100)
            assert [c.id for c in page.items] == [cp.id]


async def assert_saves(
    store: SqlCheckpointStore, saved: Saved, *, refuse: type[Exception] | None
) -> None:
    if refuse is not None:
        with pytest.raises(refuse, match="repair"):
            await store.save("job", "after damage")
        return
    cp = await store.save("job", "after damage", tags={"all": "yes"})
    # Above every stored sequence (and, unless the counter row itself was lost,
    # above the high-water mark, deleted sequences included).
    assert cp.sequence > max(saved.cps)
    saved.cps[cp.sequence] = cp


@pytest.mark.asyncio
@pytest.mark.parametrize("damage", DAMAGE, ids=lambda d: d.name.replace(" ", "-"))
async def test_damage_is_detected_reported_and_repaired(target: Target, damage: Damage) -> None:
    if damage.only is not None and damage.only != target.name:
        pytest.skip(f"{damage.name!r} can only happen on {damage.only}")
    if damage.counter_row and target.name == "postgres":
        pytest.skip("PostgreSQL takes sequences from transaction ids, not the counter row")
    saved = await populate(target)
    async with target.store() as store:
        await damage.apply(target, store, saved)
    damaged = saved.seqs(damage.records)
    tags_ok = damage.kind != "index"

    # 1. After a reopen (read-only, then writable): remembered, or refused with advice.
    async with target.store(read_only=True) as ro:
        assert ro.store_id == saved.store_id  # recovered from the records if need be
        await assert_remembered(ro, saved, damaged, tag_rows_intact=tags_ok)
        info = await ro.info()
        if damage.counter:
            assert info.high_water_mark in (None, 2)  # never a made-up 0
        # 2. verify(), without writing: not ok, and it names the damage.
        report = await ro.verify()
        assert not report.ok
        kinds = {p.kind for p in report.problems}
        assert damage.kind in kinds, report.problems
        assert kinds <= {"damaged-record", "index", "state"}, report.problems
        assert {p.sequence for p in report.problems if p.kind == "damaged-record"} == damaged
    async with target.store() as store:
        await assert_remembered(store, saved, damaged, tag_rows_intact=tags_ok)
        refuse = (
            BackendError
            if damage.counter or damage.schema
            else StoreFormatError
            if damage.meta
            else None
        )
        await assert_saves(store, saved, refuse=refuse)

        # 3. repair(): derived rows rebuilt, damaged records kept.
        report = await store.repair()
        assert {p.sequence for p in report.damaged} == damaged
        assert report.dropped == []
        if damage.kind != "damaged-record":
            assert report.rebuilt and report.actions, report
        await assert_remembered(store, saved, damaged)
        await assert_saves(store, saved, refuse=None)
    async with target.store(read_only=True) as ro:
        assert ro.store_id == saved.store_id
        await assert_remembered(ro, saved, damaged)
        report = await ro.verify()
        assert {(p.kind, p.sequence) for p in report.problems} == {
            ("damaged-record", s) for s in damaged
        }
        assert report.complete

    # 4. repair(drop_damaged=True): the explicit way a damaged checkpoint goes away.
    async with target.store() as store:
        report = await store.repair(drop_damaged=True)
        assert {p.sequence for p in report.dropped} == damaged
        for seq in damaged:
            with pytest.raises(CheckpointNotFound):
                await store.load(saved.cps.pop(seq).id)
        await assert_remembered(store, saved, set())
        assert (await store.verify()).ok
        await assert_saves(store, saved, refuse=None)
