"""The core contract package imports downward only: no cycles, TYPE_CHECKING included.

Regression: ``_protocol`` (``BaseCheckpointStore``) formed import cycles with
``_batch``, ``_paging``, ``_integrity``, ``_writes`` and ``_primitives``, whose
helpers took the whole store and imported it back under ``TYPE_CHECKING``. Every
import statement counts here, wherever it is (module level, in a function, under
``if TYPE_CHECKING:``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import statekeeper._core as core

PACKAGE = Path(core.__file__).parent


def _imported_core_modules(path: Path) -> set[str]:
    """The ``statekeeper._core`` modules that ``path`` imports, by short name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from . import x / from .x import y
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
            elif node.level == 0 and (node.module or "").startswith("statekeeper._core."):
                found.add((node.module or "").split(".")[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("statekeeper._core."):
                    found.add(alias.name.split(".")[2])
    return found


def _layers() -> list[str]:
    """The modules in the order the package docstring lists them (bottom up)."""
    return re.findall(r"^- ``(\w+)``:", core.__doc__ or "", re.M)


def test_the_docstring_lists_every_module_once() -> None:
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert sorted(_layers()) == modules


def test_each_module_imports_only_modules_listed_before_it() -> None:
    order = _layers()
    for position, name in enumerate(order):
        imported = _imported_core_modules(PACKAGE / f"{name}.py")
        above = imported - set(order[:position])
        assert not above, f"_core.{name} imports {sorted(above)}, listed after it (or itself)"


def test_the_core_imports_none_of_the_old_module_paths() -> None:
    old = ("_protocol", "_paging", "_primitives", "_batch", "_writes", "_integrity")
    old += ("_validate", "_interface")
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                assert (node.module or "").split(".")[0] not in old, (path.name, node.module)
