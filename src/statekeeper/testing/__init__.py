"""The statekeeper conformance kit: prove that a backend keeps the contract.

Every backend, built-in or third-party, runs the same kit with a three-line
subclass of :class:`CheckpointStoreTests` that provides one fixture,
``store_factory``::

    import pytest
    from statekeeper.testing import CheckpointStoreTests

    class TestMyStoreConformance(CheckpointStoreTests):
        @pytest.fixture
        def store_factory(self, tmp_path):
            return lambda **options: MyCheckpointStore(tmp_path / "store", **options)

``store_factory`` returns a function ``(**options) -> store`` that builds a *new,
unopened* store over the *same* data on every call (same directory, database,
table or key prefix), with fresh data for every test. The kit opens and closes
stores itself, simulates a restart by calling the factory again, and passes
options such as ``clock=`` and ``allowed_types=`` through it.

A backend with more than one path to the same answers (reads inline or on a
worker thread, say) runs the whole kit, the state machine included, over each:
``option_sets`` names sets of options, and every kit test runs once per set, the
set passed to ``store_factory`` on every call (under the options the kit passes
itself) and its name in the test id::

    class TestMyStoreConformance(CheckpointStoreTests):
        option_sets = {"inline": {"inline_reads": True}, "worker": {"inline_reads": False}}

        @pytest.fixture
        def store_factory(self, tmp_path):
            return lambda **options: MyCheckpointStore(tmp_path / "store", **options)

The kit reads the backend's declared :class:`~statekeeper.Capabilities` and skips,
with a reason, what is not declared: the TTL tests need ``ttl``, the tests that
``save_many`` is all or nothing and never seen half done or interleaved need
``atomic_batches``, and the tests that corrupt or plant records need
``raw_access`` (the *backdoor*: implement
:meth:`~statekeeper.BaseCheckpointStore.backdoor_read_raw` and
:meth:`~statekeeper.BaseCheckpointStore.backdoor_write_raw` to read and overwrite a
record's stored envelope bytes without going through the store's own methods).

Besides the named tests, the kit runs a Hypothesis state machine
(:class:`~statekeeper.testing.stateful.CheckpointStoreStateMachine`) that drives the
backend in lockstep with a reference model. Its size is set per backend with the
class attributes ``state_machine_examples``, ``state_machine_steps`` and
``examples_scale``, and per run with ``pytest --statekeeper-examples-scale=N``
(the option comes from this package's pytest plugin, which also registers the
``conformance`` marker that every kit test carries).

Encryption at rest (SPEC S16) is in the core, so every backend has it; run the kit
encrypted too with an option set from :func:`encrypted_options`, which holds a
fresh test keyring::

    from statekeeper.testing import CheckpointStoreTests, encrypted_options

    class TestMyStoreConformance(CheckpointStoreTests):
        option_sets = {"plain": {}, "encrypted": encrypted_options()}

Under it every kit test runs encrypted, and the encryption tests
(``test_encrypted_*``, skipped in plaintext sets) check that nothing is plaintext at
rest and that a tampered, moved, planted or unknown-key record is refused
(``raw_access`` for those that touch stored bytes). ``encrypted_options(metadata=True)``
seals tags and metadata too; the kit's filter tests then check that tag and
metadata filters raise ``InvalidQuery`` and skip the rest.

:func:`service_url` gives tests the URL of a real database server, or skips.

The kit needs pytest, pytest-asyncio and Hypothesis (the ``testing`` extra) and
says so when one is missing. The reliability checkers (``workloads``,
``invariants``, ``history``, ``recording``) need none of them: importing them, as
every workload child process does, never imports pytest.

The modules: ``kit`` (:class:`CheckpointStoreTests`, the test groups joined) over
``_base`` (fixtures, helpers, the kit's test types, :class:`FakeClock`) and the
groups, one per part of the contract: ``_core_tests`` (S1, S2), ``_read_tests``
(S3, S5, S11), ``_list_tests`` (S4), ``_write_tests`` (S6, S7, prune, lifecycle),
``_batch_tests`` (headers, S13), ``_filter_tests`` (S14), ``_codec_tests``
(prefixes, ``codec="raw"``), ``_encryption_tests`` (S16), ``_retention_tests``
(S17) and ``_stateful_tests`` (the state machine's test); ``stateful`` (the state
machine) over ``_model`` (its reference model); ``_pages`` (the bound on every walk
through pages); ``strategies`` (Hypothesis strategies); ``services`` (real-service
URLs); ``encryption`` (the kit's test keyrings, :func:`encrypted_options`);
``_deps`` (the kit's third-party imports and what to say when one is missing);
``plugin`` (the pytest plugin); and the reliability checkers above.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ._deps import missing_dependency

# The kit's assertions are its findings, so pytest must rewrite them to show the
# values; this has to happen before the kit modules are first imported. Only a
# process already running pytest needs it: a workload child process does not pay
# for importing pytest.
if "pytest" in sys.modules:
    sys.modules["pytest"].register_assert_rewrite(
        "statekeeper.testing.kit",
        "statekeeper.testing.stateful",
        "statekeeper.testing._base",
        "statekeeper.testing._core_tests",
        "statekeeper.testing._read_tests",
        "statekeeper.testing._list_tests",
        "statekeeper.testing._batch_tests",
        "statekeeper.testing._filter_tests",
        "statekeeper.testing._write_tests",
        "statekeeper.testing._codec_tests",
        "statekeeper.testing._encryption_tests",
        "statekeeper.testing._retention_tests",
        "statekeeper.testing._stateful_tests",
        "statekeeper.testing._model",
    )

if TYPE_CHECKING:
    from ._base import FakeClock, KitColor, KitModel, KitRecord, StoreFactory, assert_same_value
    from .encryption import encrypted_options, kit_keyring, rotated_keyring
    from .history import HistoryReport, HistoryViolation, analyze_history, check_history
    from .invariants import InvariantViolation, Report, Violation, check_invariants, list_all
    from .kit import CheckpointStoreTests
    from .recording import (
        Event,
        History,
        HistoryRecorder,
        LoggedOp,
        LoggedStore,
        LogWriter,
        RecordingStore,
        WriteLog,
    )
    from .services import service_url
    from .stateful import CheckpointStoreStateMachine, build_state_machine
    from .workloads import fork_workload, writer_loop

__all__ = [
    "CheckpointStoreStateMachine",
    "CheckpointStoreTests",
    "Event",
    "FakeClock",
    "History",
    "HistoryRecorder",
    "HistoryReport",
    "HistoryViolation",
    "InvariantViolation",
    "KitColor",
    "KitModel",
    "KitRecord",
    "LogWriter",
    "LoggedOp",
    "LoggedStore",
    "RecordingStore",
    "Report",
    "StoreFactory",
    "Violation",
    "WriteLog",
    "analyze_history",
    "assert_same_value",
    "build_state_machine",
    "check_history",
    "check_invariants",
    "encrypted_options",
    "fork_workload",
    "kit_keyring",
    "list_all",
    "rotated_keyring",
    "service_url",
    "writer_loop",
]

# Imported lazily so that the pytest plugin (a submodule of this package, loaded in
# every pytest run) does not import the kit, Hypothesis and the store core, and a
# workload child process imports neither the kit nor pytest.
_LAZY = {
    "service_url": "services",
    "encrypted_options": "encryption",
    "kit_keyring": "encryption",
    "rotated_keyring": "encryption",
    "CheckpointStoreTests": "kit",
    "CheckpointStoreStateMachine": "stateful",
    "build_state_machine": "stateful",
    "FakeClock": "_base",
    "KitColor": "_base",
    "KitModel": "_base",
    "KitRecord": "_base",
    "StoreFactory": "_base",
    "assert_same_value": "_base",
    "check_invariants": "invariants",
    "InvariantViolation": "invariants",
    "Report": "invariants",
    "Violation": "invariants",
    "list_all": "invariants",
    "WriteLog": "recording",
    "LogWriter": "recording",
    "LoggedStore": "recording",
    "LoggedOp": "recording",
    "History": "recording",
    "Event": "recording",
    "HistoryRecorder": "recording",
    "RecordingStore": "recording",
    "check_history": "history",
    "analyze_history": "history",
    "HistoryReport": "history",
    "HistoryViolation": "history",
    "fork_workload": "workloads",
    "writer_loop": "workloads",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    try:
        imported = import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as exc:
        raise missing_dependency(exc) from exc
    value = getattr(imported, name)
    globals()[name] = value
    return value
