"""The checkpoint codec ``sk-json/1``: JSON plus tagged values, with an allowlist.

This module is the only place that turns state into bytes and back. There is no
pickle: decoding never imports a module, never looks up an attribute by a name taken
from the data, and calls only the classes listed in ``allowed_types``.

Format
======

One UTF-8 JSON document, compact, without NaN tokens. ``dict`` with ``str`` keys,
``list``, ``str``, ``int``, ``float``, ``bool`` and ``None`` are themselves; every
other value is a *tagged value*, a JSON object whose reserved key ``"$sk"`` names
the tag:

=============  ================================================================
``datetime``   ``{"$sk":"datetime","v":"2026-01-01T00:00:00.000001+00:00"}``,
               plus ``"fold":1`` when ``fold`` is set and ``"tz"`` (below)
``date``       ``{"$sk":"date","v":"2026-01-01"}``
``time``       ``{"$sk":"time","v":"12:30:00+02:00"}`` (and ``"fold":1``)
``timedelta``  ``{"$sk":"timedelta","v":86400000000}``: total microseconds
``uuid``       ``{"$sk":"uuid","v":"1b4e28ba-2fa1-11d2-883f-0016d3cca427"}``
``decimal``    ``{"$sk":"decimal","v":"-1.50E+3"}``: ``str()``, exact
``bytes``      ``{"$sk":"bytes","v":"AAEC"}``: standard base64
``tuple``      ``{"$sk":"tuple","v":[1,2]}``; ``set`` and ``frozenset`` alike
``dict``       ``{"$sk":"dict","v":[[1,"a"],[[2,3],"b"]]}``: ``[key, value]``
               pairs, for a dict with a non-``str`` key or a ``"$sk"`` key of its
               own, so user data is never mistaken for a tag
``float``      ``{"$sk":"float","v":"nan"}`` (``"inf"``, ``"-inf"``), only with
               ``allow_nan``
``enum``       ``{"$sk":"enum","t":"app.models:Color","v":1}``: the member's
               value, decoded as ``Color(1)``
``model``      ``{"$sk":"model","t":"app.models:Order","v":{"id":1}}``: fields by
               name (and extras), decoded with ``Order.model_validate`` so
               validators run; for a ``RootModel`` ``"v"`` is the root value
``dataclass``  ``{"$sk":"dataclass","t":"app.models:Point","v":{"x":1}}``: every
               field; decoded by calling the class with the ``init`` fields,
               then setting the others
=============  ================================================================

Types are exact: whatever ``encode`` accepts comes back ``==`` with the same type
at every level. Subclasses of the builtins (``IntEnum`` without the allowlist, a
``str`` subclass, ``OrderedDict``, ``defaultdict``) are refused, never downgraded.
Sets are written in iteration order.

Time zones: a ``datetime`` whose tzinfo is a ``ZoneInfo`` keeps its zone by name,
``{"$sk":"datetime","v":"2026-11-01T01:30:00-05:00","tz":"America/New_York","fold":1}``,
and comes back with that very ``ZoneInfo`` (wall time, zone and fold win over the
offset if the tz database changed). Names must have the IANA syntax and are loaded
by ``zoneinfo``: data, never code. Any other tzinfo (``timezone``, pytz, dateutil,
``ZoneInfo.no_cache``, every ``time``) is stored as its fixed UTC offset and comes
back ``==`` with a ``datetime.timezone``; an ambiguous or skipped wall time in such
a zone is refused, since Python never finds it equal to its fixed-offset copy, and
so is a tzinfo whose ``utcoffset()`` is ``None``.

The allowlist
=============

Enum members (``IntEnum``, ``StrEnum``, ``Flag`` too), pydantic v2 models and
dataclass instances carry their class as ``"module:Qualname"`` and are encoded and
decoded only if that exact class is in ``allowed_types``, given as classes or as
``"module:Qualname"`` strings (imported once, when the codec is built). At decode
time a name is only looked up in that list: a tag naming ``"os:system"`` is a
:class:`~statekeeper.errors.CheckpointDecodeError`.

Limits and NaN
==============

:class:`CodecLimits`, defaults in :data:`DEFAULT_LIMITS`:

- ``max_depth=100`` (at most 500): nesting of JSON arrays and objects in the
  document. A tag is an object, so it counts one level; a ``tuple``, ``set`` or
  ``frozenset`` tag counts two and a ``dict`` tag three.
- ``max_bytes=16 MiB``: the size of the document, checked before parsing.
- ``max_int_digits=4300``: decimal digits of any ``int``, as in Python's own limit.
- ``allow_nan=False``: NaN and infinities (``float`` and ``Decimal``) are refused
  both ways. With ``True`` they round-trip as tags, and ``NaN``/``Infinity``
  tokens written by other tools are accepted too.

Save/load symmetry (S5): ``encode`` raises
:class:`~statekeeper.errors.CheckpointEncodeError`, naming the part
(``state['a'][3]``), for exactly what ``decode`` would refuse: a class off the
allowlist, an unsupported type, a limit, NaN, a lone surrogate (not UTF-8), a
reference cycle. ``decode`` raises :class:`~statekeeper.errors.CheckpointDecodeError`
and nothing else: invalid UTF-8 or JSON, duplicate keys, a limit, a bad tag.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import inspect
import json
import re
import sys
import uuid
from collections.abc import Callable, Iterable
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from itertools import accumulate
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field, RootModel

from statekeeper.errors import CheckpointDecodeError, CheckpointEncodeError, InvalidOptions

__all__ = ["DEFAULT_LIMITS", "Codec", "CodecLimits"]

TAG = "$sk"


class CodecLimits(BaseModel):
    """Limits that ``encode`` and ``decode`` enforce alike (see the module docs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_depth: int = Field(default=100, ge=1, le=500)
    max_bytes: int = Field(default=16 * 1024 * 1024, ge=1)
    max_int_digits: int = Field(default=4300, ge=1)
    allow_nan: bool = False


DEFAULT_LIMITS = CodecLimits()

# Strings are removed before counting brackets. The pattern also matches an
# unterminated string to the end of the text, so it can never fail and backtrack.
_STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# Escapes, tokenised left to right; a surrogate escape that is not half of a pair
# would decode to a string that is not valid UTF-8.
_ESCAPE_RE = re.compile(
    r"\\(?:u(?P<hi>[dD][89abAB][0-9a-fA-F]{2})(?P<lo>\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
    r"|u(?P<lone>[dD][c-fC-F][0-9a-fA-F]{2})|.)",
    re.S,
)
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
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
_STR = frozenset({str})
_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})
_SCALARS_NOT_INT: frozenset[type] = frozenset({str, float, bool, type(None)})
_NOTHING: frozenset[type] = frozenset()


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_depth(text: str) -> int:
    """Deepest nesting of arrays and objects in ``text`` (exact for valid JSON)."""
    skeleton = _STRING_RE.sub("", text).encode("utf-8", "surrogatepass")
    steps = skeleton.translate(_BRACKET_STEPS, _NOT_BRACKETS)
    return max(accumulate(memoryview(steps).cast("b")), default=0)


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


class Codec:
    """JSON plus tagged values, restricted to ``allowed_types`` and ``limits``.

    Instances are immutable and safe to share between tasks and threads.
    """

    name: ClassVar[str] = "sk-json/1"

    def __init__(
        self, *, allowed_types: Iterable[type | str] = (), limits: CodecLimits | None = None
    ) -> None:
        self.limits = DEFAULT_LIMITS if limits is None else limits
        if not isinstance(self.limits, CodecLimits):
            raise InvalidOptions(f"limits must be a CodecLimits, not {type(limits).__name__}")
        if isinstance(allowed_types, str | type):
            raise InvalidOptions("allowed_types must be a list of classes or 'module:Qualname'")
        resolved: list[type] = []
        self._by_type: dict[type, _Allowed] = {}
        self._by_name: dict[str, _Allowed] = {}
        for item in allowed_types:
            cls = _resolve(item)
            if cls in self._by_type:
                continue
            entry = _allow(cls)
            if entry.name in self._by_name:
                raise InvalidOptions(f"two different allowed_types are both named {entry.name!r}")
            resolved.append(cls)
            self._by_type[cls] = self._by_name[entry.name] = entry
        self.allowed_types: tuple[type, ...] = tuple(resolved)
        lim = self.limits
        self._max_depth = lim.max_depth
        self._digits = lim.max_int_digits
        self._ihi = 10**lim.max_int_digits
        self._ilo = -self._ihi
        self._json = json.JSONEncoder(
            ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
        )
        nonfinite: dict[str, Any] = {}
        if not lim.allow_nan:
            nonfinite = {"parse_constant": self._nan_token, "parse_float": self._finite_float}
        hook = self._object
        self._decoder = json.JSONDecoder(object_pairs_hook=hook, **nonfinite)
        self._int_decoder = json.JSONDecoder(
            object_pairs_hook=hook, parse_int=self._int, **nonfinite
        )

    def __repr__(self) -> str:
        names = [_type_name(cls) for cls in self.allowed_types]
        return f"Codec(allowed_types={names!r}, limits={self.limits!r})"

    # -- encoding -------------------------------------------------------------

    def encode(self, value: Any) -> bytes:
        """Encode ``value`` to UTF-8 JSON, or raise ``CheckpointEncodeError``."""
        return self._encode(value, "state")

    def check_metadata(self, value: Any) -> dict[str, Any]:
        """Return ``value`` if it is valid metadata, else raise ``CheckpointEncodeError``.

        Metadata is a ``dict`` with ``str`` keys whose values are plain JSON (exact
        ``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``, ``None``), under the
        same limits as state. Tuples are refused rather than turned into lists, and the
        reserved key ``"$sk"`` is refused, so metadata round-trips exactly both through
        this codec and through any plain JSON library.
        """
        if type(value) is not dict:
            raise CheckpointEncodeError(f"metadata must be a dict, not {type(value).__name__}")
        data = self._encode(value, "metadata")
        if b'"$sk":' in data:  # quotes inside strings are escaped, so this is a tag
            found = _first_tag(json.loads(data), "metadata")
            if found:
                raise CheckpointEncodeError(
                    f"cannot encode {found[0]}: metadata must be plain JSON (dict with str keys "
                    f"other than {TAG!r}, list, str, int, float, bool, None), not {found[1]}"
                )
        return value

    def _encode(self, value: Any, root: str) -> bytes:
        # Containers of plain scalars are handed to json as they are; json itself then
        # refuses NaN and (when Python's limit is ours) over-long ints, and only then
        # do we walk again checking every scalar, for the path and for NaN tags.
        limit = sys.get_int_max_str_digits()
        skip = _SCALARS if 0 < limit <= self.limits.max_int_digits else _SCALARS_NOT_INT
        try:
            try:
                text = self._json.encode(self._enc(value, 0, skip))
            except ValueError:
                text = self._json.encode(self._enc(value, 0, _NOTHING))
            data = text.encode("utf-8")
        except _Refuse as e:
            raise CheckpointEncodeError(e.message(root)) from None
        except UnicodeEncodeError:
            where = _find_surrogate(value, root, self._max_depth) or root
            raise CheckpointEncodeError(
                f"cannot encode {where}: the string contains a lone surrogate, "
                "which is not valid UTF-8"
            ) from None
        except RecursionError:
            raise CheckpointEncodeError(
                f"cannot encode {root}: nested too deeply for the interpreter's recursion limit"
            ) from None
        except Exception as e:  # a user class misbehaving, an int over sys limits, ...
            raise CheckpointEncodeError(f"cannot encode {root}: {type(e).__name__}: {e}") from e
        if len(data) > self.limits.max_bytes:
            raise CheckpointEncodeError(
                f"cannot encode {root}: it is {len(data)} bytes encoded, "
                f"over max_bytes={self.limits.max_bytes}"
            )
        return data

    def _enc(self, v: Any, d: int, skip: frozenset[type]) -> Any:
        """The JSON-native form of ``v``; ``d`` counts the JSON containers around it.

        A list or str-keyed dict whose items all have a type in ``skip`` is returned
        as it is, unchecked (``skip.issuperset(map(type, ...))`` runs in C).
        """
        t = type(v)
        # dict and list first and inline: one Python frame per level, no call per scalar.
        if t is dict or t is list:
            d += 1
            if d > self._max_depth:
                raise _Refuse(f"nested deeper than max_depth={self._max_depth}", depth=True)
            if t is dict:
                if TAG in v or not _STR.issuperset(map(type, v)):
                    return self._enc_pairs(v, d, skip)
                if skip.issuperset(map(type, v.values())):
                    return v
                pairs: Iterable[tuple[Any, Any]] = v.items()
            elif skip.issuperset(map(type, v)):
                return v
            else:
                pairs = enumerate(v)
            lo, hi, enc = self._ilo, self._ihi, self._enc
            out: list[Any] = []
            k: Any = None
            try:
                for k, x in pairs:  # noqa: B007 - k is read by the except clause
                    tx = type(x)
                    if (
                        tx is str
                        or tx is bool
                        or x is None
                        or (tx is int and lo < x < hi)
                        or (tx is float and x - x == 0.0)
                    ):
                        out.append(x)
                    else:
                        out.append(enc(x, d, skip))
            except _Refuse as e:
                e.at(f"[{_short(k)}]", v)
                raise
            return dict(zip(v, out, strict=True)) if t is dict else out
        if t is str or t is bool or v is None:
            return v
        if t is int:
            if self._ilo < v < self._ihi:
                return v
            raise _Refuse(f"an int has more than max_int_digits={self._digits} digits")
        if t is float:
            return v if v - v == 0.0 else self._enc_nonfinite(v, d)
        d += 1
        if d > self._max_depth:
            raise _Refuse(f"nested deeper than max_depth={self._max_depth}", depth=True)
        if t is tuple:
            return {TAG: "tuple", "v": self._enc_items(v, d, skip)}
        if t is set or t is frozenset:
            return {TAG: t.__name__, "v": self._enc_items(v, d, skip, in_set=True)}
        leaf = _LEAF_ENCODERS.get(t)
        if leaf is not None:
            return leaf(self, v)
        entry = self._by_type.get(t)
        if entry is None:
            raise _Refuse(_why_unsupported(v))
        kind, tag_name = entry.kind, entry.name
        if kind == "enum":
            return {TAG: kind, "t": tag_name, "v": self._enc_attr(v, "value", v.value, d, skip)}
        if entry.root:
            return {TAG: kind, "t": tag_name, "v": self._enc_attr(v, "root", v.root, d, skip)}
        fields: dict[str, Any] = {}
        for name in entry.fields:
            field_value = getattr(v, name, _MISSING)
            if field_value is not _MISSING:
                fields[name] = field_value
        if kind == "model" and v.__pydantic_extra__:
            fields.update(v.__pydantic_extra__)
            if TAG in fields:  # an extra field named "$sk": let the dict rules handle it
                return {TAG: kind, "t": tag_name, "v": self._enc(fields, d, skip)}
        if d + 1 > self._max_depth:
            raise _Refuse(f"nested deeper than max_depth={self._max_depth}", depth=True)
        encoded = {n: self._enc_attr(v, n, x, d + 1, skip) for n, x in fields.items()}
        return {TAG: kind, "t": tag_name, "v": encoded}

    def _enc_attr(self, owner: Any, name: str, value: Any, d: int, skip: frozenset[type]) -> Any:
        try:
            return self._enc(value, d, skip)
        except _Refuse as e:
            e.at(f".{name}", owner)
            raise

    def _enc_items(
        self, v: Iterable[Any], d: int, skip: frozenset[type], *, in_set: bool = False
    ) -> list[Any]:
        """A JSON array (one level below the tag object at depth ``d``) of ``v``'s items."""
        d += 1
        if d > self._max_depth:
            raise _Refuse(f"nested deeper than max_depth={self._max_depth}", depth=True)
        out: list[Any] = []
        x: Any = None
        try:
            for x in v:
                out.append(self._enc(x, d, skip))
        except _Refuse as e:
            e.at(f"{{{_short(x)}}}" if in_set else f"[{len(out)}]", v)
            raise
        return out

    def _enc_pairs(self, v: dict[Any, Any], d: int, skip: frozenset[type]) -> dict[str, Any]:
        """A dict with a non-str or reserved key, as a list of [key, value] pairs."""
        if d + 2 > self._max_depth:
            raise _Refuse(f"nested deeper than max_depth={self._max_depth}", depth=True)
        pairs: list[list[Any]] = []
        k: Any = None
        try:
            for k, x in v.items():
                pairs.append([self._enc(k, d + 2, skip), self._enc(x, d + 2, skip)])
        except _Refuse as e:
            e.at(f"[{_short(k)}]", v)
            raise
        return {TAG: "dict", "v": pairs}

    def _enc_nonfinite(self, v: float, d: int) -> dict[str, str]:
        if not self.limits.allow_nan:
            raise _Refuse(f"{v!r} is not allowed (allow_nan=False)")
        if d + 1 > self._max_depth:
            raise _Refuse(f"nested deeper than max_depth={self._max_depth}", depth=True)
        return {TAG: "float", "v": "nan" if v != v else ("inf" if v > 0 else "-inf")}

    def _enc_decimal(self, v: Decimal) -> dict[str, str]:
        if not v.is_finite() and not self.limits.allow_nan:
            raise _Refuse(f"Decimal({str(v)!r}) is not allowed (allow_nan=False)")
        return {TAG: "decimal", "v": str(v)}

    # -- decoding -------------------------------------------------------------

    def decode(self, data: bytes | str) -> Any:
        """Decode what ``encode`` produced, or raise ``CheckpointDecodeError``."""
        limits = self.limits
        python_digits = sys.get_int_max_str_digits()
        try:
            if isinstance(data, str):
                text = data
                if len(text) > limits.max_bytes:
                    raise _bad(f"the record is over max_bytes={limits.max_bytes}")
                if not text.isascii():
                    size = len(text.encode("utf-8"))  # also refuses lone surrogates
                    if size > limits.max_bytes:
                        raise _bad(f"the record is {size} bytes, over max_bytes={limits.max_bytes}")
            elif isinstance(data, bytes | bytearray | memoryview):
                raw = bytes(data)
                if len(raw) > limits.max_bytes:
                    raise _bad(f"the record is {len(raw)} bytes, over max_bytes={limits.max_bytes}")
                text = raw.decode("utf-8")
            else:
                raise _bad(f"expected bytes or str, got {type(data).__name__}")
            if text.count("[") + text.count("{") > self._max_depth:
                depth = _json_depth(text)
                if depth > self._max_depth:
                    raise _bad(f"nested {depth} deep, over max_depth={self._max_depth}")
            if "\\ud" in text or "\\uD" in text:
                _check_escapes(text)
            # Python's own int() limit is checked before any conversion work; use our
            # parse_int only when our limit is the tighter one.
            if 0 < python_digits <= limits.max_int_digits:
                return self._decoder.decode(text)
            return self._int_decoder.decode(text)
        except CheckpointDecodeError:
            raise
        except json.JSONDecodeError as e:
            raise CheckpointDecodeError(
                f"invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
            ) from e
        except UnicodeError as e:
            raise CheckpointDecodeError(f"not valid UTF-8: {e}") from e
        except RecursionError as e:
            raise CheckpointDecodeError("nested too deeply to decode") from e
        except Exception as e:  # MemoryError, int() limits, ...: never let anything else out
            if isinstance(e, ValueError) and "integer string conversion" in str(e):
                limit = f"max_int_digits={limits.max_int_digits}"
                if python_digits < limits.max_int_digits:
                    limit = f"{python_digits} (sys.get_int_max_str_digits())"
                raise CheckpointDecodeError(f"an int has more than {limit} digits") from e
            raise CheckpointDecodeError(f"{type(e).__name__}: {e}") from e

    def decode_plain(self, obj: Any) -> Any:
        """Decode an already parsed JSON value (say from a JSONB column).

        ``obj`` must be JSON-native (``dict`` with ``str`` keys, ``list``, ``str``,
        ``int``, ``float``, ``bool``, ``None``). Tags, depth, int digits and NaN are
        checked as in :meth:`decode`; the byte size is not (there are no bytes).
        ``decode_plain(json.loads(encode(v))) == v``.
        """
        try:
            return self._plain(obj, 0)
        except CheckpointDecodeError:
            raise
        except RecursionError as e:
            raise CheckpointDecodeError("nested too deeply to decode") from e
        except Exception as e:
            raise CheckpointDecodeError(f"{type(e).__name__}: {e}") from e

    def _plain(self, v: Any, d: int) -> Any:
        t = type(v)
        if t is str:
            if not v.isascii() and _SURROGATE_RE.search(v):
                raise _bad("a string contains a lone surrogate (not valid UTF-8)")
            return v
        if t is bool or v is None:
            return v
        if t is int:
            if self._ilo < v < self._ihi:
                return v
            raise _bad(f"an int has more than max_int_digits={self.limits.max_int_digits} digits")
        if t is float:
            return v if v - v == 0.0 else self._nan_token(repr(v))
        d += 1
        if d > self._max_depth:
            raise _bad(f"nested deeper than max_depth={self._max_depth}")
        if t is list:
            return [self._plain(x, d) for x in v]
        if t is dict:
            if not all(type(k) is str for k in v):
                raise _bad("not a JSON value: a dict key is not a str")
            return self._object([(self._plain(k, d), self._plain(x, d)) for k, x in v.items()])
        raise _bad(f"not a JSON value: {_type_name(t)}")

    def _nan_token(self, token: str) -> float:
        if not self.limits.allow_nan:
            raise _bad(f"{token} is not allowed (allow_nan=False)")
        return float(token)

    def _finite_float(self, token: str) -> float:
        value = float(token)
        if value - value != 0.0:
            raise _bad(f"{token[:20]} overflows to infinity (allow_nan=False)")
        return value

    def _int(self, token: str) -> int:
        if len(token) - (token[0] == "-") > self.limits.max_int_digits:
            raise _bad(f"an int has more than max_int_digits={self.limits.max_int_digits} digits")
        return int(token)

    def _object(self, pairs: list[tuple[Any, Any]]) -> Any:
        """``object_pairs_hook``: duplicate keys and tags, bottom-up."""
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[Any] = set()
            for key, _ in pairs:
                if key in seen:
                    raise _bad(f"duplicate key {_short(key)} in a JSON object")
                seen.add(key)
        if TAG not in obj:
            return obj
        tag = obj[TAG]
        spec = _DECODERS.get(tag) if type(tag) is str else None
        if spec is None:
            raise _bad(f"unknown tag {_short(tag)}")
        required, optional, decoder = spec
        keys = obj.keys()
        if not (required <= keys and keys <= required | optional):
            raise _bad(f"malformed {tag!r} tag: keys {sorted(keys)!r}")
        try:
            return decoder(self, obj)
        except CheckpointDecodeError:
            raise
        except Exception as e:
            raise _bad(f"malformed {tag!r} tag: {type(e).__name__}: {e}") from e

    def _dec_nonfinite(self, obj: dict[str, Any]) -> float:
        if not self.limits.allow_nan:
            raise _bad("NaN and infinities are not allowed (allow_nan=False)")
        return _NONFINITE[_want(obj["v"], str, "float")]

    def _dec_decimal(self, obj: dict[str, Any]) -> Decimal:
        value = Decimal(_want(obj["v"], str, "decimal"))
        if not value.is_finite() and not self.limits.allow_nan:
            raise _bad(f"Decimal({str(value)!r}) is not allowed (allow_nan=False)")
        return value

    def _dec_class(self, obj: dict[str, Any]) -> Any:
        kind, name, v = obj[TAG], obj["t"], obj["v"]
        entry = self._by_name.get(name) if type(name) is str else None
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


def _why_unsupported(v: Any) -> str:
    t = type(v)
    name = _type_name(t)
    if isinstance(v, enum.Enum | BaseModel) or (
        dataclasses.is_dataclass(v) and not isinstance(v, type)
    ):
        return f"{name} is not in allowed_types (add {name!r} to allowed_types if you trust it)"
    for base in (int, float, str, bytes, dict, list, tuple, set, frozenset, datetime, date, time):
        if isinstance(v, base):
            return (
                f"{name} is a subclass of {base.__name__}; only exact {base.__name__} "
                f"round-trips, so convert it to {base.__name__} first"
            )
    return f"unsupported type {name}"


def _find_surrogate(v: Any, path: str, depth: int) -> str | None:
    """Where a string with a lone surrogate is (only used to word an error)."""
    if isinstance(v, str):
        return path if _SURROGATE_RE.search(v) else None
    if depth < 0:
        return None
    children: Iterable[tuple[str, Any]] = ()
    if isinstance(v, dict):
        children = [(f"[{_short(k)}]", x) for k, x in v.items()]
        children += [(f"<key {i}>", k) for i, k in enumerate(v)]
    elif isinstance(v, list | tuple | set | frozenset):
        children = [(f"[{i}]", x) for i, x in enumerate(v)]
    elif isinstance(v, enum.Enum):
        children = [(".value", v.value)]
    elif isinstance(v, BaseModel):
        children = [(f".{k}", x) for k, x in v.__dict__.items()]
        children += [(f".{k}", x) for k, x in (v.__pydantic_extra__ or {}).items()]
    elif dataclasses.is_dataclass(v):
        children = [(f".{f.name}", getattr(v, f.name, None)) for f in dataclasses.fields(v)]
    for step, child in children:
        found = _find_surrogate(child, path + step, depth - 1)
        if found:
            return found
    return None


def _first_tag(obj: Any, path: str) -> tuple[str, str] | None:
    """Where the first tagged value (other than a NaN) in a JSON tree is, and its tag."""
    if isinstance(obj, dict):
        tag = obj.get(TAG)
        if tag is not None and tag != "float":
            return path, "a dict with a non-str or reserved key" if tag == "dict" else tag
        children: Iterable[tuple[Any, Any]] = obj.items()
    else:
        children = enumerate(obj) if isinstance(obj, list) else ()
    for key, child in children:
        found = _first_tag(child, f"{path}[{key!r}]")
        if found:
            return found
    return None


def _check_escapes(text: str) -> None:
    for match in _ESCAPE_RE.finditer(text):
        if match["lone"] or (match["hi"] and not match["lo"]):
            raise _bad(f"{match[0]!r} is a lone surrogate escape (not valid UTF-8)")


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


_LEAF_ENCODERS: dict[type, Callable[[Codec, Any], dict[str, Any]]] = {
    datetime: lambda _, v: _time_fields(v),
    time: lambda _, v: _time_fields(v),
    date: lambda _, v: {TAG: "date", "v": v.isoformat()},
    timedelta: lambda c, v: {TAG: "timedelta", "v": c._enc(v // _MICROSECOND, 0, _NOTHING)},
    uuid.UUID: lambda _, v: {TAG: "uuid", "v": str(v)},
    Decimal: Codec._enc_decimal,
    bytes: lambda _, v: {TAG: "bytes", "v": base64.b64encode(v).decode("ascii")},
}

_Decoder = Callable[[Codec, dict[str, Any]], Any]
_DECODERS: dict[str, tuple[frozenset[str], frozenset[str], _Decoder]] = {
    "datetime": (_V, _FOLD_TZ, lambda _, o: _dec_time(o, datetime.fromisoformat)),
    "time": (_V, _FOLD, lambda _, o: _dec_time(o, time.fromisoformat)),
    "date": (_V, _NONE, lambda _, o: date.fromisoformat(_want(o["v"], str, "date"))),
    "timedelta": (_V, _NONE, lambda _, o: timedelta(microseconds=_want(o["v"], int, "timedelta"))),
    "uuid": (_V, _NONE, lambda _, o: uuid.UUID(_want(o["v"], str, "uuid"))),
    "decimal": (_V, _NONE, Codec._dec_decimal),
    "bytes": (_V, _NONE, lambda _, o: base64.b64decode(_want(o["v"], str, "bytes"), validate=True)),
    "tuple": (_V, _NONE, lambda _, o: tuple(_want(o["v"], list, "tuple"))),
    "set": (_V, _NONE, lambda _, o: _dec_items(o, set)),
    "frozenset": (_V, _NONE, lambda _, o: _dec_items(o, frozenset)),
    "dict": (_V, _NONE, lambda _, o: _dec_pairs(o)),
    "float": (_V, _NONE, Codec._dec_nonfinite),
    "enum": (_TV, _NONE, Codec._dec_class),
    "model": (_TV, _NONE, Codec._dec_class),
    "dataclass": (_TV, _NONE, Codec._dec_class),
}
