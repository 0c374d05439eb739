"""The one table renderer over pyperf results (benchmarks/skbench/render.py): medians,
ratios against a baseline of the same run or of another run (before/after), target
verdicts, and what a missing benchmark shows; from pyperf JSON written here with
known values, so every figure is known."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pyperf = pytest.importorskip("pyperf")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from skbench.render import Row, before_after, duration, load, quantity, table  # noqa: E402


def write(path: Path, values: dict[str, list[float]]) -> dict[str, object]:
    benches = []
    for name, vals in values.items():
        run = pyperf.Run(vals, metadata={"name": name, "unit": "second"}, collect_metadata=False)
        benches.append(pyperf.Benchmark([run]))
    pyperf.BenchmarkSuite(benches).dump(str(path))
    return load(path)


def test_a_row_shows_the_medians_and_their_ratio_and_the_verdict(tmp_path: Path) -> None:
    results = write(
        tmp_path / "r.json.gz",
        {"ours": [0.002, 0.003, 0.004], "peer": [0.001, 0.0015, 0.002], "fast": [1e-6] * 3},
    )
    lines = table(
        results,
        [
            Row("ours vs peer", "ours", "peer", 1.0, against="the peer"),
            Row("fast vs peer", "fast", "peer", 1.0),
            Row("ours alone", "ours"),
        ],
    )
    assert lines[0] == "|  | measured | baseline | ratio | target |"
    assert "**3 ms**" in lines[2] and "the peer: **1.5 ms**" in lines[2]
    assert "x2.00" in lines[2] and "**NOT met** (≤ x1)" in lines[2]
    assert "| x0.0007 |" in lines[3] and "| met (≤ x1)" in lines[3]
    assert lines[4].startswith("| ours alone | **3 ms** ± 1 ms |  |  |")


def test_a_missing_benchmark_says_why(tmp_path: Path) -> None:
    results = write(tmp_path / "r.json", {"ours": [0.001]})
    lines = table(results, [Row("x", "gone", "ours", 1.0)], why={"gone": "skipped: no server"})
    assert "skipped: no server" in lines[2]
    assert "not measured" in lines[2]  # the verdict


def test_before_after_is_after_over_before_for_every_common_benchmark(tmp_path: Path) -> None:
    before = write(tmp_path / "b.json.gz", {"a": [0.004], "b": [0.001], "only-before": [1.0]})
    after = write(tmp_path / "a.json.gz", {"a": [0.001], "b": [0.002], "only-after": [1.0]})
    lines = before_after(before, after)
    assert lines[0] == "|  | after | before | ratio |"
    assert len(lines) == 4
    assert "| `a` | **1 ms** | **4 ms** | x0.25 |" in lines
    assert "| `b` | **2 ms** | **1 ms** | x2.00 |" in lines


def test_durations_read_in_their_unit() -> None:
    assert duration(2.5) == "2.5 s"
    assert duration(0.000573) == "573 µs"
    assert duration(4.6e-6) == "4.6 µs"
    assert duration(4.79e-8) == "47.9 ns"


def test_a_percentile_row_shows_that_percentile_of_both_sides(tmp_path: Path) -> None:
    slow = [0.001] * 98 + [0.05, 0.06]
    results = write(tmp_path / "r.json", {"during": slow, "quiet": [0.001] * 99 + [0.002]})
    lines = table(results, [Row("p99", "during", "quiet", against="quiet", percentile=99)])
    want_during = results["during"].percentile(99)
    want_quiet = results["quiet"].percentile(99)
    assert f"p99 **{duration(want_during)}**" in lines[2]
    assert f"quiet: p99 **{duration(want_quiet)}**" in lines[2]
    assert f"x{want_during / want_quiet:.2f}" in lines[2]
    assert "±" not in lines[2]  # the spread is the median's, not a percentile's


def test_counts_read_in_their_unit_and_compare_like_timings(tmp_path: Path) -> None:
    benches = [
        pyperf.Benchmark(
            [pyperf.Run([value], metadata={"name": name, "unit": unit}, collect_metadata=False)]
        )
        for name, value, unit in (
            ("frames", 7.58, "integer"),
            ("floor", 1.64, "integer"),
            ("built", 24_117_248, "byte"),
            ("swept", 3_145_728, "byte"),
        )
    ]
    pyperf.BenchmarkSuite(benches).dump(str(tmp_path / "c.json"))
    results = load(tmp_path / "c.json")
    lines = table(results, [Row("frames", "frames", "floor"), Row("space", "swept", "built")])
    assert "| frames | **7.58** | **1.64** | x4.62 |" in lines
    assert "| space | **3 MiB** | **23 MiB** | x0.13 |" in lines


def test_sizes_and_plain_numbers() -> None:
    assert quantity(512, "byte") == "512 B"
    assert quantity(1536, "byte") == "1.5 KiB"
    assert quantity(3 * 2**30, "byte") == "3 GiB"
    assert quantity(3.0, "integer") == "3"
    assert quantity(12_345, "integer") == "12,345"
    assert quantity(0.00025, "second") == "250 µs"
