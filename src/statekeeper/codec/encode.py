"""The encoder of ``sk-json/1``: one walk from a value to bytes.

:meth:`Encoder.encode` hands plain JSON of exact types (checked by
:meth:`Encoder._is_plain`, a walk that builds nothing) to msgspec as it is; every
other value goes through :meth:`Encoder.walk`, which tags what JSON has no type for
(through :mod:`~statekeeper.codec.tags`) and refuses, naming the part, whatever the
decoder would refuse. Both end in the same msgspec writer, so the bytes are the
same either way (``tests/core/test_codec_fast_path.py`` holds the two equal).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
from collections.abc import Iterable
from datetime import date, datetime, time
from typing import Any

import msgspec
from pydantic import BaseModel

from statekeeper.codec.allowlist import Allowed, type_name
from statekeeper.codec.limits import CodecLimits
from statekeeper.codec.tags import (
    LEAF_ENCODERS,
    NOTHING,
    TAG,
    Refuse,
    enc_class,
    enc_items,
    enc_nonfinite,
    enc_pairs,
    short,
)
from statekeeper.errors import CheckpointEncodeError

__all__ = ["Encoder"]

_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_STR = frozenset({str})
# The scalars a walk may pass unchecked, by type alone. Never float: msgspec writes
# NaN and infinities as null, so each float is checked for being finite; and int
# only when Python's own digit limit is the tighter one (msgspec then refuses longer
# ints, as json did).
_PLAIN: frozenset[type] = frozenset({str, int, bool, type(None)})
_PLAIN_NOT_INT: frozenset[type] = frozenset({str, bool, type(None)})
# msgspec's encoder built once: msgspec.json.encode sets one up on every call.
_msgspec_encode = msgspec.json.Encoder().encode
# a child dict with at most this many keys is checked by a loop (see _plain_items)
_LOOP_DICT = 16


class Encoder:
    """Values to ``sk-json/1`` bytes under ``limits``, classes only from ``by_type``.

    Immutable once built; the codec shares one between tasks and threads.
    """

    def __init__(self, limits: CodecLimits, by_type: dict[type, Allowed]) -> None:
        self.limits = limits
        self.max_depth = limits.max_depth
        self.allow_nan = limits.allow_nan
        self._by_type = by_type
        self._digits = limits.max_int_digits
        self._max_bytes = limits.max_bytes  # read per call: a plain attribute, not the model's
        self._ihi = 10**limits.max_int_digits
        self._ilo = -self._ihi

    def check_metadata(self, value: Any) -> dict[str, Any]:
        """``value`` if it is valid metadata (see ``Codec.check_metadata``), else raise."""
        if type(value) is not dict:
            raise CheckpointEncodeError(f"metadata must be a dict, not {type(value).__name__}")
        data = self.encode(value, "metadata")
        if b'"$sk":' in data:  # quotes inside strings are escaped, so this is a tag
            found = _first_tag(json.loads(data), "metadata")
            if found:
                raise CheckpointEncodeError(
                    f"cannot encode {found[0]}: metadata must be plain JSON (dict with str keys "
                    f"other than {TAG!r}, list, str, int, float, bool, None), not {found[1]}"
                )
        return value

    def is_plain(self, value: Any) -> bool:
        """Whether ``value`` is plain JSON that :meth:`encode` writes as it is, every
        ``int`` within ``max_int_digits`` (see :meth:`_is_plain`); builds nothing."""
        try:
            return self._is_plain(value, 0, _PLAIN_NOT_INT)
        except RecursionError:
            return False

    def encode(self, value: Any, root: str) -> bytes:
        """``value`` as bytes, or ``CheckpointEncodeError`` naming the part of ``root``."""
        # Plain JSON of exact types (checked by _is_plain, a walk that builds nothing) is
        # handed to msgspec as it is. Anything else goes through walk, which tags what
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
                    data = _msgspec_encode(self.walk(value, 0, leaves))
                except UnicodeEncodeError:
                    raise
                except ValueError:
                    data = _msgspec_encode(self.walk(value, 0, NOTHING))
        except Refuse as e:
            raise CheckpointEncodeError(e.message(root)) from None
        except UnicodeEncodeError:
            where = _find_surrogate(value, root, self.max_depth) or root
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
        if d > self.max_depth:
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
        inner = d < self.max_depth  # a child container is within max_depth
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

    def walk(self, v: Any, d: int, skip: frozenset[type]) -> Any:
        """The JSON-native form of ``v``; ``d`` counts the JSON containers around it.

        A list or str-keyed dict whose items all have a type in ``skip`` is returned
        as it is, unchecked (``skip.issuperset(map(type, ...))`` runs in C).
        """
        t = type(v)
        # dict and list first and inline: one Python frame per level, no call per scalar.
        if t is dict or t is list:
            d += 1
            if d > self.max_depth:
                raise Refuse(f"nested deeper than max_depth={self.max_depth}", depth=True)
            if t is dict:
                if TAG in v or not _STR.issuperset(map(type, v)):
                    return enc_pairs(self, v, d, skip)
                if skip.issuperset(map(type, v.values())):
                    return v
                pairs: Iterable[tuple[Any, Any]] = v.items()
            elif skip.issuperset(map(type, v)):
                return v
            else:
                pairs = enumerate(v)
            lo, hi, enc = self._ilo, self._ihi, self.walk
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
            except Refuse as e:
                e.at(f"[{short(k)}]", v)
                raise
            return dict(zip(v, out, strict=True)) if t is dict else out
        if t is str or t is bool or v is None:
            return v
        if t is int:
            if self._ilo < v < self._ihi:
                return v
            raise Refuse(f"an int has more than max_int_digits={self._digits} digits")
        if t is float:
            return v if v - v == 0.0 else enc_nonfinite(self, v, d)
        d += 1
        if d > self.max_depth:
            raise Refuse(f"nested deeper than max_depth={self.max_depth}", depth=True)
        if t is tuple:
            return {TAG: "tuple", "v": enc_items(self, v, d, skip)}
        if t is set or t is frozenset:
            return {TAG: t.__name__, "v": enc_items(self, v, d, skip, in_set=True)}
        leaf = LEAF_ENCODERS.get(t)
        if leaf is not None:
            return leaf(self, v)
        entry = self._by_type.get(t)
        if entry is None:
            raise Refuse(_why_unsupported(v))
        return enc_class(self, v, entry, d, skip)

    # -- decoding -------------------------------------------------------------


def _why_unsupported(v: Any) -> str:
    t = type(v)
    name = type_name(t)
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
        children = [(f"[{short(k)}]", x) for k, x in v.items()]
        children += [(f"<key {i}>", k) for i, k in enumerate(v)]
    elif isinstance(v, list | tuple | set | frozenset):
        children = [(f"[{i}]", x) for i, x in enumerate(v)]
    elif isinstance(v, enum.Enum):
        children = [(".value", v.value)]
    elif isinstance(v, BaseModel):
        children = [(f".{k}", x) for k, x in v.__dict__.items()]
        children += [(f".{k}", x) for k, x in (v.model_extra or {}).items()]
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
