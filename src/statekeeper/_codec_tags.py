"""The tagged values of ``sk-json/1``: one encoder and one decoder per tag.

:mod:`statekeeper.codec` walks the value and owns the format's documentation, the
limits and the JSON parsing; this module says how each value that JSON has no
type for becomes a ``{"$sk": tag, ...}`` object and back: datetime, date, time,
timedelta, UUID, Decimal, bytes, tuple, set, frozenset, a dict with non-``str``
keys, NaN and infinities, and the allowlisted Enum members, pydantic models and
dataclasses. The encoders raise :class:`_Refuse` (the codec turns it into
:class:`~statekeeper.errors.CheckpointEncodeError` with the path); the decoders
raise :class:`~statekeeper.errors.CheckpointDecodeError`. Nothing here imports a
module or looks up a name taken from the data: a class tag is resolved only
through the codec's allowlist.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import inspect
import re
import uuid
from collections.abc import Callable, Iterable
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel, RootModel

from statekeeper.errors import CheckpointDecodeError, InvalidOptions

if TYPE_CHECKING:
    from statekeeper.codec import Codec

TAG = "$sk"

_MICROSECOND = timedelta(microseconds=1)
_NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
_VALIDATE_BY_NAME = "by_name" in inspect.signature(BaseModel.model_validate).parameters
_MISSING = object()
_V = frozenset({TAG, "v"})
_TV = frozenset({TAG, "t", "v"})
_FOLD = frozenset({"fold"})
_FOLD_TZ = frozenset({"fold", "tz"})
# IANA zone names; no dots, so a name can't become a module path inside zoneinfo.
_ZONE_KEY_RE = re.compile(r"[A-Za-z0-9_+-]{1,64}(?:/[A-Za-z0-9_+-]{1,64}){0,3}\Z")
_ZONES: dict[str, ZoneInfo] = {}
_OFFSET_US_RE = re.compile(r"([+-])(\d\d):(\d\d):(\d\d)\.(\d{6})\Z")
_NONE: frozenset[str] = frozenset()
_NOTHING: frozenset[type] = frozenset()


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Refuse(Exception):
    """Raised inside the encoder walk; collects the path while it unwinds."""

    def __init__(self, reason: str, *, depth: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.depth = depth
        self.path: list[str] = []
        self.ids: list[int] = []

    def at(self, step: str, container: object) -> None:
        self.path.append(step)
        self.ids.append(id(container))

    def message(self, root: str) -> str:
        reason = self.reason
        if self.depth and len(set(self.ids)) < len(self.ids):
            reason = "it contains a reference cycle (a container that contains itself)"
        steps = self.path[::-1]
        if len(steps) > 12:
            steps[6:-5] = ["..."]
        return f"cannot encode {root}{''.join(steps)}: {reason}"


@dataclasses.dataclass(frozen=True, slots=True)
class _Allowed:
    """An allowlisted class and what the codec needs to know about it."""

    cls: type
    kind: str  # the tag: "enum", "model" or "dataclass"
    name: str  # "module:Qualname"
    fields: tuple[str, ...] = ()  # what to store: model or dataclass fields
    init: tuple[str, ...] = ()  # dataclass fields passed to __init__
    root: bool = False  # a pydantic RootModel


def _bad(reason: str) -> CheckpointDecodeError:
    return CheckpointDecodeError(reason)


def _want(value: Any, kind: type, tag: str) -> Any:
    if type(value) is not kind:
        raise _bad(f"malformed {tag!r} tag: expected {kind.__name__}, got {type(value).__name__}")
    return value


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


def _allow(cls: type) -> _Allowed:
    name = _type_name(cls)
    if issubclass(cls, enum.Enum):
        return _Allowed(cls, "enum", name)
    if issubclass(cls, BaseModel):
        if issubclass(cls, RootModel):
            return _Allowed(cls, "model", name, root=True)
        return _Allowed(cls, "model", name, tuple(cls.model_fields))
    if dataclasses.is_dataclass(cls):
        fields = dataclasses.fields(cls)
        init = tuple(f.name for f in fields if f.init)
        return _Allowed(cls, "dataclass", name, tuple(f.name for f in fields), init)
    raise InvalidOptions(
        f"allowed_types entry {_type_name(cls)} is not an Enum, a pydantic model or a dataclass"
    )


# -- encoders ---------------------------------------------------------------


def _enc_class(codec: Codec, v: Any, entry: _Allowed, d: int, skip: frozenset[type]) -> Any:
    """An allowlisted Enum member, pydantic model or dataclass instance as its tag."""
    kind, tag_name = entry.kind, entry.name
    if kind == "enum":
        return {TAG: kind, "t": tag_name, "v": _enc_attr(codec, v, "value", v.value, d, skip)}
    if entry.root:
        return {TAG: kind, "t": tag_name, "v": _enc_attr(codec, v, "root", v.root, d, skip)}
    fields: dict[str, Any] = {}
    for name in entry.fields:
        field_value = getattr(v, name, _MISSING)
        if field_value is not _MISSING:
            fields[name] = field_value
    if kind == "model" and v.__pydantic_extra__:
        fields.update(v.__pydantic_extra__)
        if TAG in fields:  # an extra field named "$sk": let the dict rules handle it
            return {TAG: kind, "t": tag_name, "v": codec._enc(fields, d, skip)}
    if d + 1 > codec._max_depth:
        raise _Refuse(f"nested deeper than max_depth={codec._max_depth}", depth=True)
    encoded = {n: _enc_attr(codec, v, n, x, d + 1, skip) for n, x in fields.items()}
    return {TAG: kind, "t": tag_name, "v": encoded}


def _enc_attr(
    codec: Codec, owner: Any, name: str, value: Any, d: int, skip: frozenset[type]
) -> Any:
    try:
        return codec._enc(value, d, skip)
    except _Refuse as e:
        e.at(f".{name}", owner)
        raise


def _enc_items(
    codec: Codec, v: Iterable[Any], d: int, skip: frozenset[type], *, in_set: bool = False
) -> list[Any]:
    """A JSON array (one level below the tag object at depth ``d``) of ``v``'s items."""
    d += 1
    if d > codec._max_depth:
        raise _Refuse(f"nested deeper than max_depth={codec._max_depth}", depth=True)
    out: list[Any] = []
    x: Any = None
    try:
        for x in v:
            out.append(codec._enc(x, d, skip))
    except _Refuse as e:
        e.at(f"{{{_short(x)}}}" if in_set else f"[{len(out)}]", v)
        raise
    return out


def _enc_pairs(codec: Codec, v: dict[Any, Any], d: int, skip: frozenset[type]) -> dict[str, Any]:
    """A dict with a non-str or reserved key, as a list of [key, value] pairs."""
    if d + 2 > codec._max_depth:
        raise _Refuse(f"nested deeper than max_depth={codec._max_depth}", depth=True)
    pairs: list[list[Any]] = []
    k: Any = None
    try:
        for k, x in v.items():
            pairs.append([codec._enc(k, d + 2, skip), codec._enc(x, d + 2, skip)])
    except _Refuse as e:
        e.at(f"[{_short(k)}]", v)
        raise
    return {TAG: "dict", "v": pairs}


def _enc_nonfinite(codec: Codec, v: float, d: int) -> dict[str, str]:
    if not codec.limits.allow_nan:
        raise _Refuse(f"{v!r} is not allowed (allow_nan=False)")
    if d + 1 > codec._max_depth:
        raise _Refuse(f"nested deeper than max_depth={codec._max_depth}", depth=True)
    return {TAG: "float", "v": "nan" if v != v else ("inf" if v > 0 else "-inf")}


def _enc_decimal(codec: Codec, v: Decimal) -> dict[str, str]:
    if not v.is_finite() and not codec.limits.allow_nan:
        raise _Refuse(f"Decimal({str(v)!r}) is not allowed (allow_nan=False)")
    return {TAG: "decimal", "v": str(v)}


def _zone_key(tz: ZoneInfo) -> str | None:
    """``tz.key`` if ``ZoneInfo(tz.key)`` gives back this very object, else None."""
    key = tz.key
    if _ZONES.get(key) is tz:
        return key
    try:
        if not _ZONE_KEY_RE.match(key) or ZoneInfo(key) is not tz:
            return None
    except Exception:
        return None
    _ZONES[key] = tz
    return key


def _time_fields(v: datetime | time) -> dict[str, Any]:
    tz = v.tzinfo
    out: dict[str, Any] = {TAG: type(v).__name__, "v": v.isoformat()}
    if tz is not None:
        offset = v.utcoffset()
        if offset is None:
            raise _Refuse(f"{type(v).__name__} has a tzinfo without a UTC offset ({tz!r})")
        key = _zone_key(tz) if type(tz) is ZoneInfo and type(v) is datetime else None
        if key is not None:
            out["tz"] = key
        elif type(tz) is not timezone and v.replace(fold=1 - v.fold).utcoffset() != offset:
            # Python never finds such a time equal to one in another zone, and only
            # a fixed offset could be stored for this tzinfo.
            raise _Refuse(
                f"{v!r} is an ambiguous or skipped wall time in a zone that can only be "
                "stored as a fixed offset; use a ZoneInfo zone or a datetime.timezone"
            )
    if v.fold:
        out["fold"] = 1
    return out


# -- decoders ---------------------------------------------------------------


def _dec_nonfinite(codec: Codec, obj: dict[str, Any]) -> float:
    if not codec.limits.allow_nan:
        raise _bad("NaN and infinities are not allowed (allow_nan=False)")
    return _NONFINITE[_want(obj["v"], str, "float")]


def _dec_decimal(codec: Codec, obj: dict[str, Any]) -> Decimal:
    value = Decimal(_want(obj["v"], str, "decimal"))
    if not value.is_finite() and not codec.limits.allow_nan:
        raise _bad(f"Decimal({str(value)!r}) is not allowed (allow_nan=False)")
    return value


def _dec_class(codec: Codec, obj: dict[str, Any]) -> Any:
    kind, name, v = obj[TAG], obj["t"], obj["v"]
    entry = codec._by_name.get(name) if type(name) is str else None
    if entry is None:
        raise _bad(f"type {_short(name)} is not in allowed_types; add it there if you trust it")
    cls: Any = entry.cls
    if entry.kind != kind:
        raise _bad(f"{name} is not a {kind} (it is a {entry.kind})")
    if kind == "enum":
        result = cls(v)
    elif entry.root:
        result = cls.model_validate(v)
    else:
        fields = _want(v, dict, kind)
        if kind == "model":
            if _VALIDATE_BY_NAME:
                result = cls.model_validate(fields, by_alias=False, by_name=True)
            else:  # pragma: no cover - pydantic < 2.11
                result = cls.model_validate(fields)
        else:
            unknown = fields.keys() - set(entry.fields)
            if unknown:
                raise _bad(f"{name} has no fields {sorted(map(str, unknown))!r}")
            result = cls(**{k: fields[k] for k in entry.init if k in fields})
            for k in entry.fields:
                if k not in entry.init and k in fields:
                    object.__setattr__(result, k, fields[k])
    if type(result) is not cls:
        raise _bad(f"{name} decoded to a {type(result).__name__}")
    return result


def _dec_time(obj: dict[str, Any], parse: Callable[[str], Any]) -> Any:
    text = _want(obj["v"], str, obj[TAG])
    value = parse(text)
    offset = _OFFSET_US_RE.search(text)
    if offset:  # CPython 3.11 parses "+00:00:00.000001" as UTC; do it ourselves
        sign, h, m, s, us = offset.groups()
        delta = timedelta(hours=int(h), minutes=int(m), seconds=int(s), microseconds=int(us))
        value = value.replace(tzinfo=timezone(-delta if sign == "-" else delta))
    if "tz" in obj:
        key = _want(obj["tz"], str, obj[TAG])
        if not _ZONE_KEY_RE.match(key):
            raise _bad(f"malformed 'datetime' tag: bad time zone name {_short(key)}")
        value = value.replace(tzinfo=ZoneInfo(key))
    if "fold" in obj:
        if _want(obj["fold"], int, obj[TAG]) != 1:
            raise _bad(f"malformed {obj[TAG]!r} tag: fold must be 1")
        value = value.replace(fold=1)
    return value


def _dec_items(obj: dict[str, Any], make: Callable[[list[Any]], Any]) -> Any:
    items = _want(obj["v"], list, obj[TAG])
    result = make(items)
    if len(result) != len(items):
        raise _bad(f"malformed {obj[TAG]!r} tag: repeated items")
    return result


def _dec_pairs(obj: dict[str, Any]) -> Any:
    pairs = _want(obj["v"], list, "dict")
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2:
            raise _bad("malformed 'dict' tag: expected [key, value] pairs")
    return _dec_items(obj, dict)


# -- the tables the codec dispatches on --------------------------------------

# Leaf tags by exact type; tuple, set, frozenset, dict and float are tagged by the
# codec walk itself, class tags through the allowlist.
_LEAF_ENCODERS: dict[type, Callable[[Codec, Any], dict[str, Any]]] = {
    datetime: lambda _, v: _time_fields(v),
    time: lambda _, v: _time_fields(v),
    date: lambda _, v: {TAG: "date", "v": v.isoformat()},
    timedelta: lambda c, v: {TAG: "timedelta", "v": c._enc(v // _MICROSECOND, 0, _NOTHING)},
    uuid.UUID: lambda _, v: {TAG: "uuid", "v": str(v)},
    Decimal: _enc_decimal,
    bytes: lambda _, v: {TAG: "bytes", "v": base64.b64encode(v).decode("ascii")},
}

# Tag name -> (required keys, optional keys, decoder).
_DECODERS: dict[
    str, tuple[frozenset[str], frozenset[str], Callable[[Codec, dict[str, Any]], Any]]
] = {
    "datetime": (_V, _FOLD_TZ, lambda _, o: _dec_time(o, datetime.fromisoformat)),
    "time": (_V, _FOLD, lambda _, o: _dec_time(o, time.fromisoformat)),
    "date": (_V, _NONE, lambda _, o: date.fromisoformat(_want(o["v"], str, "date"))),
    "timedelta": (_V, _NONE, lambda _, o: timedelta(microseconds=_want(o["v"], int, "timedelta"))),
    "uuid": (_V, _NONE, lambda _, o: uuid.UUID(_want(o["v"], str, "uuid"))),
    "decimal": (_V, _NONE, _dec_decimal),
    "bytes": (_V, _NONE, lambda _, o: base64.b64decode(_want(o["v"], str, "bytes"), validate=True)),
    "tuple": (_V, _NONE, lambda _, o: tuple(_want(o["v"], list, "tuple"))),
    "set": (_V, _NONE, lambda _, o: _dec_items(o, set)),
    "frozenset": (_V, _NONE, lambda _, o: _dec_items(o, frozenset)),
    "dict": (_V, _NONE, lambda _, o: _dec_pairs(o)),
    "float": (_V, _NONE, _dec_nonfinite),
    "enum": (_TV, _NONE, _dec_class),
    "model": (_TV, _NONE, _dec_class),
    "dataclass": (_TV, _NONE, _dec_class),
}
