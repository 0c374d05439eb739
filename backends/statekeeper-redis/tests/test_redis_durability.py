"""Honest durability: the store reads the server's persistence settings on open and
refuses a server that can lose acknowledged writes, unless told otherwise.

The local test server keeps nothing on disk (no AOF), so the refusal is what a
default open must do there; every other test opens with the explicit opt-out.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from statekeeper_redis import RedisCheckpointStore, ServerPersistence, UnsafeDurabilityError

from statekeeper.errors import StatekeeperError

Maker = Callable[..., RedisCheckpointStore]


@pytest.mark.asyncio
async def test_full_durability_is_refused_on_a_server_without_aof(
    make_store: Maker, redis_url: str, key_prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        appendonly = client.config_get("appendonly")["appendonly"]
    finally:
        client.close()
    if appendonly != "no":
        pytest.fail(f"the test server must run without AOF for this test, it has {appendonly!r}")
    for durability in ("full", "fast"):
        store = make_store(allow_unsafe_durability=False, durability=durability)
        with pytest.raises(UnsafeDurabilityError) as info:
            await store.open()
        message = str(info.value)
        assert "appendonly is 'no'" in message
        assert "allow_unsafe_durability=True" in message
        assert f"durability={durability!r}" in message
        assert isinstance(info.value, StatekeeperError)
        assert not store.is_open
    # nothing was created by the refused opens
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match="{" + key_prefix + "}:*")) == []
    finally:
        client.close()


@pytest.mark.asyncio
async def test_the_opt_out_opens_and_info_reports_the_server_settings(make_store: Maker) -> None:
    async with make_store(allow_unsafe_durability=True) as store:
        info = await store.info()
    assert info.extra["appendonly"] == "no"
    assert info.extra["appendfsync"] in ("always", "everysec", "no")
    assert info.extra["durability"].startswith("NOT guaranteed")


@pytest.fixture
def user_without_config(redis_url: str, key_prefix: str) -> Iterator[str]:
    """A URL for an ACL user who may do everything to this test's keys except CONFIG,
    like the default user of several managed Redis services."""
    name, password = f"sk-test-{secrets.token_hex(4)}", secrets.token_hex(16)
    admin = redis.Redis.from_url(redis_url)
    admin.acl_setuser(
        name,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["{" + key_prefix + "}:*"],
        commands=["+@all", "-config"],
    )
    parts = urlsplit(redis_url)
    netloc = f"{name}:{password}@{parts.hostname}:{parts.port or 6379}"
    try:
        yield urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    finally:
        admin.acl_deluser(name)
        admin.close()


@pytest.mark.asyncio
async def test_a_server_that_hides_its_config_is_refused_with_the_way_out(
    user_without_config: str, key_prefix: str
) -> None:
    store = RedisCheckpointStore(user_without_config, key_prefix=key_prefix)
    with pytest.raises(UnsafeDurabilityError) as info:
        await store.open()
    message = str(info.value)
    assert "cannot be read" in message and "CONFIG GET failed" in message
    assert "allow_unsafe_durability=True" in message
    assert "managed service" in message
    # the same user, having checked the service's settings, opts out explicitly
    store = RedisCheckpointStore(
        user_without_config, key_prefix=key_prefix, allow_unsafe_durability=True
    )
    async with store:
        cp = await store.save("job", {"ok": True})
        assert (await store.get_latest("job")) == cp
        assert store.server is not None and store.server.unreadable is not None


@pytest.mark.parametrize(
    ("settings", "durability", "refused_for"),
    [
        (("yes", "always", "noeviction"), "full", None),
        (("yes", "always", "volatile-lru"), "full", "maxmemory-policy is 'volatile-lru'"),
        (("yes", "no", "volatile-ttl"), "fast", "evict"),
        (("yes", "everysec", "noeviction"), "full", "appendfsync is 'everysec'"),
        (("yes", "everysec", "noeviction"), "fast", None),
        (("yes", "no", "noeviction"), "fast", None),
        (("no", "always", "noeviction"), "fast", "appendonly is 'no'"),
        (("no", "everysec", "noeviction"), "full", "appendonly is 'no'"),
        (("yes", "always", "allkeys-lru"), "full", "maxmemory-policy is 'allkeys-lru'"),
        (("yes", "always", "allkeys-random"), "fast", "evict"),
    ],
)
def test_what_each_durability_level_requires(
    settings: tuple[str, str, str], durability: str, refused_for: str | None
) -> None:
    appendonly, appendfsync, policy = settings
    server = ServerPersistence.from_config(
        {"appendonly": appendonly, "appendfsync": appendfsync, "maxmemory-policy": policy}
    )
    refusal = server.refuse("redis://example/0", durability)
    if refused_for is None:
        assert refusal is None
    else:
        assert refusal is not None and refused_for in str(refusal)
