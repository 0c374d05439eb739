"""The code's layout rules (CONTRIBUTING.md, "How the code is organised"), checked.

- no module in ``src/`` or ``backends/*/src`` is over 800 lines, a soft ceiling: a
  module is cut where a concept ends, never at a count, and one that must stay
  whole past it is named in ``LONG_MODULES`` with the reason;
- no import cycle among the project's own modules, counting every import: module
  level, inside functions, and under ``if TYPE_CHECKING:``;
- no class inherits through more than four of the project's own classes;
- no read has a ``*_nowait`` twin: one body runs inline and on the worker;
- every package of more than one module names each of its modules in its
  ``__init__`` docstring (the package's map), but the root ``statekeeper``, whose
  map is CONTRIBUTING.md's.

The graph is built from the source with :mod:`ast`, so nothing is imported.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "src", *sorted((ROOT / "backends").glob("*/src"))]
MAX_LINES = 800
#: Modules allowed past ``MAX_LINES``: path -> why the concept does not cut.
LONG_MODULES: dict[str, str] = {}
MAX_DEPTH = 4


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    imports: set[str] = field(default_factory=set)


def _modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for src in SOURCES:
        for path in sorted(src.rglob("*.py")):
            rel = path.relative_to(src).with_suffix("")
            parts = list(rel.parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join(parts)
            found[name] = Module(name, path, is_package, ast.parse(path.read_text(), str(path)))
    for mod in found.values():
        mod.imports = set(_imports_of(mod, found))
    return found


def _resolve(mod: Module, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = mod.name.split(".")
    if not mod.is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([target] if target else [])])


def _imports_of(mod: Module, known: dict[str, Module]) -> Iterator[str]:
    def own(name: str) -> str | None:
        # the longest prefix of ``name`` that is one of our modules
        while name:
            if name in known:
                return name
            name = name.rpartition(".")[0]
        return None

    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                hit = own(alias.name)
                if hit is not None:
                    yield hit
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, node.level, node.module)
            for alias in node.names:
                # ``from pkg import sub`` imports the submodule ``pkg.sub``
                hit = own(f"{base}.{alias.name}") if base else own(alias.name)
                if hit is None or hit == mod.name:
                    hit = own(base)
                if hit is not None and hit != mod.name:
                    yield hit


def _cycles(mods: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def edges(name: str) -> set[str]:
        # importing ``a.b.c`` runs ``a`` and ``a.b`` first, but a package importing
        # its own submodules is how packages work; only count the named module
        return {m for m in mods[name].imports if m != name}

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for name in sorted(mods):
        if name not in index:
            visit(name)
    return out


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return _modules()


def test_no_module_is_past_the_soft_ceiling_unless_named(modules: dict[str, Module]) -> None:
    long = {
        str(m.path.relative_to(ROOT)): n
        for m in modules.values()
        if (n := len(m.path.read_text().splitlines())) > MAX_LINES
    }
    assert {path: n for path, n in long.items() if path not in LONG_MODULES} == {}
    assert set(LONG_MODULES) <= set(long), "a named exception that is short again: drop it"


def test_no_import_cycles_type_checking_imports_included(modules: dict[str, Module]) -> None:
    # a package's __init__ importing its submodules, which import siblings through
    # the package, is the one shape that is not a cycle of concepts: drop the edges
    # from a submodule to its own package's __init__
    for mod in modules.values():
        mod.imports = {
            m for m in mod.imports if not (modules[m].is_package and mod.name.startswith(m + "."))
        }
    assert _cycles(modules) == []


def _class_depths(modules: dict[str, Module]) -> dict[str, int]:
    """Each project class: how many of the project's own classes it inherits through."""
    bases: dict[str, list[str]] = {}
    for mod in modules.values():
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.ClassDef):
                names = []
                for b in node.bases:
                    target = b.value if isinstance(b, ast.Subscript) else b
                    if isinstance(target, ast.Name):
                        names.append(target.id)
                    elif isinstance(target, ast.Attribute):
                        names.append(target.attr)
                bases.setdefault(node.name, names)
    memo: dict[str, int] = {}

    def depth(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name in memo:
            return memo[name]
        own = [b for b in bases.get(name, []) if b in bases and b not in seen]
        d = max((1 + depth(b, seen | {name}) for b in own), default=0)
        memo[name] = d
        return d

    return {name: depth(name) for name in bases}


def test_no_class_inherits_through_more_than_four_own_classes(
    modules: dict[str, Module],
) -> None:
    deep = {name: d for name, d in _class_depths(modules).items() if d > MAX_DEPTH}
    assert deep == {}


def test_no_read_has_a_nowait_twin(modules: dict[str, Module]) -> None:
    twins = sorted(
        f"{m.name}.{node.name}"
        for m in modules.values()
        for node in ast.walk(m.tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.endswith("_nowait")
    )
    assert twins == []


def test_the_checker_sees_a_cycle_and_a_deep_class(tmp_path: Path) -> None:
    # the rules above would pass vacuously if the walk found nothing
    def mod(name: str, source: str, package: bool = False) -> Module:
        return Module(name, tmp_path / f"{name}.py", package, ast.parse(source))

    mods = {
        "pkg": mod("pkg", "", package=True),
        "pkg.a": mod(
            "pkg.a", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
        ),
        "pkg.b": mod("pkg.b", "def f():\n    from . import a\n"),
        "pkg.c": mod(
            "pkg.c",
            "class A: ...\n"
            + "".join(f"class {b}({a}): ...\n" for a, b in zip("ABCDE", "BCDEF", strict=True)),
        ),
    }
    for m in mods.values():
        m.imports = set(_imports_of(m, mods))
    assert _cycles(mods) == [["pkg.a", "pkg.b"]]
    assert _class_depths(mods)["F"] == 5
    real = _modules()
    assert len(real) > 50 and any(m.imports for m in real.values())


def _unmapped(modules: dict[str, Module]) -> dict[str, list[str]]:
    """Each package (not the root): the modules its docstring does not name."""
    found: dict[str, list[str]] = {}
    for pkg in modules.values():
        if not pkg.is_package or "." not in pkg.name:
            continue
        members = sorted(
            m.name.rsplit(".", 1)[1]
            for m in modules.values()
            if m.name.rsplit(".", 1)[0] == pkg.name and m.name != pkg.name
        )
        if len(members) < 2:
            continue
        doc = ast.get_docstring(pkg.tree) or ""
        missing = [m for m in members if not re.search(rf"(?<!\w){re.escape(m)}(?!\w)", doc)]
        if missing:
            found[pkg.name] = missing
    return found


def test_every_package_docstring_maps_its_modules(modules: dict[str, Module]) -> None:
    assert _unmapped(modules) == {}


def test_the_map_check_sees_a_module_left_out(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""The map: :mod:`.alpha` holds the alphas."""\n')
    (pkg / "alpha.py").write_text("")
    (pkg / "beta.py").write_text("")
    found = {
        name: Module(name, path, path.name == "__init__.py", ast.parse(path.read_text()))
        for name, path in [
            ("root.pkg", pkg / "__init__.py"),
            ("root.pkg.alpha", pkg / "alpha.py"),
            ("root.pkg.beta", pkg / "beta.py"),
        ]
    }
    assert _unmapped(found) == {"root.pkg": ["beta"]}
