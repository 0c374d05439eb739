"""Fixtures of the statekeeper-redis tests: the real server's URL and a key prefix per test.

Every test gets its own random key prefix, so runs (and engineers sharing the
server) never see each other's keys; teardown unlinks every key under it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from statekeeper_redis import RedisCheckpointStore

from statekeeper.testing import service_url


def key_pattern(prefix: str) -> str:
    """The SCAN pattern matching every key of the store with ``key_prefix=prefix``."""
    return "{" + prefix + "}:*"


def drop_keys(url: str, prefix: str) -> int:
    """SCAN + UNLINK every key under ``prefix``; return how many there were."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=key_pattern(prefix), count=1000))
        for i in range(0, len(keys), 500):
            client.unlink(*keys[i : i + 500])
        return len(keys)
    finally:
        client.close()


@pytest.fixture
def redis_url() -> str:
    return service_url("redis")


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    prefix = f"sk-test-{secrets.token_hex(6)}"
    yield prefix
    drop_keys(redis_url, prefix)


@pytest.fixture
def other_prefix(redis_url: str, key_prefix: str) -> Iterator[str]:
    """A second key prefix (for isolation tests), a prefix-extension of the first."""
    prefix = key_prefix + "-other"
    yield prefix
    drop_keys(redis_url, prefix)


@pytest.fixture
def make_store(redis_url: str, key_prefix: str) -> Callable[..., RedisCheckpointStore]:
    """``(**options) -> unopened store`` over this test's key prefix.

    The local server keeps nothing on disk, so the tests open with the explicit
    durability opt-out (test_redis_durability.py asserts the refusal without it).
    """

    def make(**options: Any) -> RedisCheckpointStore:
        options.setdefault("key_prefix", key_prefix)
        options.setdefault("allow_unsafe_durability", True)
        return RedisCheckpointStore(redis_url, **options)

    return make
