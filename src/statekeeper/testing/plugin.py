"""The ``statekeeper`` pytest plugin (entry point ``pytest11``), loaded automatically.

It registers the markers the conformance kit and the test suite use, and the
option ``--statekeeper-examples-scale=N`` that multiplies the number of examples
the kit's Hypothesis state machine runs (``nox -s conformance_long`` passes 10).

It imports nothing from the kit, so loading it costs nothing in test runs that
do not use the kit.
"""

from __future__ import annotations

import argparse

import pytest

__all__ = ["SCALE_OPTION", "examples_scale"]

#: The ``dest`` of ``--statekeeper-examples-scale``.
SCALE_OPTION = "statekeeper_examples_scale"

_MARKERS = (
    "conformance: a test of the statekeeper conformance kit (statekeeper.testing)",
    "reliability: crash, fault-injection, concurrency and hostile-input tests "
    "(slow; run with -m reliability)",
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("statekeeper", "statekeeper conformance kit")
    group.addoption(
        "--statekeeper-examples-scale",
        dest=SCALE_OPTION,
        type=_positive_int,
        default=1,
        metavar="N",
        help="multiply the examples of the conformance kit's state machine by N (default 1)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for line in _MARKERS:
        config.addinivalue_line("markers", line)


def examples_scale(config: pytest.Config) -> int:
    """The ``--statekeeper-examples-scale`` of this run (1 if the plugin is disabled)."""
    value = config.getoption(SCALE_OPTION, default=1)
    return value if isinstance(value, int) and value >= 1 else 1
