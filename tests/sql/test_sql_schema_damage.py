"""Tables and indexes of the SQL backend lost behind the store's back (issue 25).

Nothing about the records is wrong then, but saves fail or stop being checked, so
``verify`` compares the catalog with what the schema version needs and names what
is missing, ``repair()`` recreates it (tag and fields rows refilled from the
records, the counter from the highest stored sequence), and a save that fails on
it says to repair. On SQLite, PostgreSQL and MariaDB/MySQL (when their URL
variables are set); the verify command exits 1 and names the damage.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_sql_damage import assert_remembered, populate

from cli_helpers import run_cli
from sql_helpers import Target
from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.errors import BackendError


@dataclass(frozen=True)
class Lost:
    """An index (``table`` is its table) or, with ``index`` ``None``, a table."""

    table: str
    index: str | None = None
    #: Recreated by hand with the same name but without UNIQUE (else: dropped).
    not_unique: bool = False
    only: str | None = None

    @property
    def name(self) -> str:
        what = f"index-{self.index}" if self.index else f"table-{self.table}"
        return what + ("-not-unique" if self.not_unique else "")


LOST = [
    Lost("checkpoints", "checkpoints_id"),
    Lost("checkpoints", "checkpoints_id", not_unique=True),
    Lost("checkpoints", "checkpoints_stream_seq"),
    Lost("checkpoints", "checkpoints_expires"),
    Lost("checkpoints", "checkpoints_stream_c", only="postgres"),
    Lost("tags", "tags_stream"),
    Lost("tags", "tags_global"),
    Lost("fields", "fields_stream"),
    Lost("fields", "fields_global"),
    Lost("tags"),
    Lost("fields"),
    Lost("counter"),
]


async def damage(target: Target, lost: Lost) -> None:
    table = f"{target.prefix}{lost.table}"
    if lost.index is None:
        await target.sql(f"DROP TABLE {table}")
        return
    index = f"{target.prefix}{lost.index}"
    on = f" ON {table}" if target.name == "mysql" else ""
    await target.sql(f"DROP INDEX {index}{on}")
    if lost.not_unique:
        await target.sql(f"CREATE INDEX {index} ON {table} (id)")


@pytest.mark.asyncio
@pytest.mark.parametrize("lost", LOST, ids=lambda lost: lost.name)
async def test_lost_schema_is_named_by_verify_and_rebuilt_by_repair(
    target: Target, lost: Lost
) -> None:
    if lost.only is not None and lost.only != target.name:
        pytest.skip(f"{lost.name} exists on {lost.only} only")
    saved = await populate(target)
    await damage(target, lost)
    named = f"{target.prefix}{lost.index or lost.table}"

    async with target.store(read_only=True) as ro:
        report = await ro.verify()
        assert not report.ok
        [problem] = report.problems
        assert named in problem.reason and "repair()" in problem.reason
        assert problem.location == f"{target.prefix}{lost.table}"
        assert problem.kind == ("index" if lost.index else "state")
        await assert_remembered(ro, saved, set(), tag_rows_intact=lost.table == "counter")

    async with target.store() as store:
        report = await store.repair()
        assert report.rebuilt.get("schema") == 1, report
        assert any(named in action for action in report.actions), report
        assert report.damaged == [] and report.dropped == []
        assert (await store.verify()).ok
        await assert_remembered(store, saved, set())
        cp = await store.save("job", "after repair", tags={"all": "yes"})
        assert cp.sequence > max(saved.cps)


@pytest.mark.asyncio
@pytest.mark.parametrize("what", ["index", "counter"])
async def test_a_save_on_a_lost_table_or_index_says_to_repair(target: Target, what: str) -> None:
    """SQLite needs the unique index on id to save (ON CONFLICT); every dialect but
    PostgreSQL (sequences from transaction ids) needs the counter table."""
    if what == "index" and target.name != "sqlite":
        pytest.skip("only SQLite's saves name the unique index on id")
    if what == "counter" and target.name == "postgres":
        pytest.skip("PostgreSQL takes sequences from transaction ids, not the counter")
    saved = await populate(target)
    lost = Lost("checkpoints", "checkpoints_id") if what == "index" else Lost("counter")
    await damage(target, lost)
    async with target.store() as store:
        with pytest.raises(BackendError) as caught:
            await store.save("job", "refused")
        message = str(caught.value)
        assert f"{target.prefix}{lost.index or lost.table}" in message
        assert "nothing was saved" in message and "store.repair()" in message
        await store.repair()
        cp = await store.save("job", "after repair")
        assert cp.sequence > max(saved.cps)


#: SQL run on a populated SQLite store, and what ``verify --json`` must name.
CLI_DAMAGE = {
    "lost-index": (
        "DROP INDEX statekeeper_checkpoints_id",
        "statekeeper_checkpoints_id is missing",
    ),
    "lost-counter-table": ("DROP TABLE statekeeper_counter", "statekeeper_counter is missing"),
    "store_id-overwritten": (
        "UPDATE statekeeper_meta SET value = 'ffffffff' WHERE name = 'store_id'",
        "the store_id row says 'ffffffff'",
    ),
    "record-cell-text": (
        "UPDATE statekeeper_checkpoints SET record = 'garbage' WHERE seq = 3",
        "record is str, not bytes",
    ),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", list(CLI_DAMAGE))
async def test_the_verify_command_exits_1_and_names_the_damage(tmp_path: Path, case: str) -> None:
    statement, named = CLI_DAMAGE[case]
    url = f"sqlite:///{tmp_path / 'store.db'}"
    target = Target("sqlite", url, "statekeeper_")
    await populate(target)
    await target.sql(statement)
    result = await asyncio.to_thread(
        run_cli, "verify", "--url", url, "--json", cwd=tmp_path, expect=1
    )
    doc = result.json()
    assert doc["ok"] is False
    assert any(named in p["reason"] for p in doc["problems"]), doc["problems"]
    async with SqlCheckpointStore.from_url(url) as store:
        await store.repair(drop_damaged=True)
    await asyncio.to_thread(run_cli, "verify", "--url", url, cwd=tmp_path, expect=0)


@pytest.mark.asyncio
async def test_drop_damaged_never_takes_a_readable_row_that_shares_its_id(tmp_path: Path) -> None:
    """With the unique index on id lost, a damaged row can share its id with an intact
    one: repair() says why the index cannot come back, and drop_damaged removes the
    damaged row only (by its sequence, not by id)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    target = Target("sqlite", url, "statekeeper_")
    saved = await populate(target)
    await damage(target, Lost("checkpoints", "checkpoints_id"))
    intact = saved.cps[saved.order[1]]
    await target.sql(
        "INSERT INTO statekeeper_checkpoints (seq, id, stream, expires_at, record) "
        "SELECT 100, id, stream, expires_at, record FROM statekeeper_checkpoints "
        "WHERE seq = :seq",
        {"seq": intact.sequence},
    )  # a replayed row at another sequence: its record says it is at the first
    async with target.store() as store:
        report = await store.repair()
        [why] = [a for a in report.actions if "cannot be recreated" in a]
        assert f"{intact.id!r} at sequences {intact.sequence}, 100" in why
        assert [p.sequence for p in report.damaged] == [100]
        report = await store.repair(drop_damaged=True)
        assert [p.sequence for p in report.dropped] == [100]
        assert await store.load(intact.id) == intact
        await assert_remembered(store, saved, set())
        report = await store.repair()  # now the index can come back
        assert any("recreated the index statekeeper_checkpoints_id" in a for a in report.actions)
        assert (await store.verify()).ok
