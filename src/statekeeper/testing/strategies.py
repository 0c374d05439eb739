"""Hypothesis strategies for checkpoint states and names.

Public for backend authors and application tests::

    from hypothesis import given
    from statekeeper.testing.strategies import states

    @given(states())
    def test_round_trip(state): ...

Every value :func:`states` generates is accepted by the default codec and must come
back from a store equal and of the same type at every level (see
:func:`statekeeper.testing.assert_same_value`).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from hypothesis import strategies as st

__all__ = ["states", "stream_names", "tag_sets"]

# Lone surrogates are not valid UTF-8, so no backend can store them (the codec
# refuses them); every other code point must round-trip.
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)


def _leaves() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=False, allow_infinity=False),
        _text,
        st.binary(max_size=12),
        st.datetimes(timezones=st.just(UTC)),
        st.dates(),
        st.timedeltas(),
        st.uuids(),
        st.decimals(allow_nan=False, allow_infinity=False, places=4),
        st.frozensets(st.integers(-5, 5), max_size=4),
        st.sets(_text, max_size=3),
    )


def states(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """JSON-like values mixed with every built-in tagged type (tuples, sets, bytes,
    datetimes, Decimals, UUIDs, dicts with non-``str`` keys)."""
    return st.recursive(
        _leaves(),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.tuples(children, children),
            st.dictionaries(_text, children, max_size=4),
            st.dictionaries(st.integers(-3, 3), children, max_size=3),
        ),
        max_leaves=max_leaves,
    )


def stream_names() -> st.SearchStrategy[str]:
    """Valid stream names: 1..512 characters, no NUL, no lone surrogates, including
    the path-like names (``..``, ``/``, ``a/../b``) that a backend must keep opaque."""
    tricky = st.sampled_from([".", "..", "/", "a/b", "a/../b", "/etc/passwd", "C:\\x", "%2e"])
    plain = st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
        min_size=1,
        max_size=512,
    )
    return st.one_of(tricky, plain)


def tag_sets() -> st.SearchStrategy[dict[str, str]]:
    """Small tag dictionaries over a few keys and values, so filters match often."""
    return st.dictionaries(
        st.sampled_from(["kind", "owner", "k"]), st.sampled_from(["a", "b", ""]), max_size=2
    )
