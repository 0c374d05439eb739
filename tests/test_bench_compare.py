"""benchmarks/compare.py: the arithmetic of its ratios and verdicts, its report, and
one tiny run end to end (two exports of HEAD, the memory store, two rounds). No
figure is asserted: the benchmark measures, the tests hold what it computes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from skbench.compare_report import SECTION, render, rows  # noqa: E402
from skbench.compare_run import CompareResults  # noqa: E402
from skbench.compare_stats import (  # noqa: E402
    Ratio,
    by_replica,
    null_spread,
    plan_for,
    ratio_of,
    verdict,
)


def _rounds(scale: float, n: int = 12) -> list[list[float]]:
    return [[scale * (1 + (k + i) % 5 / 10) for i in range(9)] for k in range(n)]


def test_identical_sides_give_a_ratio_of_one_inside_its_interval() -> None:
    r = ratio_of(_rounds(1.0), _rounds(1.0))
    assert r.ratio == pytest.approx(1.0)
    assert r.p10 == pytest.approx(1.0)
    assert r.low <= 1.0 <= r.high
    assert r.rounds == 12


def test_a_side_twice_as_slow_gives_two() -> None:
    r = ratio_of(_rounds(1.0), _rounds(2.0))
    assert r.ratio == pytest.approx(2.0)
    assert r.low == pytest.approx(2.0)
    assert r.round_min == pytest.approx(2.0) == r.round_max
    assert verdict(r) == "NO"


def test_rounds_empty_on_either_side_are_left_out_of_the_pairs() -> None:
    before, after = _rounds(1.0, 4), _rounds(1.0, 4)
    after[2] = []
    assert ratio_of(before, after).rounds == 3
    with pytest.raises(ValueError, match="no round"):
        ratio_of([[]], [[1.0]])


def test_the_bootstrap_works_on_rounds_larger_than_it_keeps() -> None:
    big = [[1.0 + i / 1000 for i in range(500)] for _ in range(5)]
    r = ratio_of(big, [[2 * x for x in rnd] for rnd in big])
    assert r.low == pytest.approx(2.0, rel=0.01)


@pytest.mark.parametrize(
    ("ratio", "low", "p10", "expected"),
    [
        (1.05, 0.9, 1.2, "yes"),
        (1.10, 1.0, 1.0, "yes"),
        (1.3, 1.2, 1.25, "NO"),
        (1.3, 1.05, 1.25, "unclear"),  # the interval reaches x1.10
        (1.3, 1.2, 1.0, "unclear"),  # the fastest calls did not move
    ],
)
def test_verdict(ratio: float, low: float, p10: float, expected: str) -> None:
    assert verdict(Ratio(ratio, p10, low, 2.0, 0.5, 2.0, 10)) == expected


@pytest.mark.parametrize(
    ("ratio", "low", "null", "expected"),
    [
        (1.3, 1.2, 1.02, "NO"),  # two processes of the same code agree: a finding
        (1.3, 1.2, 1.25, "unclear"),  # they differ as much as the sides do
        (2.49, 1.20, 1.89, "unclear"),  # a shared disk: the interval is inside A/A
        (3.0, 2.1, 1.5, "NO"),  # a change far beyond the A/A spread is still called
    ],
)
def test_verdict_against_the_runs_own_null_test(
    ratio: float, low: float, null: float, expected: str
) -> None:
    assert verdict(Ratio(ratio, 1.5, low, 4.0, 0.5, 4.0, 10), null=null) == expected


def test_calls_go_back_to_the_process_that_made_them() -> None:
    # round 0: chunks on processes 0, 1, 0; round 1: on 1, 0, 1 (two calls a chunk)
    rounds = [[1.0, 1.0, 2.0, 2.0, 1.0, 1.0], [2.0, 2.0, 1.0, 1.0, 2.0, 2.0]]
    assert by_replica(rounds, per_chunk=2, replicas=2) == [[1.0] * 6, [2.0] * 6]
    before = [[1.0, 1.0, 2.0, 2.0], [2.0, 2.0, 1.0, 1.0]]
    assert null_spread(before, before, per_chunk=2, replicas=2) == pytest.approx(2.0)
    assert null_spread(before, before, per_chunk=2, replicas=1) is None


def test_plan_gives_slow_ops_one_call_a_chunk_and_fast_ops_many() -> None:
    assert plan_for([0.050, 0.040], slice_seconds=0.06, chunk_seconds=0.01) == (1, 1)
    reps, chunks = plan_for([100e-6, 120e-6], slice_seconds=0.06, chunk_seconds=0.01)
    assert reps == round(0.01 / 120e-6)  # sized on the slower side
    assert chunks == 6
    assert plan_for([1e-6], 0.06, 0.01) == (200, 8)  # at most 200 calls, 8 chunks
    assert plan_for([1e-6], 0.06, 0.01, cap=40) == (40, 8)
    assert plan_for([0.0, float("nan")], 0.06, 0.01) == (1, 1)


def _results() -> CompareResults:
    results = CompareResults()
    side = {"describe": "abc1234 subject", "note": "exported"}
    results.meta = {
        "command": "uv run nox -s bench_compare",
        "date": "2026-12-01 23:00 UTC",
        "elapsed": 12.0,
        "before": side,
        "after": side,
        "settings": {"size": 100, "rounds": 12, "slice_ms": 60, "replicas": 2},
    }
    results.groups = {
        "memory": {
            "info": {"before": {"saved": 10, "builds": [0.1, 0.2]}},
            "loads": ["start 1.00 1.00 1.00"],
            "ops": {
                "get_latest": {"before": _rounds(1e4), "after": _rounds(2e4), "reps": 5},
                "load by id": {"before": [], "after": [], "error": "wrong answer on after: x"},
            },
        },
        "postgresql": {"unavailable": "STATEKEEPER_TEST_POSTGRES_URL is not set"},
    }
    return results


def test_the_report_has_a_row_per_operation_with_its_verdict() -> None:
    results = _results()
    got = rows(results.groups["memory"], "memory")
    assert [r["op"] for r in got] == ["get_latest", "load by id"]
    assert got[0]["verdict"] == "NO" and "error" in got[1]
    text = render(results)
    assert text.startswith(SECTION + "\n")
    assert "| get_latest | 12 µs (10 µs-14 µs) n=108" in text and "**x2.00**" in text
    assert "ERROR: wrong answer on after: x" in text
    assert "Not measured: STATEKEEPER_TEST_POSTGRES_URL is not set." in text
    assert "1 over" in text and "1 not measured" in text


def test_a_tiny_run_of_head_against_itself(tmp_path: Path) -> None:
    out = tmp_path / "compare.md"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compare.py"),
            *("--before", "HEAD", "--after", "HEAD", "--only", "memory"),
            *("--size", "300", "--rounds", "2", "--replicas", "1", "--quick"),
            *("--output", str(out), "--workdir", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text(encoding="utf-8")
    assert "ERROR" not in text and "WRONG" not in done.stdout
    raw = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    ops = raw["groups"]["memory"]["ops"]
    assert len(ops) == 9 and all(len(cell["after"]) == 2 for cell in ops.values())


def test_writes_stay_within_their_budget_a_round() -> None:
    from skbench.compare_run import WRITE_BUDGET, _within_write_budget

    assert _within_write_budget("save_many(100) (full)", 1, 3) == (1, 1)
    assert _within_write_budget("save (full)", 5, 3) == (5, 3)  # already within
    reps, chunks = _within_write_budget("save (fast)", 40, 3)
    assert reps * chunks <= WRITE_BUDGET and reps == 40
    assert _within_write_budget("save", 80, 1) == (WRITE_BUDGET, 1)
