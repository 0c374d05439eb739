"""The allowlist: which Enum, pydantic model and dataclass classes may be stored.

Built once, when the codec is built, from ``allowed_types`` (classes or
``"module:Qualname"`` strings, imported here and nowhere else). Decoding only looks
a class name up in :attr:`Allowlist.by_name`; it never imports anything.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, RootModel

from statekeeper.errors import InvalidOptions

__all__ = ["Allowed", "Allowlist", "type_name"]


def type_name(cls: type) -> str:
    """``"module:Qualname"``, the name a class tag carries."""
    return f"{cls.__module__}:{cls.__qualname__}"


@dataclasses.dataclass(frozen=True, slots=True)
class Allowed:
    """An allowlisted class and what the codec needs to know about it."""

    cls: type
    kind: str  # the tag: "enum", "model" or "dataclass"
    name: str  # "module:Qualname"
    fields: tuple[str, ...] = ()  # what to store: model or dataclass fields
    init: tuple[str, ...] = ()  # dataclass fields passed to __init__
    root: bool = False  # a pydantic RootModel


class Allowlist:
    """The allowed classes, by exact type (to encode) and by name (to decode)."""

    def __init__(self, allowed_types: Iterable[type | str]) -> None:
        if isinstance(allowed_types, str | type):
            raise InvalidOptions("allowed_types must be a list of classes or 'module:Qualname'")
        resolved: list[type] = []
        self.by_type: dict[type, Allowed] = {}
        self.by_name: dict[str, Allowed] = {}
        for item in allowed_types:
            cls = _resolve(item)
            if cls in self.by_type:
                continue
            entry = _allow(cls)
            if entry.name in self.by_name:
                raise InvalidOptions(f"two different allowed_types are both named {entry.name!r}")
            resolved.append(cls)
            self.by_type[cls] = self.by_name[entry.name] = entry
        self.types: tuple[type, ...] = tuple(resolved)


def _resolve(item: type | str) -> type:
    if isinstance(item, type):
        return item
    if not isinstance(item, str):
        raise InvalidOptions(f"allowed_types entries must be classes or strings, not {item!r}")
    module_name, _, qualname = item.partition(":")
    if not module_name or not qualname:
        raise InvalidOptions(f"allowed_types entry {item!r} must look like 'module:Qualname'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception as e:
        raise InvalidOptions(f"allowed_types entry {item!r} cannot be imported: {e}") from e
    if not isinstance(obj, type):
        raise InvalidOptions(f"allowed_types entry {item!r} is not a class")
    return obj


def _allow(cls: type) -> Allowed:
    name = type_name(cls)
    if issubclass(cls, enum.Enum):
        return Allowed(cls, "enum", name)
    if issubclass(cls, BaseModel):
        if issubclass(cls, RootModel):
            return Allowed(cls, "model", name, root=True)
        return Allowed(cls, "model", name, tuple(cls.model_fields))
    if dataclasses.is_dataclass(cls):
        fields = dataclasses.fields(cls)
        init = tuple(f.name for f in fields if f.init)
        return Allowed(cls, "dataclass", name, tuple(f.name for f in fields), init)
    raise InvalidOptions(
        f"allowed_types entry {type_name(cls)} is not an Enum, a pydantic model or a dataclass"
    )
