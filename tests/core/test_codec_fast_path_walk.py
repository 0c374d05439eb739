"""The encode-side plain check (``Encoder._is_plain``) against a reference check.

``_plain_items`` checks a child dict's keys and values in one loop (no
``frozenset.issuperset`` over them, which builds a set on Python 3.11). This holds it
to the check it replaced, written out plainly below: the same decision for every
value, under every set of limits and both choices of leaf types (with and without
``int``, which depends on Python's own int digit limit). The encode differentials in
``test_codec_fast_path.py`` hold the bytes and errors to the tagging walk besides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import test_codec_fast_path as _fast
from hypothesis import given
from hypothesis import strategies as st

from statekeeper.codec import CodecLimits
from statekeeper.codec.encode import _LOOP_DICT, _PLAIN, _PLAIN_NOT_INT, Encoder
from statekeeper.codec.tags import TAG


def Codec(*, limits: CodecLimits | None = None) -> Encoder:
    """The encoder a ``Codec(limits=limits)`` builds (no allowed types)."""
    return Encoder(limits or CodecLimits(), {})


def reference_plain(codec: Encoder, v: Any, d: int, leaves: frozenset[type]) -> bool:
    """Plain JSON msgspec may write as it is: exact ``dict`` with exact ``str`` keys
    and no ``"$sk"``, ``list``, ``str``, ``bool``, ``None``, finite ``float``, ``int``
    within the limit, at most ``max_depth`` containers deep (``d`` around ``v``).
    Inside a container a type in ``leaves`` passes by type alone (``int`` is among
    them only when Python's own digit limit is the tighter one, and msgspec then
    refuses a longer int); a value at the top is checked as it is."""
    t = type(v)
    if (d > 0 and t in leaves) or t is str or t is bool or v is None:
        return True
    if t is int:
        hi = 10**codec.limits.max_int_digits
        return -hi < v < hi
    if t is float:
        return bool(v - v == 0.0)
    if t is not dict and t is not list:
        return False
    if d + 1 > codec.max_depth:
        return False
    items: Iterable[Any] = v
    if t is dict:
        if TAG in v or not all(type(k) is str for k in v):
            return False
        items = v.values()
    return all(reference_plain(codec, x, d + 1, leaves) for x in items)


class Text(str):
    pass


class Whole(int):
    pass


class Sub(dict):  # type: ignore[type-arg]
    pass


_odd = st.sampled_from(
    [float("nan"), float("inf"), Text("t"), Whole(2), (1,), Sub(), 10**30, -(10**30)]
)
_keys = st.text(max_size=2) | st.sampled_from([TAG, "v"]) | st.sampled_from([Text("k"), 1])
trees = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3) | _odd,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(_keys, kids, max_size=4)  # type: ignore[arg-type]
        | st.builds(lambda d: {"a": "x", "b": 1, **d}, st.dictionaries(_keys, kids, max_size=2))  # type: ignore[arg-type]
        # around _LOOP_DICT keys: the loop and the C-level checks alike
        | st.builds(
            lambda d, extra: {**{f"k{i}": i for i in range(extra)}, **d},
            st.dictionaries(_keys, kids, max_size=2),  # type: ignore[arg-type]
            st.integers(_LOOP_DICT - 2, _LOOP_DICT + 2),
        )
    ),
    max_leaves=20,
)

CODECS = [
    Codec(),
    Codec(limits=CodecLimits(max_depth=1, max_int_digits=20)),
    Codec(limits=CodecLimits(max_depth=2, max_int_digits=3)),
    Codec(limits=CodecLimits(max_depth=3, allow_nan=True)),
]


@_fast.FUZZ
@given(trees)
def test_plain_check_agrees_with_the_reference(value: Any) -> None:
    for codec in CODECS:
        for leaves in (_PLAIN, _PLAIN_NOT_INT):
            assert codec._is_plain(value, 0, leaves) == reference_plain(codec, value, 0, leaves)


@pytest.mark.parametrize("max_depth", [1, 2, 3, 4])
def test_plain_check_agrees_at_the_depth_limit(max_depth: int) -> None:
    codec = Codec(limits=CodecLimits(max_depth=max_depth))
    bottoms = [1, 0.5, float("nan"), None, "s", [], {}, [1.5], {"a": None}, Text("t"), (1,)]
    for depth in range(max_depth + 2):
        for bottom in bottoms:
            for value in _fast._nestings(depth, bottom):
                for nested in (value, {"m": value, "n": 1}, [{"a": "b", "c": value}]):
                    for leaves in (_PLAIN, _PLAIN_NOT_INT):
                        got = codec._is_plain(nested, 0, leaves)
                        assert got == reference_plain(codec, nested, 0, leaves), nested


def test_agent_like_state_takes_the_plain_path() -> None:
    """The common shape (a list of small str-keyed dicts, a dict with a float) is
    plain, so it is written by msgspec without the tagging walk."""
    state = {
        "step": 3,
        "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": None}],
        "scratch": {"attempt": 1, "score": 0.25, "done": False, "deep": {"x": [1.5]}},
        "tags": ["a", "b"],
    }
    codec = Codec()
    assert codec._is_plain(state, 0, _PLAIN)
    small = Codec(limits=CodecLimits(max_int_digits=3))
    for leaves in (_PLAIN, _PLAIN_NOT_INT):
        assert not small._is_plain(10**5, 0, leaves)
        assert not reference_plain(small, 10**5, 0, leaves)
        assert small._is_plain([10**5], 0, leaves) == (leaves is _PLAIN)
        assert small._is_plain({"a": 10**5}, 0, leaves) == (leaves is _PLAIN)
        assert small._is_plain([{"a": 10**5}], 0, leaves) == (leaves is _PLAIN)
    for size in (_LOOP_DICT, _LOOP_DICT + 1):
        big = {f"k{i}": i for i in range(size)}
        for bad in (float("nan"), Text("t"), {TAG: 1}, [float("inf")]):
            assert not codec._is_plain({"x": {**big, "z": bad}}, 0, _PLAIN)
        assert not codec._is_plain({"x": {**big, Text("z"): 1}}, 0, _PLAIN)
        assert not codec._is_plain({"x": {**big, TAG: 1}}, 0, _PLAIN)
        assert codec._is_plain({"x": {**big, "z": [0.5, {"y": None}]}}, 0, _PLAIN)
    assert reference_plain(codec, state, 0, _PLAIN)
    assert not codec._is_plain({"m": [{"role": Text("user")}]}, 0, _PLAIN)
    assert not codec._is_plain({"m": [{Text("role"): "user"}]}, 0, _PLAIN)
    assert not codec._is_plain({"m": [{"s": {TAG: "x"}}]}, 0, _PLAIN)
    assert not codec._is_plain({"m": [{"s": float("nan")}]}, 0, _PLAIN)
