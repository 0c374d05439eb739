"""Item 2: a writer loop killed with SIGKILL at seeded random moments, over many rounds.

After every kill the store is reopened as a restarted application would, and the
invariants D, A, R, L and S are checked against the writer's fsynced write log.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from harness import kill_loop
from reliability_support import FIGURES, Backend

from statekeeper.testing.invariants import InvariantViolation

pytestmark = pytest.mark.reliability

SEED = 20240611


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres", "mysql", "redis", "snap"])
def test_random_kill_loop_keeps_invariants(
    kind: str, backend_factory: Callable[..., Backend], tmp_path: Path, long_run: bool
) -> None:
    backend = backend_factory(kind)
    # the honest snapshot backend is only the control for its max+1 mutant below
    rounds = 40 if long_run else (3 if kind == "snap" else 6)
    result = kill_loop(backend, tmp_path, rounds=rounds, seed=SEED)
    FIGURES[f"kill loop: SIGKILLs survived ({kind})"] += result.kills
    FIGURES["kill loop: SIGKILLs survived (all backends)"] += result.kills
    FIGURES["kill loop: acknowledged writes verified"] += result.acked
    FIGURES["kill loop: operations in doubt at a kill"] += result.in_doubt
    assert result.kills >= rounds - 1, "the writer finished instead of being killed"
    assert result.acked > 0


def test_kill_loop_catches_max_plus_one_mutant(
    backend_factory: Callable[..., Backend], tmp_path: Path
) -> None:
    """The kill loop fails on a backend that reuses sequences (next = max(existing)+1)."""
    backend = backend_factory("snap", bug="max_plus_one")
    with pytest.raises(InvariantViolation) as info:
        kill_loop(backend, tmp_path, rounds=12, seed=SEED)
    assert "S" in info.value.report.codes()
    FIGURES["mutants caught"] += 1


def test_kill_loop_catches_sql_max_plus_one_mutant(
    backend_factory: Callable[..., Backend], tmp_path: Path
) -> None:
    """The same on the real SQL backend (SQLite), its counter replaced by max(seq)+1."""
    backend = backend_factory("sqlite")
    with pytest.raises(InvariantViolation) as info:
        kill_loop(backend, tmp_path, rounds=12, seed=SEED, setup=["mutants:sql_max_plus_one"])
    assert "S" in info.value.report.codes()
    FIGURES["mutants caught"] += 1
