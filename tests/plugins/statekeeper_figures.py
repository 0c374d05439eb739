"""The reliability suite's figures in the run's report, also when pytest-xdist runs it.

The reliability tests count what they did (kills survived, crash points, faults
injected, inputs tried) into ``reliability_support.FIGURES``. At the end of the
run this plugin prints the sums in a section of their own and, when
``$STATEKEEPER_RELIABILITY_FIGURES`` names a file, writes them there as JSON;
``docs/reliability.md`` quotes them.

Under pytest-xdist (``nox -s reliability`` runs on several workers) the tests, and
so the counts, are in the workers, and the conftest of ``tests/reliability`` is
never loaded by the controller. Hence a plugin that ``tests/conftest.py`` loads for
every run: each worker hands its counts over with its output, and the controller
adds them to its own before reporting.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

__all__ = ["FIGURES_ENV"]

FIGURES_ENV = "STATEKEEPER_RELIABILITY_FIGURES"
_SUPPORT = "reliability_support"  # the module that owns FIGURES (tests/reliability)
_WORKER_KEY = "statekeeper_reliability_figures"


def _figures(*, load: bool = False) -> Counter[str] | None:
    """``reliability_support.FIGURES``; ``None`` if no reliability test imported it."""
    module = sys.modules.get(_SUPPORT)
    if module is None and load:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "reliability"))
        import reliability_support as module
    return None if module is None else module.FIGURES


def pytest_sessionfinish(session: pytest.Session) -> None:
    # on an xdist worker: the counts travel to the controller with the worker's output
    workeroutput = getattr(session.config, "workeroutput", None)
    figures = _figures()
    if workeroutput is not None and figures:
        workeroutput[_WORKER_KEY] = dict(figures)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    # on the xdist controller, as each worker finishes
    counts = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    if counts:
        figures = _figures(load=True)
        assert figures is not None
        figures.update(counts)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    figures = _figures()
    if not figures or hasattr(config, "workerinput"):
        return
    terminalreporter.section("statekeeper reliability figures")
    for key in sorted(figures):
        terminalreporter.write_line(f"{key}: {figures[key]}")
    out = os.environ.get(FIGURES_ENV)
    if out:
        Path(out).write_text(json.dumps(dict(sorted(figures.items())), indent=2) + "\n")
