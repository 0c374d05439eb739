"""The codec's fast decode path is the reference path, only faster (S5, S11).

``Codec.decode`` (``statekeeper.codec.decode.Decoder``) first tries msgspec
(``_decode_fast``) and hands anything it is not sure of to ``_decode_checked``, the
reference decoder. These tests decode the same
bytes both ways and require the same outcome: an equal value with the same type at
every level and the same key order, or the same error type and message.

Sized for the normal suite (a few seconds). For a long run:
``STATEKEEPER_FUZZ_EXAMPLES=100000 uv run pytest tests/core/test_codec_fast_path.py``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import msgspec
import pytest
import test_codec as _unit
import test_codec_properties as _props
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from statekeeper.codec import Codec, CodecLimits
from statekeeper.codec.allowlist import Allowlist
from statekeeper.codec.decode import _MISS, Decoder
from statekeeper.codec.encode import Encoder
from statekeeper.errors import CheckpointDecodeError, CheckpointEncodeError

EXAMPLES = int(os.environ.get("STATEKEEPER_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CODECS = {
    "default": _props.CODEC,
    "nan": _props.NAN_CODEC,
    "small": Codec(limits=CodecLimits(max_depth=3, max_bytes=64, max_int_digits=5)),
    "flat": Codec(limits=CodecLimits(max_depth=1, max_int_digits=20)),
    "deep": Codec(limits=CodecLimits(max_depth=500, max_int_digits=30)),
}


_DECODERS: dict[int, tuple[Codec, Decoder]] = {}


def decoder(codec: Codec) -> Decoder:
    """A decoder built as ``codec`` builds its own (same limits, same allowlist)."""
    kept = _DECODERS.get(id(codec))
    if kept is None or kept[0] is not codec:
        built = Decoder(codec.limits, Allowlist(codec.allowed_types).by_name)
        kept = _DECODERS[id(codec)] = (codec, built)
    return kept[1]


def identical(a: Any, b: Any) -> bool:
    """``same`` (equal, same type at every level), and dicts in the same key order."""
    if not _unit.same(a, b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(identical(a[k], b[k]) for k in a)
    if type(a) is list:
        return all(identical(x, y) for x, y in zip(a, b, strict=True))
    return True


def outcome(decode: Callable[[Any], Any], data: Any) -> tuple[Any, ...]:
    try:
        return ("value", decode(data))
    except CheckpointDecodeError as exc:
        return ("error", type(exc), str(exc), exc.reason)
    except Exception as exc:  # a crash of either path is a failure of its own
        return ("crash", type(exc), str(exc))


def check(codec: Codec, data: Any) -> tuple[Any, ...]:
    """Decode ``data`` both ways and require the same outcome; return it."""
    fast = outcome(codec.decode, data)
    ref = outcome(decoder(codec)._decode_checked, data)
    assert fast[0] == ref[0] != "crash", (data, fast, ref)
    if fast[0] == "value":
        assert identical(fast[1], ref[1]), (data, fast, ref)
    else:
        assert fast[1:] == ref[1:], (data, fast, ref)
    return fast


def check_everywhere(data: Any) -> None:
    for codec in CODECS.values():
        check(codec, data)


@contextmanager
def _interpreter_limit(
    get: Callable[[], int], set_to: Callable[[int], object], limit: int
) -> Iterator[None]:
    """An interpreter limit set to ``limit`` for the block, then restored."""
    old = get()
    set_to(limit)
    try:
        yield
    finally:
        set_to(old)


def python_int_limit(digits: int) -> AbstractContextManager[None]:
    return _interpreter_limit(sys.get_int_max_str_digits, sys.set_int_max_str_digits, digits)


def recursion_limit(limit: int) -> AbstractContextManager[None]:
    return _interpreter_limit(sys.getrecursionlimit, sys.setrecursionlimit, limit)


# -- a targeted corpus of nasty inputs --------------------------------------------

DEEP = 100  # the default max_depth
CORPUS: list[bytes] = [
    b"{}",
    b"[]",
    b"null",
    b"0",
    b'""',
    b'{"a":1,"a":1}',
    b'{"a":1,"a":2}',
    b'{"a":{"b":1,"b":1}}',
    b'[{"x":1},{"x":1,"x":1}]',
    b'{"$sk":"tuple","v":[1]}',
    b'{"a":{"b":{"$sk":"set","v":[1]}}}',
    b'{"a":[{"$sk":"nope","v":1}]}',
    b'{"\\u0024sk":"tuple","v":[1]}',
    b'{"a":"$sk"}',
    b'["$sk"]',
    b'{"$sk":1}',
    b"1.0",
    b"1",
    b"[1.0,1,-0,-0.0,0.0,1E2,1e2,1e+2,1e16,1e+16,1e-7,1e-07,0.1,5e-324]",
    b"-0.0",
    b"-0",
    b"1e400",
    b"-1e400",
    b"[1e400]",
    b"NaN",
    b"[NaN,Infinity,-Infinity]",
    b'{"a":Infinity}',
    b"9" * 19,
    b"9" * 20,
    b"-" + b"9" * 20,
    b"9" * 30,
    b"9" * 4300,
    b"9" * 4301,
    b"-" + b"9" * 4300,
    b"[" + b"1" * 5000 + b"]",
    b'"' + b"1" * 5000 + b'"',
    b"1." + b"0" * 5000,
    b'"\\u0000"',
    b'"a\\u0000b"',
    b'"\\u001f\\"\\\\\x7f\xe2\x80\xa8"',
    b'"\\/"',
    b'"\\ud800"',
    b'"\\udc00"',
    b'"\\ud83d\\ude00"',
    b'"\xf0\x9f\x98\x80"',
    b'"\\ud83d"',
    b'"\xed\xa0\x80"',
    b'"\xff"',
    b"\xff",
    b'"\xc3"',
    b"\xef\xbb\xbf{}",
    b'\xef\xbb\xbf{"a":1}',
    b"{} ",
    b" {}",
    b'{"a":1}x',
    b'{"a":1}{}',
    b"[1,]",
    b"[1 2]",
    b'{"a" :1}',
    b'{"a":1 }',
    b"",
    b" ",
    b"tru",
    b"true",
    b"[true,false,null]",
    b'"\x01"',
    b'"\t"',
    b'"\\t"',
    b"\x00",
    b"[" * DEEP + b"]" * DEEP,
    b"[" * (DEEP - 1) + b"]" * (DEEP - 1),
    b"[" * (DEEP + 1) + b"]" * (DEEP + 1),
    b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    b'{"a":' * (DEEP + 1) + b"1" + b"}" * (DEEP + 1),
    b"[" + b"[]," * 200 + b"[]]",
    b'["' + b"[" * 300 + b'"]',
    b"[" * 3000 + b"]" * 3000,
    b"[" * 3000,
    b'{"k":"' + "é".encode() * 40 + b'"}',
    b'{"":""}',
    b'{"a":[1,{"b":[2,{"c":[3]}]}]}',
]


@pytest.mark.parametrize("name", sorted(CODECS))
def test_corpus_decodes_the_same_both_ways(name: str) -> None:
    codec = CODECS[name]
    for data in CORPUS:
        check(codec, data)
        check(codec, data.decode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("digits", [640, 4300, 5000])
def test_corpus_under_python_int_limits(digits: int) -> None:
    with python_int_limit(digits):
        for data in CORPUS:
            check_everywhere(data)


def test_canonical_plain_json_takes_the_fast_path() -> None:
    """Not vacuous: the plain, canonical documents really are decoded by msgspec."""
    codec = CODECS["default"]
    for value in (
        {"step": 1, "messages": [{"role": "user", "content": "hé \u2028"}], "ok": None},
        [1.5, -0.0, 10**18, -(10**30), "a\u0000b", True],
        {"": {"": []}},
    ):
        data = codec.encode(value)
        assert decoder(codec)._decode_fast(data) is not _MISS
        assert identical(check(codec, data)[1], value)
    # and what it must leave to the reference path
    for data in (b'{"a":1,"a":1}', b'{"a":{"$sk":"tuple","v":[]}}', b"[ 1]", b"1e+16"):
        assert decoder(codec)._decode_fast(data) is _MISS


# -- differential fuzz --------------------------------------------------------------

text = st.text(
    st.characters(codec="utf-8") | st.characters(categories=["Cs"]) | st.sampled_from('$sk"\\/'),
    max_size=8,
)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    # built lazily: hypothesis cannot repr an int over Python's digit limit
    st.sampled_from([4299, 4300, -4300]).map(lambda n: (10 ** abs(n)) * (1 if n > 0 else -1)),
    st.sampled_from([2**63, 2**64, -(2**63) - 1]),
    st.floats(),
    st.sampled_from([0.0, -0.0, 1.0, 1e16, 1e-7, 1e22, 5e-324, 1.7976931348623157e308]),
)
json_trees = st.recursive(
    st.none() | st.booleans() | numbers | text | st.just("$sk"),
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(text | st.sampled_from(["$sk", "v", "t", "a"]), kids, max_size=4)
    ),
    max_leaves=16,
)


def spellings(obj: Any, how: str) -> bytes:
    """``obj`` as JSON bytes, in one of several spellings (canonical or not)."""
    if how == "msgspec":
        return msgspec.json.encode(obj)
    kwargs: dict[str, Any] = {"ensure_ascii": how == "ascii"}
    if how != "spaced":
        kwargs["separators"] = (",", ":")
    return json.dumps(obj, **kwargs).encode("utf-8", "surrogatepass")


@FUZZ
@given(json_trees, st.sampled_from(["compact", "ascii", "spaced", "msgspec"]))
def test_fuzz_json_documents(obj: Any, how: str) -> None:
    try:
        data = spellings(obj, how)
    except (ValueError, UnicodeEncodeError, OverflowError):
        return
    check_everywhere(data)


@FUZZ
@given(json_trees, st.data())
def test_fuzz_duplicate_keys_and_edits(obj: Any, data: st.DataObject) -> None:
    try:
        doc = bytearray(msgspec.json.encode(obj))
    except (ValueError, UnicodeEncodeError, OverflowError):
        return
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(doc)))
        action = data.draw(st.sampled_from(["dup", "flip", "insert", "delete"]))
        if action == "dup":
            i = doc.find(b"{", at)
            if i >= 0 and doc[i + 1 : i + 2] == b'"':
                end = doc.find(b",", i)
                close = doc.find(b"}", i)
                if end < 0 or (0 <= close < end):
                    end = close
                if end > i + 1:
                    doc[i + 1 : i + 1] = doc[i + 1 : end] + b","
        elif action == "insert" or at == len(doc):
            doc[at:at] = data.draw(st.binary(min_size=1, max_size=3) | st.sampled_from(_SNIPPETS))
        elif action == "flip":
            doc[at] ^= data.draw(st.integers(1, 255))
        else:
            del doc[at]
    check_everywhere(bytes(doc))


_SNIPPETS = [b'"$sk":', b"[", b"{", b"]", b"}", b"\\u0000", b"\\ud800", b"e400", b".0", b"-", b" "]


@FUZZ
@given(_props.values(allow_nan=True))
def test_fuzz_encoded_values(value: Any) -> None:
    try:
        data = _props.BIG.encode(value)
    except Exception:
        return
    check_everywhere(data)


@FUZZ
@given(st.binary(max_size=64))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    check_everywhere(data)


# -- encoding: plain JSON goes straight to msgspec, the rest through the walk -------


class WalkOnly(Encoder):
    """The encoder with the plain shortcut off: every value goes through ``walk``."""

    def _is_plain(self, v: Any, d: int, leaves: frozenset[type]) -> bool:
        return False


WALK_ONLY = {
    name: WalkOnly(codec.limits, Allowlist(codec.allowed_types).by_type)
    for name, codec in CODECS.items()
}


def encode_outcome(codec: Codec | Encoder, value: Any) -> tuple[Any, ...]:
    try:
        if isinstance(codec, Encoder):
            return ("bytes", codec.encode(value, "state"))
        return ("bytes", codec.encode(value))
    except Exception as exc:
        return ("error", type(exc), str(exc))


def check_encode(value: Any) -> None:
    for name, codec in CODECS.items():
        fast = encode_outcome(codec, value)
        assert fast == encode_outcome(WALK_ONLY[name], value), value
        if fast[0] == "bytes":
            # the reference decoder reads back exactly what was given ...
            assert _unit.same(decoder(codec)._decode_checked(fast[1]), value)
            # ... and the bytes are canonical, so the fast decoder takes them whole
            # (a run of digits longer than max_int_digits, even in a float or a
            # string, is left to the reference decoder)
            digits = codec.limits.max_int_digits
            if b'"$sk"' not in fast[1] and not re.search(b"[0-9]{%d}" % (digits + 1), fast[1]):
                assert decoder(codec)._decode_fast(fast[1]) is not _MISS


@FUZZ
@given(_props.values(allow_nan=True))
def test_fuzz_encode_values(value: Any) -> None:
    check_encode(value)


@FUZZ
@given(json_trees)
def test_fuzz_encode_json_trees(value: Any) -> None:
    check_encode(value)


class Sub(dict):  # type: ignore[type-arg]
    pass


class Text(str):
    pass


class Whole(int):
    pass


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ([1.0, float("nan")], "state[1]"),
        ({"a": [float("inf")]}, "state['a'][0]"),
        ({"a": Sub()}, "state['a']"),
        ([Text("x")], "state[0]"),
        ([Whole(1)], "state[0]"),
        ([_props.Rank.ACE], "state[0]"),
        ({"a": {"b": _props.Tone.LOW}}, "state['a']['b']"),
    ],
)
def test_what_msgspec_would_write_silently_is_still_refused(value: Any, where: str) -> None:
    """msgspec writes NaN as null and subclasses and enums as their base value; the
    plain shortcut never lets them through, so the walk refuses them with the path."""
    codec = Codec()
    with pytest.raises(CheckpointEncodeError, match=re.escape(f"cannot encode {where}:")):
        codec.encode(value)


def test_plain_state_and_metadata_are_written_by_msgspec() -> None:
    codec = Codec()
    value = {"f": [1e16, 1e-7, -0.0], "s": "\u2028\x00", "n": None, "i": -(10**25)}
    assert codec.encode(value) == msgspec.json.encode(value)
    assert identical(codec.decode(codec.encode(value)), value)
    with python_int_limit(640), pytest.raises(CheckpointEncodeError, match="Exceeds the limit"):
        codec.encode([10**700])


def test_recursion_in_the_plain_check_is_an_encode_error() -> None:
    """Regression: the plain check ran outside the error handling, so running out of
    interpreter stack escaped as a bare RecursionError."""
    codec = Codec(limits=CodecLimits(max_depth=500))
    value: Any = []
    for _ in range(400):
        value = [value]
    with recursion_limit(250), pytest.raises(CheckpointEncodeError, match="recursion limit"):
        codec.encode(value)
    assert codec.decode(codec.encode(value)) == value


def _nestings(depth: int, leaf: Any) -> Iterator[Any]:
    """Every chain of lists and dicts ``depth`` deep around ``leaf``, alone and
    beside a scalar sibling."""
    if depth == 0:
        yield leaf
        return
    for inner in _nestings(depth - 1, leaf):
        yield [inner]
        yield [1, inner]
        yield {"k": inner}
        yield {"s": "x", "k": inner, "f": 0.5}


@pytest.mark.parametrize("max_depth", [1, 2, 3, 4])
def test_the_plain_check_agrees_with_the_walk_at_the_depth_limit(max_depth: int) -> None:
    """The plain check settles a child container in its parent's loop and its items
    in one call; around max_depth and with every kind of bottom value, it decides
    exactly as the tagging walk does (same bytes or same error)."""
    limits = CodecLimits(max_depth=max_depth, allow_nan=False)
    fast, walk = Codec(limits=limits), WalkOnly(limits, {})
    leaves = [1, 0.5, float("nan"), None, "s", [], {}, [1.5], {"a": None}, Text("t"), (1,)]
    for depth in range(max_depth + 2):
        for leaf in leaves:
            for value in _nestings(depth, leaf):
                assert encode_outcome(fast, value) == encode_outcome(walk, value), value


@FUZZ
@given(st.one_of(json_trees, _props.values(allow_nan=True)))
@example({"\ud800": None})
@example(["a", "\udfff"])
def test_fuzz_a_plain_value_is_what_json_gives_back_type_for_type(value: Any) -> None:
    """``Codec.is_plain``: what it accepts, the codec writes as msgspec does (or, for
    a string with a lone surrogate, which no UTF-8 encoder writes, refuses as msgspec
    does), and the stdlib's json writes and parses back equal with the same type at
    every level."""
    codec = Codec()
    if codec.is_plain(value):
        try:
            expected = msgspec.json.encode(value)
        except UnicodeEncodeError:
            with pytest.raises(CheckpointEncodeError, match="lone surrogate"):
                codec.encode(value)
        else:
            assert codec.encode(value) == expected
        assert identical(json.loads(json.dumps(value)), value)


@pytest.mark.parametrize(
    "value",
    [
        [1.0, float("nan")],
        {"a": [float("inf")]},
        {"a": Sub()},
        [Text("x")],
        [Whole(1)],
        [(1,)],
        {"$sk": 1},
        {1: "a"},
        [10**5000],
    ],
)
def test_what_is_not_plain_json_is_not_plain(value: Any) -> None:
    assert not Codec().is_plain(value)


def test_the_plain_check_says_no_when_the_stack_runs_out() -> None:
    codec = Codec(limits=CodecLimits(max_depth=500))
    value: Any = []
    for _ in range(400):
        value = [value]
    assert codec.is_plain(value)
    with recursion_limit(250):
        assert not codec.is_plain(value)
