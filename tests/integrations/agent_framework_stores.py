"""Backends for the Agent Framework adapter's tests (imported by test_agent_framework_*).

``Backend`` names one store location on one backend: ``storage()`` builds a
``StatekeeperCheckpointStorage`` over it (every call is a new storage over the same
data, as a restarted process would build), ``raw_store()`` an unopened store with
``codec="raw"`` over the same data for writing behind the adapter's back.
Server backends skip, naming the variable to set, when their URL is unset; each
test gets its own SQL table prefix or Redis key prefix, removed afterwards.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import statekeeper
from statekeeper import BaseCheckpointStore
from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage
from statekeeper.testing import service_url

BACKENDS = ["memory", "file", "sqlite", "postgres", "mysql", "redis"]


class Backend:
    def __init__(self, name: str, make_raw: Callable[..., BaseCheckpointStore]) -> None:
        self.name = name
        self._make_raw = make_raw
        self._storages: list[StatekeeperCheckpointStorage] = []

    def raw_store(self, **options: Any) -> BaseCheckpointStore:
        """An unopened ``codec="raw"`` store over this backend's data."""
        return self._make_raw(**options)

    def storage(self, **kwargs: Any) -> StatekeeperCheckpointStorage:
        """A new adapter over an unopened store (it opens lazily; closed at teardown)."""
        options = kwargs.pop("store_options", {})
        storage = StatekeeperCheckpointStorage(self.raw_store(**options), **kwargs)
        self._storages.append(storage)
        return storage

    async def close_all(self) -> None:
        for storage in self._storages:
            await storage.aclose()


def _memory() -> Callable[..., BaseCheckpointStore]:
    data = MemoryStorage()
    return lambda **o: MemoryCheckpointStore(storage=data, codec="raw", **o)


def _url(url: str) -> Callable[..., BaseCheckpointStore]:
    return lambda **o: statekeeper.open_store(url, codec="raw", **o)


async def _drop_redis(url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match="{" + prefix + "}:*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.unlink(*keys[i : i + 500])
    finally:
        await client.aclose()


@pytest_asyncio.fixture(name="backend", params=BACKENDS)
async def backend_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """One fresh store location per test on each backend."""
    name = request.param
    cleanup: Callable[[], Any] | None = None
    if name == "memory":
        make = _memory()
    elif name == "file":
        make = _url(f"file://{tmp_path / 'store'}")
    elif name == "sqlite":
        make = _url(f"sqlite:///{tmp_path / 'store.db'}")
    elif name in ("postgres", "mysql"):
        base = service_url(name)  # skips with the variable's name when unset
        prefix = f"af{secrets.token_hex(4)}_"
        make = _url(f"{base}?table_prefix={prefix}")
        from statekeeper.backends.sql import SqlCheckpointStore

        def cleanup() -> Any:
            return SqlCheckpointStore.from_url(base, table_prefix=prefix).drop_tables()

    else:
        base = service_url("redis")
        prefix = f"sk-af-{secrets.token_hex(6)}"
        make = _url(f"{base}?key_prefix={prefix}&allow_unsafe_durability=true")

        def cleanup() -> Any:
            return _drop_redis(base, prefix)

    backend = Backend(name, make)
    try:
        yield backend
    finally:
        await backend.close_all()
        if cleanup is not None:
            await cleanup()
