"""Hypothesis properties of statekeeper.codec: exact round trips, S5 symmetry, hostile input."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
from datetime import UTC, date, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pydantic
import test_codec as _unit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekeeper.codec import Codec, CodecLimits
from statekeeper.errors import CheckpointDecodeError, CheckpointEncodeError


class Suit(enum.Enum):
    HEARTS = 1
    SPADES = "s"
    PAIR = (1, "x")


class Rank(enum.IntEnum):
    ACE = 1
    KING = 13


class Tone(enum.StrEnum):
    LOW = "low"


@dataclasses.dataclass(frozen=True)
class Card:
    suit: Suit
    extra: Any = None


class Hand(pydantic.BaseModel):
    cards: list[Any] = []
    note: Any = None


ALLOWED = [Suit, Rank, Tone, Card, Hand]
CODEC = Codec(allowed_types=ALLOWED)
NAN_CODEC = Codec(allowed_types=ALLOWED, limits=CodecLimits(allow_nan=True))
BIG = Codec(allowed_types=ALLOWED, limits=CodecLimits(max_depth=500, allow_nan=True))
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# the exact-type equality of the unit tests is the property's notion of equal
same = _unit.same


offsets = st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23)).map(timezone)
fixed_zones = st.none() | st.just(UTC) | offsets
members = st.sampled_from([*Suit, *Rank, *Tone])
# st.timezones() would scan the whole tz database; a few zones with folds and gaps do.
zones = st.sampled_from(
    ["America/New_York", "Europe/Paris", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"]
).map(ZoneInfo)


def with_fold(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(lambda v, fold: v.replace(fold=fold), strategy, st.integers(0, 1))


def hashables(allow_nan: bool) -> st.SearchStrategy[Any]:
    base = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=allow_nan),
        st.text(max_size=8),
        st.dates(),
        st.uuids(),
        st.decimals(allow_nan=False, allow_infinity=allow_nan),
        st.binary(max_size=8),
        members,
    )
    return st.recursive(
        base,
        lambda kids: st.lists(kids, max_size=3).map(tuple) | st.frozensets(kids, max_size=3),
        max_leaves=4,
    )


def values(allow_nan: bool = False) -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers() | st.integers(min_value=-(10**4400), max_value=10**4400),
        st.floats(allow_nan=allow_nan, allow_infinity=allow_nan),
        st.text(),
        with_fold(st.datetimes(timezones=fixed_zones | zones)),
        st.dates(),
        with_fold(st.times(timezones=fixed_zones)),
        st.timedeltas(),
        st.uuids(),
        st.decimals(allow_nan=allow_nan, allow_infinity=allow_nan),
        st.binary(),
        members,
    )
    keys = hashables(allow_nan)
    return st.recursive(
        leaves,
        lambda kids: st.one_of(
            st.lists(kids, max_size=4),
            st.lists(kids, max_size=3).map(tuple),
            st.dictionaries(st.text(max_size=4) | st.just("$sk"), kids, max_size=4),
            st.dictionaries(keys, kids, max_size=3),
            st.sets(keys, max_size=3),
            st.frozensets(keys, max_size=3),
            st.builds(Card, st.sampled_from(Suit), kids),
            st.builds(Hand, cards=st.lists(kids, max_size=3), note=kids),
        ),
        max_leaves=12,
    )


def check_round_trip(codec: Codec, value: Any) -> None:
    try:
        data = codec.encode(value)
    except CheckpointEncodeError:
        return
    assert same(codec.decode(data), value)
    assert same(codec.decode(data.decode()), value)  # text takes the reference decoder


@SETTINGS
@given(values())
def test_encode_refuses_or_round_trips_exactly(value: Any) -> None:
    check_round_trip(CODEC, value)


@SETTINGS
@given(values(allow_nan=True))
def test_round_trip_with_allow_nan(value: Any) -> None:
    check_round_trip(NAN_CODEC, value)


@SETTINGS
@given(
    values(allow_nan=True),
    st.integers(1, 8),
    st.integers(1, 400),
    st.integers(1, 6),
    st.booleans(),
)
def test_encode_refuses_exactly_what_decode_refuses(
    value: Any, depth: int, size: int, digits: int, allow_nan: bool
) -> None:
    try:
        data = BIG.encode(value)
    except CheckpointEncodeError:
        return
    limits = CodecLimits(
        max_depth=depth, max_bytes=size, max_int_digits=digits, allow_nan=allow_nan
    )
    small = Codec(allowed_types=ALLOWED, limits=limits)
    try:
        encoded: bytes | None = small.encode(value)
    except CheckpointEncodeError:
        encoded = None
    try:
        small.decode(data)
        decodes = True
    except CheckpointDecodeError:
        decodes = False
    assert (encoded is not None) == decodes
    assert encoded is None or encoded == data


@SETTINGS
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    with contextlib.suppress(CheckpointDecodeError):
        CODEC.decode(data)


TAG_NAMES = st.sampled_from(
    [
        *("datetime", "date", "time", "timedelta", "uuid", "decimal", "bytes", "tuple"),
        *("set", "frozenset", "dict", "float", "enum", "model", "dataclass", "nope"),
    ]
)
TYPE_NAMES = st.sampled_from(
    [f"{c.__module__}:{c.__qualname__}" for c in ALLOWED] + ["os:system", "builtins:eval"]
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(st.characters(max_codepoint=0x7F) | st.characters(categories=["Cs"]), max_size=6)
    | TAG_NAMES
    | TYPE_NAMES,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(
            st.sampled_from(["$sk", "v", "t", "fold", "tz"]) | st.text(max_size=3), kids
        )
    ),
    max_leaves=10,
)


def plain(obj: Any) -> bool:
    """JSON that must decode to itself: no tag key, NaN, lone surrogate or deep nesting."""
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, str):
        return not any(0xD800 <= ord(ch) <= 0xDFFF for ch in obj)
    if isinstance(obj, list):
        return all(map(plain, obj))
    if isinstance(obj, dict):
        return "$sk" not in obj and all(map(plain, obj)) and all(map(plain, obj.values()))
    return True


@SETTINGS
@given(json_values, st.booleans())
def test_arbitrary_json_decodes_or_raises_decode_error(obj: Any, ascii_only: bool) -> None:
    text = json.dumps(obj, ensure_ascii=ascii_only)
    try:
        out = CODEC.decode(text)
    except CheckpointDecodeError:
        assert not plain(obj)
        return
    if plain(obj):
        assert out == obj


@SETTINGS
@given(values(), st.data())
def test_tampered_records_decode_or_raise_decode_error(value: Any, data: st.DataObject) -> None:
    try:
        record = bytearray(CODEC.encode(value))
    except CheckpointEncodeError:
        return
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(record)))
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "insert" or at == len(record):
            record[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        elif action == "flip":
            record[at] ^= data.draw(st.integers(1, 255))
        else:
            del record[at]
    with contextlib.suppress(CheckpointDecodeError):
        CODEC.decode(bytes(record))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from('[]{}"\\:,1a u'), max_size=60).map("".join))
def test_bracket_soup_never_crashes(text: str) -> None:
    small = Codec(limits=CodecLimits(max_depth=3))
    with contextlib.suppress(CheckpointDecodeError):
        small.decode(text)


def test_dates_are_plain_leaves() -> None:
    assert CODEC.decode(CODEC.encode([date.min, date.max])) == [date.min, date.max]
