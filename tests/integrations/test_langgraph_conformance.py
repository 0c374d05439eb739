"""LangGraph's published conformance suite (langgraph-checkpoint-conformance) against
``StatekeeperSaver``, every capability, base and optional, on every backend.

The package drives itself: ``validate(registered)`` runs each capability's spec
against a fresh saver from our factory and returns a report, which must pass in
full ("FULL": every detected capability) with all eight capabilities detected.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

import statekeeper
from statekeeper.integrations.langgraph import StatekeeperSaver

pytestmark = pytest.mark.asyncio


async def test_conformance_suite_passes_in_full(backend: str, store_url: Callable[[], str]) -> None:
    async def factory() -> AsyncIterator[StatekeeperSaver]:
        async with statekeeper.open_store(store_url(), codec="raw") as store:
            yield StatekeeperSaver(store)

    registered = checkpointer_test(name=f"StatekeeperSaver[{backend}]")(factory)
    report = await validate(registered)
    failures = {name: result.failures for name, result in report.results.items() if result.failures}
    undetected = sorted(c.value for c in ALL_CAPABILITIES if not report.results[c.value].detected)
    passed = sum(r.tests_passed for r in report.results.values())
    print(f"{backend}: {passed} conformance tests passed, level {report.conformance_level()}")
    assert not undetected, f"capabilities not implemented: {undetected}"
    assert not failures, failures
    assert report.conformance_level() == "FULL"
    assert passed >= 80
