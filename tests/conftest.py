"""Shared test configuration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "plugins"))

# statekeeper_progress: skips counted by reason, a heartbeat while a test runs long;
# statekeeper_figures: the reliability suite's figures, summed over xdist workers
# (their docstrings say more); pytester: tests/test_run_report.py runs pytest on small
# suites to check that report
pytest_plugins = ["statekeeper_progress", "statekeeper_figures", "pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    # Options of tests/reliability must be known to a run rooted at tests/ too;
    # tests/reliability/conftest.py tolerates this registration.
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="reliability suite: every crash point and more rounds (minutes, not seconds)",
    )
