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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import statekeeper
from statekeeper._protocol import BaseCheckpointStore
from statekeeper.testing.services import service_url

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
}


def backend_available(kind: str) -> None:
    """Skip (with the reason) if the backend for ``kind`` is not importable yet."""
    try:
        importlib.import_module(_MODULES[kind])
    except ImportError as exc:
        pytest.skip(f"the {kind} backend is not importable: {exc}")


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
    service = {"postgres": "postgres", "mysql": "mysql"}[kind]
    base = service_url(service)
    prefix = _sql_prefix()
    url = f"{base}?table_prefix={prefix}" + (f"&{qs}" if qs else "")
    return Backend(kind, url, cleanup=lambda: _drop_sql_tables(url))
