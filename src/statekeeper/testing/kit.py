"""The conformance kit: :class:`CheckpointStoreTests`.

Usage, capability skips and the backdoor are described in :mod:`statekeeper.testing`.
The tests are grouped by contract clause in private modules; this class is the one
public entry point and the only one a backend's tests subclass.
"""

from __future__ import annotations

from ._deps import missing_dependency

try:
    # All three are checked here, before the kit modules need them, so that a
    # missing one is reported with the install hint.
    import hypothesis  # noqa: F401
    import pytest
    import pytest_asyncio  # noqa: F401
except ModuleNotFoundError as exc:
    raise missing_dependency(exc) from exc

from ._base import StoreFactory
from ._batch_tests import BatchTests
from ._core_tests import CoreTests
from ._filter_tests import FilterTests
from ._list_tests import ListTests
from ._read_tests import ReadTests
from .stateful import StatefulTests

__all__ = ["CheckpointStoreTests", "StoreFactory"]


class CheckpointStoreTests(CoreTests, ReadTests, ListTests, BatchTests, FilterTests, StatefulTests):
    """The statekeeper contract (SPEC S1-S8, S11 as far as the codec goes, S13 and
    S14) as tests.

    Subclass it in a test module (name the subclass ``Test...Conformance``) and
    provide the one fixture the kit needs::

        class TestMyStoreConformance(CheckpointStoreTests):
            @pytest.fixture
            def store_factory(self, tmp_path):
                return lambda **options: MyCheckpointStore(tmp_path / "store", **options)

    ``store_factory`` must be a plain (synchronous) fixture returning a function
    ``(**options) -> store``: a *new, unopened* store over the *same* underlying data
    on every call, with fresh data for each test. The kit passes ``clock=`` (a
    callable returning an aware UTC ``datetime``), ``allowed_types=``, ``codec=``,
    ``max_bytes=`` and ``read_only=`` through it, and the concurrency tests hold two
    stores from it open at once.

    What the kit provides to the tests, and to a subclass's own extra tests:

    - ``store``: an async fixture, the factory's store, opened, closed at teardown;
    - ``await self.reopen(store, **options)``: close ``store`` and open a new one
      from the factory over the same data (a restart); closed at teardown;
    - ``await self.open_store(**options)``: open one more store from the factory.

    Tests that need an undeclared capability skip with a reason: ``ttl`` for the
    TTL tests, ``raw_access`` (the backdoor) for the corruption tests,
    ``atomic_batches`` for the tests that ``save_many`` is all or nothing and never
    seen half done or interleaved with concurrent saves. The ``codec="raw"`` tests
    reopen the store through the factory with ``codec="raw"``.

    Size knobs (class attributes): ``state_machine_examples`` (25),
    ``state_machine_steps`` (30) and ``examples_scale`` (1.0, multiplied by
    ``--statekeeper-examples-scale``). Every test carries the ``conformance`` marker.
    """

    pytestmark = [pytest.mark.conformance]
