"""Item 6: hostile input gives a typed error or a ``Skipped`` entry, never a crash, a hang,
code execution or data from outside the store.

- Fuzzed bytes, hostile JSON documents and mutated envelopes through the record
  parser and the codec (``StoredRecord.from_bytes`` then ``Codec.decode``, the path
  every backend reads through).
- Records planted through each backend's raw backdoor: ``list`` reports them as
  skipped, ``get_latest`` and ``load`` raise ``CheckpointDecodeError``, nothing
  falls back and nothing runs.
- SQL metacharacters and LIKE wildcards in stream names and tags round-trip
  exactly and match only themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import random
import re
import stat
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import mutants
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_support import FIGURES, Backend

from statekeeper.codec import Codec
from statekeeper.errors import CheckpointDecodeError, CheckpointNotFound, InvalidQuery
from statekeeper.record import StoredRecord
from statekeeper.testing.invariants import LoggedStore, LogWriter, WriteLog, check_invariants

pytestmark = pytest.mark.reliability

KINDS = ["memory", "snap", "file", "sqlite", "postgres", "mysql", "redis"]
MARKER_ENV = "STATEKEEPER_HOSTILE_MARKER"


def _examples(request: pytest.FixtureRequest, normal: int) -> settings:
    long_run = os.environ.get("STATEKEEPER_RELIABILITY_LONG", "") not in ("", "0") or bool(
        request.config.getoption("--long", default=False)
    )
    return settings(
        max_examples=normal * (20 if long_run else 1),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )


def _make(kind: str, backend_factory: Callable[..., Backend]) -> Backend:
    if kind == "memory":
        return Backend("memory", "memory://")
    return backend_factory(kind)


# -- hostile documents ---------------------------------------------------------------


def _callable_tags(marker: Path) -> list[bytes]:
    """Tags that would run a command (creating ``marker``) if a decoder resolved names."""
    cmd = f"touch {marker}"
    docs: list[Any] = []
    for target in (
        "os:system",
        "posix:system",
        "subprocess:getoutput",
        "builtins:eval",
        "builtins:exec",
        "hostile_sentinel:boom",
        "os.system",
        "__import__",
    ):
        for kind in ("enum", "model", "dataclass", "callable", "object", "reduce"):
            docs.append({"$sk": kind, "t": target, "v": cmd})
            docs.append({"$sk": kind, "t": target, "v": {"command": cmd}})
            docs.append({"a": [{"$sk": kind, "t": target, "v": [cmd]}]})
    return [json.dumps(d).encode() for d in docs]


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _pickles(marker: Path) -> list[bytes]:
    return [pickle.dumps(_Evil(marker), protocol=p) for p in range(pickle.HIGHEST_PROTOCOL + 1)]


HOSTILE_JSON: list[bytes] = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b"[" * 100_000,
    b"1" * 100_000,
    b"-" + b"9" * 5000,
    b"1e999999",
    b"-1e400",
    b"NaN",
    b"[Infinity, -Infinity]",
    b'{"a": 1, "a": 2}',
    b'{"$sk": "set", "v": [1, 1]}',
    b'{"$sk": "dict", "v": [[1, 2], [1, 3]]}',
    b'{"$sk": "bytes", "v": "!!!"}',
    b'{"$sk": "datetime", "v": "9999-99-99"}',
    b'{"$sk": "decimal", "v": "NaN"}',
    b'{"$sk": "decimal", "v": "not a number"}',
    b'{"$sk": "timedelta", "v": 99999999999999999999999}',
    b'"\\ud800"',
    b"\xff\xfe\x00",
    b'{"step": 1',  # truncated JSON
    b'{"step": 12',
    b"",
    b"\x00" * 1000,
]


def _envelope(state: bytes, *, seq: int = 5, cid: str = "victim", store: str = "s1") -> bytes:
    from datetime import UTC, datetime

    from statekeeper.models import CheckpointHeader

    now = datetime.now(UTC)
    header = CheckpointHeader.model_construct(
        id=cid,
        stream="st",
        sequence=seq,
        created_at=now,
        updated_at=now,
        etag="e",
        parent_id=None,
        tags={},
        metadata={},
        expires_at=None,
    )
    return StoredRecord(header=header, state=state, codec="sk-json/1").to_bytes(store)


def _recrc(blob: bytes) -> bytes:
    newline = blob.index(b"\n")
    magic, hlen, slen, _ = blob[:newline].split(b" ")
    body = blob[newline + 1 :]
    crc = zlib.crc32(body[int(hlen) :], zlib.crc32(body[: int(hlen)]))
    return b" ".join([magic, hlen, slen, b"%08x" % crc]) + b"\n" + body


def _read_like_a_store(data: bytes, codec: Codec, **expect: Any) -> None:
    """What every backend does with stored bytes: parse the envelope, decode the state.

    Returns or raises :class:`CheckpointDecodeError`; a hang is caught by the test's
    timeout (pyproject.toml). How long hostile bytes take to read is a measurement for
    benchmarks/, not an assertion: a loaded machine can miss any bound in seconds."""
    try:
        record = StoredRecord.from_bytes(data, location="fuzz", **expect)
        codec.decode(record.state)
    except CheckpointDecodeError:
        pass


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "hostile input executed a command"
    assert "hostile_sentinel" not in sys.modules, "a decoder imported a module named by data"


def test_codec_refuses_hostile_documents(marker: Path) -> None:
    codec = Codec()
    inputs = [*HOSTILE_JSON, *_callable_tags(marker), *_pickles(marker)]
    for data in inputs:
        with pytest.raises(CheckpointDecodeError):
            codec.decode(data)
    # other serialisers' spellings of "call this" are plain data here, and stay data
    lookalikes = [
        {"py/object": "os.system", "args": [f"touch {marker}"]},
        {"__reduce__": ["os:system", [f"touch {marker}"]]},
        {"!!python/object/apply:os.system": [f"touch {marker}"]},
    ]
    for doc in lookalikes:
        assert codec.decode(json.dumps(doc).encode()) == doc
    FIGURES["hostile input: documents and envelopes tried"] += len(inputs) + len(lookalikes)


@st.composite
def _mutated_envelopes(draw: st.DrawFn) -> bytes:
    state = draw(st.sampled_from([b'{"step":1}', b"[1,2,3]", b'"x"', b"12345", *HOSTILE_JSON[9:]]))
    data = bytearray(_envelope(state))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete", "splice"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[i:]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        else:
            data[i : i + 4] = draw(st.sampled_from([b" 99 ", b"-1 ", b"\n", b"SK1 ", b"0000"]))
    fix_crc = draw(st.booleans())
    blob = bytes(data)
    if fix_crc:  # a well-formed envelope around whatever the mutations left
        with contextlib.suppress(ValueError, IndexError):
            blob = _recrc(blob)
    return blob


def test_fuzzed_bytes_and_envelopes_give_typed_errors(
    request: pytest.FixtureRequest, marker: Path
) -> None:
    codec = Codec()
    count = 0

    @_examples(request, 300)
    @given(
        st.one_of(
            st.binary(max_size=512),
            _mutated_envelopes(),
            st.sampled_from([_envelope(p) for p in _pickles(marker)]),
            st.sampled_from([_envelope(t) for t in _callable_tags(marker)]),
        ),
        st.sampled_from(
            [
                {},
                {"expect_sequence": 5},
                {"expect_id": "victim"},
                {"expect_sequence": 6},
                {"expect_store_id": "s2"},
            ]
        ),
    )
    def run(data: bytes, expect: dict[str, Any]) -> None:
        nonlocal count
        count += 1
        _read_like_a_store(data, codec, **expect)

    run()
    FIGURES["hostile input: documents and envelopes tried"] += count


def test_every_truncation_of_a_valid_json_state_is_detected() -> None:
    """A record cut short is refused even where the shorter state is valid JSON."""
    data = _envelope(b"1234567890")
    for cut in range(len(data)):
        with pytest.raises(CheckpointDecodeError):
            StoredRecord.from_bytes(data[:cut], location="t")
    FIGURES["hostile input: documents and envelopes tried"] += len(data)


# -- records planted in each backend ---------------------------------------------------


def _plants(good: bytes, store_id: str, marker: Path, seq: int) -> dict[str, bytes]:
    """Hostile replacements for the stored bytes of one checkpoint (at ``seq``; a
    positional record needs it), by name."""
    rec = StoredRecord.from_bytes(good, location="plant", expect_sequence=seq)
    # one bit flipped inside a string of the state: still valid JSON, so only the
    # checksum can tell (a "p" becomes a "P")
    flipped = bytearray(good)
    flipped[good.rindex(b"p")] ^= 0x20

    def state(payload: bytes) -> bytes:
        return replace(rec, state=payload).to_bytes(store_id)

    seq_header = rec.header.model_copy(update={"sequence": rec.sequence + 1000})
    id_header = rec.header.model_copy(update={"id": "someone-else"})
    return {
        "random bytes": random.Random(1).randbytes(300),
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "one flipped bit": bytes(flipped),
        "another store's record": rec.to_bytes("f" * 32),
        "another id's record": replace(rec, header=id_header).to_bytes(store_id),
        "a sequence disagreeing with its position": replace(rec, header=seq_header).to_bytes(
            store_id
        ),
        "a pickle": state(_pickles(marker)[-1]),
        "a tag naming os:system": state(_callable_tags(marker)[0]),
        "deep nesting": state(HOSTILE_JSON[0]),
        "a huge number": state(HOSTILE_JSON[3]),
        "duplicate keys": state(HOSTILE_JSON[9]),
        "NaN": state(HOSTILE_JSON[7]),
        "truncated where the state is still valid JSON": state(b"12345")[:-2],
        "the same, checksum recomputed": _recrc(state(b"12345")[:-2]),
    }


def plant_and_check(backend: Backend, workdir: Path, marker: Path) -> int:
    """Plant every hostile record over the newest and over a middle checkpoint of a
    stream, and check R and L each time; returns how many were planted."""

    async def run() -> int:
        planted = 0
        async with backend.opened() as store:
            if not store.capabilities.raw_access:
                pytest.skip(f"{backend.kind} does not declare raw_access")
            for position in ("newest", "middle"):
                log_path = workdir / f"{position}.log"
                writer = LogWriter(log_path)
                logged = LoggedStore(store, writer)
                stream = f"victims-{position}"
                saved = [
                    await logged.save(stream, {"step": i, "pad": "p" * 40}, id=f"{position}{i}")
                    for i in range(3)
                ]
                writer.close()
                victim = saved[-1] if position == "newest" else saved[1]
                good = await store.backdoor_read_raw(victim.id)
                for name, blob in _plants(good, store.store_id, marker, victim.sequence).items():
                    await store.backdoor_write_raw(victim.id, blob)
                    where = f"{backend.kind}, {position}, planted {name}"
                    try:
                        report = await check_invariants(
                            store,
                            WriteLog.read(log_path),
                            streams=[stream],
                            expect_corrupt=[victim.id],
                            probe_stream=None,
                        )
                    except AssertionError as exc:
                        raise AssertionError(f"{where}: {exc}") from exc
                    assert report.skipped == 1, where
                    with pytest.raises(CheckpointDecodeError) as info:
                        await store.load(victim.id)
                    assert info.value.id in (victim.id, None), where
                    planted += 1
                await store.backdoor_write_raw(victim.id, good)
                assert (await store.load(victim.id)).state == victim.state
        return planted

    return asyncio.run(run())


@pytest.mark.parametrize("kind", KINDS)
def test_planted_records_are_reported_never_trusted(
    kind: str, backend_factory: Callable[..., Backend], tmp_path: Path, marker: Path
) -> None:
    planted = plant_and_check(_make(kind, backend_factory), tmp_path, marker)
    FIGURES["hostile input: records planted in a backend"] += planted
    FIGURES[f"hostile input: records planted ({kind})"] += planted


@pytest.mark.parametrize(
    ("kind", "mutant", "finding"),
    [
        ("snap", "ignore_checksum", "[R]"),
        ("snap", "fallback_latest", "[L]"),
        ("sqlite", "ignore_checksum", "[R]"),
        ("sqlite", "fallback_latest", "[L]"),
    ],
)
def test_planted_records_catch_mutant(
    kind: str,
    mutant: str,
    finding: str,
    backend_factory: Callable[..., Backend],
    tmp_path: Path,
    marker: Path,
) -> None:
    """A reader that ignores the checksum, and a get_latest that falls back past an
    unreadable newest checkpoint, are caught: on the snapshot mutant backend by its
    ``bug`` option, on SQLite by patching the shared code every backend reads through."""
    if kind == "snap":
        backend = backend_factory("snap", bug=mutant)
    else:
        backend = backend_factory(kind)
        getattr(mutants, mutant)()
    try:
        with pytest.raises(AssertionError, match=re.escape(finding)):
            plant_and_check(backend, tmp_path, marker)
    finally:
        mutants.restore()
    FIGURES["mutants caught"] += 1


# -- SQL metacharacters --------------------------------------------------------------

NASTY = [
    "'; DROP TABLE statekeeper_checkpoints; --",
    "Robert'); DELETE FROM statekeeper_meta;--",
    '" OR 1=1 --',
    "%",
    "_",
    "a%b",
    "a_b",
    "\\",
    "\\%",
    "' OR ''='",
    "`x`",
    "$1",
    ":name",
    "?",
    "%s",
    "{0}",
    "\u2028\u00e9\U0001f600",
    "a\tb\nc\rd",
    " trailing ",
    "A",
    "a",
    "../../etc/passwd",
    "/" * 10,
    "x" * 512,
]


@pytest.mark.parametrize("kind", KINDS)
def test_sql_metacharacters_round_trip_exactly(
    kind: str, backend_factory: Callable[..., Backend], request: pytest.FixtureRequest
) -> None:
    backend = _make(kind, backend_factory)
    names = list(NASTY)
    rng = random.Random(3)
    alphabet = "'\";%_\\`$?:-/*() aA\u00e9"
    extra = 200 if _examples(request, 1).max_examples > 1 else 20
    names += [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(extra)
    ]
    names = list(dict.fromkeys(names))

    async def run() -> None:
        async with backend.opened() as store:
            for name in names:
                await store.save(name, {"name": name}, tags={name[:128]: name, "kind": name})
            assert set(names) <= set(await store.list_streams())
            for name in names:
                latest = await store.get_latest(name)
                assert latest is not None and latest.stream == name
                assert latest.state == {"name": name}
                assert latest.tags == {name[:128]: name, "kind": name}
                page = await store.list(None, tags={"kind": name}, limit=1000)
                assert [cp.stream for cp in page.items] == [name], name
            with pytest.raises(InvalidQuery):
                await store.load("x' OR '1'='1")
            with pytest.raises(CheckpointNotFound):
                await store.load("x:1-OR.1")
            assert await store.list_streams()  # the tables are all still there

    asyncio.run(run())
    FIGURES["hostile input: SQL-metacharacter names round-tripped"] += len(names)


# -- links, FIFOs and devices planted in a file store -------------------------------------


def _plant_file(kind: str, path: Path, outside: Path) -> None:
    """Replace the record file at ``path`` by a hostile kind of file."""
    good = path.read_bytes()
    if kind == "hard link":
        os.link(path, outside / "second-link.ckpt")  # same bytes, but two names
        return
    path.unlink()
    if kind == "symlink to a valid copy outside the store":
        copy = outside / "copy.ckpt"
        copy.write_bytes(good)
        path.symlink_to(copy)
    elif kind == "symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "character device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        except PermissionError:
            path.write_bytes(good)
            pytest.skip("cannot create a device node here")
    elif kind == "directory":
        path.mkdir()


FILE_PLANTS = [
    "symlink to a valid copy outside the store",
    "symlink to /dev/zero",
    "FIFO",
    "character device",
    "hard link",
    "directory",
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", FILE_PLANTS)
def test_file_store_skips_links_fifos_and_devices(
    kind: str, backend_factory: Callable[..., Backend], tmp_path: Path
) -> None:
    """A planted link, FIFO or device never hangs a reader, is never followed out of
    the store, and is reported: skipped by list, an error for get_latest and load."""
    backend = backend_factory("file")
    root = Path(backend.url.removeprefix("file://"))
    outside = tmp_path / "outside"
    outside.mkdir()
    log_path = tmp_path / "w.log"

    async def save() -> None:
        writer = LogWriter(log_path)
        async with backend.opened() as store:
            logged = LoggedStore(store, writer)
            for i in range(3):
                await logged.save("victims", {"step": i}, id=f"v{i}")
        writer.close()

    async def check(victim: str) -> None:
        async with backend.opened() as store:
            await check_invariants(
                store, WriteLog.read(log_path), expect_corrupt=[victim], probe_stream=None
            )

    asyncio.run(save())
    for victim in ("v2", "v1"):  # the newest, then one in the middle
        (path,) = root.rglob(f"*.{victim}.ckpt")
        good = path.read_bytes()
        _plant_file(kind, path, outside)
        try:
            asyncio.run(check(victim))
        except AssertionError as exc:
            raise AssertionError(f"{kind} planted as {victim}: {exc}") from exc
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
        for extra in outside.iterdir():
            extra.unlink()
        path.write_bytes(good)
    asyncio.run(check("none"))  # and the repaired store is whole again
    FIGURES["hostile input: links, FIFOs and devices planted in a file store"] += 2
