"""The conformance kit against the file backend (a fresh directory per test), with
inline reads on and off: each read's one function runs on the event loop's thread
first (``inline_reads=True``, the default) or only in the worker (``False``), and
the contract holds either way. The fast class runs it plaintext and encrypted (S16):
sealing sits above the backend, so the fsyncing class runs plaintext only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.testing import CheckpointStoreTests, encrypted_options


@pytest.fixture(params=[True, False], ids=["inline", "worker"])
def inline_reads(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


class TestFileConformance(CheckpointStoreTests):
    # Every step fsyncs; the fast class below runs the state machine at full size.
    state_machine_examples = 8

    @pytest.fixture
    def store_factory(
        self, tmp_path: Path, inline_reads: bool
    ) -> Callable[..., FileCheckpointStore]:
        def make(**options: Any) -> FileCheckpointStore:
            options.setdefault("inline_reads", inline_reads)
            return FileCheckpointStore(tmp_path / "store", **options)

        return make


class TestFileConformanceFast(CheckpointStoreTests):
    """The same contract with ``durability="fast"`` (no fsyncs), plaintext and
    encrypted."""

    option_sets = {"plain": {}, "encrypted": encrypted_options()}

    @pytest.fixture
    def store_factory(
        self, tmp_path: Path, inline_reads: bool
    ) -> Callable[..., FileCheckpointStore]:
        def make(**options: Any) -> FileCheckpointStore:
            options.setdefault("durability", "fast")
            options.setdefault("inline_reads", inline_reads)
            return FileCheckpointStore(tmp_path / "store", **options)

        return make
