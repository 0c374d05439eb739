"""Item 1: SIGKILL at every K-th file-changing system call of a short workload.

``strace -e inject=<syscall>:signal=KILL:when=K`` kills the workload as it enters
the K-th call of that system call (counted per thread, as strace does), for every
K it makes: the crash states between every pair of writes, fsyncs, renames and
unlinks. After each kill D, A, R, L and S are checked on the reopened store.

A normal run checks a seeded sample of the crash points (always the first and the
last call of each kind); ``--long`` checks every one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from harness import STRACE, crash_point_sweep
from reliability_support import FIGURES, Backend

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.skipif(STRACE is None, reason="strace is not installed (.ci/run installs it)"),
]

SEED = 7
BUDGET = 18  # crash points per backend in a normal run (--long: all of them)


@pytest.mark.parametrize("kind", ["file", "sqlite", "snap"])
def test_crash_points_keep_invariants(
    kind: str, backend_factory: Callable[..., Backend], tmp_path: Path, long_run: bool
) -> None:
    # the honest snapshot backend is only the control for its torn-write mutant below
    budget = None if long_run else (6 if kind == "snap" else BUDGET)
    figures = crash_point_sweep(lambda: backend_factory(kind), tmp_path, budget=budget, seed=SEED)
    FIGURES[f"crash points: killed and checked ({kind})"] += figures["kills"]
    FIGURES[f"crash points: file-changing calls in the workload ({kind})"] += figures["total"]
    FIGURES["crash points: SIGKILLs survived (all backends)"] += figures["kills"]
    assert figures["kills"] >= figures["points"] // 2


def test_crash_points_catch_torn_write_mutant(
    backend_factory: Callable[..., Backend], tmp_path: Path
) -> None:
    """A backend that rewrites its data in place (no temp file + rename) is caught."""
    with pytest.raises(AssertionError, match=r"\[D\]|\[A\]"):
        crash_point_sweep(
            lambda: backend_factory("snap", bug="torn_write"), tmp_path, budget=None, seed=SEED
        )
    FIGURES["mutants caught"] += 1
