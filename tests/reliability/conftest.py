"""Shared machinery of the reliability suite: backends by URL, forked workloads, figures.

Every test here is marked ``reliability`` (``nox -s reliability`` runs them;
``nox -s tests`` leaves them out). ``--long`` makes the runs deeper: more kill
rounds, every crash point instead of a sample, longer histories, more examples.

The figures (kills survived, crash points, faults injected, inputs tried,
violations found) are summed over the session and printed at the end, and written
as JSON to ``$STATEKEEPER_RELIABILITY_FIGURES`` when that is set;
``docs/reliability.md`` quotes them.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import secrets
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
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

statekeeper.register_backend("snap", mutants.SnapshotStore)

#: ``--register`` arguments a workload child needs to open every URL below.
CHILD_REGISTER = ["--register", f"snap={mutants.SNAP_TARGET}"]

FIGURES: Counter[str] = Counter()

_MODULES = {
    "file": "statekeeper.backends.file",
    "sqlite": "statekeeper.backends.sql",
    "postgres": "statekeeper.backends.sql",
    "mysql": "statekeeper.backends.sql",
    "snap": "mutants",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    # pytest only asks initial conftests for options: this one is initial when the run
    # names tests/reliability; for `pytest tests --long` the option must also be added
    # by tests/conftest.py, hence the tolerance of a second registration
    with suppress(ValueError):
        parser.addoption(
            "--long",
            action="store_true",
            default=False,
            help="reliability suite: deeper runs (every crash point, more kills, longer "
            "histories); also STATEKEEPER_RELIABILITY_LONG=1",
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "reliability: crash, fault-injection, concurrency and hostile-input tests "
        "(slow; run with -m reliability)",
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("statekeeper reliability figures")
    for key in sorted(FIGURES):
        terminalreporter.write_line(f"{key}: {FIGURES[key]}")
    out = os.environ.get("STATEKEEPER_RELIABILITY_FIGURES")
    if out:
        Path(out).write_text(json.dumps(dict(sorted(FIGURES.items())), indent=2) + "\n")


@pytest.fixture(scope="session")
def long_run(pytestconfig: pytest.Config) -> bool:
    env = os.environ.get("STATEKEEPER_RELIABILITY_LONG", "") not in ("", "0")
    return env or bool(pytestconfig.getoption("--long", default=False))


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


@pytest.fixture
def backend_factory(tmp_path: Path) -> Iterator[Callable[..., Backend]]:
    made: list[Backend] = []
    counter = iter(range(10_000))

    def factory(kind: str, **query: str) -> Backend:
        backend = make_backend(kind, tmp_path / f"{kind}{next(counter)}", **query)
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend.close()
