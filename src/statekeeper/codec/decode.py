"""The decoder of ``sk-json/1``: bytes to a value, every refusal worded.

:meth:`Decoder.decode` parses with ``json`` and two hooks (duplicate keys and the
tags of :mod:`~statekeeper.codec.tags`, bottom-up; the limits and NaN), so every
error is a :class:`~statekeeper.errors.CheckpointDecodeError` with its reason. A
document in the exact form the encoder writes (plain JSON, no tag, within the
limits) is parsed by msgspec instead, and kept only if writing it again gives back
the very same bytes: then ``json`` would have read an equal value of the same
types, so the result is the same either way (``tests/core/test_codec_fast_path.py``
checks both differentially). Anything else, every error included, takes ``json``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from itertools import accumulate
from typing import Any

import msgspec

from statekeeper.codec.allowlist import Allowed
from statekeeper.codec.limits import CodecLimits
from statekeeper.codec.tags import DECODERS, TAG, bad, short
from statekeeper.errors import CheckpointDecodeError

__all__ = ["Decoder"]

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


class Decoder:
    """``sk-json/1`` bytes to values under ``limits``, classes only from ``by_name``.

    Immutable once built; the codec shares one between tasks and threads.
    """

    def __init__(self, limits: CodecLimits, by_name: dict[str, Allowed]) -> None:
        self.limits = limits
        self.allow_nan = limits.allow_nan
        self.by_name = by_name
        self._max_depth = limits.max_depth
        self._digits = limits.max_int_digits
        self._max_bytes = limits.max_bytes  # read per call: a plain attribute, not the model's
        nonfinite: dict[str, Any] = {}
        if not limits.allow_nan:
            nonfinite = {"parse_constant": self._nan_token, "parse_float": self._finite_float}
        hook = self._object
        self._decoder = json.JSONDecoder(object_pairs_hook=hook, **nonfinite)
        self._int_decoder = json.JSONDecoder(
            object_pairs_hook=hook, parse_int=self._int, **nonfinite
        )

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
                    raise bad(f"the record is over max_bytes={limits.max_bytes}")
                if not text.isascii():
                    size = len(text.encode("utf-8"))  # also refuses lone surrogates
                    if size > limits.max_bytes:
                        raise bad(f"the record is {size} bytes, over max_bytes={limits.max_bytes}")
            elif isinstance(data, bytes | bytearray | memoryview):
                raw = bytes(data)
                if len(raw) > limits.max_bytes:
                    raise bad(f"the record is {len(raw)} bytes, over max_bytes={limits.max_bytes}")
                text = raw.decode("utf-8")
            else:
                raise bad(f"expected bytes or str, got {type(data).__name__}")
            if text.count("[") + text.count("{") > self._max_depth:
                depth = _json_depth(text)
                if depth > self._max_depth:
                    raise bad(f"nested {depth} deep, over max_depth={self._max_depth}")
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

    def _nan_token(self, token: str) -> float:
        if not self.limits.allow_nan:
            raise bad(f"{token} is not allowed (allow_nan=False)")
        return float(token)

    def _finite_float(self, token: str) -> float:
        value = float(token)
        if value - value != 0.0:
            raise bad(f"{token[:20]} overflows to infinity (allow_nan=False)")
        return value

    def _int(self, token: str) -> int:
        if len(token) - (token[0] == "-") > self.limits.max_int_digits:
            raise bad(f"an int has more than max_int_digits={self.limits.max_int_digits} digits")
        return int(token)

    def _object(self, pairs: list[tuple[Any, Any]]) -> Any:
        """``object_pairs_hook``: duplicate keys and tags, bottom-up."""
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[Any] = set()
            for key, _ in pairs:
                if key in seen:
                    raise bad(f"duplicate key {short(key)} in a JSON object")
                seen.add(key)
        if TAG not in obj:
            return obj
        tag = obj[TAG]
        spec = DECODERS.get(tag) if type(tag) is str else None
        if spec is None:
            raise bad(f"unknown tag {short(tag)}")
        required, optional, decoder = spec
        keys = obj.keys()
        if not (required <= keys and keys <= required | optional):
            raise bad(f"malformed {tag!r} tag: keys {sorted(keys)!r}")
        try:
            return decoder(self, obj)
        except CheckpointDecodeError:
            raise
        except Exception as e:
            raise bad(f"malformed {tag!r} tag: {type(e).__name__}: {e}") from e


def _check_escapes(text: str) -> None:
    for match in _ESCAPE_RE.finditer(text):
        if match["lone"] or (match["hi"] and not match["lo"]):
            raise bad(f"{match[0]!r} is a lone surrogate escape (not valid UTF-8)")
