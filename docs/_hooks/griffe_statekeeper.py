"""A Griffe extension: statekeeper's reST-flavoured docstrings as the site's Markdown.

The docstrings are written for ``help()`` and IDEs, in reST habits: ``:class:`X```
roles, ``#:`` comments above attributes, ``::`` before an indented example. The API
reference renders them through mkdocstrings, so this extension translates them once,
when Griffe loads the package, instead of the sources changing style:

- ``:class:`~statekeeper.errors.StoreTimeout``` (and ``:meth:``, ``:func:``, ...)
  becomes an autorefs cross-reference. The name is resolved in the docstring's own
  scope, as Python would (then among inherited members, then among the public names
  of ``statekeeper`` and ``statekeeper.errors``). A name that resolves nowhere stays
  an unresolved reference, which fails ``mkdocs build --strict``. A real object the
  reference does not render (an implementation module or helper) has no entry to
  link to and stays a code span; every exported name has an entry (checked by
  tests/test_site.py).
  Names outside statekeeper (the standard library, Hypothesis) stay code spans: the
  site is built offline, with no external inventories to link them to.
- ``#:`` comments directly above an attribute become its docstring (how the options
  models document each option).
- A paragraph ending in ``::`` followed by an indented block becomes a fenced
  Python block.
- The ``CheckpointStore`` protocol's methods have no docstrings in the source: they
  get ``BaseCheckpointStore``'s, as rendered, so that the page applications type
  against states each method's contract (strict or tolerant, what it raises,
  concurrency) while the text is still written once, on ``BaseCheckpointStore``.
  Methods of other wrappers that repeat ``BaseCheckpointStore``'s methods (the
  blocking facade, the kit's recording wrappers) get one line pointing at the
  method that states the contract.

``MIRRORS`` and :func:`missing_docstrings` are also used by the build hook that
fails on public names without a docstring (``docs/_hooks/mkdocs_hooks.py``).
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator
from typing import Any

import griffe

#: The modules the API reference renders; every name in their ``__all__`` needs a
#: docstring, and so does every public method or property of an exported class.
REFERENCE_MODULES = (
    "statekeeper",
    "statekeeper.errors",
    "statekeeper.sync",
    "statekeeper.testing",
    "statekeeper.backends.memory",
    "statekeeper.backends.file",
    "statekeeper.backends.sql",
    "statekeeper.codec",
    "statekeeper.rawcodec",
    "statekeeper.integrations.langgraph",
    "statekeeper.integrations.agent_framework",
)

_BASE = "statekeeper._core.store.BaseCheckpointStore"

#: Classes whose same-named methods have another class's contract: the class that
#: states it, and how the method relates to it (``None``: the same method, so its
#: docstring is the source's, copied).
MIRRORS: dict[str, tuple[str, str | None]] = {
    "statekeeper._core.interface.CheckpointStore": (_BASE, None),
    "statekeeper.sync.SyncCheckpointStore": (_BASE, "Blocking form of"),
    "statekeeper.testing.recording.LoggedStore": (_BASE, "Logs, then calls"),
    "statekeeper.testing.recording.RecordingStore": (_BASE, "Records, then calls"),
    "statekeeper.backends.file.io.OsFileIO": (
        "statekeeper.backends.file.io.FileIO",
        "The operating system's",
    ),
}

# Hypothesis state-machine steps are driven by Hypothesis, not called by users.
_HYPOTHESIS_DECORATORS = ("rule", "invariant", "initialize", "precondition")

# the contract paragraph of BaseCheckpointStore's docstring, up to how to subclass it
_CONTRACT = re.compile(r"^\*\*The contract\*\*.*?(?=^\*\*Subclassing|\Z)", re.M | re.S)
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj|const):`([^`]+)`")
_LITERAL_INTRO = re.compile(r"(\S)::$")


class StatekeeperDocstrings(griffe.Extension):
    """Translate the reST habits of statekeeper's docstrings (see the module docstring)."""

    def on_attribute_instance(
        self, *, node: Any, attr: griffe.Attribute, agent: Any, **kwargs: Any
    ) -> None:
        if attr.docstring is not None or attr.lineno is None:
            return
        try:
            lines = attr.lines_collection[attr.filepath]  # type: ignore[index]
        except (KeyError, TypeError):
            return
        comment: list[str] = []
        index = attr.lineno - 2  # the line above the attribute, 0-based
        while index >= 0 and lines[index].strip().startswith("#:"):
            comment.insert(0, lines[index].strip()[2:].strip())
            index -= 1
        if comment:
            attr.docstring = griffe.Docstring(
                "\n".join(comment), lineno=index + 2, endlineno=attr.lineno - 1, parent=attr
            )

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "statekeeper":
            return
        rendered = _rendered(pkg)
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _markdown(obj, obj.docstring.value, rendered)
        # after the translation: a copied contract keeps the references as resolved
        # in the scope it was written in
        for mirror, (source, verb) in MIRRORS.items():
            _fill_mirror(pkg, mirror, source, verb)


def _rendered(pkg: griffe.Module) -> set[str]:
    """The canonical paths of what the reference renders: the exports and their members."""
    paths: set[str] = set()

    def add(obj: griffe.Object) -> None:
        paths.add(obj.path)
        for name, member in obj.members.items():
            if not member.is_alias and not name.startswith("_"):
                add(member)  # type: ignore[arg-type]

    for path in REFERENCE_MODULES:
        module = pkg.modules_collection[path]
        paths.add(module.path)
        for name in module.exports or ():
            obj = module[name]
            add(obj.final_target if obj.is_alias else obj)
    return paths


def _walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)  # type: ignore[arg-type]


def _fill_mirror(pkg: griffe.Module, mirror: str, source: str, verb: str | None) -> None:
    cls = pkg.modules_collection[mirror]
    base = pkg.modules_collection[source]
    public = _public_path(base)
    if verb is None and cls.docstring is not None and base.docstring is not None:
        # the class states the contract in one paragraph: the mirror shows it too
        contract = _CONTRACT.search(base.docstring.value)
        if contract is not None:
            cls.docstring.value += "\n\n" + contract.group(0).rstrip()
    for name, member in cls.members.items():
        if name.startswith("_") or member.is_alias or member.docstring is not None:
            continue
        stated = base.members.get(name)
        if stated is None or stated.docstring is None:
            continue
        if verb is None:
            text = stated.docstring.value
        else:
            text = f"{verb} [`{base.name}.{name}`][{public}.{name}]."
        member.docstring = griffe.Docstring(text, parent=member)


def _public_path(obj: griffe.Object) -> str:
    """The path under which the reference renders ``obj`` (its exported name)."""
    for module in ("statekeeper", "statekeeper.backends.file"):
        exported = obj.modules_collection[module]
        if obj.name in (exported.exports or ()):
            return f"{module}.{obj.name}"
    return obj.path


def _markdown(obj: griffe.Object, text: str, rendered: set[str]) -> str:
    text = _ROLE.sub(lambda m: _crossref(obj, m.group(1), rendered), text)
    return _fence_literal_blocks(text)


def _crossref(obj: griffe.Object, target: str, rendered: set[str]) -> str:
    short = target.startswith("~")
    target = target.lstrip("~.")
    title = target.rsplit(".", 1)[-1] if short else target
    head, _, rest = target.partition(".")
    if head != "statekeeper":
        resolved = _resolve(obj, head)
        if resolved is None:
            if hasattr(builtins, head):
                return f"`{title}`"  # ValueError, dict, ...: no inventory offline
            return f"[`{title}`][{target}]"  # names nothing: the strict build fails
        target = f"{resolved}.{rest}" if rest else resolved
    if not target.startswith("statekeeper"):
        return f"`{title}`"  # imported from the standard library or a third party
    if _is_internal(obj, target, rendered):
        return f"`{title}`"  # an implementation detail: named, but no entry to link
    return f"[`{title}`][{_documented(obj, target)}]"


def _resolve(obj: griffe.Object, name: str) -> str | None:
    """``name`` as Python would see it from ``obj``'s scope, else as an inherited
    member of ``obj``'s class, else as a public name of ``statekeeper`` or
    ``statekeeper.errors`` (docstrings name errors without importing them)."""
    try:
        return obj.resolve(name)
    except griffe.NameResolutionError:
        pass
    owner: griffe.Object | None = obj
    while owner is not None and not owner.is_class:
        owner = owner.parent
    if owner is not None:
        for base in owner.mro():  # type: ignore[attr-defined]
            if name in base.members:
                return f"{base.path}.{name}"
    for module in ("statekeeper", "statekeeper.errors"):
        namespace = obj.modules_collection[module]
        if name in (namespace.exports or ()):
            return f"{module}.{name}"
    return None


def _is_internal(obj: griffe.Object, path: str, rendered: set[str]) -> bool:
    """Whether ``path`` is a real object that the reference does not render: an
    implementation module or helper (every exported name is rendered, which
    tests/test_site.py checks). Anything that does not resolve (a typo, a removed
    name) stays a cross-reference and fails the build."""
    if path in rendered:
        return False
    try:
        obj.modules_collection[path]
    except KeyError:
        return False
    return True


def _documented(obj: griffe.Object, path: str) -> str:
    """``path``, or the documented base-class member it overrides without a docstring
    (an undocumented override is not rendered; the base's entry states its contract)."""
    owner_path, _, name = path.rpartition(".")
    try:
        target = obj.modules_collection[path]
        owner = obj.modules_collection[owner_path]
    except KeyError:
        return path
    if target.docstring is not None or not owner.is_class:
        return path
    for base in owner.mro():
        member = base.members.get(name)
        if member is not None and member.docstring is not None:
            return member.path
    return path


def _fence_literal_blocks(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _LITERAL_INTRO.search(line.rstrip()) and i + 2 < len(lines) and not lines[i + 1].strip():
            indent = len(lines[i + 2]) - len(lines[i + 2].lstrip())
            block_indent = len(line) - len(line.lstrip())
            if lines[i + 2].strip() and indent > block_indent:
                out.append(_LITERAL_INTRO.sub(r"\1:", line.rstrip()))
                out.append("")
                j = i + 2
                block: list[str] = []
                while j < len(lines) and (
                    not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) >= indent
                ):
                    block.append(lines[j][indent:])
                    j += 1
                while block and not block[-1].strip():
                    block.pop()
                pad = " " * block_indent
                out += [f"{pad}```python", *(pad + b if b else "" for b in block), f"{pad}```"]
                out.append("")
                i = j
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _is_hypothesis_step(member: griffe.Object) -> bool:
    decorators = getattr(member, "decorators", [])
    return any(
        str(d.value).split("(")[0].split(".")[-1] in _HYPOTHESIS_DECORATORS for d in decorators
    )


def _documented_in_a_base(cls: griffe.Class, name: str) -> bool:
    for base in cls.mro():
        member = base.members.get(name)
        if member is not None and not member.is_alias and member.docstring is not None:
            return True
    return False


def missing_docstrings(pkg: griffe.Module) -> list[str]:
    """Public names the reference renders that have no docstring (after this extension)."""
    missing = []
    for path in REFERENCE_MODULES:
        module = pkg.modules_collection[path]
        for name in module.exports or ():
            obj = module[name]
            target = obj.final_target if obj.is_alias else obj
            if target.docstring is None or not target.docstring.value.strip():
                missing.append(f"{path}.{name}")
            if not target.is_class:
                continue
            for member_name, member in target.members.items():
                if member_name.startswith("_") or member.is_alias:
                    continue
                if not (member.is_function or "property" in member.labels):
                    continue
                if member.docstring is not None and member.docstring.value.strip():
                    continue
                if _is_hypothesis_step(member) or _documented_in_a_base(target, member_name):
                    continue
                missing.append(f"{path}.{name}.{member_name} (defined in {member.path})")
    return sorted(set(missing))


def load_statekeeper(search_path: str) -> griffe.Module:
    """Load the package the way the reference does, with this extension."""
    loader = griffe.GriffeLoader(
        search_paths=[search_path],
        extensions=griffe.load_extensions(StatekeeperDocstrings),
    )
    pkg = loader.load("statekeeper")
    loader.resolve_aliases(implicit=False, external=False)
    return pkg  # type: ignore[return-value]


__all__ = ["MIRRORS", "StatekeeperDocstrings", "load_statekeeper", "missing_docstrings"]
