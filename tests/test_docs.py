"""Every ```python block in README.md and docs/*.md runs, so the docs match the code.

Blocks of one file run in order in one namespace, inside a fresh temporary working
directory. A block that starts with ``# doctest: skip`` is shown but not run.

Each page runs twice in the same directory, in a fresh namespace, as a reader who
pastes its examples again would: an example that asserts the exact contents of a
persistent store it created must still hold when that store already has data.

The backend written from scratch in docs/backend-authors.md also runs the whole
conformance kit (:class:`TestGuideBackendConformance`): the guide shows a backend
that passes it, not one that merely runs.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import sys
import types
from pathlib import Path

import pytest

from statekeeper.testing import CheckpointStoreTests, StoreFactory

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


GUIDE = ROOT / "docs" / "backend-authors.md"
GUIDE_BACKEND = "# shelf_backend.py"  # the first line of the guide's from-scratch backend


def _guide_backend_source() -> str:
    blocks = [b for b in _blocks(GUIDE) if b.startswith(GUIDE_BACKEND)]
    assert len(blocks) == 1, f"{GUIDE.name} has no python block starting {GUIDE_BACKEND!r}"
    return blocks[0]


def _guide_backend() -> types.ModuleType:
    """The from-scratch backend of the backend author guide, as a module."""
    module = types.ModuleType("shelf_backend")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    code = compile(_guide_backend_source(), f"{GUIDE.name}[{GUIDE_BACKEND}]", "exec")
    exec(code, module.__dict__)
    return module


def test_the_guide_backend_uses_only_the_public_extension_api() -> None:
    tree = ast.parse(_guide_backend_source())
    public = {"statekeeper", "statekeeper.errors", "statekeeper.record"}
    used: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("statekeeper"):
            assert node.module in public, node.module
            used += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            used += [a.name for a in node.names if a.name.startswith("statekeeper")]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "sk"
        ):
            used.append(f"statekeeper.{node.attr}")
    assert "statekeeper" in used, "the guide backend does not import statekeeper"
    for name in used:
        module, _, attr = name.rpartition(".")
        if module:
            assert not attr.startswith("_"), f"the guide backend uses a private name: {name}"
            assert attr in importlib.import_module(module).__all__, f"not exported: {name}"
    bases = [
        ast.unparse(base)
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        for base in node.bases
    ]
    assert "sk.BaseCheckpointStore" in bases and "MemoryCheckpointStore" not in bases


class TestGuideBackendConformance(CheckpointStoreTests):
    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        backend = _guide_backend()
        shelf = backend.Shelf()
        return lambda **options: backend.ShelfStore(shelf, **options)  # type: ignore[no-any-return]
