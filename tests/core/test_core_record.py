"""The record envelope: torn, truncated or mismatched bytes are never valid data."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statekeeper.errors import CheckpointDecodeError
from statekeeper.record import NewRecord, StoredRecord

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _record(state: bytes = b'{"step":10}', seq: int = 7) -> StoredRecord:
    return NewRecord(
        id="cp-1",
        stream="s/ü",
        state=state,
        codec="sk-json/1",
        created_at=NOW,
        updated_at=NOW,
        etag="e1",
        parent_id=None,
        tags={"k": "v'%_"},
        metadata={"note": [1, 2.5, None]},
        ttl=30.0,
        expires_at=NOW,
    ).seal(seq)


def test_round_trip_keeps_every_field() -> None:
    rec = _record()
    back = StoredRecord.from_bytes(rec.to_bytes("store-1"), location="t", expect_store_id="store-1")
    assert back == rec
    assert back.header.created_at == NOW and back.header.created_at.tzinfo is not None


@pytest.mark.parametrize("cut", [1, 2, 5, 20])
def test_every_truncation_is_detected(cut: int) -> None:
    data = _record().to_bytes("s")
    with pytest.raises(CheckpointDecodeError):
        StoredRecord.from_bytes(data[:-cut], location="t")


def test_truncated_ten_never_parses_as_one() -> None:
    data = _record(b"10").to_bytes("s")
    with pytest.raises(CheckpointDecodeError, match="torn or truncated"):
        StoredRecord.from_bytes(data[:-1], location="t")


def test_every_single_byte_flip_is_detected() -> None:
    data = _record().to_bytes("s")
    for i in range(len(data)):
        corrupt = bytearray(data)
        corrupt[i] ^= 0x20
        with pytest.raises(CheckpointDecodeError):
            StoredRecord.from_bytes(bytes(corrupt), location="t")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"expect_store_id": "other"}, "another store"),
        ({"expect_id": "cp-2"}, "id is"),
        ({"expect_sequence": 70}, "stored at sequence 70"),
    ],
)
def test_mismatch_with_where_it_is_stored_is_an_error(
    kwargs: dict[str, object], match: str
) -> None:
    data = _record().to_bytes("s")
    with pytest.raises(CheckpointDecodeError, match=match) as info:
        StoredRecord.from_bytes(data, location="file.rec", **kwargs)  # type: ignore[arg-type]
    assert info.value.location == "file.rec"


@pytest.mark.parametrize("junk", [b"", b"SK1 ", b"SK1 a b c\n", b"\x00" * 100, b"SK1 1 1 0\n{"])
def test_junk_is_a_decode_error(junk: bytes) -> None:
    with pytest.raises(CheckpointDecodeError):
        StoredRecord.from_bytes(junk, location="t")


def test_update_keeps_identity_and_slides_ttl() -> None:
    rec = _record()
    later = datetime(2026, 1, 3, tzinfo=UTC)
    new = rec.updated(b"2", now=later, etag="e2")
    assert (new.id, new.sequence, new.header.created_at) == (rec.id, rec.sequence, NOW)
    assert new.header.updated_at == later and new.header.etag == "e2"
    assert new.header.expires_at is not None
    assert (new.header.expires_at - later).total_seconds() == 30.0


def _reseal(head: dict[str, object], state: bytes = b"1") -> bytes:
    """An envelope with a valid checksum around an arbitrary header (a planted record)."""
    import json
    import zlib

    raw = json.dumps(head).encode()
    crc = zlib.crc32(state, zlib.crc32(raw))
    return b"SK1 %d %d %08x\n" % (len(raw), len(state), crc) + raw + state


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tags", ["k", "v"]),
        ("tags", {"k": 1}),
        ("meta", [1]),
        ("seq", True),
        ("seq", 0),
        ("seq", "7"),
        ("id", 7),
        ("created", "2026-01-01T00:00:00"),  # naive
        ("created", 12),
        ("parent", 3),
        ("ttl", "30"),
        ("store", None),
    ],
)
def test_planted_header_with_wrong_types_is_a_decode_error(field: str, value: object) -> None:
    import json

    good = _record().to_bytes("s")
    newline = good.index(b"\n")
    head_len = int(good[:newline].split(b" ")[1])
    head = json.loads(good[newline + 1 : newline + 1 + head_len])
    assert StoredRecord.from_bytes(_reseal(dict(head)), location="t").id == "cp-1"
    head[field] = value
    with pytest.raises(CheckpointDecodeError, match="malformed record header"):
        StoredRecord.from_bytes(_reseal(head), location="t")


def test_positional_record_takes_its_sequence_from_where_it_is_stored() -> None:
    rec = _record(seq=7)
    data = rec.to_bytes("store-1", positional=True)
    assert b'"seq":null' in data
    back = StoredRecord.from_bytes(data, location="t", expect_sequence=42)
    assert back.sequence == 42
    assert back.header.model_copy(update={"sequence": 7}) == rec.header
    # the checksum still covers the rest: one flipped byte of the header is caught
    flipped = bytearray(data)
    flipped[data.index(b'"stream"') + 2] ^= 0x01
    with pytest.raises(CheckpointDecodeError):
        StoredRecord.from_bytes(bytes(flipped), location="t", expect_sequence=42)


def test_positional_record_without_a_position_is_a_decode_error() -> None:
    data = _record().to_bytes("store-1", positional=True)
    with pytest.raises(CheckpointDecodeError, match="positional"):
        StoredRecord.from_bytes(data, location="t")


# -- the one header parser reads what json reads, as the format says ----------------

_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**20),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(["2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00", "2026-13-01", "1"]),
    st.lists(st.integers(0, 3) | st.text(max_size=2), max_size=2),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3) | st.integers() | st.floats()),
)
_STRINGS = ("store", "id", "stream", "created", "updated", "etag", "codec")
_KEYS = (*_STRINGS, "v", "seq", "parent", "tags", "meta", "expires", "ttl")


def _not_json(token: str) -> object:
    raise ValueError(f"{token} is not JSON")


def _reference(head: bytes, expect_sequence: object) -> tuple[object, ...]:
    """The header as ``json`` reads it (strict JSON: no NaN or Infinity), held to the
    format: every key present with its JSON type, the version 1, a positive sequence
    (a positional record's is ``expect_sequence``), timezone-aware timestamps."""
    import json

    def number(x: object) -> bool:
        return type(x) in (int, float)

    try:
        h = json.loads(head, parse_constant=_not_json)
    except ValueError:
        return ("refused",)
    if not isinstance(h, dict):
        return ("refused",)
    if "v" in h and h["v"] != 1:
        return ("version", h["v"])
    if not all(k in h for k in _KEYS) or not all(type(h[k]) is str for k in _STRINGS):
        return ("refused",)
    seq, tags, ttl = h["seq"], h["tags"], h["ttl"]
    if not all(x is None or type(x) is str for x in (h["parent"], h["expires"])):
        return ("refused",)
    if not (seq is None or type(seq) is int) or not (ttl is None or number(ttl)):
        return ("refused",)
    if type(tags) is not dict or not all(type(x) is str for x in tags.values()):
        return ("refused",)
    if type(h["meta"]) is not dict:
        return ("refused",)
    sequence = expect_sequence if seq is None else seq
    if type(sequence) is not int or sequence < 1:
        return ("refused",)
    stamps = []
    for key in ("created", "updated", "expires"):
        try:
            stamp = None if h[key] is None else datetime.fromisoformat(h[key])
        except ValueError:
            return ("refused",)
        if stamp is not None and stamp.tzinfo is None:
            return ("refused",)
        stamps.append(stamp)
    values = {
        "id": h["id"],
        "stream": h["stream"],
        "sequence": sequence,
        "created_at": stamps[0],
        "updated_at": stamps[1],
        "etag": h["etag"],
        "parent_id": h["parent"],
        "tags": tags,
        "metadata": h["meta"],
        "expires_at": stamps[2],
    }
    return ("ok", values, h["store"], h["codec"], ttl, seq)


def _parsed(head: bytes, expect_sequence: object) -> tuple[object, ...]:
    from statekeeper.record.frame import Malformed
    from statekeeper.record.header import parse_header

    try:
        values, *rest = parse_header(head, expect_sequence)  # type: ignore[arg-type]
    except Malformed as exc:
        if exc.reason.startswith("unsupported record format version"):
            return ("version", exc.reason)
        return ("refused",) if exc.reason.startswith("malformed record header: ") else (exc,)
    return ("ok", values, *rest)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["v", "seq", "id", "created", "updated", "expires", "tags", "meta"])
        | st.sampled_from(["ttl", "store", "codec", "parent", "etag", "stream", "extra"]),
        _FIELD_VALUES,
        max_size=3,
    ),
    st.sampled_from(["compact", "spaced", "duplicate"]),
    st.none() | st.integers(-1, 9) | st.just(True),
    st.booleans(),
)
def test_header_parse_reads_what_json_reads_as_the_format_says(
    edits: dict[str, object], spelling: str, expect_sequence: int | None, positional: bool
) -> None:
    """Whatever the spelling (spaces, a duplicate key), the one parser accepts
    exactly the headers that json reads and the format allows, with the same values
    and types, and refuses the rest with a reason (a NaN or Infinity token is not
    JSON: refused, where the json reading of old accepted one in the metadata)."""
    import json

    good = _record().to_bytes("s", positional=positional)
    newline = good.index(b"\n")
    head_len = int(good[:newline].split(b" ")[1])
    raw = good[newline + 1 : newline + 1 + head_len]
    fields = {**json.loads(raw), **edits}
    if spelling == "spaced":
        head = json.dumps(fields, ensure_ascii=False).encode()
    else:
        head = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()
        if spelling == "duplicate" and edits:
            key = next(iter(edits))
            head = b'{"%s":%s,' % (key.encode(), json.dumps(json.loads(raw).get(key)).encode())
            head += json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()[1:]
    want, got = _reference(head, expect_sequence), _parsed(head, expect_sequence)
    if want[0] == "version":
        assert got == ("version", f"unsupported record format version {want[1]!r}")
    elif want[0] == "ok":
        assert got[0] == "ok", (head, got)
        assert [(k, type(v)) for k, v in got[1].items()] == [  # type: ignore[union-attr]
            (k, type(v))
            for k, v in want[1].items()  # type: ignore[union-attr]
        ]
        assert got[1:] == want[1:]
    else:
        assert got == want, (head, got)


def test_header_bytes_read_back_as_the_header() -> None:
    import json

    from statekeeper.record.header import parse_header

    rec = _record()
    data = rec.to_bytes("store-1")
    newline = data.index(b"\n")
    head_len = int(data[:newline].split(b" ")[1])
    head = data[newline + 1 : newline + 1 + head_len]
    assert list(json.loads(head)) == [
        "v", "store", "id", "stream", "seq", "created", "updated", "etag",
        "parent", "tags", "meta", "expires", "ttl", "codec",
    ]  # fmt: skip
    values, store, codec, ttl, seq = parse_header(head, None)
    assert values == dict(rec.header)
    assert (store, codec, ttl, seq) == ("store-1", "sk-json/1", 30.0, 7)


def test_another_format_version_says_so_whatever_its_fields() -> None:
    import json

    from statekeeper.record.frame import Malformed
    from statekeeper.record.header import parse_header

    for head in ({"v": 2}, {"v": 2, "seq": "x"}, {"v": "1"}):
        with pytest.raises(Malformed, match="unsupported record format version"):
            parse_header(json.dumps(head).encode(), None)


def test_metadata_with_nan_is_refused_by_to_bytes_as_before() -> None:
    """msgspec would write NaN as null; the header keeps json's refusal."""
    rec = _record()
    bad = replace(rec, header=rec.header.model_copy(update={"metadata": {"x": [float("nan")]}}))
    with pytest.raises(ValueError, match="Out of range float"):
        bad.to_bytes("s")


def test_trusted_new_record_is_new_record_field_for_field() -> None:
    """The save path's constructor sets every field of NewRecord, each to its own
    value (a field added or reordered in the dataclass breaks this, not a save)."""
    import dataclasses
    import inspect
    from datetime import timedelta

    from statekeeper.record import trusted_new_record

    names = [f.name for f in dataclasses.fields(NewRecord)]
    assert list(inspect.signature(trusted_new_record).parameters) == names
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    values: dict[str, object] = {
        "id": "i",
        "stream": "s",
        "state": b"x",
        "codec": "c",
        "created_at": t0,
        "updated_at": t0 + timedelta(seconds=1),
        "etag": "e",
        "parent_id": "p",
        "tags": {"k": "v"},
        "metadata": {"m": 1},
        "ttl": 1.5,
        "expires_at": t0 + timedelta(seconds=2),
        "written_at": t0 + timedelta(seconds=3),
    }
    made = trusted_new_record(**values)  # type: ignore[arg-type]
    assert type(made) is NewRecord
    assert made == NewRecord(**values)  # type: ignore[arg-type]
    assert [getattr(made, name) for name in names] == list(values.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.id = "other"  # type: ignore[misc]


def test_trusted_stored_record_is_stored_record_field_for_field() -> None:
    """The read paths' constructor sets every field of StoredRecord, each to its own
    value, in the dataclass's order."""
    import dataclasses
    import inspect

    from statekeeper.record import trusted_stored_record

    names = [f.name for f in dataclasses.fields(StoredRecord)]
    assert list(inspect.signature(trusted_stored_record).parameters) == names
    header = _record().header
    made = trusted_stored_record(header, b"x", "c", 2.5)
    assert type(made) is StoredRecord
    assert made == StoredRecord(header=header, state=b"x", codec="c", ttl=2.5)
    assert [getattr(made, name) for name in names] == [header, b"x", "c", 2.5]
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.codec = "other"  # type: ignore[misc]


def test_read_models_are_the_validated_ones() -> None:
    """trusted_header, trusted_checkpoint and checkpoint_with_state build models
    with pydantic's public ``model_copy`` of a template: what they build equals,
    dumps, copies and pickles as the models built directly, and keeps the state
    object it was given. Each has every field set, in a plain set of its own (a
    change to one model's set reaches no other model, nor the template), and no
    placeholder value of the template shows through."""
    import copy
    import pickle
    from datetime import timedelta

    from statekeeper.models import (
        Checkpoint,
        CheckpointHeader,
        checkpoint_with_state,
        trusted_checkpoint,
        trusted_header,
    )

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    values = {
        "id": "i",
        "stream": "s",
        "sequence": 3,
        "created_at": t0,
        "updated_at": t0 + timedelta(seconds=1),
        "etag": "e",
        "parent_id": None,
        "tags": {"k": "v"},
        "metadata": {"m": [1]},
        "expires_at": None,
    }
    header = trusted_header(dict(values))
    assert type(header) is CheckpointHeader
    assert header == CheckpointHeader(**values)  # type: ignore[arg-type]
    assert header.model_dump() == CheckpointHeader(**values).model_dump()  # type: ignore[arg-type]
    assert header.model_fields_set == set(CheckpointHeader.model_fields)
    state = {"v": 1}
    for cp in (checkpoint_with_state(header, state), trusted_checkpoint(dict(values), state)):
        assert type(cp) is Checkpoint and cp.state is state
        assert cp == Checkpoint(**values, state={"v": 1})  # type: ignore[arg-type]
        assert list(vars(cp)) == list(Checkpoint.model_fields)
        assert cp.model_fields_set == set(Checkpoint.model_fields)
        changed = cp.model_copy(update={"etag": "f"})
        assert changed.etag == "f" and cp.etag == "e"
        for twin in (changed, copy.copy(cp), copy.deepcopy(cp), pickle.loads(pickle.dumps(cp))):
            assert twin.model_fields_set == set(Checkpoint.model_fields)
        assert pickle.loads(pickle.dumps(cp)) == cp
        assert cp.model_dump(exclude_unset=True) == cp.model_dump()
    # a checkpoint made from a checkpoint takes the new state, not the old one
    again = checkpoint_with_state(checkpoint_with_state(header, state), None)
    assert again.state is None and again.header() == header
    assert type(header.model_fields_set) is set
    header.model_fields_set.discard("id")  # the caller's own model: nobody else's set
    for other in (
        trusted_header(dict(values)),
        trusted_checkpoint(dict(values), None),
        checkpoint_with_state(header, None),
    ):
        assert type(other.model_fields_set) is set
        assert other.model_fields_set == set(type(other).model_fields)
    for twin in (copy.copy(header), header.model_copy(update={"etag": "g"})):
        assert type(twin.model_fields_set) is set
    # the values are the ones given, never the template's placeholders
    made = trusted_checkpoint(dict(values), 7)
    assert made.model_dump() == {**values, "state": 7}
    bare = trusted_checkpoint(dict(values), None)
    assert bare.model_dump() == {**values, "state": None} and bare == Checkpoint(**values)  # type: ignore[arg-type]
    assert bare.model_fields_set == set(Checkpoint.model_fields)
    assert made.tags is values["tags"] and made.metadata is values["metadata"]


def _both_ways(
    data: object, store_id: str | None, id: str, seq: int
) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """``read_record`` and the ``from_bytes`` call it stands for, as comparable outcomes."""
    from statekeeper.record import read_record

    def outcome(call: object) -> tuple[object, ...]:
        try:
            rec = call()  # type: ignore[operator]
        except CheckpointDecodeError as exc:
            return ("error", type(exc), str(exc), exc.id, exc.location, exc.sequence)
        return ("ok", type(rec), rec, rec.header.__dict__)

    fast = outcome(
        lambda: read_record(
            data,  # type: ignore[arg-type]
            lambda n: f"tbl[seq={n}]",
            store_id=store_id,
            id=id,
            sequence=seq,
        )
    )
    reference = outcome(
        lambda: StoredRecord.from_bytes(
            data,  # type: ignore[arg-type]
            location=f"tbl[seq={seq}]",
            expect_store_id=store_id,
            expect_id=id,
            expect_sequence=seq,
        )
    )
    return fast, reference


def test_read_record_is_from_bytes_for_every_damage_and_mismatch() -> None:
    """The backends' read path gives the same record, or the same error in the same
    words at the same location, as ``from_bytes`` with the same expectations."""
    good = _record().to_bytes("store-1")
    positional = _record().to_bytes("store-1", positional=True)
    cases: list[bytes | bytearray | memoryview] = [good, positional, bytearray(good)]
    cases += [memoryview(good), good[:-1], good + b"x", b"", b"SK1 ", b"SK1 1 1 0\n{"]
    for data in (good, positional):
        for i in range(len(data)):
            corrupt = bytearray(data)
            corrupt[i] ^= 0x20
            cases.append(bytes(corrupt))
    for data in cases:
        for store_id in ("store-1", "other", None):
            for id in ("cp-1", "cp-2"):
                for seq in (7, 70):
                    fast, reference = _both_ways(data, store_id, id, seq)
                    assert fast == reference, (bytes(data)[:40], store_id, id, seq)
    # the well-formed cases do take the fast path and read back the record
    assert _both_ways(good, "store-1", "cp-1", 7)[0][2] == _record()
    assert _both_ways(positional, "store-1", "cp-1", 7)[0][2] == _record()


def test_read_checkpoint_is_read_record_then_the_strict_decode() -> None:
    """A listed page's fused read: for every input, ``read_checkpoint`` gives the
    checkpoint that ``read_record`` and the store's ``_decode_strict`` give (same
    fields, same state, same types), or hands back ``read_record``'s record where
    that decode fails or the codec is unknown (the caller decodes it and words the
    error), or raises ``read_record``'s error in the same words."""
    from statekeeper.codec import Codec
    from statekeeper.models import Checkpoint, checkpoint_with_state
    from statekeeper.rawcodec import RawCodec
    from statekeeper.record import read_checkpoint, read_record

    codec, raw = Codec(), RawCodec(max_bytes=1 << 20)
    decoders = {codec.name: codec, raw.name: raw}

    def record(state: bytes, codec_name: str) -> bytes:
        return replace(_record(state), codec=codec_name).to_bytes("store-1")

    states = [
        (b'{"step":10}', codec.name),
        (codec.encode({"t": (1, 2), "s": {3}, "f": 1.5, "n": None}), codec.name),
        (b'{"a":1,"a":2}', codec.name),  # a duplicate key: the checked path decides
        (b'{"a": 1}', codec.name),  # not canonical: the checked path decides
        (b"[1,2", codec.name),  # refused by the codec
        (b'{"$sk":"nope"}', codec.name),  # an unknown tag
        (b"\x00\xffraw", raw.name),
        (b'{"step":10}', "no-such-codec/1"),
    ]
    cases: list[bytes] = []
    for state, name in states:
        good = record(state, name)
        cases += [good, good[:-1]]
        for i in range(0, len(good), 7):
            corrupt = bytearray(good)
            corrupt[i] ^= 0x20
            cases.append(bytes(corrupt))

    def strict(rec: StoredRecord) -> tuple[object, ...]:
        decoder = decoders.get(rec.codec)
        if decoder is None:
            return ("unknown codec",)
        try:
            state = decoder.decode(rec.state)
        except CheckpointDecodeError as exc:
            return ("refused", str(exc))
        cp = checkpoint_with_state(rec.header, state)
        return ("ok", cp, cp.__dict__, repr(cp.state))

    kinds: list[str] = []
    for data in cases:
        for id in ("cp-1", "cp-2"):
            for seq in (7, 70):
                args = {"store_id": "store-1", "id": id, "sequence": seq}
                failed: CheckpointDecodeError | None = None
                try:
                    rec = read_record(data, lambda n: f"tbl[seq={n}]", **args)  # type: ignore[arg-type]
                except CheckpointDecodeError as exc:
                    failed = exc
                if failed is not None:
                    with pytest.raises(CheckpointDecodeError) as again:
                        read_checkpoint(data, lambda n: f"tbl[seq={n}]", decoders=decoders, **args)  # type: ignore[arg-type]
                    assert str(again.value) == str(failed)
                    assert (again.value.id, again.value.location) == (failed.id, failed.location)
                    kinds.append("raised")
                    continue
                got = read_checkpoint(data, lambda n: f"tbl[seq={n}]", decoders=decoders, **args)  # type: ignore[arg-type]
                want = strict(rec)
                kinds.append("StoredRecord" if isinstance(got, StoredRecord) else "Checkpoint")
                if isinstance(got, Checkpoint):
                    assert want[0] == "ok", (data[:60], want)
                    assert (got, got.__dict__, repr(got.state)) == want[1:]
                    assert got.model_fields_set == set(Checkpoint.model_fields)
                else:
                    assert got == rec
                    # a record it hands back is one the strict decode refuses, or
                    # one off the fast parse (which the strict decode still decides)
                    assert want[0] != "ok" or rec.to_bytes("store-1") != data
    # each way out is taken: decoded, handed back, raised
    assert kinds.count("Checkpoint") >= 3, kinds
    assert kinds.count("StoredRecord") >= 4, kinds
    assert kinds.count("raised") >= 100, kinds


def test_read_record_words_a_location_only_for_an_error() -> None:
    from statekeeper.record import read_record

    asked: list[int] = []

    def location_of(seq: int) -> str:
        asked.append(seq)
        return f"tbl[seq={seq}]"

    good = _record().to_bytes("store-1")
    read_record(good, location_of, store_id="store-1", id="cp-1", sequence=7)
    assert asked == []
    with pytest.raises(CheckpointDecodeError) as info:
        read_record(good, location_of, store_id="store-1", id="cp-1", sequence=70)
    assert asked == [70] and info.value.location == "tbl[seq=70]"


def test_a_verified_record_is_a_stored_record_whose_header_is_built_once_when_asked() -> None:
    """A record that a read verified (``from_bytes``, ``read_record``, ``seal``) holds
    its checked header values and builds its header model on first use, once. In
    every other way it is a ``StoredRecord``: equal to the eagerly built one (and it
    to it), the same repr and hash failure, frozen, ``dataclasses.replace`` keeps
    working, and it copies and pickles as a plain ``StoredRecord``. ``checkpoint_of``
    and ``header_values`` give the same for either kind, and ``checkpoint_of``
    builds no header model."""
    import copy
    import dataclasses
    import pickle
    from datetime import timedelta

    from statekeeper.models import Checkpoint, CheckpointHeader
    from statekeeper.record import (
        NewRecord,
        RecordEdits,
        StoredRecord,
        checkpoint_of,
        header_values,
        read_record,
        trusted_stored_record,
    )

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    new = NewRecord(
        id="cp-1", stream="s", state=b'{"a":1}', codec="sk-json/1", created_at=t0,
        updated_at=t0, etag="e1", parent_id=None, tags={"k": "v"}, metadata={"m": [1]},
        ttl=5.0, expires_at=t0 + timedelta(seconds=5),
    )  # fmt: skip
    sealed = new.seal(7)
    blob = sealed.to_bytes("store-1")
    read = read_record(blob, lambda n: f"row {n}", store_id="store-1", id="cp-1", sequence=7)
    from_bytes = StoredRecord.from_bytes(blob, location="x", expect_sequence=7)
    values = dict(header_values(read))
    eager = StoredRecord(
        header=CheckpointHeader(**values), state=new.state, codec="sk-json/1", ttl=5.0
    )
    plain = trusted_stored_record(eager.header, new.state, "sk-json/1", 5.0)
    for lazy in (sealed, read, from_bytes):
        assert isinstance(lazy, StoredRecord)
        # nothing below needs the header model
        assert (lazy.id, lazy.sequence, lazy.stream) == ("cp-1", 7, "s")
        assert not lazy.is_expired(t0) and lazy.is_expired(t0 + timedelta(seconds=5))
        assert lazy.to_bytes("store-1") == blob == eager.to_bytes("store-1")
        assert header_values(lazy) == header_values(eager) == values
        cp = checkpoint_of(lazy, {"a": 1})
        assert type(cp) is Checkpoint and cp == checkpoint_of(eager, {"a": 1})
        assert cp.model_fields_set == set(Checkpoint.model_fields)
        assert checkpoint_of(lazy, None) == Checkpoint(**values)
        # the header: built when asked, once, the same model every time
        header = lazy.header
        assert type(header) is CheckpointHeader and lazy.header is header
        assert header == eager.header and header.model_fields_set == set(values)
        for other in (eager, plain):
            assert lazy == other and other == lazy
            assert not (lazy != other)  # noqa: SIM202
        assert repr(lazy) == repr(eager)
        with pytest.raises(TypeError):
            hash(lazy)  # as the eager one: its header holds dicts
        with pytest.raises(dataclasses.FrozenInstanceError):
            lazy.state = b"x"  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            lazy.header = header  # type: ignore[misc]
        for twin in (copy.copy(lazy), copy.deepcopy(lazy), pickle.loads(pickle.dumps(lazy))):
            assert type(twin) is StoredRecord and twin == eager
        changed = dataclasses.replace(lazy, state=b"{}")
        assert changed.state == b"{}" and changed.header == header
        assert changed == dataclasses.replace(eager, state=b"{}")
        # an update gives the same record from either kind
        edits = RecordEdits(tags={"n": "w"}, metadata={"z": 1}, parent_id="p")
        later = t0 + timedelta(seconds=1)
        a = lazy.updated(b"{}", now=later, etag="e2", edits=edits, codec="raw/1")
        b = eager.updated(b"{}", now=later, etag="e2", edits=edits, codec="raw/1")
        assert a == b and a.to_bytes("store-1") == b.to_bytes("store-1")
        assert lazy.header.etag == "e1" and lazy.header.tags == {"k": "v"}
    # a record is not equal to what is not a record
    assert read != values and read != read.header


def test_a_record_replaced_with_a_checkpoint_as_header_gives_no_old_state() -> None:
    """Regression: a verified record given a ``Checkpoint`` (or a header subclass)
    as its header through ``dataclasses.replace`` must not carry that checkpoint's
    state, or a subclass's own fields, into the checkpoints and values it gives."""
    import dataclasses

    from statekeeper.models import Checkpoint
    from statekeeper.record import checkpoint_of, header_values, verified_record

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    values = {
        "id": "i", "stream": "s", "sequence": 3, "created_at": t0, "updated_at": t0,
        "etag": "e", "parent_id": None, "tags": {}, "metadata": {}, "expires_at": None,
    }  # fmt: skip
    lazy = verified_record(dict(values), b"{}", "sk-json/1", None)
    old = Checkpoint(**values, state={"old": 1})  # type: ignore[arg-type]
    swapped = dataclasses.replace(lazy, header=old)
    assert header_values(swapped) == values
    assert checkpoint_of(swapped, None).state is None
    assert checkpoint_of(swapped, {"new": 1}).state == {"new": 1}
    assert swapped.header is old
