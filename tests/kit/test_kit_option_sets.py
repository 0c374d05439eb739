"""The kit runs under a backend's option sets (``option_sets``), and is one class
wide, not deep: ``CheckpointStoreTests`` inherits its test groups, each on ``KitBase``
alone, and refuses a name two of them define."""

from __future__ import annotations

import textwrap

import pytest

from statekeeper.testing import CheckpointStoreTests
from statekeeper.testing._base import KitBase
from statekeeper.testing.kit import GROUPS, check_groups

#: A backend with two paths to its latest checkpoint, chosen by an option, and a
#: factory that records the options of every store it builds.
PATHS = """
import pytest
from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.config import StoreOptions
from statekeeper._core.primitives import StorePrimitives
from statekeeper.testing import CheckpointStoreTests

class PathOptions(StoreOptions):
    scan_latest: bool = False


class PathStore(MemoryCheckpointStore):
    Options = PathOptions

    async def _latest(self, stream, now):
        if getattr(self.options, "scan_latest"):  # the default primitive: a scan
            return await StorePrimitives._latest(self, stream, now)
        return await super()._latest(stream, now)


class Paths(CheckpointStoreTests):
    state_machine_examples = 3

    @pytest.fixture
    def store_factory(self):
        storage = MemoryStorage()

        def make(**options):
            store = PathStore(storage=storage, **options)
            make.built.append(store)
            return store

        make.built = []
        return make

    @pytest.mark.asyncio(loop_scope="function")
    async def test_the_set_reaches_every_store(self, store, kit_options, store_factory):
        raw = await self.reopen(store, codec="raw")
        assert store_factory.built == [store, raw]
        for built in store_factory.built:
            assert built.options.scan_latest is kit_options.get("scan_latest", False)
        assert raw.options.codec == "raw"


class TestTwoPaths(Paths):
    option_sets = {"index": {"scan_latest": False}, "scan": {"scan_latest": True}}


class TestNoSets(Paths):
    pass


class TestKitOptionsWin(Paths):
    option_sets = {"json": {"codec": "json", "scan_latest": True}}
"""

SELECTED = (
    "test_the_set_reaches_every_store or test_high_water_mark_survives_reopen "
    "or test_raw_codec_stores_bytes_verbatim or test_state_machine_matches_reference_model"
)


def test_each_test_runs_once_per_option_set_with_the_set_in_its_id(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(test_paths=PATHS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-v", "-k", SELECTED)
    result.assert_outcomes(passed=16)
    out = result.stdout.str()
    for name in (
        "test_high_water_mark_survives_reopen",
        "test_state_machine_matches_reference_model",
        "test_the_set_reaches_every_store",
    ):
        assert f"TestTwoPaths::{name}[index] PASSED" in out
        assert f"TestTwoPaths::{name}[scan] PASSED" in out
        assert f"TestNoSets::{name} PASSED" in out
    # the kit reopens with codec="raw": its own option wins over the set's codec
    assert "TestKitOptionsWin::test_raw_codec_stores_bytes_verbatim[json] PASSED" in out


def test_a_backend_test_class_inherits_the_groups_through_three_kit_classes() -> None:
    class TestSomeConformance(CheckpointStoreTests):
        pass

    own = [c for c in TestSomeConformance.__mro__[1:] if c.__module__.startswith("statekeeper")]
    assert own == [CheckpointStoreTests, *GROUPS, KitBase]
    assert CheckpointStoreTests.__bases__ == GROUPS
    for group in GROUPS:
        assert group.__bases__ == (KitBase,)
        for name in vars(group):
            if name.startswith("test_"):
                assert getattr(TestSomeConformance, name) is vars(group)[name], name


def test_a_name_two_groups_define_is_refused() -> None:
    class One(KitBase):
        def test_same(self) -> None: ...

    class Two(KitBase):
        def test_same(self) -> None: ...

    with pytest.raises(TypeError, match="'test_same' is defined by both One and Two"):
        check_groups((One, Two))
    with pytest.raises(TypeError, match="'store' is defined by both KitBase and Three"):
        check_groups((type("Three", (KitBase,), {"store": None}),))
    with pytest.raises(TypeError, match="Four must subclass KitBase alone"):
        check_groups((type("Four", (One,), {}),))


def test_the_documented_example_names_a_real_knob() -> None:
    doc = textwrap.dedent(CheckpointStoreTests.__doc__ or "")
    assert "option_sets = {" in doc
    assert KitBase.option_sets == {}
