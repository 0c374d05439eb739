"""benchmarks/encryption.py: the arithmetic of its added costs and verdicts, its
report, and one tiny run end to end (the memory store, two rounds). No figure is
asserted: the benchmark measures, the tests hold what it computes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from skbench.encryption import (  # noqa: E402
    OPS,
    PLAIN,
    SEALED,
    SIZES,
    VARIANTS,
    EncResults,
    added,
    big_state,
    target_us,
)
from skbench.encryption_report import SECTION, render, target_rows, verdict  # noqa: E402


def _rounds(us: float, n: int = 10) -> list[list[int]]:
    """``n`` rounds of calls around ``us`` microseconds (in ns, as the run keeps them)."""
    return [[int(us * 1000 * (1 + (k + i) % 3 / 100)) for i in range(7)] for k in range(n)]


def test_the_added_cost_is_the_median_paired_difference_in_microseconds() -> None:
    a = added(_rounds(100.0), _rounds(112.0))
    assert a.median == pytest.approx(12.0, rel=0.05)
    assert a.low <= a.median <= a.high
    assert a.pooled == pytest.approx(12.0, rel=0.05)
    assert a.rounds == 10


def test_identical_sides_add_nothing() -> None:
    a = added(_rounds(50.0), _rounds(50.0))
    assert a.median == 0.0 and a.low == 0.0 and a.high == 0.0


def test_rounds_empty_on_either_side_are_left_out() -> None:
    base, other = _rounds(10.0, 4), _rounds(20.0, 4)
    other[1] = []
    assert added(base, other).rounds == 3
    with pytest.raises(ValueError, match="no round"):
        added([[]], [[1]])


def test_the_target_is_15_us_plus_1_us_per_kb() -> None:
    assert target_us(1) == 16.0
    assert target_us(100) == 115.0


@pytest.mark.parametrize(
    ("median", "low", "high", "expected"),
    [
        (10.0, 8.0, 12.0, "**met**"),
        (10.0, 8.0, 20.0, "**met** (borderline: the interval reaches past it)"),
        (20.0, 17.0, 25.0, "**NOT met**"),
        (20.0, 10.0, 25.0, "**NOT met** (borderline: the interval reaches below it)"),
    ],
)
def test_verdict(median: float, low: float, high: float, expected: str) -> None:
    assert verdict(median, low, high, 16.0) == expected


def test_the_100_kb_state_is_about_100_kb_of_json() -> None:
    import statekeeper as sk

    encoded = sk.open_store("memory://").codec.encode(big_state(1))
    assert 100_000 <= len(encoded) <= 110_000


def _results() -> EncResults:
    results = EncResults()
    results.meta = {
        "command": "uv run nox -s bench_encryption",
        "date": "2026-12-02 03:00 UTC",
        "elapsed": 5.0,
        "commit": "abc1234 subject",
        "tree_note": " (src/ as committed)",
    }
    results.machine = {"nproc": 2}
    cells = {}
    for op in OPS:
        for label in SIZES:
            cells[f"{op} {label}"] = {v: _rounds(30.0 if v == SEALED else 10.0) for v in VARIANTS}
    results.cells = {"memory": cells}
    reps = {f"{op} {label}": {"json": 7, "raw": 7} for op in OPS for label in SIZES}
    results.configs = {
        "memory": {"reps": reps, "encoded": {"1 KB": 999, "100 KB": 100_829}},
        "postgresql full": {"unavailable": "STATEKEEPER_TEST_POSTGRES_URL is not set"},
    }
    results.raw = {"seal": {"1 KB": [1500.0, 1600.0], "100 KB": [20000.0, 21000.0]}}
    return results


def test_the_report_has_a_row_per_store_operation_size_and_codec() -> None:
    results = _results()
    rows = target_rows(results)
    assert len(rows) == len(OPS) * len(SIZES) * 2
    by_state = {(r["op"], r["size"]): r for r in rows}
    # +20 µs at 1 KB is over 16 µs; at 100 KB within 115 µs; the raw codec pair adds 0
    assert by_state[("save", "1 KB")]["verdict"] == "**NOT met**"
    assert by_state[("save", "100 KB")]["verdict"] == "**met**"
    assert by_state[("get_latest", "1 KB, raw codec")]["added"].median == 0.0
    text = render(results)
    assert text.startswith(SECTION + "\n")
    assert "6 of 8 met" in text  # the two json 1 KB rows are over
    assert "| memory | save | 1 KB | +20.2 µs (+20.2 µs to +20.2 µs) |" in text
    assert "not measured: STATEKEEPER_TEST_POSTGRES_URL is not set" in text
    assert "| seal | 1.55 µs (1.5 µs) | 20.5 µs (20 µs) |" in text


def test_an_included_compare_section_goes_one_level_down() -> None:
    compare = "## Before and after the redesign\n\nIntro.\n\n### Memory\n\n| a |\n"
    text = render(_results(), compare)
    assert "## Before and after the redesign" not in text
    assert "### Plaintext stores, before and after encryption was added" in text
    assert "#### Memory" in text and "Intro." in text


def test_a_tiny_run_on_the_memory_store(tmp_path: Path) -> None:
    out = tmp_path / "encryption.md"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "encryption.py"),
            *("--only", "memory", "--rounds", "2", "--quick"),
            *("--output", str(out), "--workdir", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text(encoding="utf-8")
    assert "ERROR" not in text and text.startswith(SECTION)
    raw = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    cells = raw["cells"]["memory"]
    assert set(cells) == {f"{op} {label}" for op in OPS for label in SIZES}
    assert all(len(cell[v]) == 2 for cell in cells.values() for v in VARIANTS)
    assert all(cell[PLAIN][0] for cell in cells.values())
    assert set(raw["raw"]) >= {"seal", "open", "AES-256-GCM encrypt"}
    # re-rendering from the raw figures measures nothing and gives the same tables
    again = tmp_path / "again.md"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "encryption.py"),
            *("--from-json", str(out.with_suffix(".json")), "--output", str(again)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = text.split("### Targets", 1)[1]
    assert again.read_text(encoding="utf-8").split("### Targets", 1)[1] == table
