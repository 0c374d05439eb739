"""The benchmark command (benchmarks/run.py): a quick run really runs the workloads
it is given, under pyperf, keeps their results in one pyperf JSON file with the run's
facts beside it, says why a workload it could not run was skipped, and writes the
page with the single-save target rows. Behaviour only: no figure is judged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pyperf = pytest.importorskip("pyperf")

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "benchmarks" / "run.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

from skbench import workloads  # noqa: E402
from skbench.render import load  # noqa: E402

TARGET_ROWS = (
    "save/memory",
    "save/sqlite-full",
    "save/file-full",
    "save/InMemorySaver",
    "save/SqliteSaver",
    "save/floor-sqlite-FULL",
    "save/floor-durable-write",
)


def run(tmp_path: Path, *args: str, quick: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEKEEPER_TEST_")}
    return subprocess.run(
        [sys.executable, str(RUN), *(["--quick"] if quick else []), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )


def test_a_quick_run_measures_the_target_rows_and_writes_the_page(tmp_path: Path) -> None:
    out, page = tmp_path / "r.json.gz", tmp_path / "b.md"
    only = (
        "^save/(" + "|".join(n.split("/")[1] for n in TARGET_ROWS) + ")$|^af/save/af-sqlite-full$"
    )
    run(tmp_path, "--only", only, "-o", str(out), "--docs", str(page))
    results = load(out)
    assert set(TARGET_ROWS) <= set(results)
    for name in TARGET_ROWS:
        assert results[name].median() > 0
    facts = json.loads((tmp_path / "r.facts.json").read_text())
    assert facts["failed"] == {}
    text = page.read_text()
    assert "## Targets: a single save at the floor" in text
    row = next(line for line in text.splitlines() if "vs `SqliteSaver.put`" in line)
    want = results["save/sqlite-full"].median() / results["save/SqliteSaver"].median()
    assert f"x{want:.2f}" in row
    af = "af/save/af-sqlite-full"
    if af in facts["skipped"]:  # the peers' env has Agent Framework; the dev env may not
        assert "agent_framework" in facts["skipped"][af]
        assert f"`{af}`: agent_framework" in text and "| skipped |" in text
    else:
        assert af in results


def test_a_workload_that_fails_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "r.json.gz"
    # no server URL in the environment: the PostgreSQL rows are skipped, named
    run(tmp_path, "--only", "^save/(memory|postgresql-full)$", "-o", str(out))
    facts = json.loads((tmp_path / "r.facts.json").read_text())
    assert "save/postgresql-full" in facts["skipped"]
    assert set(load(out)) == {"save/memory"}


def test_every_peer_comparison_and_floor_is_in_the_full_catalogue() -> None:
    names = {w.name for w in workloads(quick=False)}
    for subject in (
        "InMemorySaver",
        "SqliteSaver",
        "AsyncSqliteSaver",
        "AsyncPostgresSaver",
        "AF-File",
        "AF-InMemory",
        "floor-durable-write",
        "floor-plain-write",
        "floor-sqlite-FULL",
        "floor-sqlite-NORMAL",
    ):
        assert f"save/{subject}" in names, subject
    for prefix in (
        "get_latest@",
        "middle_page@",
        "list_all@",
        "group@64/",
        "writers@16/",
        "api/filtered_page/",
        "langgraph/graph/lg-sqlite-full",
        "langgraph/aput/AsyncPostgresSaver",
        "af/save/af-file-full",
        "af/get_latest@",
        "encryption/save 100KB/sqlite-encrypted",
        "encryption/open 1KB/envelope",
        "telemetry/save/file-on",
        "telemetry/list/sqlite-on",
        "encryption/save 1KB/postgresql-encrypted",
        "retention/sweep/postgresql",
        "retention/save-quiet/file",
        "retention/save-during-sweep/postgresql",
        "retention/space/sqlite",
        "retention/space/file",
        "hop/worker-run",
        "hop/to_thread",
        "wal-frames/sqlite-full",
        "wal-frames/SqliteSaver",
        "wal-frames/floor-sqlite-FULL",
        "startup/latest",
    ):
        assert any(n.startswith(prefix) for n in names), prefix
    assert len(names) == len(workloads(quick=False)), "a workload name is used twice"


def test_the_largest_reads_are_opt_in() -> None:
    default = {w.name for w in workloads(quick=False)}
    large = {w.name for w in workloads(quick=False, large=True)}
    assert not any("@100000/" in n for n in default)
    added = large - default
    assert {"list_all@100000/sqlite-full", "get_latest@100000/SqliteSaver"} <= added
    assert all("@100000/" in n for n in added)
    assert not any(n.endswith(("AF-File", "AF-InMemory")) for n in added)
    assert all(w.heavy for w in workloads(quick=False, large=True) if w.name in added)


@pytest.mark.parametrize(
    "only",
    [
        "^encryption/(save 1KB/memory-encrypted|open 1KB/envelope)$",
        "^telemetry/save/memory-on$",
        "^retention/sweep/sqlite$",
        "^retention/save-during-sweep/file$",
        "^hop/worker-run$",
        "^startup/help$",
        "^api/(cursor_page@60|load_many100)/sqlite-full$",
        "^group@8/sqlite-full$",
        "^writers@4/sqlite-full$",
        "^langgraph/aput_writes/lg-sqlite-full$",
    ],
)
def test_each_kind_of_workload_really_runs(tmp_path: Path, only: str) -> None:
    out = tmp_path / "r.json.gz"
    run(tmp_path, "--only", only, "-o", str(out))
    facts = json.loads((tmp_path / "r.facts.json").read_text())
    assert facts["failed"] == {}
    assert load(out), facts["skipped"]


def test_a_run_can_measure_another_commits_src(tmp_path: Path) -> None:
    out = tmp_path / "r.json.gz"
    run(tmp_path, "--rev", "HEAD", "--only", "^save/memory$", "-o", str(out))
    facts = json.loads((tmp_path / "r.facts.json").read_text())
    assert facts["source"].endswith("(git archive of src/)")
    assert set(load(out)) == {"save/memory"}


def test_a_count_is_kept_in_its_unit_and_shown_on_the_page(tmp_path: Path) -> None:
    out, page = tmp_path / "r.json.gz", tmp_path / "b.md"
    only = "^wal-frames/floor-sqlite-FULL$|^retention/space/sqlite$"
    run(tmp_path, "--only", only, "-o", str(out), "--docs", str(page))
    results = load(out)
    frames = results["wal-frames/floor-sqlite-FULL"]
    assert frames.get_unit() == "integer" and frames.median() >= 1  # a commit writes a page
    space = {s: results[f"retention/space-{s}/sqlite"] for s in ("before", "swept", "compacted")}
    assert all(b.get_unit() == "byte" for b in space.values())
    assert space["swept"].median() < space["before"].median()  # the sweep removed 90%
    text = page.read_text()
    section = text.split("## WAL frames per commit", 1)[1].split("\n## ", 1)[0]
    assert f"| **{frames.median():.3g}** |" in section
    section = text.split("## Space given back by a sweep", 1)[1].split("\n## ", 1)[0]
    assert "MiB** |" in section or "KiB** |" in section


def test_a_latency_workload_records_one_call_per_value(tmp_path: Path) -> None:
    from skbench.features import RETENTION_SAVES

    out = tmp_path / "r.json.gz"
    only = "^retention/save-quiet/sqlite$"
    run(tmp_path, "--only", only, "--processes", "2", "-o", str(out), quick=False)
    bench = load(out)["retention/save-quiet/sqlite"]
    runs = [r for r in bench.get_runs() if r.values]
    assert len(runs) == 1  # a slow workload: half the processes
    assert len(bench.get_values()) == RETENTION_SAVES
    assert [r.get_loops() for r in runs] == [1]
