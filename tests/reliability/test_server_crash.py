"""Issue 11, part 6: the database server crashes, not the client.

The test starts a PostgreSQL server of its own (``initdb`` into a temp dir, a free
port on 127.0.0.1; see ``scratch_postgres``), runs the random writer workload
against it with ``durability="full"``, and SIGKILLs the server's postmaster at a
seeded random moment, a few times. After each crash the server restarts (crash
recovery from its WAL), the writer must get writes acknowledged again without
being restarted, and D, A, R, L, S are checked against the writer's fsynced write
log: every acknowledged save is there, no sequence is reused, ``get_latest`` is
never older than what was acknowledged.

The control: with ``durability="fast"`` (``synchronous_commit=off``, which promises
nothing about a server crash) and a WAL writer that waits 10 s, the same loop must
find acknowledged writes lost, or the test could not see a loss at all.

Without PostgreSQL server binaries, or as root without a non-root user to run them,
the tests skip; under ``STATEKEEPER_REQUIRE_SERVICES`` (CI) that is a failure, as
for the tests that need a running server, since CI has the binaries.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from faultenv import postgres_maker
from harness import server_crash_loop
from reliability_support import FIGURES, Backend
from scratch_postgres import ScratchPostgres

from statekeeper.testing.invariants import InvariantViolation

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]

SEED = 20250311


@pytest.fixture
def scratch_postgres() -> Iterator[Callable[..., ScratchPostgres]]:
    """``(**settings) -> a started server``; every server is destroyed at teardown."""
    make, made = postgres_maker()
    try:
        yield make
    finally:
        for server in made:
            server.destroy()
    assert not any(server.root.exists() for server in made)


def _backend(server: ScratchPostgres, durability: str) -> Backend:
    prefix = f"crash{secrets.token_hex(3)}_"
    return Backend("postgres-server", server.url(table_prefix=prefix, durability=durability))


def test_postgres_server_crash_keeps_acknowledged_writes(
    scratch_postgres: Callable[..., ScratchPostgres], tmp_path: Path, long_run: bool
) -> None:
    server = scratch_postgres()
    rounds = 10 if long_run else 3
    result = server_crash_loop(_backend(server, "full"), server, tmp_path, rounds=rounds, seed=SEED)
    recoveries = server.log_text().count("automatic recovery in progress")
    FIGURES["server crash: PostgreSQL postmaster SIGKILLs survived"] += result.server_kills
    FIGURES["server crash: crash recoveries run by the restarted server"] += recoveries
    FIGURES["server crash: acknowledged writes verified"] += result.acked
    FIGURES["server crash: writes acknowledged again after a restart"] += result.acked_after_restart
    FIGURES["server crash: operations in doubt (cut off, or failed while down)"] += result.in_doubt
    assert result.server_kills == rounds
    # each kill was a crash, not a clean shutdown: every restart had to replay the WAL
    assert recoveries == rounds, server.log_text()[-3000:]
    assert server.stragglers == 0, "server processes outlived their postmaster by 30 s"


def test_server_crash_catches_unflushed_commits(
    scratch_postgres: Callable[..., ScratchPostgres], tmp_path: Path
) -> None:
    """The control: asynchronous commit loses acknowledged writes in a server crash,
    and the loop reports them: as a missing checkpoint (D), an older state where the
    last operation on the id was cut off (A), or a sequence handed out twice (S)."""
    server = scratch_postgres(wal_writer_delay="10s")
    with pytest.raises(InvariantViolation) as info:
        server_crash_loop(_backend(server, "fast"), server, tmp_path, rounds=3, seed=SEED)
    assert info.value.report.codes() <= {"D", "A", "S"}, str(info.value)
    FIGURES["mutants caught"] += 1
