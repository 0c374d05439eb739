"""Issue 36: PostgreSQL restarts and idle kills, on a server of the test's own.

A scratch server (``initdb`` into a temp dir, a free port; ``faultenv``) is
restarted with ``pg_ctl``'s ``fast`` and ``immediate`` shutdowns while 4 writers and
2 readers work, and its store's connections are killed while idle
(``pg_terminate_backend``) before each public operation. Counted: calls raised by
type, acknowledged saves lost, unknown outcomes (``OutcomeUnknown``), duplicates,
wrong answers, unsignalled unknown outcomes, and whether ``verify`` is clean; all
but the raised calls and the signalled unknowns must be 0, and every error raised
must be retryable. After an idle kill every operation answers on its first call.

Without PostgreSQL server binaries the tests skip (fail in CI, which has them).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator

import pytest
from faultenv import (
    every_operation,
    postgres_maker,
    restart,
    run_workload,
    terminate_store_backends,
)
from reliability_support import FIGURES
from scratch_postgres import ScratchPostgres

from statekeeper import open_store

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]


@pytest.fixture
def scratch_pg() -> Iterator[Callable[..., ScratchPostgres]]:
    make, made = postgres_maker()
    try:
        yield make
    finally:
        for server in made:
            server.destroy()


def _url(server: ScratchPostgres) -> str:
    return server.url(table_prefix=f"f{secrets.token_hex(3)}_")


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_during_writes_and_reads(
    scratch_pg: Callable[..., ScratchPostgres], mode: str
) -> None:
    server = scratch_pg()

    async def main() -> dict[str, object]:
        async with open_store(_url(server)) as store:
            tally = await run_workload(store, lambda: asyncio.to_thread(restart, server, mode))
        FIGURES[f"connection faults: PostgreSQL -m {mode} restarts"] += 1
        FIGURES["connection faults: acknowledged saves checked"] += len(tally.acked)
        FIGURES["connection faults: unknown outcomes signalled"] += tally.unknown
        tally.assert_clean()
        return tally.summary()

    print(asyncio.run(main()))


def test_idle_kill_then_every_operation_answers_first_time(
    scratch_pg: Callable[..., ScratchPostgres],
) -> None:
    server = scratch_pg()
    admin = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"

    async def main() -> None:
        killed = 0

        async def kill() -> None:
            nonlocal killed
            killed += await terminate_store_backends(admin)

        async with open_store(_url(server), pool_size=2) as store:
            done = await every_operation(store, kill)
            latest = await store.get_latest("ops")
            assert latest is not None and latest.state == {"n": 10}
            assert (await store.verify()).ok
        assert killed >= len(done)  # every operation met killed connections
        FIGURES["connection faults: PostgreSQL idle kills answered"] += len(done)

    asyncio.run(main())
