"""The SQL tests' shared fixtures: a table prefix per module on each server, and
``target``, one store URL per dialect (:mod:`sql_helpers` has the helpers).

The server fixtures use the real servers named by ``STATEKEEPER_TEST_POSTGRES_URL``
and ``STATEKEEPER_TEST_MYSQL_URL`` (skipped without them); each module's tables are
dropped at its end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sql_helpers import ServerStores, Target, sql_target


@pytest.fixture(scope="module")
def postgres_stores() -> Iterator[ServerStores]:
    stores = ServerStores("postgres")
    yield stores
    stores.drop()


@pytest.fixture(scope="module")
def mysql_stores() -> Iterator[ServerStores]:
    stores = ServerStores("mysql")
    yield stores
    stores.drop()


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    yield from sql_target(request, tmp_path)
