"""Shared test configuration."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    # Options of tests/reliability must be known to a run rooted at tests/ too;
    # tests/reliability/conftest.py tolerates this registration.
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="reliability suite: every crash point and more rounds (minutes, not seconds)",
    )
