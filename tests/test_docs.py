"""Every ```python block in README.md and docs/*.md runs, so the docs match the code.

Blocks of one file run in order in one namespace, inside a fresh temporary working
directory. A block that starts with ``# doctest: skip`` is shown but not run.
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


@pytest.mark.parametrize("path", [p for p in DOCS if _blocks(p)], ids=lambda p: p.name)
def test_code_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATEKEEPER_URL", raising=False)
    # a real module, so dataclasses and "module:Qualname" allowlist entries work in examples
    module = types.ModuleType(f"docs_{path.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for number, block in enumerate(_blocks(path), start=1):
        code = compile(block, f"{path.name}[block {number}]", "exec")
        exec(code, module.__dict__)
    assert os.getcwd() == str(tmp_path)
