"""The checkpoint codec ``sk-json/1``: JSON plus tagged values, with an allowlist.

This module (with ``_codec_tags.py``, which holds one encoder and one decoder per
tag) is the only place that turns state into bytes and back. There is no pickle:
decoding never imports a module, never looks up an attribute by a name taken from
the data, and calls only the classes listed in ``allowed_types``.

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
  both ways. With ``True`` they round-trip as tags in state, and ``NaN``/``Infinity``
  tokens written by other tools are accepted too; metadata refuses them either way
  (it is stored as strict JSON in the record header and the index rows).

Save/load symmetry (S5): ``encode`` raises
:class:`~statekeeper.errors.CheckpointEncodeError`, naming the part
(``state['a'][3]``), for exactly what ``decode`` would refuse: a class off the
allowlist, an unsupported type, a limit, NaN, a lone surrogate (not UTF-8), a
reference cycle. ``decode`` raises :class:`~statekeeper.errors.CheckpointDecodeError`
and nothing else: invalid UTF-8 or JSON, duplicate keys, a limit, a bad tag.

Fast paths: ``encode`` hands plain JSON of exact types (checked by a walk that
builds nothing: no subclass, no ``"$sk"`` key, finite floats, ints and depth within
the limits) to msgspec as it is, and everything else through the tagging walk,
whose output msgspec writes too. ``decode`` lets msgspec parse bytes and keeps the
result only if re-encoding it gives back the very same bytes, with no tag, within
the limits; anything else (and every error) goes through the reference decoder, so
values, types and error messages are the same either way
(``tests/test_codec_fast_path.py`` checks both differentially).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
from collections.abc import Iterable
from datetime import date, datetime, time
from itertools import accumulate
from typing import Any, ClassVar

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from statekeeper._codec_tags import (
    _DECODERS,
    _LEAF_ENCODERS,
    _NOTHING,
    TAG,
    _allow,
    _Allowed,
    _bad,
    _enc_class,
    _enc_items,
    _enc_nonfinite,
    _enc_pairs,
    _Refuse,
    _resolve,
    _short,
    _type_name,
)
from statekeeper.errors import CheckpointDecodeError, CheckpointEncodeError, InvalidOptions

__all__ = ["DEFAULT_LIMITS", "Codec", "CodecLimits"]


class CodecLimits(BaseModel):
    """Limits that ``encode`` and ``decode`` enforce alike (see the module docs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_depth: int = Field(default=100, ge=1, le=500)
    max_bytes: int = Field(default=16 * 1024 * 1024, ge=1)
    max_int_digits: int = Field(default=4300, ge=1)
    allow_nan: bool = False


DEFAULT_LIMITS = CodecLimits()
"""The limits every store uses unless its options set others."""

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
_STR = frozenset({str})
# The scalars a walk may pass unchecked, by type alone. Never float: msgspec writes
# NaN and infinities as null, so each float is checked for being finite; and int
# only when Python's own digit limit is the tighter one (msgspec then refuses longer
# ints, as json did).
_PLAIN: frozenset[type] = frozenset({str, int, bool, type(None)})
_PLAIN_NOT_INT: frozenset[type] = frozenset({str, bool, type(None)})
# msgspec's encoder and decoder built once: the module-level functions set theirs up
# on every call. Same output as msgspec.json.encode and decode.
_msgspec_encode = msgspec.json.Encoder().encode
_msgspec_decode = msgspec.json.Decoder().decode
_TAG_BYTES = b'"$sk"'
#: Every byte but ``[`` and ``{``: ``data.translate(None, _NOT_OPENERS)`` keeps the
#: openers, one pass over the bytes where two ``count`` calls made two.
_NOT_OPENERS = bytes(b for b in range(256) if b not in b"[{")
_MISS: Any = object()
_CONTAINERS: frozenset[type] = frozenset({dict, list})
# a child dict with at most this many keys is checked by a loop (see _plain_items)
_LOOP_DICT = 16
_DIGIT_RUNS: dict[int, re.Pattern[bytes]] = {}


def _digit_run(limit: int) -> re.Pattern[bytes]:
    """A run of more than ``limit`` decimal digits (found in O(n): a run starts once)."""
    pattern = _DIGIT_RUNS.get(limit)
    if pattern is None:
        pattern = _DIGIT_RUNS[limit] = re.compile(rb"(?<![0-9])[0-9]{%d}" % (limit + 1))
    return pattern


def _tree_depth(v: Any) -> int:
    """Nesting of lists and dicts in a parsed JSON value (``_json_depth`` of its text)."""
    t = type(v)
    if t is dict:
        children: Iterable[Any] = v.values()
    elif t is list:
        children = v
    else:
        return 0
    return 1 + max((_tree_depth(x) for x in children if type(x) in _CONTAINERS), default=0)


def _json_depth(text: str) -> int:
    """Deepest nesting of arrays and objects in ``text`` (exact for valid JSON)."""
    skeleton = _STRING_RE.sub("", text).encode("utf-8", "surrogatepass")
    steps = skeleton.translate(_BRACKET_STEPS, _NOT_BRACKETS)
    return max(accumulate(memoryview(steps).cast("b")), default=0)


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
        self._max_bytes = lim.max_bytes  # read per call: a plain attribute, not the model's
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
        # Plain JSON of exact types (checked by _is_plain, a walk that builds nothing) is
        # handed to msgspec as it is. Anything else goes through _enc, which tags what
        # JSON has no type for and refuses, with the path, what decode would refuse.
        # Neither walk looks at ints Python's own limit already refuses when that
        # limit is the tighter one: msgspec raises for them, as json did.
        limit = sys.get_int_max_str_digits()
        leaves = _PLAIN if 0 < limit <= self._digits else _PLAIN_NOT_INT
        data: bytes | None = None
        try:
            if self._is_plain(value, 0, leaves):
                data = _msgspec_encode(value)
        except Exception:  # a lone surrogate, an int over Python's limit, recursion: below
            data = None
        try:
            if data is None:
                try:
                    data = _msgspec_encode(self._enc(value, 0, leaves))
                except UnicodeEncodeError:
                    raise
                except ValueError:
                    data = _msgspec_encode(self._enc(value, 0, _NOTHING))
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
        if len(data) > self._max_bytes:
            raise CheckpointEncodeError(
                f"cannot encode {root}: it is {len(data)} bytes encoded, "
                f"over max_bytes={self.limits.max_bytes}"
            )
        return data

    def _is_plain(self, v: Any, d: int, leaves: frozenset[type]) -> bool:
        """Whether ``v`` is plain JSON msgspec may write as it is: exact ``dict`` (``str``
        keys, no ``"$sk"``), ``list``, ``str``, ``bool``, ``None``, finite ``float``,
        ``int`` within the limit, nested at most ``max_depth`` deep."""
        t = type(v)
        if t is dict:
            if TAG in v or not _STR.issuperset(map(type, v)):
                return False
            items: Iterable[Any] = v.values()
        elif t is list:
            items = v
        else:
            return bool(
                t is str
                or t is bool
                or v is None
                or (t is int and self._ilo < v < self._ihi)
                or (t is float and v - v == 0.0)
            )
        d += 1
        if d > self._max_depth:
            return False
        if leaves.issuperset(map(type, items)):
            return True
        return self._plain_items(items, d, leaves)

    def _plain_items(self, items: Iterable[Any], d: int, leaves: frozenset[type]) -> bool:
        """Whether the items of a container at depth ``d`` are plain (see
        :meth:`_is_plain`). A child container is checked here, and its own items
        by a call only when they are not all ``leaves``: no check runs twice.

        A small child dict (at most ``_LOOP_DICT`` keys: messages, records) has its
        keys and values checked in one loop over its items, a nested container among
        them by a call for that one value: on Python 3.11 ``frozenset.issuperset``
        builds a set of a non-set argument, which costs a small dict more than the
        loop does. A larger one keeps the two C-level checks, faster per item.
        """
        inner = d < self._max_depth  # a child container is within max_depth
        for x in items:
            tx = type(x)
            if tx in leaves:  # one set lookup for str, bool, None (and int, see above)
                continue
            if tx is float:
                if x - x == 0.0:  # not NaN nor infinite (msgspec would write null)
                    continue
                return False
            children: Iterable[Any]
            if tx is dict:
                if not inner or TAG in x:
                    return False
                if len(x) <= _LOOP_DICT:
                    for k, y in x.items():
                        if type(k) is not str:
                            return False
                        ty = type(y)
                        if ty in leaves:
                            continue
                        if ty is float:
                            if y - y == 0.0:
                                continue
                            return False
                        if not self._plain_items((y,), d + 1, leaves):  # y is an item of x
                            return False
                    continue
                if not _STR.issuperset(map(type, x)):
                    return False
                children = x.values()
            elif tx is list:
                if not inner:
                    return False
                children = x
            elif tx is int:
                if self._ilo < x < self._ihi:
                    continue
                return False
            else:
                return False
            if not (
                leaves.issuperset(map(type, children)) or self._plain_items(children, d + 1, leaves)
            ):
                return False
        return True

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
                    return _enc_pairs(self, v, d, skip)
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
            return v if v - v == 0.0 else _enc_nonfinite(self, v, d)
        d += 1
        if d > self._max_depth:
            raise _Refuse(f"nested deeper than max_depth={self._max_depth}", depth=True)
        if t is tuple:
            return {TAG: "tuple", "v": _enc_items(self, v, d, skip)}
        if t is set or t is frozenset:
            return {TAG: t.__name__, "v": _enc_items(self, v, d, skip, in_set=True)}
        leaf = _LEAF_ENCODERS.get(t)
        if leaf is not None:
            return leaf(self, v)
        entry = self._by_type.get(t)
        if entry is None:
            raise _Refuse(_why_unsupported(v))
        return _enc_class(self, v, entry, d, skip)

    # -- decoding -------------------------------------------------------------

    def decode(self, data: bytes | str) -> Any:
        """Decode what ``encode`` produced, or raise ``CheckpointDecodeError``."""
        if type(data) is bytes:
            value = self._decode_fast(data)
            if value is not _MISS:
                return value
        return self._decode_checked(data)

    def _decode_fast(self, data: bytes) -> Any:
        """The value of ``data`` if it is plain JSON in the exact form ``encode``
        writes, else ``_MISS`` (and :meth:`_decode_checked` decides).

        msgspec parses; the value is accepted only if re-encoding it gives back
        these very bytes. Canonical bytes have no duplicate keys, whitespace,
        escapes other than the compulsory ones, ``NaN`` tokens or non-canonical
        numbers, so ``json`` with our hooks would parse them to an equal value of
        the same types at every level. What the hooks also check is checked here
        or sent to the checked path: a tag (``"$sk"`` anywhere), the size, the
        depth and the int digits. Any error, whatever it is, goes to the checked
        path too, which words the errors.
        """
        if len(data) > self._max_bytes or (data.find(b"$") >= 0 and _TAG_BYTES in data):
            return _MISS
        digits = self._digits
        python_digits = sys.get_int_max_str_digits()
        if 0 < python_digits < digits:
            digits = python_digits
        if len(data) > digits and _digit_run(digits).search(data):
            return _MISS
        try:
            value = _msgspec_decode(data)
            if _msgspec_encode(value) != data:
                return _MISS
            if (
                len(data.translate(None, _NOT_OPENERS)) > self._max_depth
                and _tree_depth(value) > self._max_depth
            ):
                return _MISS
        except Exception:  # RecursionError, an int over Python's limit, ...
            return _MISS
        return value

    def _decode_checked(self, data: bytes | str) -> Any:
        """The reference decoder: every check in Python, every error worded."""
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


_TAG_MEANS = {
    "dict": "a dict with a non-str or reserved key",
    # metadata lives in the record header and in index rows, which are strict JSON
    "float": "a NaN or infinite float (metadata is strict JSON, even with allow_nan)",
}


def _first_tag(obj: Any, path: str) -> tuple[str, str] | None:
    """Where the first tagged value in a JSON tree is, and what it stands for."""
    if isinstance(obj, dict):
        tag = obj.get(TAG)
        if tag is not None:
            return path, _TAG_MEANS.get(tag, str(tag))
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
