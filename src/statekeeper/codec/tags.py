"""The tagged values of ``sk-json/1``: one encoder and one decoder per tag.

:mod:`~statekeeper.codec.encode` and :mod:`~statekeeper.codec.decode` walk the value
and own the limits and the JSON parsing; this module says how each value that JSON
has no type for becomes a ``{"$sk": tag, ...}`` object and back: datetime, date,
time, timedelta, UUID, Decimal, bytes, tuple, set, frozenset, a dict with non-``str``
keys, NaN and infinities, and the allowlisted Enum members, pydantic models and
dataclasses. The encoders raise :class:`Refuse` (the encoder turns it into
:class:`~statekeeper.errors.CheckpointEncodeError` with the path); the decoders
raise :class:`~statekeeper.errors.CheckpointDecodeError`. Nothing here imports a
module or looks up a name taken from the data: a class tag is resolved only
through the codec's allowlist.

The walks are passed in, as the two small protocols :class:`Walk` and
:class:`Lookup` describe them, so this module imports neither of them.
"""

from __future__ import annotations

import base64
import inspect
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from pydantic import BaseModel

from statekeeper.codec.allowlist import Allowed
from statekeeper.errors import CheckpointDecodeError

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
NOTHING: frozenset[type] = frozenset()


def short(value: Any) -> str:
    """``repr(value)``, cut to 40 characters, for error messages."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Refuse(Exception):
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


def bad(reason: str) -> CheckpointDecodeError:
    """The decode error for ``reason`` (the decoders raise it)."""
    return CheckpointDecodeError(reason)


def _want(value: Any, kind: type, tag: str) -> Any:
    if type(value) is not kind:
        raise bad(f"malformed {tag!r} tag: expected {kind.__name__}, got {type(value).__name__}")
    return value


class Walk(Protocol):
    """What a tag's encoder needs of the encoder walk."""

    max_depth: int
    allow_nan: bool

    def walk(self, v: Any, d: int, skip: frozenset[type]) -> Any:
        """The JSON-native form of ``v`` at depth ``d`` (see ``Encoder.walk``)."""
        ...


class Lookup(Protocol):
    """What a tag's decoder needs of the decoder."""

    @property
    def allow_nan(self) -> bool:
        """Whether NaN and infinities are allowed (``CodecLimits.allow_nan``)."""
        ...

    @property
    def by_name(self) -> Mapping[str, Allowed]:
        """The allowlisted classes by ``"module:Qualname"``."""
        ...


# -- encoders ---------------------------------------------------------------


def enc_class(codec: Walk, v: Any, entry: Allowed, d: int, skip: frozenset[type]) -> Any:
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
    if kind == "model" and v.model_extra:
        fields.update(v.model_extra)
        if TAG in fields:  # an extra field named "$sk": let the dict rules handle it
            return {TAG: kind, "t": tag_name, "v": codec.walk(fields, d, skip)}
    if d + 1 > codec.max_depth:
        raise Refuse(f"nested deeper than max_depth={codec.max_depth}", depth=True)
    encoded = {n: _enc_attr(codec, v, n, x, d + 1, skip) for n, x in fields.items()}
    return {TAG: kind, "t": tag_name, "v": encoded}


def _enc_attr(codec: Walk, owner: Any, name: str, value: Any, d: int, skip: frozenset[type]) -> Any:
    try:
        return codec.walk(value, d, skip)
    except Refuse as e:
        e.at(f".{name}", owner)
        raise


def enc_items(
    codec: Walk, v: Iterable[Any], d: int, skip: frozenset[type], *, in_set: bool = False
) -> list[Any]:
    """A JSON array (one level below the tag object at depth ``d``) of ``v``'s items."""
    d += 1
    if d > codec.max_depth:
        raise Refuse(f"nested deeper than max_depth={codec.max_depth}", depth=True)
    out: list[Any] = []
    x: Any = None
    try:
        for x in v:
            out.append(codec.walk(x, d, skip))
    except Refuse as e:
        e.at(f"{{{short(x)}}}" if in_set else f"[{len(out)}]", v)
        raise
    return out


def enc_pairs(codec: Walk, v: dict[Any, Any], d: int, skip: frozenset[type]) -> dict[str, Any]:
    """A dict with a non-str or reserved key, as a list of [key, value] pairs."""
    if d + 2 > codec.max_depth:
        raise Refuse(f"nested deeper than max_depth={codec.max_depth}", depth=True)
    pairs: list[list[Any]] = []
    k: Any = None
    try:
        for k, x in v.items():
            pairs.append([codec.walk(k, d + 2, skip), codec.walk(x, d + 2, skip)])
    except Refuse as e:
        e.at(f"[{short(k)}]", v)
        raise
    return {TAG: "dict", "v": pairs}


def enc_nonfinite(codec: Walk, v: float, d: int) -> dict[str, str]:
    if not codec.allow_nan:
        raise Refuse(f"{v!r} is not allowed (allow_nan=False)")
    if d + 1 > codec.max_depth:
        raise Refuse(f"nested deeper than max_depth={codec.max_depth}", depth=True)
    return {TAG: "float", "v": "nan" if v != v else ("inf" if v > 0 else "-inf")}


def _enc_decimal(codec: Walk, v: Decimal) -> dict[str, str]:
    if not v.is_finite() and not codec.allow_nan:
        raise Refuse(f"Decimal({str(v)!r}) is not allowed (allow_nan=False)")
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
            raise Refuse(f"{type(v).__name__} has a tzinfo without a UTC offset ({tz!r})")
        key = _zone_key(tz) if type(tz) is ZoneInfo and type(v) is datetime else None
        if key is not None:
            out["tz"] = key
        elif type(tz) is not timezone and v.replace(fold=1 - v.fold).utcoffset() != offset:
            # Python never finds such a time equal to one in another zone, and only
            # a fixed offset could be stored for this tzinfo.
            raise Refuse(
                f"{v!r} is an ambiguous or skipped wall time in a zone that can only be "
                "stored as a fixed offset; use a ZoneInfo zone or a datetime.timezone"
            )
    if v.fold:
        out["fold"] = 1
    return out


# -- decoders ---------------------------------------------------------------


def _dec_nonfinite(codec: Lookup, obj: dict[str, Any]) -> float:
    if not codec.allow_nan:
        raise bad("NaN and infinities are not allowed (allow_nan=False)")
    return _NONFINITE[_want(obj["v"], str, "float")]


def _dec_decimal(codec: Lookup, obj: dict[str, Any]) -> Decimal:
    value = Decimal(_want(obj["v"], str, "decimal"))
    if not value.is_finite() and not codec.allow_nan:
        raise bad(f"Decimal({str(value)!r}) is not allowed (allow_nan=False)")
    return value


def _dec_class(codec: Lookup, obj: dict[str, Any]) -> Any:
    kind, name, v = obj[TAG], obj["t"], obj["v"]
    entry = codec.by_name.get(name) if type(name) is str else None
    if entry is None:
        raise bad(f"type {short(name)} is not in allowed_types; add it there if you trust it")
    cls: Any = entry.cls
    if entry.kind != kind:
        raise bad(f"{name} is not a {kind} (it is a {entry.kind})")
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
                raise bad(f"{name} has no fields {sorted(map(str, unknown))!r}")
            result = cls(**{k: fields[k] for k in entry.init if k in fields})
            for k in entry.fields:
                if k not in entry.init and k in fields:
                    object.__setattr__(result, k, fields[k])
    if type(result) is not cls:
        raise bad(f"{name} decoded to a {type(result).__name__}")
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
            raise bad(f"malformed 'datetime' tag: bad time zone name {short(key)}")
        value = value.replace(tzinfo=ZoneInfo(key))
    if "fold" in obj:
        if _want(obj["fold"], int, obj[TAG]) != 1:
            raise bad(f"malformed {obj[TAG]!r} tag: fold must be 1")
        value = value.replace(fold=1)
    return value


def _dec_items(obj: dict[str, Any], make: Callable[[list[Any]], Any]) -> Any:
    items = _want(obj["v"], list, obj[TAG])
    result = make(items)
    if len(result) != len(items):
        raise bad(f"malformed {obj[TAG]!r} tag: repeated items")
    return result


def _dec_pairs(obj: dict[str, Any]) -> Any:
    pairs = _want(obj["v"], list, "dict")
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2:
            raise bad("malformed 'dict' tag: expected [key, value] pairs")
    return _dec_items(obj, dict)


# -- the tables the codec dispatches on --------------------------------------

# Leaf tags by exact type; tuple, set, frozenset, dict and float are tagged by the
# encoder walk itself, class tags through the allowlist.
LEAF_ENCODERS: dict[type, Callable[[Walk, Any], dict[str, Any]]] = {
    datetime: lambda _, v: _time_fields(v),
    time: lambda _, v: _time_fields(v),
    date: lambda _, v: {TAG: "date", "v": v.isoformat()},
    timedelta: lambda c, v: {TAG: "timedelta", "v": c.walk(v // _MICROSECOND, 0, NOTHING)},
    uuid.UUID: lambda _, v: {TAG: "uuid", "v": str(v)},
    Decimal: _enc_decimal,
    bytes: lambda _, v: {TAG: "bytes", "v": base64.b64encode(v).decode("ascii")},
}

# Tag name -> (required keys, optional keys, decoder).
DECODERS: dict[
    str, tuple[frozenset[str], frozenset[str], Callable[[Lookup, dict[str, Any]], Any]]
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
