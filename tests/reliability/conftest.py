"""Hooks and fixtures of the reliability suite (the machinery is in ``reliability_support``).

Every test here is marked ``reliability`` (``nox -s reliability`` runs them;
``nox -s tests`` leaves them out). ``--long`` makes the runs deeper: more kill
rounds, every crash point instead of a sample, longer histories, more examples.

The figures (kills survived, crash points, faults injected, inputs tried,
violations found) are summed over the session and printed at the end, and written
as JSON to ``$STATEKEEPER_RELIABILITY_FIGURES`` when that is set;
``docs/reliability.md`` quotes them. ``tests/plugins/statekeeper_figures.py`` does
that, on the controller when pytest-xdist runs the suite on several workers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from reliability_support import Backend, make_backend

from statekeeper import _registry


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


@pytest.fixture(scope="session")
def long_run(pytestconfig: pytest.Config) -> bool:
    env = os.environ.get("STATEKEEPER_RELIABILITY_LONG", "") not in ("", "0")
    return env or bool(pytestconfig.getoption("--long", default=False))


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
    _registry._registered.pop("snap", None)
