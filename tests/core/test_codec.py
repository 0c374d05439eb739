"""Unit tests for statekeeper.codec: every tag, every refusal both ways, the allowlist."""

from __future__ import annotations

import builtins
import collections
import dataclasses
import enum
import importlib
import json
import math
import re
import sys
import time as time_module
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from http import HTTPStatus
from typing import Any
from zoneinfo import ZoneInfo

import pydantic
import pytest

from statekeeper.codec import DEFAULT_LIMITS, Codec, CodecLimits
from statekeeper.errors import CheckpointDecodeError, CheckpointEncodeError, InvalidOptions


class Color(enum.Enum):
    RED = 1
    GREEN = "green"
    PAIR = (1, 2)


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(enum.StrEnum):
    FAST = "fast"


class Perm(enum.Flag):
    R = 1
    W = 2


class NotAllowed(enum.Enum):
    X = 1


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: tuple[int, ...] = ()
    label: str = dataclasses.field(default="", kw_only=True)
    area: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "area", self.x * 2)


@dataclasses.dataclass(slots=True)
class Slotted:
    a: Any
    b: Any = None


class Inner(pydantic.BaseModel):
    when: datetime
    tags: frozenset[str] = frozenset()


class Order(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")

    order_id: int = pydantic.Field(alias="orderId")
    inner: Inner | None = None
    color: Color = Color.RED
    payload: Any = None


class Ints(pydantic.RootModel[list[int]]):
    pass


class Positive(pydantic.BaseModel):
    n: int = pydantic.Field(gt=0)


ALLOWED: list[type | str] = [Color, Level, Mode, Perm, Point, Slotted, Inner, Order, Ints]
ALLOWED.append(f"{Positive.__module__}:{Positive.__qualname__}")
codec = Codec(allowed_types=ALLOWED)
NOW = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)


def same(a: Any, b: Any) -> bool:
    """Equal, with the same type at every level (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and str(a) == str(b))
    if isinstance(a, Decimal):
        return a.compare_total(b) == 0
    if isinstance(a, datetime | time):
        return (
            a.replace(tzinfo=None) == b.replace(tzinfo=None)
            and a.fold == b.fold
            and (a.tzinfo is None) == (b.tzinfo is None)
            and a.utcoffset() == b.utcoffset()
            and a == b
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, set | frozenset):
        by_value = {y: y for y in b}
        return len(a) == len(b) and all(x in by_value and same(x, by_value[x]) for x in a)
    if isinstance(a, dict):
        keys = {k: k for k in b}
        return len(a) == len(b) and all(
            k in keys and same(k, keys[k]) and same(v, b[k]) for k, v in a.items()
        )
    if isinstance(a, pydantic.BaseModel):
        return same(a.__dict__, b.__dict__) and same(a.__pydantic_extra__, b.__pydantic_extra__)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, enum.Enum):
        return a is b
    return bool(a == b)


def ident(value: Any) -> str:
    """A short test id (repr() of a huge int raises)."""
    try:
        text = repr(value)
    except ValueError:
        text = type(value).__name__
    # no memory address: pytest-xdist needs every worker to collect the same ids
    return re.sub(r" at 0x[0-9a-f]+", "", text)[:40]


def roundtrip(value: Any, c: Codec = codec) -> Any:
    data = c.encode(value)
    assert isinstance(data, bytes)
    out = c.decode(data)
    assert same(out, value), (value, out, data)
    assert same(c.decode(data.decode()), value)  # text takes the reference decoder
    return out


# -- round trips --------------------------------------------------------------

ROUNDTRIP_VALUES = [
    None,
    True,
    0,
    -(10**4299),
    1.5,
    -0.0,
    1e308,
    "",
    "snow ☃ \U0001f600 \x00 \\ud800",
    [],
    {},
    {"a": [1, {"b": None}], "c": "d"},
    NOW,
    datetime(2026, 1, 2),
    datetime(2026, 1, 2, fold=1),
    datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5, seconds=7, microseconds=8))),
    datetime.max,
    date(2026, 1, 2),
    time(23, 59, 59, 999999),
    time(1, 2, tzinfo=timezone(timedelta(hours=-3, minutes=-30))),
    time(1, 2, fold=1),
    time(0, tzinfo=timezone(timedelta(microseconds=1))),
    datetime(2026, 1, 1, tzinfo=timezone(-timedelta(microseconds=1))),
    datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-1, microseconds=7))),
    timedelta(0),
    timedelta(days=-1, microseconds=1),
    timedelta.max,
    timedelta.min,
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    Decimal("1.10"),
    Decimal("-0"),
    Decimal("1E+999999"),
    b"",
    bytes(range(256)),
    (),
    (1, (2, [3])),
    set(),
    {1, "a", (2, 3), frozenset({4})},
    frozenset({None, b"x"}),
    {1: "int key", 1.5: "float", None: "none", False: "bool", (1, 2): "tuple", "s": "str"},
    {"$sk": "datetime", "v": "2026-01-01"},
    {"$sk": {"$sk": 1}},
    {frozenset({1}): {date(2026, 1, 1): Color.RED}},
    Color.RED,
    Color.PAIR,
    Level.HIGH,
    Mode.FAST,
    Perm.R | Perm.W,
    Point(3, (1, 2), label="p"),
    Slotted([Point(1)], {"k": Level.LOW}),
    Order(orderId=7, inner=Inner(when=NOW, tags=frozenset({"a"})), payload={1: (2,)}),
    Order(orderId=1, extra_field=[1], **{"$sk": "not a tag"}),
    Ints([1, 2, 3]),
    Positive(n=3),
]


@pytest.mark.parametrize("value", ROUNDTRIP_VALUES, ids=ident)
def test_round_trip_is_exact(value: Any) -> None:
    roundtrip(value)


def test_format_is_pinned() -> None:
    value = {"a": (1, "x"), "b": NOW, 2: b"\x00"}
    assert codec.encode(value) == (
        b'{"$sk":"dict","v":[["a",{"$sk":"tuple","v":[1,"x"]}],'
        b'["b",{"$sk":"datetime","v":"2026-01-02T03:04:05.000006+00:00"}],'
        b'[2,{"$sk":"bytes","v":"AA=="}]]}'
    )
    assert codec.encode({"d": [1.5, None, True]}) == b'{"d":[1.5,null,true]}'
    assert codec.encode(Color.RED) == (
        b'{"$sk":"enum","t":"' + Color.__module__.encode() + b':Color","v":1}'
    )
    assert codec.encode("é") == '"é"'.encode()  # UTF-8, not \u escapes
    assert Codec.name == "sk-json/1"


def test_user_dict_with_tag_key_is_never_a_tag() -> None:
    data = codec.encode({"$sk": "tuple", "v": [1]})
    assert json.loads(data)["$sk"] == "dict"
    assert codec.decode(data) == {"$sk": "tuple", "v": [1]}


def test_zoneinfo_keeps_its_zone_even_in_a_fold_and_a_gap() -> None:
    ny = ZoneInfo("America/New_York")
    for value in (
        datetime(2026, 7, 1, 12, tzinfo=ny),
        datetime(2026, 11, 1, 1, 30, tzinfo=ny),  # ambiguous, first
        datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=ny),  # ambiguous, second
        datetime(2026, 3, 8, 2, 30, tzinfo=ny),  # skipped
    ):
        out = roundtrip(value)
        assert out.tzinfo is ny
    assert json.loads(codec.encode(datetime(2026, 7, 1, tzinfo=ny)))["tz"] == "America/New_York"


class FoldZone(tzinfo):
    """A non-ZoneInfo zone whose offset depends on fold at 01:xx."""

    def utcoffset(self, dt: datetime | None) -> timedelta:
        if dt is not None and dt.hour == 1 and dt.fold:
            return timedelta(hours=-5)
        return timedelta(hours=-4)

    def dst(self, dt: datetime | None) -> timedelta:
        return timedelta(0)


class NoOffset(tzinfo):
    def utcoffset(self, dt: datetime | None) -> None:
        return None


def test_other_tzinfo_is_a_fixed_offset_and_ambiguity_is_refused() -> None:
    out = roundtrip(datetime(2026, 1, 1, 12, tzinfo=FoldZone()))
    assert out.tzinfo == timezone(timedelta(hours=-4))
    no_cache = ZoneInfo.no_cache("Europe/Paris")
    assert roundtrip(datetime(2026, 1, 1, tzinfo=no_cache)).utcoffset() == timedelta(hours=1)
    with pytest.raises(CheckpointEncodeError, match="ambiguous or skipped"):
        codec.encode({"t": datetime(2026, 1, 1, 1, 30, tzinfo=FoldZone())})
    with pytest.raises(CheckpointEncodeError, match="without a UTC offset"):
        codec.encode(datetime(2026, 1, 1, tzinfo=NoOffset()))
    with pytest.raises(CheckpointEncodeError, match="without a UTC offset"):
        codec.encode(time(1, tzinfo=ZoneInfo("Europe/Paris")))


def test_enum_flag_and_allowlist_by_string() -> None:
    c = Codec(allowed_types=["http:HTTPStatus", "http:HTTPStatus", HTTPStatus])
    assert c.allowed_types == (HTTPStatus,)
    assert roundtrip(HTTPStatus.OK, c) is HTTPStatus.OK
    assert roundtrip(Perm.R | Perm.W) == Perm.R | Perm.W
    assert codec.allowed_types[-1] is Positive


def test_model_decode_runs_validation() -> None:
    name = f"{Positive.__module__}:Positive"
    data = json.dumps({"$sk": "model", "t": name, "v": {"n": -1}})
    with pytest.raises(CheckpointDecodeError, match="ValidationError"):
        codec.decode(data)


# -- encode refusals ----------------------------------------------------------


class MyStr(str):
    pass


@dataclasses.dataclass
class Unlisted:
    a: int = 1


class UnlistedModel(pydantic.BaseModel):
    a: int = 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (object(), "unsupported type builtins:object"),
        (lambda: 1, "unsupported type"),
        (bytearray(b"x"), "subclass of|unsupported type"),
        (MyStr("x"), "subclass of str"),
        (collections.OrderedDict(a=1), "subclass of dict"),
        (collections.defaultdict(list), "subclass of dict"),
        (NotAllowed.X, "not in allowed_types"),
        (Unlisted(), "not in allowed_types"),
        (UnlistedModel(), "not in allowed_types"),
        (Color, "unsupported type"),
        (float("nan"), "allow_nan=False"),
        (float("-inf"), "allow_nan=False"),
        (Decimal("NaN"), "allow_nan=False"),
        (Decimal("sNaN"), "allow_nan=False"),
        (Decimal("-Infinity"), "allow_nan=False"),
        (10**4300, "max_int_digits=4300"),
        (-(10**4300), "max_int_digits=4300"),
        ("\ud800", "lone surrogate"),
    ],
    ids=ident,
)
def test_encode_refuses(value: Any, message: str) -> None:
    with pytest.raises(CheckpointEncodeError, match=message):
        codec.encode(value)
    with pytest.raises(CheckpointEncodeError, match=message):
        codec.encode({"k": [value]})


def test_intenum_not_allowlisted_is_refused_not_turned_into_int() -> None:
    with pytest.raises(CheckpointEncodeError, match="not in allowed_types"):
        Codec().encode({"level": Level.LOW})
    assert type(Codec().decode(Codec().encode(True))) is bool


def test_encode_error_says_where() -> None:
    with pytest.raises(CheckpointEncodeError, match=r"state\['a'\]\[3\]: unsupported type"):
        codec.encode({"a": [0, 1, 2, object()]})
    with pytest.raises(CheckpointEncodeError, match=r"state\['p'\]\.y\[0\]: unsupported"):
        codec.encode({"p": Point(1, (object(),))})  # type: ignore[arg-type]
    with pytest.raises(CheckpointEncodeError, match=r"state\[1\]\['x'\]: an int"):
        codec.encode([1, {"x": 10**5000}])
    with pytest.raises(CheckpointEncodeError, match=r"state\[2\]: nan"):
        codec.encode((1, 2, float("nan")))
    with pytest.raises(CheckpointEncodeError, match=r"state\['k'\]\[1\]: the string"):
        codec.encode({"k": ["ok", "bad \udfff"]})
    with pytest.raises(CheckpointEncodeError, match=r"state<key 0>: the string"):
        codec.encode({"\ud800": 1})


def test_cycles_are_encode_errors() -> None:
    loop: list[Any] = []
    loop.append(loop)
    mapping: dict[str, Any] = {}
    mapping["self"] = (mapping,)
    for value in (loop, {"x": mapping}):
        with pytest.raises(CheckpointEncodeError, match="reference cycle"):
            codec.encode(value)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def test_depth_limit_is_the_same_both_ways() -> None:
    small = Codec(limits=CodecLimits(max_depth=5))
    big = Codec(limits=CodecLimits(max_depth=500))
    assert small.decode(small.encode(nested(5))) == nested(5)
    for value in (nested(6), [[[[(1,)]]]], [[[{1: 2}]]], [[[[{"k": NOW}]]]]):
        with pytest.raises(CheckpointEncodeError, match="max_depth=5"):
            small.encode(value)
        with pytest.raises(CheckpointDecodeError, match="max_depth=5"):
            small.decode(big.encode(value))
    assert small.decode(small.encode([[[(1,)]]])) == [[[(1,)]]]


def test_size_limit_is_the_same_both_ways() -> None:
    value = {"k": "x" * 20}
    size = len(codec.encode(value))
    exact = Codec(limits=CodecLimits(max_bytes=size))
    assert exact.decode(exact.encode(value)) == value
    tight = Codec(limits=CodecLimits(max_bytes=size - 1))
    with pytest.raises(CheckpointEncodeError, match="max_bytes"):
        tight.encode(value)
    with pytest.raises(CheckpointDecodeError, match="max_bytes"):
        tight.decode(codec.encode(value))
    with pytest.raises(CheckpointDecodeError, match="max_bytes"):
        tight.decode(codec.encode(value).decode())
    with pytest.raises(CheckpointDecodeError, match="max_bytes"):  # checked before parsing
        Codec(limits=CodecLimits(max_bytes=10)).decode(b"[" * 11)


def test_int_digits_limit_is_the_same_both_ways() -> None:
    c = Codec(limits=CodecLimits(max_int_digits=3))
    assert c.decode(c.encode([999, -999])) == [999, -999]
    for value in (1000, -1000, [1000], {"a": (1000,)}):
        with pytest.raises(CheckpointEncodeError, match="max_int_digits=3"):
            c.encode(value)
        with pytest.raises(CheckpointDecodeError, match="max_int_digits=3"):
            c.decode(codec.encode(value))


def no_constants(token: str) -> Any:
    raise AssertionError(f"non-standard JSON token {token}")


def test_int_digits_above_pythons_own_limit_are_refused_both_ways() -> None:
    c = Codec(limits=CodecLimits(max_int_digits=10_000))
    with pytest.raises(CheckpointEncodeError, match="Exceeds the limit"):
        c.encode([10**5000])
    with pytest.raises(CheckpointDecodeError, match=r"more than 4300 \(sys"):
        c.decode(b"1" * 5000)


def test_nan_policy_allow() -> None:
    c = Codec(limits=CodecLimits(allow_nan=True))
    for value in (
        float("nan"),
        float("inf"),
        [float("-inf")],
        {float("inf"): 1},
        Decimal("NaN"),
        Decimal("-sNaN123"),
        Decimal("Infinity"),
    ):
        data = c.encode(value)
        json.loads(data, parse_constant=no_constants)  # always strict JSON
        roundtrip(value, c)
        with pytest.raises(CheckpointDecodeError, match="allow_nan=False"):
            codec.decode(data)
    assert math.isnan(c.decode(b"NaN"))
    assert c.decode(b"[Infinity,-Infinity,1e400]") == [math.inf, -math.inf, math.inf]


# -- decode refusals ----------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff", "not valid UTF-8"),
        (b'"\xed\xa0\x80"', "not valid UTF-8"),  # an encoded surrogate
        ("\ud800", "not valid UTF-8"),
        (b"", "invalid JSON"),
        (b"[1,]", "invalid JSON"),
        (b"{} {}", "invalid JSON"),
        (b"\xef\xbb\xbf{}", "invalid JSON"),
        (b'{"a":1,"a":2}', "duplicate key 'a'"),
        (b'[{"$sk":"tuple","v":[],"v":[]}]', "duplicate key 'v'"),
        (b"NaN", "allow_nan=False"),
        (b"[-Infinity]", "allow_nan=False"),
        (b"1e400", "overflows"),
        (b'"\\ud800"', "lone surrogate"),
        (b'"\\udc00\\ud800"', "lone surrogate"),
        (b'{"\\uDBFF":1}', "lone surrogate"),
        (b"[" * 100_000 + b"]" * 100_000, "max_depth=100"),
        (b'{"a":' * 100_000, "max_depth=100"),
        (b"1" * 1_000_000, "max_int_digits=4300"),
        (b"-" + b"1" * 4301, "max_int_digits=4300"),
        (b'{"$sk":"nope","v":1}', "unknown tag 'nope'"),
        (b'{"$sk":1}', "unknown tag 1"),
        (b'{"$sk":["tuple"],"v":[]}', "unknown tag"),
        (b'{"$sk":"tuple","v":[],"x":1}', "malformed 'tuple' tag"),
        (b'{"$sk":"tuple"}', "malformed 'tuple' tag"),
        (b'{"$sk":"tuple","v":"ab"}', "expected list"),
        (b'{"$sk":"datetime","v":"yesterday"}', "malformed 'datetime'"),
        (b'{"$sk":"datetime","v":1}', "expected str"),
        (b'{"$sk":"datetime","v":"2026-01-01","fold":0}', "fold must be 1"),
        (b'{"$sk":"datetime","v":"2026-01-01","fold":true}', "expected int"),
        (b'{"$sk":"datetime","v":"2026-01-01","tz":"../etc/passwd"}', "time zone"),
        (b'{"$sk":"datetime","v":"2026-01-01","tz":"Nowhere/Atlantis"}', "datetime"),
        (b'{"$sk":"time","v":"10:00","tz":"UTC"}', "malformed 'time'"),
        (b'{"$sk":"date","v":"2026-13-01"}', "malformed 'date'"),
        (b'{"$sk":"timedelta","v":1.5}', "expected int"),
        (b'{"$sk":"timedelta","v":99999999999999999999999}', "malformed 'timedelta'"),
        (b'{"$sk":"uuid","v":"nope"}', "malformed 'uuid'"),
        (b'{"$sk":"decimal","v":"1.2.3"}', "malformed 'decimal'"),
        (b'{"$sk":"decimal","v":"NaN"}', "allow_nan=False"),
        (b'{"$sk":"bytes","v":"***"}', "malformed 'bytes'"),
        (b'{"$sk":"set","v":[[1]]}', "unhashable"),
        (b'{"$sk":"set","v":[1,1]}', "repeated items"),
        (b'{"$sk":"frozenset","v":[1,true]}', "repeated items"),
        (b'{"$sk":"dict","v":[[1,2],[1,3]]}', "repeated items"),
        (b'{"$sk":"dict","v":[[1,2,3]]}', "pairs"),
        (b'{"$sk":"dict","v":[[[1],2]]}', "unhashable"),
        (b'{"$sk":"float","v":"nan"}', "allow_nan=False"),
        (b'{"$sk":"enum","t":"os:system","v":"echo hi"}', "'os:system' is not in allowed_types"),
        (b'{"$sk":"model","t":"builtins:eval","v":{}}', "not in allowed_types"),
        (b'{"$sk":"enum","t":["x"],"v":1}', "not in allowed_types"),
        (b'{"$sk":"enum","t":"x"}', "malformed 'enum'"),
    ],
    ids=ident,
)
def test_decode_refuses(data: bytes | str, message: str) -> None:
    with pytest.raises(CheckpointDecodeError, match=message):
        codec.decode(data)


def test_decode_refuses_bad_user_class_tags() -> None:
    def tag(kind: str, cls: type, v: Any) -> bytes:
        return json.dumps(
            {"$sk": kind, "t": f"{cls.__module__}:{cls.__qualname__}", "v": v}
        ).encode()

    for data, message in [
        (tag("enum", Color, 99), "ValueError"),
        (tag("dataclass", Color, 1), "is not a dataclass"),
        (tag("dataclass", Point, {"x": 1, "evil": 2}), "no fields"),
        (tag("dataclass", Point, {}), "TypeError"),
        (tag("dataclass", Point, [1]), "expected dict"),
        (tag("model", Order, {"order_id": "x"}), "ValidationError"),
        (tag("model", Ints, {"a": 1}), "ValidationError"),
    ]:
        with pytest.raises(CheckpointDecodeError, match=message):
            codec.decode(data)


def test_decode_never_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_import(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"import at decode time: {args[:1]}")

    planted = [json.dumps({"$sk": k, "t": "this:s", "v": {}}) for k in ("enum", "model")]
    good = codec.encode([Color.RED, Point(1), NOW, Order(orderId=1)])
    errors: list[str] = []
    assert "this" not in sys.modules
    with monkeypatch.context() as patch:
        patch.setattr(importlib, "import_module", no_import)
        patch.setattr(builtins, "__import__", no_import)
        for data in planted:
            try:
                codec.decode(data)
            except CheckpointDecodeError as e:
                errors.append(str(e))
        decoded = codec.decode(good)
    assert decoded == [Color.RED, Point(1), NOW, Order(orderId=1)]
    assert len(errors) == 2 and all("'this:s' is not in allowed_types" in e for e in errors)
    assert "this" not in sys.modules


def test_decode_input_types() -> None:
    assert codec.decode(bytearray(b"[1]")) == [1]
    assert codec.decode(memoryview(b"[1]")) == [1]
    assert codec.decode(" [1] ") == [1]
    with pytest.raises(CheckpointDecodeError, match="expected bytes or str"):
        codec.decode(None)  # type: ignore[arg-type]


def test_decode_is_fast_on_hostile_input() -> None:
    started = time_module.perf_counter()
    for data in (
        b"9" * 2_000_000,
        b"[" * 2_000_000,
        b'"' + b'\\"[' * 1_000_000,
        b'"' + b"\\ud800\\udc00" * 300_000,
    ):
        with pytest.raises(CheckpointDecodeError):
            codec.decode(data)
    assert time_module.perf_counter() - started < 5


# -- metadata, decode refusals, options ---------------------------------------


def test_check_metadata() -> None:
    meta = {"note": 'say "$sk": hi', "n": [1, 2.5, None, True, {"x": "y"}]}
    assert codec.check_metadata(meta) is meta
    assert json.loads(codec.encode(meta)) == meta
    for bad, message in [
        ([1], "must be a dict"),
        ({"t": (1, 2)}, r"metadata\['t'\]: metadata must be plain JSON .*, not tuple"),
        ({"s": [0, {1}]}, r"metadata\['s'\]\[1\]: .*not set"),
        ({"d": NOW}, "not datetime"),
        ({"e": Color.RED}, "not enum"),
        ({"s": MyStr("x")}, "subclass of str"),
        ({1: "x"}, r"metadata: .*not a dict with a non-str or reserved key"),
        ({"a": {"$sk": "tuple"}}, r"metadata\['a'\]: .*not a dict with a non-str"),
        ({"f": float("nan")}, "allow_nan=False"),
        ({"big": 10**4300}, "max_int_digits"),
        ({"s": "\ud800"}, r"metadata\['s'\]: the string contains a lone surrogate"),
        ({"deep": nested(100)}, "max_depth=100"),
        ({"x": object()}, r"metadata\['x'\]: unsupported type"),
    ]:
        with pytest.raises(CheckpointEncodeError, match=message):
            codec.check_metadata(bad)
    with pytest.raises(CheckpointEncodeError, match="max_bytes"):
        Codec(limits=CodecLimits(max_bytes=10)).check_metadata({"k": "0123456789"})
    # allow_nan is for state: metadata lives in the record header and the index rows,
    # which are strict JSON (it was accepted here, then every save failed with a bare
    # ValueError from the header encoder)
    nan_ok = Codec(limits=CodecLimits(allow_nan=True))
    for bad in ({"f": math.inf}, {"a": [1, {"n": math.nan}]}):
        with pytest.raises(CheckpointEncodeError, match="NaN or infinite float"):
            nan_ok.check_metadata(bad)
    assert nan_ok.check_metadata({"f": 1.5}) == {"f": 1.5}


def test_decode_refuses_what_json_from_elsewhere_may_hold() -> None:
    """What ``decode_plain`` (removed: only tests used it) checked, through ``decode``."""
    assert codec.decode(b'{"$sk": "tuple", "v": [1]}') == (1,)
    for bad, message in [
        (b"NaN", "allow_nan=False"),
        (b'"\\ud800"', "lone surrogate"),
        (b"1" * 5000, "max_int_digits"),
        (json.dumps(nested(101)).encode(), "max_depth=100"),
        (b'{"$sk": "tuple"}', "malformed"),
        (b'{"$sk": "enum", "t": "os:system", "v": 1}', "not in allowed_types"),
    ]:
        with pytest.raises(CheckpointDecodeError, match=message):
            codec.decode(bad)


def test_limits_model() -> None:
    assert CodecLimits() == DEFAULT_LIMITS
    assert (DEFAULT_LIMITS.max_depth, DEFAULT_LIMITS.max_bytes) == (100, 16 * 1024 * 1024)
    assert (DEFAULT_LIMITS.max_int_digits, DEFAULT_LIMITS.allow_nan) == (4300, False)
    assert Codec().limits is DEFAULT_LIMITS
    with pytest.raises(pydantic.ValidationError):
        CodecLimits(max_depth=0)
    with pytest.raises(pydantic.ValidationError):
        CodecLimits(max_depth=501)
    with pytest.raises(pydantic.ValidationError):
        CodecLimits(unknown=1)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        DEFAULT_LIMITS.max_depth = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("allowed", "message"),
    [
        (["no_such_module_xyz:Thing"], "cannot be imported"),
        (["http:NoSuchThing"], "cannot be imported"),
        (["http.HTTPStatus"], "module:Qualname"),
        ([":X"], "module:Qualname"),
        (["json:dumps"], "is not a class"),
        ([int], "not an Enum, a pydantic model or a dataclass"),
        ([42], "classes or strings"),
        ("http:HTTPStatus", "must be a list"),
    ],
)
def test_bad_allowed_types(allowed: Any, message: str) -> None:
    with pytest.raises(InvalidOptions, match=message):
        Codec(allowed_types=allowed)
    assert issubclass(InvalidOptions, ValueError)


def test_two_classes_with_one_name_are_refused() -> None:
    def make() -> type:
        class Twin(enum.Enum):
            A = 1

        return Twin

    with pytest.raises(InvalidOptions, match="both named"):
        Codec(allowed_types=[make(), make()])


def test_repr_names_the_allowlist() -> None:
    assert "http:HTTPStatus" in repr(Codec(allowed_types=[HTTPStatus]))
