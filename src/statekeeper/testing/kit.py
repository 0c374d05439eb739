"""The conformance kit: :class:`CheckpointStoreTests`.

Usage, capability skips and the backdoor are described in :mod:`statekeeper.testing`.
The tests are grouped by contract clause in private modules, one class each
(``CoreTests``, ``WriteTests``, ``ReadTests``, ``ListTests``, ``BatchTests``,
``FilterTests``, ``CodecTests``, ``EncryptionTests``, ``RetentionTests``,
``StatefulTests``), all on
:class:`~statekeeper.testing._base.KitBase`, which holds the fixtures, helpers and
knobs. :class:`CheckpointStoreTests` is the one public entry point and the only
class a backend's tests subclass.

The groups are inherited: :class:`CheckpointStoreTests` subclasses each of them,
and each subclasses :class:`~statekeeper.testing._base.KitBase` alone. That is a
wide class, not a tower: no group builds on another or keeps state (the fixtures and
helpers are ``KitBase``'s), a backend's test class inherits through three of the
kit's classes whatever the number of groups, and ``super()`` works in the groups and
in a backend's override of one test, as in any Python class. Plain inheritance is
what pytest collects, what type checkers and IDEs read, and what the suites this
kit follows do: fsspec's ``Abstract*Tests`` and SQLAlchemy's dialect suite are
inherited, zarr's ``StoreTests`` subclassed. A name
that two groups, or a group and ``KitBase``, define would be settled silently by
the method resolution order, so :func:`check_groups` refuses it at import.
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

from ._base import KitBase, StoreFactory
from ._batch_tests import BatchTests
from ._codec_tests import CodecTests
from ._core_tests import CoreTests
from ._encryption_tests import EncryptionTests
from ._filter_tests import FilterTests
from ._list_tests import ListTests
from ._read_tests import ReadTests
from ._retention_tests import RetentionTests
from ._stateful_tests import StatefulTests
from ._write_tests import WriteTests

__all__ = ["CheckpointStoreTests", "StoreFactory"]


class CheckpointStoreTests(
    CoreTests,
    WriteTests,
    ReadTests,
    ListTests,
    BatchTests,
    FilterTests,
    CodecTests,
    EncryptionTests,
    RetentionTests,
    StatefulTests,
):
    """The statekeeper contract (SPEC S1-S8, S11 as far as the codec goes, S13,
    S14 and S17) as tests.

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

    To run the whole kit (the state machine too) over each of a backend's paths,
    name option sets in ``option_sets``; each test then runs once per set, the set
    passed to ``store_factory`` on every call and its name in the test id::

        class TestMyStoreConformance(CheckpointStoreTests):
            option_sets = {"inline": {"inline_reads": True}, "worker": {"inline_reads": False}}

    To run it encrypted (SPEC S16), name a set from
    :func:`~statekeeper.testing.encrypted_options` (a fresh test keyring); the
    ``test_encrypted_*`` tests run there and skip in plaintext sets::

        class TestMyStoreConformance(CheckpointStoreTests):
            option_sets = {"plain": {}, "encrypted": encrypted_options()}
    """

    pytestmark = [pytest.mark.conformance]


#: The kit's test groups: the bases of :class:`CheckpointStoreTests`.
GROUPS: tuple[type[KitBase], ...] = CheckpointStoreTests.__bases__


def check_groups(groups: tuple[type[KitBase], ...]) -> None:
    """Refuse test groups that would not combine by plain inheritance: each must
    subclass :class:`KitBase` alone, and no name may be defined by two groups or by
    a group and ``KitBase`` (the method resolution order would pick one silently)."""
    owner: dict[str, str] = {}
    for group in groups:
        if group.__bases__ != (KitBase,):
            raise TypeError(f"{group.__name__} must subclass KitBase alone")
        for name in vars(group):
            if name.startswith("__"):
                continue
            clash = owner.get(name) or ("KitBase" if name in vars(KitBase) else None)
            if clash is not None:
                raise TypeError(f"{name!r} is defined by both {clash} and {group.__name__}")
            owner[name] = group.__name__


check_groups(GROUPS)
