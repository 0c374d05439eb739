"""Issue 36: PostgreSQL behind PgBouncer in transaction mode.

A scratch server (``faultenv``) behind a PgBouncer of the test's own, in
``pool_mode = transaction`` with 3 server connections for every client, and with
``ignore_startup_parameters`` for the session settings a direct connection sends:
the configuration under which statekeeper used to run other clients' prepared
statements (``get_latest`` returning ``None`` for live checkpoints) and hang in
the migration lock.

- Without ``pooler="transaction"`` the open refuses, naming the option.
- With it, the conformance kit passes through the pooler; concurrent opens of one
  new store do not hang (the migration lock is the transaction's); many stores'
  saves and reads interleaved on the 3 server connections are all answered right;
  and ``lock_timeout`` holds (a save waiting on a stream lock times out).

Without PostgreSQL server binaries or pgbouncer the tests skip (fail in CI, which
has them: ``.ci/run`` installs pgbouncer).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import asyncpg
import pytest
from faultenv import ScratchPgBouncer, pgbouncer_available, postgres_maker
from reliability_support import FIGURES
from scratch_postgres import ScratchPostgres

from sql_helpers import wipe_store
from statekeeper import open_store
from statekeeper.backends.sql import SqlCheckpointStore
from statekeeper.errors import BackendError, StoreTimeout
from statekeeper.testing import CheckpointStoreTests, StoreFactory

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def bouncer() -> Iterator[tuple[ScratchPostgres, ScratchPgBouncer]]:
    pgbouncer_available()
    make, made = postgres_maker()
    pool: ScratchPgBouncer | None = None
    try:
        server = make()
        pool = ScratchPgBouncer(server, pool_size=3)
        pool.start()
        yield server, pool
    finally:
        if pool is not None:
            pool.destroy()
        for server in made:
            server.destroy()


def _prefix() -> str:
    return f"b{secrets.token_hex(3)}_"


def test_open_without_pooler_option_refuses_naming_it(
    bouncer: tuple[ScratchPostgres, ScratchPgBouncer],
) -> None:
    _, pool = bouncer

    async def main() -> None:
        with pytest.raises(BackendError, match="pooler='transaction'"):
            async with open_store(pool.url(table_prefix=_prefix())):
                pass

    asyncio.run(main())


def test_reads_through_the_pooler_are_right(
    bouncer: tuple[ScratchPostgres, ScratchPgBouncer],
) -> None:
    """8 stores (40 client connections) on 3 server connections, saving and reading
    their own streams at once: every get_latest and load answers the last save."""
    _, pool = bouncer
    prefix = _prefix()

    async def one(n: int) -> int:
        checked = 0
        async with open_store(pool.url(table_prefix=prefix), pooler="transaction") as store:
            for step in range(15):
                saved = await store.save(f"s{n}", {"n": n, "step": step})
                latest = await store.get_latest(f"s{n}")
                assert latest is not None and latest.id == saved.id, (n, step, latest)
                assert (await store.load(saved.id)).state == {"n": n, "step": step}
                page = await store.list(f"s{n}", limit=1)
                assert [c.id for c in page.items] == [saved.id]
                checked += 3
        return checked

    async def main() -> int:
        async with open_store(pool.url(table_prefix=prefix), pooler="transaction"):
            pass  # created once, then opened by 8 at once
        return sum(await asyncio.gather(*(one(n) for n in range(8))))

    FIGURES["connection faults: reads through PgBouncer checked"] += asyncio.run(main())


def test_concurrent_opens_of_a_new_store_finish(
    bouncer: tuple[ScratchPostgres, ScratchPgBouncer],
) -> None:
    _, pool = bouncer
    url = pool.url(table_prefix=_prefix())

    async def opened() -> str:
        async with open_store(url, pooler="transaction") as store:
            return store.store_id

    async def main() -> None:
        ids = await asyncio.gather(*(opened() for _ in range(4)))
        assert len(set(ids)) == 1  # one store, created once

    asyncio.run(main())


def test_lock_timeout_holds_through_the_pooler(
    bouncer: tuple[ScratchPostgres, ScratchPgBouncer],
) -> None:
    """busy_timeout bounds a save that waits on a lock another session holds: the
    setting reached the server connection that ran the save."""
    server, pool = bouncer
    prefix = _prefix()

    async def main() -> None:
        url = pool.url(table_prefix=prefix)
        async with open_store(url, pooler="transaction", busy_timeout=0.3) as store:
            await store.save("locked", {"n": 0})
            holder = await asyncpg.connect(server.url().replace("+asyncpg", ""))
            try:
                async with holder.transaction():
                    await holder.execute(f"LOCK TABLE {prefix}checkpoints IN EXCLUSIVE MODE")
                    with pytest.raises(StoreTimeout):
                        await store.save("locked", {"n": 1})
            finally:
                await holder.close()

    asyncio.run(main())


class TestPgBouncerConformance(CheckpointStoreTests):
    """The kit through PgBouncer in transaction mode, ``pooler="transaction"``: one
    table prefix, wiped after each test (cheaper than new tables per test)."""

    state_machine_examples = 8
    prefix = _prefix()

    @pytest.fixture
    def store_factory(
        self, bouncer: tuple[ScratchPostgres, ScratchPgBouncer]
    ) -> Iterator[StoreFactory]:
        server, pool = bouncer
        url, prefix = pool.url(), self.prefix
        yield lambda **options: SqlCheckpointStore.from_url(
            url, table_prefix=prefix, pooler="transaction", **options
        )
        wipe_store(server.url(), prefix)
