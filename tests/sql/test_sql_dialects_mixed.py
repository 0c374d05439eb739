"""SQLite, PostgreSQL and MariaDB/MySQL stores with the same table prefix in one process.

Statements are cached per process; a statement built for one dialect must never be
run by another (issue 11: a SQLite store opened first made every PostgreSQL save
fail with ``'OnConflictDoNothing' object has no attribute 'constraint_target'``).
Every order of first use is tried, each with a table prefix no earlier order used,
so each order starts from cold caches.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from sql_helpers import drop_store, new_prefix
from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.testing import service_url

DIALECTS = ("sqlite", "postgres", "mysql")


@pytest.fixture
def urls(tmp_path: Path) -> dict[str, str]:
    """The three dialects' URLs (skips, naming the variable, if a server is not set)."""
    return {
        "sqlite": f"sqlite:///{tmp_path / 'store.db'}",
        "postgres": service_url("postgres"),
        "mysql": service_url("mysql"),
    }


async def _exercise(store: SqlCheckpointStore, name: str) -> None:
    first = await store.save("job", {"at": name, "n": 1}, tags={"d": name})
    second = await store.save("job", {"at": name, "n": 2}, tags={"d": name})
    # The id is taken: the insert-or-skip statement runs its conflict path too.
    await store.save("other", {"at": name}, id=f"fixed-{name}")
    assert second.sequence > first.sequence
    latest = await store.get_latest("job")
    assert latest is not None and latest.id == second.id
    page = await store.list("job", tags={"d": name})
    assert [c.id for c in page.items] == [second.id, first.id] and page.skipped == []
    updated = await store.update(first.id, {"at": name, "n": 10}, if_match=first.etag)
    assert (await store.load(first.id)).state == {"at": name, "n": 10}
    assert updated.sequence == first.sequence
    assert await store.delete(second.id, if_match=second.etag)
    latest = await store.get_latest("job")
    assert latest is not None and latest.id == first.id


@pytest.mark.asyncio
@pytest.mark.parametrize("order", list(itertools.permutations(DIALECTS)), ids="-".join)
async def test_every_dialect_works_whichever_was_opened_first(
    urls: dict[str, str], order: tuple[str, ...]
) -> None:
    prefix = new_prefix()
    stores = [SqlCheckpointStore.from_url(urls[name], table_prefix=prefix) for name in order]
    try:
        # Open all first, so that every dialect's open runs before any save...
        for store in stores:
            await store.open()
        # ...then use them in the same order, then once more interleaved.
        for name, store in zip(order, stores, strict=True):
            await _exercise(store, name)
        for name, store in zip(order, stores, strict=True):
            cp = await store.save("again", {"at": name})
            assert (await store.get_latest("again")) == cp
    finally:
        for store in stores:
            await store.close()
        for name in order:
            if name != "sqlite":
                drop_store(urls[name], prefix)
