"""Issue 36: connections killed under Redis and MariaDB/MySQL stores.

- Redis: a server of the test's own with AOF (``faultenv.ScratchRedis``); ``CLIENT
  KILL`` of every client but the killer, every 10 ms for a while, during 4 writers
  and 2 readers; and before each public operation. The client must re-send no
  write script whose reply it lost (redis-py retries by default: a save reported
  as ``PreconditionFailed`` for its own write, a step stored twice).
- MariaDB/MySQL: the shared server (``STATEKEEPER_TEST_MYSQL_URL``), never
  restarted. ``KILL CONNECTION`` of the connections this test's store opened (and
  only those: their ids are recorded as the pool opens them) during the writers,
  and before each public operation.

Counted as in ``test_connection_faults_pg``: lost, wrong, duplicates and
unsignalled unknown outcomes must be 0, every raised error retryable, ``verify``
clean, and after a kill every operation answers on its first call.
"""

from __future__ import annotations

import asyncio
import gc
import secrets
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from faultenv import ScratchRedis, every_operation, run_workload, unavailable
from reliability_support import FIGURES

from statekeeper import open_store
from statekeeper.testing import service_url

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]


@pytest.fixture
def scratch_redis() -> Iterator[ScratchRedis]:
    pytest.importorskip("statekeeper_redis")
    if shutil.which("redis-server") is None:
        unavailable("no redis-server binary")
    server = ScratchRedis()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


async def _client_kill(port: int) -> int:
    import redis.asyncio as aioredis

    killer = aioredis.Redis(host="127.0.0.1", port=port)
    try:
        return int(
            await killer.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        )
    finally:
        await killer.aclose()


def test_redis_client_kill_during_writes(scratch_redis: ScratchRedis) -> None:
    async def main() -> dict[str, object]:
        kills = 0

        async def fault() -> None:
            nonlocal kills
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                kills += await _client_kill(scratch_redis.port)
                await asyncio.sleep(0.01)

        async with open_store(scratch_redis.url()) as store:
            tally = await run_workload(store, fault)
        assert kills > 0
        FIGURES["connection faults: Redis CLIENT KILLs"] += kills
        FIGURES["connection faults: acknowledged saves checked"] += len(tally.acked)
        FIGURES["connection faults: unknown outcomes signalled"] += tally.unknown
        tally.assert_clean()
        return tally.summary()

    print(asyncio.run(main()))


def test_redis_kill_then_every_operation_answers_first_time(scratch_redis: ScratchRedis) -> None:
    async def main() -> None:
        async def kill() -> None:
            await _client_kill(scratch_redis.port)
            await asyncio.sleep(0.01)  # the store's sockets see their EOF

        async with open_store(scratch_redis.url()) as store:
            done = await every_operation(store, kill)
            assert (await store.verify()).ok
        FIGURES["connection faults: Redis idle kills answered"] += len(done)

    asyncio.run(main())


class MysqlConnections:
    """The server-side ids of the MySQL connections this process's pools open (the
    store's, and only while :meth:`watching`), and ``KILL CONNECTION`` of them."""

    def __init__(self, url: str) -> None:
        self.url = sa.make_url(url)
        self.ids: set[int] = set()

    def _record(self, dbapi_conn: Any, record: Any) -> None:
        self.ids.add(int(dbapi_conn._connection.thread_id()))

    def __enter__(self) -> MysqlConnections:
        sa.event.listen(sa.pool.Pool, "connect", self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        sa.event.remove(sa.pool.Pool, "connect", self._record)

    async def kill(self) -> int:
        import aiomysql
        import pymysql

        u = self.url
        con = await aiomysql.connect(
            host=u.host or "127.0.0.1", port=u.port or 3306, user=u.username or "root",
            password=u.password or "", db=u.database,
        )  # fmt: skip
        killed = 0
        try:
            async with con.cursor() as cur:
                await cur.execute("SELECT ID FROM information_schema.PROCESSLIST")
                alive = {int(r[0]) for r in await cur.fetchall()}
                for cid in sorted(self.ids & alive):
                    try:
                        await cur.execute(f"KILL CONNECTION {cid}")
                        killed += 1
                    except pymysql.err.OperationalError as exc:
                        if exc.args[0] != 1094:  # gone meanwhile: unknown thread id
                            raise
        finally:
            con.close()
        await asyncio.sleep(0.01)  # the store's sockets see their EOF
        return killed


@pytest.fixture
def mysql_url() -> str:
    pytest.importorskip("aiomysql")
    return service_url("mysql")


def _mysql_store_url(url: str) -> str:
    return f"{url}?table_prefix=k{secrets.token_hex(3)}_"


# aiomysql leaves the socket of a connection the server killed mid-query to the
# garbage collector (SQLAlchemy's close of it fails); collected in the test, while
# its event loop still runs
def _killed_sockets(test: Any) -> Any:
    test = pytest.mark.filterwarnings("ignore::ResourceWarning")(test)
    return pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")(test)


@_killed_sockets
def test_mysql_kill_connection_during_writes(mysql_url: str) -> None:
    async def main() -> dict[str, object]:
        url = _mysql_store_url(mysql_url)
        with MysqlConnections(mysql_url) as conns:
            kills = 0

            async def fault() -> None:
                nonlocal kills
                end = time.monotonic() + 1.5
                while time.monotonic() < end:
                    kills += await conns.kill()
                    await asyncio.sleep(0.05)

            store = open_store(url)
            async with store:
                tally = await run_workload(store, fault)
                await store.drop_tables()
        gc.collect()  # while the loop runs: the killed connections' transports close
        assert kills > 0
        FIGURES["connection faults: MariaDB KILL CONNECTIONs"] += kills
        FIGURES["connection faults: acknowledged saves checked"] += len(tally.acked)
        FIGURES["connection faults: unknown outcomes signalled"] += tally.unknown
        tally.assert_clean()
        return tally.summary()

    print(asyncio.run(main()))
    gc.collect()  # what the loop's end left: in this test, not in the next one


@_killed_sockets
def test_mysql_kill_then_every_operation_answers_first_time(mysql_url: str) -> None:
    async def main() -> None:
        url = _mysql_store_url(mysql_url)
        with MysqlConnections(mysql_url) as conns:
            killed = 0

            async def kill() -> None:
                nonlocal killed
                killed += await conns.kill()

            store = open_store(url, pool_size=2)
            async with store:
                done = await every_operation(store, kill)
                assert (await store.verify()).ok
                await store.drop_tables()
        gc.collect()  # while the loop runs: the killed connections' transports close
        assert killed >= len(done)
        FIGURES["connection faults: MariaDB idle kills answered"] += len(done)

    asyncio.run(main())
    gc.collect()  # what the loop's end left: in this test, not in the next one
