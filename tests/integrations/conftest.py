"""Backends for the integration tests: one ``open_store`` URL maker per backend.

Every backend the issue names: memory, file, SQLite, PostgreSQL, MariaDB and Redis.
Server backends read their URL from ``STATEKEEPER_TEST_POSTGRES_URL``,
``STATEKEEPER_TEST_MYSQL_URL`` and ``STATEKEEPER_TEST_REDIS_URL`` and skip (with
the reason) when it is unset; each test gets its own table or key prefix, which
is dropped afterwards, so runs sharing a server never see each other's data.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statekeeper.testing import service_url

BACKENDS = ["memory", "file", "sqlite", "postgres", "mysql", "redis"]

#: ``() -> url``: a new store location each call (all under this test's prefix).
UrlMaker = Callable[[], str]


def _drop_sql(url: str, prefixes: list[str]) -> None:
    from sql_helpers import drop_store

    for prefix in prefixes:
        drop_store(url, prefix)


def _drop_redis(url: str, prefixes: list[str]) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        for prefix in prefixes:
            keys = list(client.scan_iter(match="{" + prefix + "}:*", count=1000))
            for i in range(0, len(keys), 500):
                client.unlink(*keys[i : i + 500])
    finally:
        client.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path) -> Iterator[UrlMaker]:
    """Makes URLs of fresh, empty stores of ``backend`` (opened with ``codec="raw"``)."""
    made: list[str] = []
    counter = iter(range(1_000_000))
    if backend == "memory":
        yield lambda: "memory://"
    elif backend == "file":
        yield lambda: f"file://{tmp_path}/file-store-{next(counter)}"
    elif backend == "sqlite":
        yield lambda: f"sqlite:///{tmp_path}/store-{next(counter)}.db"
    elif backend in ("postgres", "mysql"):
        server = service_url(backend)

        def sql() -> str:
            prefix = f"lg{secrets.token_hex(4)}_"
            made.append(prefix)
            return f"{server}?table_prefix={prefix}"

        yield sql
        _drop_sql(server, made)
    else:
        server = service_url("redis")

        def redis_url() -> str:
            prefix = f"sk-lg-{secrets.token_hex(6)}"
            made.append(prefix)
            return f"{server}?key_prefix={prefix}&allow_unsafe_durability=true"

        yield redis_url
        _drop_redis(server, made)
