"""Shared machinery of the reliability suite: stores by URL for the parent and for
forked workload children, and the session's figures.

Kept out of ``conftest.py`` so that test modules import it by a name of its own
(``tests/conftest.py`` is a ``conftest`` module too).
"""

from __future__ import annotations

import asyncio
import importlib
import secrets
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import statekeeper
from statekeeper._core.store import BaseCheckpointStore
from statekeeper.backends.file import FileCheckpointStore
from statekeeper.testing.services import require_services, service_url

HERE = Path(__file__).parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import mutants  # noqa: E402

#: ``--register`` arguments a workload child needs to open every URL below.
CHILD_REGISTER = ["--register", f"snap={mutants.SNAP_TARGET}"]

#: Summed over the session, printed at its end (see ``conftest.py``).
FIGURES: Counter[str] = Counter()

_MODULES = {
    "file": "statekeeper.backends.file",
    "sqlite": "statekeeper.backends.sql",
    "postgres": "statekeeper.backends.sql",
    "mysql": "statekeeper.backends.sql",
    "snap": "mutants",
    # the plugin is its own distribution (backends/statekeeper-redis)
    "redis": "statekeeper_redis",
}


def backend_available(kind: str) -> None:
    """Skip (with the reason) if the backend for ``kind`` is not importable yet.

    The Redis plugin is a separate distribution, so a missing one means the
    environment was synced without it; under ``STATEKEEPER_REQUIRE_SERVICES`` that
    is a failure, like a missing server, so CI cannot go green by skipping Redis.
    """
    try:
        importlib.import_module(_MODULES[kind])
    except ImportError as exc:
        problem = f"the {kind} backend is not importable: {exc}"
        if kind == "redis":
            problem += " (uv sync --all-packages, or pip install backends/statekeeper-redis)"
            if require_services():
                pytest.fail(f"{problem}; STATEKEEPER_REQUIRE_SERVICES is set, so this is a failure")
        pytest.skip(problem)


def _sql_prefix() -> str:
    return f"rel{secrets.token_hex(4)}_"


class Backend:
    """One store under test: its URL (for the parent and for workload children)."""

    def __init__(self, kind: str, url: str, cleanup: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self.url = url
        self._cleanup = cleanup

    def open(self, **options: Any) -> BaseCheckpointStore:
        return statekeeper.open_store(self.url, **options)

    @asynccontextmanager
    async def opened(self, **options: Any) -> AsyncIterator[BaseCheckpointStore]:
        async with self.open(**options) as store:
            yield store

    def child_args(self) -> list[str]:
        return ["--url", self.url, *CHILD_REGISTER]

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()


def _with_query(url: str, **query: str) -> str:
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    if not qs:
        return url
    return url + ("&" if "?" in url else "?") + qs


def _drop_redis_keys(url: str, key_prefix: str) -> None:
    """Unlink every key of a Redis test store (its key prefix is unique to the test);
    never FLUSHDB: the database is shared with other tests and engineers."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match="{" + key_prefix + "}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.unlink(*keys[i : i + 500])
    finally:
        client.close()


def _drop_sql_tables(url: str) -> None:
    """Drop the tables of an SQL test store (its table prefix is unique to the test)."""

    async def drop() -> None:
        store = statekeeper.open_store(url)
        await store.drop_tables()  # type: ignore[attr-defined]

    asyncio.run(drop())


def make_backend(kind: str, root: Path, **query: str) -> Backend:
    """A fresh, isolated store of ``kind`` (skips if the backend or server is missing)."""
    backend_available(kind)
    if kind == "snap":
        # registered only by the tests that use it, so other suites never see the scheme
        statekeeper.register_backend("snap", mutants.SnapshotStore)
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    if kind == "snap":
        root.mkdir(parents=True, exist_ok=True)
        return Backend(kind, f"snap://{root / 'snap'}" + (f"?{qs}" if qs else ""))
    if kind == "file":
        return Backend(kind, f"file://{root / 'store'}" + (f"?{qs}" if qs else ""))
    if kind == "sqlite":
        root.mkdir(parents=True, exist_ok=True)
        return Backend(kind, f"sqlite:///{root / 'store.db'}" + (f"?{qs}" if qs else ""))
    if kind == "redis":
        base = service_url("redis")
        key_prefix = f"sk-rel-{secrets.token_hex(6)}"
        # the local and CI servers run without AOF: the kill loop kills the client,
        # never the server, so the opt-out does not weaken what is checked here
        url = _with_query(base, key_prefix=key_prefix, allow_unsafe_durability="true", **query)
        return Backend(kind, url, cleanup=lambda: _drop_redis_keys(base, key_prefix))
    service = {"postgres": "postgres", "mysql": "mysql"}[kind]
    base = service_url(service)
    prefix = _sql_prefix()
    url = f"{base}?table_prefix={prefix}" + (f"&{qs}" if qs else "")
    return Backend(kind, url, cleanup=lambda: _drop_sql_tables(url))


async def list_everything(store: BaseCheckpointStore) -> list[statekeeper.Checkpoint]:
    """Every checkpoint, page by page in ascending order; no page may skip a damaged
    or stray file (the store after a crash)."""
    listed: list[statekeeper.Checkpoint] = []
    cursor = None
    while True:
        page = await store.list(None, order="asc", limit=100, after=cursor)
        assert not page.skipped, f"damaged or stray files after the crash: {page.skipped}"
        listed += page.items
        cursor = page.next_cursor
        if cursor is None:
            return listed


async def reopen_file_store(
    root: Path, io: object | None, check: Callable[[FileCheckpointStore], Awaitable[None]]
) -> None:
    """Reopen the file store at ``root`` after a crash (over ``io``), ``check`` it,
    repair it, ``check`` it again, and verify it."""
    async with FileCheckpointStore(root, io=io) as store:  # type: ignore[arg-type]
        await check(store)
        await store.repair()
        await check(store)
        report = await store.verify()
        assert report.ok, report.problems
