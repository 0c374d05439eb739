"""Demo stream names sort in the order the runs started, also within one second.

Regression: the name was ``demo-<second>-<4 random hex>``, so two demo runs in the
same second listed in random order (``statekeeper streams`` sorts by name), and the
command line page's transcript test failed when a fast machine ran the page's two
demos within one second.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from statekeeper.cli import demo


class _Clock:
    """``datetime`` whose ``now`` gives the instants given, one per call."""

    def __init__(self, *instants: datetime) -> None:
        self.instants = list(instants)

    def now(self, tz: object = None) -> datetime:
        return self.instants.pop(0)


def test_names_within_one_second_sort_in_start_order(monkeypatch: pytest.MonkeyPatch) -> None:
    second = datetime(2026, 12, 2, 3, 37, 6, tzinfo=UTC)
    instants = [second.replace(microsecond=us) for us in (1_000, 250_000, 500_000, 999_000)]
    monkeypatch.setattr(demo, "datetime", _Clock(*instants))
    names = [demo.demo_stream_name() for _ in instants]
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"demo-20261202T033706-[0-9a-f]{4}", n) for n in names)


def test_names_are_distinct_within_the_same_instant(monkeypatch: pytest.MonkeyPatch) -> None:
    instant = datetime(2026, 12, 2, 3, 37, 6, 123_456, tzinfo=UTC)
    monkeypatch.setattr(demo, "datetime", _Clock(*[instant] * 64))
    names = {demo.demo_stream_name() for _ in range(64)}
    assert len(names) > 1  # the random byte separates runs started together
