"""docs/benchmarks.md speaks to users: it names features, never the project's
internal issue numbers, and neither do the generators that write its sections
(so a regenerated page has none either)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
SKBENCH = ROOT / "benchmarks" / "skbench"
GENERATORS = [*sorted(SKBENCH.glob("*report.py")), SKBENCH / "targets.py"]
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
    assert len(GENERATORS) >= 5
    found = [
        f"{path.name}: {text!r}"
        for path in GENERATORS
        for text in _rendered_strings(path)
        if ISSUE.search(text) or text.endswith("| #")  # "| #{t.issue} |"
    ]
    assert not found, "\n".join(found)
