"""A server that evicts keys on its own is refused like a server without AOF.

Redis with any ``maxmemory-policy`` but ``noeviction`` deletes keys under memory
pressure: ``allkeys-*`` any key, ``volatile-*`` every key with a TTL (a checkpoint
saved with ``ttl=``). An evicted index key makes a store answer "empty"; an
evicted record loses an acknowledged checkpoint. So the store refuses such a
server on open (``UnsafeDurabilityError``, a ``DurabilityUnavailable``) unless
``allow_unsafe_durability=True``.

The shared test server is never reconfigured: each test starts its own scratch
``redis-server`` on a free loopback port, with AOF on (so only the eviction
policy can be the reason for a refusal), and stops it afterwards.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from statekeeper_redis import RedisCheckpointStore, UnsafeDurabilityError

from statekeeper.errors import DurabilityUnavailable


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def scratch_server(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """``(maxmemory_policy) -> url`` of a scratch redis-server with AOF (fsync always)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    started: list[subprocess.Popen[bytes]] = []

    def start(policy: str) -> str:
        port = _free_port()
        workdir = tmp_path / str(port)
        workdir.mkdir()
        proc = subprocess.Popen(
            [
                binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--dir", str(workdir),
                "--maxmemory", "64mb",
                "--maxmemory-policy", policy,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        started.append(proc)
        client = redis.Redis(host="127.0.0.1", port=port)
        # 60 s: a guard against a server that never starts, not a bound on how fast
        deadline = time.monotonic() + 60
        try:
            while True:
                try:
                    if client.ping():
                        break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        pytest.fail(f"the scratch redis-server on port {port} did not start")
                    time.sleep(0.025)
        finally:
            client.close()
        return f"redis://127.0.0.1:{port}/0"

    try:
        yield start
    finally:
        for proc in started:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "policy", ["allkeys-lru", "allkeys-random", "volatile-lru", "volatile-ttl", "volatile-lfu"]
)
@pytest.mark.parametrize("durability", ["full", "fast"])
async def test_an_evicting_server_is_refused_unless_opted_in(
    scratch_server: Callable[[str], str], policy: str, durability: str
) -> None:
    url = scratch_server(policy)
    store = RedisCheckpointStore(url, key_prefix="evict", durability=durability)
    with pytest.raises(UnsafeDurabilityError) as info:
        await store.open()
    assert isinstance(info.value, DurabilityUnavailable)
    message = str(info.value)
    assert f"maxmemory-policy is {policy!r}" in message
    assert "noeviction" in message and "allow_unsafe_durability=True" in message
    assert not store.is_open
    client = redis.Redis.from_url(url)
    try:
        assert client.dbsize() == 0  # the refused open wrote nothing
    finally:
        client.close()

    opted = RedisCheckpointStore(
        url, key_prefix="evict", durability=durability, allow_unsafe_durability=True
    )
    async with opted:
        cp = await opted.save("job", {"n": 1})
        assert await opted.get_latest("job") == cp
        info_extra = (await opted.info()).extra
        assert info_extra["maxmemory_policy"] == policy
        assert info_extra["durability"].startswith("NOT guaranteed")


@pytest.mark.asyncio
async def test_a_non_evicting_server_with_aof_opens_without_the_opt_in(
    scratch_server: Callable[[str], str],
) -> None:
    url = scratch_server("noeviction")
    async with RedisCheckpointStore(url, key_prefix="evict") as store:
        cp = await store.save("job", {"n": 1})
        assert await store.get_latest("job") == cp
        extra = (await store.info()).extra
        assert extra["maxmemory_policy"] == "noeviction"
        assert extra["durability"] == "full: checked on open"
