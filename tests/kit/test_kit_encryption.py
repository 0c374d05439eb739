"""The kit's encryption support: ``encrypted_options`` and the ``test_encrypted_*``
tests, which run in an encrypted option set, skip in a plaintext one, and fail on
backends that let plaintext or tampered records through.

A backend never sees plaintext (the core seals records before its primitives), so
the realistic bugs are fast paths in a backend's public methods that go around the
sealed primitives; the mutants below are the in-memory backend with one each.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.errors import RecordUndecryptable
from statekeeper.models import Checkpoint
from statekeeper.testing import encrypted_options, kit_keyring, rotated_keyring

# -- the mutants -----------------------------------------------------------------------


class Faithful(MemoryCheckpointStore):
    """No bug: the control."""


class SaveSkipsTheEnvelope(Faithful):
    """A "fast" save path that writes through the backend's own primitives, past the
    sealed ones: the state lands in plaintext."""

    async def save(self, stream: str, state: Any, **kwargs: Any) -> Checkpoint:
        sealed, self._sealed = self._sealed, None
        try:
            return await super().save(stream, state, **kwargs)
        finally:
            self._sealed = sealed


class LatestFromWriteCache(Faithful):
    """A write-through cache of each stream's newest checkpoint answers get_latest,
    so a record altered at rest is never authenticated on that path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.latest_cache: dict[str, Checkpoint] = {}

    async def save(self, stream: str, state: Any, **kwargs: Any) -> Checkpoint:
        cp = await super().save(stream, state, **kwargs)
        self.latest_cache[stream] = cp
        return cp

    async def get_latest(self, stream: str) -> Checkpoint | None:
        return self.latest_cache.get(stream) or await super().get_latest(stream)


class LatestFallsBackOnDecryptError(Faithful):
    """get_latest treats a record that does not decrypt as missing and returns the
    newest one that does (the downgrade the issue forbids)."""

    async def get_latest(self, stream: str) -> Checkpoint | None:
        try:
            return await super().get_latest(stream)
        except RecordUndecryptable:
            page = await self.list(stream, limit=1000)
            return page.items[0] if page.items else None


# -- the harness -----------------------------------------------------------------------

TEST_MODULE = """
import pytest
from statekeeper.backends.memory import MemoryStorage
from statekeeper.testing import CheckpointStoreTests, encrypted_options


class TestMutantConformance(CheckpointStoreTests):
    option_sets = {OPTION_SETS}

    @pytest.fixture
    def store_factory(self, backend_class):
        storage = MemoryStorage()
        return lambda **options: backend_class(storage=storage, **options)
"""

INI = """
[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""

ENCRYPTED = '{"encrypted": encrypted_options(), "sealed": encrypted_options(metadata=True)}'
PLAIN = '{"plain": {}}'


class _Harness:
    """A pytest plugin for the nested session: provides the backend, records outcomes."""

    def __init__(self, backend: type[MemoryCheckpointStore]) -> None:
        self.backend = backend
        self.outcomes: dict[str, str] = {}
        self.skips: list[str] = []

    @pytest.fixture
    def backend_class(self) -> type[MemoryCheckpointStore]:
        return self.backend

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = report.nodeid.split("::")[-1]
        counts = report.when == "call" or report.outcome != "passed"
        if counts and self.outcomes.get(name) != "failed":
            self.outcomes[name] = report.outcome
        if report.skipped and isinstance(report.longrepr, tuple):
            self.skips.append(str(report.longrepr[2]))


def run_kit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: type[Any],
    selection: str,
    option_sets: str = ENCRYPTED,
) -> _Harness:
    module = tmp_path / f"test_{re.sub(r'[^A-Za-z0-9_]', '_', tmp_path.name)}.py"
    module.write_text(textwrap.dedent(TEST_MODULE).replace("{OPTION_SETS}", option_sets))
    ini = tmp_path / "pytest.ini"
    ini.write_text(INI)
    monkeypatch.chdir(tmp_path)
    harness = _Harness(backend)
    args = [
        str(module),
        "-c",
        str(ini),
        "--rootdir",
        str(tmp_path),
        "--import-mode=importlib",
        "-p",
        "no:cacheprovider",
        "-q",
        "-k",
        selection,
    ]
    pytest.main(args, plugins=[harness])
    return harness


MUTANTS: dict[type[Faithful], list[str]] = {
    SaveSkipsTheEnvelope: ["test_encrypted_records_keep_no_plaintext_at_rest"],
    LatestFromWriteCache: [
        "test_encrypted_tampered_ciphertext_is_refused_without_fallback",
        "test_encrypted_store_refuses_a_planted_plaintext_record",
    ],
    LatestFallsBackOnDecryptError: [
        "test_encrypted_tampered_ciphertext_is_refused_without_fallback",
        "test_encrypted_records_under_an_unknown_key_are_refused",
    ],
}


@pytest.mark.parametrize(
    ("backend", "names"), list(MUTANTS.items()), ids=lambda v: getattr(v, "__name__", "")
)
def test_encryption_tests_fail_on_broken_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: type[Faithful], names: list[str]
) -> None:
    outcomes = run_kit(tmp_path, monkeypatch, backend, " or ".join(names)).outcomes
    for name in names:
        for option_set in ("encrypted", "sealed"):
            test = f"{name}[{option_set}]"
            assert test in outcomes, f"{test} did not run against {backend.__name__}"
            assert outcomes[test] == "failed", (
                f"the kit's {test} did not catch {backend.__name__}: {backend.__doc__}"
            )


def test_encryption_tests_pass_the_faithful_backend_in_both_encrypted_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes = run_kit(tmp_path, monkeypatch, Faithful, "test_encrypted_").outcomes
    assert len(outcomes) >= 16, sorted(outcomes)
    assert {name.split("[")[-1] for name in outcomes} == {"encrypted]", "sealed]"}
    assert set(outcomes.values()) == {"passed"}, outcomes


def test_encryption_tests_skip_with_a_reason_in_a_plaintext_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = run_kit(tmp_path, monkeypatch, Faithful, "test_encrypted_", option_sets=PLAIN)
    assert harness.outcomes, "no encryption test was collected"
    assert set(harness.outcomes.values()) == {"skipped"}, harness.outcomes
    assert harness.skips and all("encrypted_options()" in reason for reason in harness.skips)


def test_filter_tests_check_the_refusal_where_metadata_is_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under encrypt_metadata the filter tests skip only after checking that tag and
    metadata filters raise InvalidQuery; the update tests still run in full."""
    selection = "test_tag_filter_requires_every_given_tag or test_update_replaces_tags"
    harness = run_kit(tmp_path, monkeypatch, Faithful, selection)
    assert harness.outcomes == {
        "test_tag_filter_requires_every_given_tag[encrypted]": "passed",
        "test_tag_filter_requires_every_given_tag[sealed]": "skipped",
        "test_update_replaces_tags_metadata_and_parent[encrypted]": "passed",
        "test_update_replaces_tags_metadata_and_parent[sealed]": "passed",
    }
    assert any("refuses such filters with InvalidQuery (checked)" in s for s in harness.skips)


# -- the helpers ------------------------------------------------------------------------


def test_encrypted_options_hold_a_fresh_keyring_each_call() -> None:
    first, second = encrypted_options(), encrypted_options()
    assert set(first) == {"encryption"}
    assert first["encryption"] != second["encryption"], "two option sets share one key"
    assert first["encryption"].active == "kit-k1"
    sealed = encrypted_options(metadata=True)
    assert sealed["encrypt_metadata"] is True
    given = kit_keyring("mine")
    assert encrypted_options(keyring=given) == {"encryption": given}


@pytest.mark.asyncio
async def test_rotated_keyring_keeps_the_old_keys_readable() -> None:
    old = kit_keyring()
    new = rotated_keyring(old, "kit-k2")
    assert (new.active, new.key_ids) == ("kit-k2", ("kit-k1", "kit-k2"))
    with pytest.raises(ValueError, match="already in the keyring"):
        rotated_keyring(new, "kit-k1")
    storage = MemoryStorage()
    async with MemoryCheckpointStore(storage=storage, encryption=old) as store:
        cp = await store.save("job", {"n": 1})
    async with MemoryCheckpointStore(storage=storage, encryption=new) as store:
        assert (await store.load(cp.id)).state == {"n": 1}
    assert repr(kit_keyring()) == "Keyring(key_ids=['kit-k1'], active='kit-k1')"
