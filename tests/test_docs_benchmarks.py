"""docs/benchmarks.md speaks to users: it names features, never the project's
internal issue numbers, and neither does the code that writes it (so a regenerated
page has none either). It shows the single-save targets, each a ratio against its
peer or floor from the same run, and the before/after table, whose before run is
kept in the repository as pyperf JSON."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
SKBENCH = ROOT / "benchmarks" / "skbench"
GENERATORS = [SKBENCH / "report.py", SKBENCH / "render.py", ROOT / "benchmarks" / "run.py"]
ISSUE = re.compile(r"\bissues?\b|\bissue-\d+|\| #\d+ \|", re.I)


def test_the_benchmarks_page_names_no_issues() -> None:
    found = [line for line in PAGE.read_text("utf-8").splitlines() if ISSUE.search(line)]
    assert not found, "\n".join(found)


def _rendered_strings(path: Path) -> list[str]:
    """The string literals of ``path`` that can reach the page (docstrings excluded)."""
    tree = ast.parse(path.read_text("utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_the_generators_of_the_page_write_no_issue_numbers() -> None:
    found = [
        f"{path.name}: {text!r}"
        for path in GENERATORS
        for text in _rendered_strings(path)
        if ISSUE.search(text)
    ]
    assert not found, "\n".join(found)


def test_the_page_shows_the_single_save_targets_with_ratios() -> None:
    text = PAGE.read_text("utf-8")
    section = text.split("## Targets: a single save at the floor", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and " x" in line]
    for what in (
        "SQLite full save vs `SqliteSaver.put`",
        "SQLite full save vs the bare transaction at FULL",
        "file full save vs the bare durable write",
        "memory save vs `InMemorySaver.put`",
        "Agent Framework storage over SQLite",
        "Agent Framework storage over the file store",
    ):
        assert any(what in row for row in rows), what


def test_the_before_run_is_kept_and_the_page_compares_with_it() -> None:
    kept = sorted((ROOT / "benchmarks" / "results").glob("*.json.gz"))
    assert kept, "no before run in benchmarks/results/"
    for path in kept:
        assert path.stat().st_size < 2_000_000, f"{path.name} is not small"
        assert path.with_name(path.name.replace(".json.gz", ".facts.json")).is_file()
    text = PAGE.read_text("utf-8")
    assert "## Before and after" in text
    assert any(p.name in text for p in kept), "the page does not name the before run"
