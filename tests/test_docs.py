"""Every ```python block in README.md and docs/*.md runs, so the docs match the code.

Blocks of one file run in order in one namespace, inside a fresh temporary working
directory. A block that starts with ``# doctest: skip`` is shown but not run.

Each page runs twice in the same directory, in a fresh namespace, as a reader who
pastes its examples again would: an example that asserts the exact contents of a
persistent store it created must still hold when that store already has data.
"""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(path: Path) -> list[str]:
    return [
        b for b in FENCE.findall(path.read_text("utf-8")) if not b.startswith("# doctest: skip")
    ]


def _run_page(path: Path, run: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # a real module, so dataclasses and "module:Qualname" allowlist entries work in examples
    module = types.ModuleType(f"docs_{path.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for number, block in enumerate(_blocks(path), start=1):
        code = compile(block, f"{path.name}[block {number}, run {run}]", "exec")
        exec(code, module.__dict__)


@pytest.mark.parametrize("path", [p for p in DOCS if _blocks(p)], ids=lambda p: p.name)
def test_code_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATEKEEPER_URL", raising=False)
    for run in (1, 2):
        _run_page(path, run, monkeypatch)
        assert os.getcwd() == str(tmp_path)
