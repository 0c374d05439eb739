"""``backends/memory/`` is the reference backend authors read (the guide points to
it): its modules import what a plugin may import, and the package docstring names
each exception and its reason.

A plugin may import the names a public module exports (``__all__`` of
``statekeeper``, ``statekeeper.errors``, ``statekeeper.record``, ...). The memory
store also uses a few private constructors for speed; its module docstring must say
so, with the measured cost of doing without, so that no author copies them unawares.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import statekeeper.backends.memory as memory

#: the package's modules (its own imports between them are not a plugin's concern)
SOURCES = sorted(Path(memory.__file__).parent.glob("*.py"))
#: private names the memory store may use, each explained in its module docstring
FAST_PATHS = {
    "statekeeper.models.trusted_header",
    "statekeeper.models.trusted_checkpoint",
    "statekeeper.record.trusted_stored_record",
    "statekeeper.record.verified_record",
    "statekeeper.record.header_values",
}


def _imports() -> list[tuple[str, str]]:
    """``(module, name)`` for each name the memory backend's modules import from
    statekeeper, outside the backend itself."""
    found = []
    for source in SOURCES:
        for node in ast.walk(ast.parse(source.read_text("utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            if node.level:  # relative to statekeeper.backends.memory
                base = memory.__name__.rsplit(".", node.level - 1)[0]
                module = f"{base}.{module}" if module else base
            if module.startswith("statekeeper") and not module.startswith(memory.__name__):
                found += [(module, alias.name) for alias in node.names]
    return found


def test_memory_backend_imports_only_what_a_plugin_may() -> None:
    imports = _imports()
    assert imports, "the memory backend imports nothing from statekeeper?"
    private = []
    for module, name in imports:
        if f"{module}.{name}" in FAST_PATHS:
            continue
        public_module = not any(part.startswith("_") for part in module.split("."))
        if not public_module or name not in importlib.import_module(module).__all__:
            private.append(f"{module}.{name}")
    assert not private, f"the memory backend imports private names: {private}"


def test_memory_backend_says_why_it_uses_each_private_fast_path() -> None:
    doc = memory.__doc__ or ""
    used = {f"{m}.{n}" for m, n in _imports()} & FAST_PATHS
    for path in used:
        name = path.rsplit(".", 1)[1]
        assert name in doc, f"the memory package's docstring does not say why it uses {name}"
