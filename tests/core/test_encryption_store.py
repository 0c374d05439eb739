"""Encryption at rest (S16), the store: what an encrypted store keeps through every
read and write path (json and raw codecs, with and without ``encrypt_metadata``),
the filters it refuses, switching ``encrypt_metadata`` across reopenings, mixing
plaintext and encrypted stores, key rotation and ``verify()``; on memory, file and
SQLite. Tampering is ``test_encryption_tamper.py``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statekeeper as sk
from sql_helpers import drop_store, new_prefix
from statekeeper import NewCheckpoint
from statekeeper.encryption import Keyring
from statekeeper.errors import (
    CheckpointDecodeError,
    InvalidQuery,
    RecordUndecryptable,
    StoreFormatError,
)
from statekeeper.record import frame
from statekeeper.testing import service_url

K0 = os.urandom(32)
K1 = os.urandom(32)
RING = Keyring({"k1": K1, "k0": K0}, active="k1")
SERVERS = {"postgresql": "postgres", "mysql": "mysql"}
BACKENDS = ["memory", "file", "sqlite", *SERVERS]
DURABLE = ["file", "sqlite", *SERVERS]
SECRET = "MARKER-SECRET-7f3a"
TAG_VALUE = "MARKER-TAG-91c2"
META_VALUE = "MARKER-META-4be0"


Place = Callable[..., str]


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    """``place(backend, name="a")``: the URL of a store of ``backend``, the same for
    the same name; on a server (its URL from the environment, else the test skips)
    under a fresh table prefix, whose tables are dropped afterwards."""
    prefixes: dict[tuple[str, str], tuple[str, str]] = {}

    def where(backend: str, name: str = "a") -> str:
        if backend not in SERVERS:
            path = tmp_path / name
            path.mkdir(exist_ok=True)
            return {
                "memory": "memory://",
                "file": f"file://{path}/files",
                "sqlite": f"sqlite:///{path}/store.db",
            }[backend]
        if (backend, name) not in prefixes:
            prefixes[backend, name] = (service_url(SERVERS[backend]), new_prefix())
        url, prefix = prefixes[backend, name]
        return f"{url}{'&' if '?' in url else '?'}table_prefix={prefix}"

    yield where
    for url, prefix in prefixes.values():
        drop_store(url, prefix)


def open_at(url: str, **options: Any) -> sk.BaseCheckpointStore:
    return sk.open_store(url, **options)


def state_of(codec: str, n: int) -> Any:
    if codec == "raw":
        return f"{SECRET}-{n}".encode()
    return {"secret": SECRET, "n": n}


async def raw_parts(store: sk.BaseCheckpointStore, id: str) -> tuple[dict[str, Any], bytes]:
    """The record's header (parsed) and its state bytes (the envelope), as stored."""
    head, state = frame.split(await store.backdoor_read_raw(id))
    return json.loads(head), state


def assert_sealed(header: dict[str, Any], envelope: bytes, *, metadata_inside: bool) -> None:
    assert header["codec"].startswith("aes256gcm:")
    assert envelope.startswith(b"SKE1")
    assert bool(envelope[5] & 1) is metadata_inside
    assert SECRET.encode() not in envelope
    if metadata_inside:
        assert header["tags"] == {} and header["meta"] == {}


# -- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("codec", ["json", "raw"])
@pytest.mark.parametrize("meta", [False, True], ids=["meta-header", "meta-sealed"])
@pytest.mark.asyncio
async def test_every_read_and_write_path_round_trips(
    backend: str, codec: str, meta: bool, place: Place
) -> None:
    tags = {"t": TAG_VALUE}
    metadata = {"m": META_VALUE, "nested": {"n": [1, 2.5, None, True]}}
    store = open_at(place(backend), encryption=RING, encrypt_metadata=meta, codec=codec)
    async with store:
        parent = await store.save("s", state_of(codec, 0))
        cp = await store.save(
            "s", state_of(codec, 1), tags=tags, metadata=metadata, parent_id=parent.id, ttl=3600
        )
        assert (cp.tags, cp.metadata, cp.parent_id) == (tags, metadata, parent.id)
        assert cp.state == state_of(codec, 1) and cp.expires_at is not None

        first = state_of(codec, 1)

        def same(got: Any, state: Any = first) -> None:
            assert got.id == cp.id and got.stream == "s" and got.sequence == cp.sequence
            assert (got.tags, got.metadata, got.parent_id) == (tags, metadata, parent.id)
            assert got.expires_at == cp.expires_at and got.created_at == cp.created_at
            assert getattr(got, "state", None) == state

        latest = await store.get_latest("s")
        same(latest)
        same(await store.load(cp.id))
        same(await store.load(cp.id, include_state=False), None)
        many = await store.load_many([cp.id, parent.id])
        same(many[cp.id])
        assert many[parent.id].state == state_of(codec, 0) and many[parent.id].tags == {}
        same((await store.load_many([cp.id], include_state=False))[cp.id], None)
        for include_state in (True, False):
            page = await store.list("s", include_state=include_state)
            assert page.skipped == []
            assert [c.id for c in page.items] == [cp.id, parent.id]
            same(page.items[0], state_of(codec, 1) if include_state else None)
            everything = await store.list(include_state=include_state)
            assert [c.id for c in everything.items] == [cp.id, parent.id]

        header, envelope = await raw_parts(store, cp.id)
        assert_sealed(header, envelope, metadata_inside=meta)
        assert (TAG_VALUE.encode() in envelope) is False  # sealed, or in the header
        assert header["tags"] == ({} if meta else tags)

        # update without edits keeps tags, metadata and the parent
        up = await store.update(cp.id, state_of(codec, 2))
        assert (up.tags, up.metadata, up.parent_id) == (tags, metadata, parent.id)
        got = await store.load(cp.id)
        assert got.state == state_of(codec, 2)
        assert (got.tags, got.metadata, got.parent_id) == (tags, metadata, parent.id)
        assert got.etag == up.etag != cp.etag and got.sequence == cp.sequence

        # update of the tags keeps the metadata, and the other way round
        up = await store.update(cp.id, state_of(codec, 3), tags={"t2": "v2"})
        assert (up.tags, up.metadata) == ({"t2": "v2"}, metadata)
        got = await store.load(cp.id)
        assert (got.state, got.tags, got.metadata) == (state_of(codec, 3), {"t2": "v2"}, metadata)
        up = await store.update(cp.id, state_of(codec, 4), metadata={"m": "new"})
        assert (up.tags, up.metadata) == ({"t2": "v2"}, {"m": "new"})
        got = (await store.list("s", limit=1)).items[0]
        assert (got.state, got.tags, got.metadata) == (
            state_of(codec, 4),
            {"t2": "v2"},
            {"m": "new"},
        )
        up = await store.update(cp.id, state_of(codec, 5), parent_id=cp.id)
        got = await store.load(cp.id)
        assert (got.tags, got.metadata, got.parent_id) == ({"t2": "v2"}, {"m": "new"}, cp.id)
        header, envelope = await raw_parts(store, cp.id)
        assert_sealed(header, envelope, metadata_inside=meta)

        # save_many
        saved = await store.save_many(
            [
                NewCheckpoint(stream="b", state=state_of(codec, 10), tags=tags, ttl=60),
                NewCheckpoint(stream="b", state=state_of(codec, 11), metadata=metadata),
            ]
        )
        assert [c.state for c in saved] == [state_of(codec, 10), state_of(codec, 11)]
        assert (saved[0].tags, saved[1].metadata) == (tags, metadata)
        listed = (await store.list("b", order="asc")).items
        assert [(c.state, c.tags, c.metadata) for c in listed] == [
            (state_of(codec, 10), tags, {}),
            (state_of(codec, 11), {}, metadata),
        ]
        for c in saved:
            assert_sealed(*(await raw_parts(store, c.id)), metadata_inside=meta)

        # import_checkpoint keeps id, etag, stamps, tags and metadata
        source = await store.load(cp.id)
        async with open_at("memory://") as other:
            imported = await other.import_checkpoint(source, source.state)
        dst_url = place(backend, "dst")
        async with open_at(dst_url, encryption=RING, codec=codec, encrypt_metadata=meta) as dst:
            copied = await dst.import_checkpoint(imported, imported.state)
            back = await dst.load(cp.id)
            assert_sealed(*(await raw_parts(dst, cp.id)), metadata_inside=meta)
        for c in (copied, back):
            assert (c.id, c.etag, c.created_at, c.tags, c.metadata, c.parent_id) == (
                source.id,
                source.etag,
                source.created_at,
                source.tags,
                source.metadata,
                source.parent_id,
            )
        assert back.state == state_of(codec, 5)


@pytest.mark.parametrize("backend", DURABLE)
@pytest.mark.asyncio
async def test_a_store_of_the_other_codec_reads_the_records(backend: str, place: Place) -> None:
    url = place(backend)
    async with open_at(url, encryption=RING, codec="raw") as store:
        raw_cp = await store.save("s", b"\x00\xffbytes")
    async with open_at(url, encryption=RING, codec="json") as store:
        json_cp = await store.save("s", {"a": 1})
        assert (await store.load(raw_cp.id)).state == b"\x00\xffbytes"
    async with open_at(url, encryption=RING, codec="raw") as store:
        assert (await store.load(json_cp.id)).state == {"a": 1}
        header, _ = await raw_parts(store, raw_cp.id)
        assert header["codec"] == "aes256gcm:" + store.codec.name


# -- encrypt_metadata: filters ---------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.asyncio
async def test_filters_on_sealed_metadata_are_refused_with_a_reason(
    backend: str, place: Place
) -> None:
    async with open_at(place(backend), encryption=RING, encrypt_metadata=True) as st:
        ids = [
            (await st.save("s", {"n": n}, tags={"t": "x"}, metadata={"m": n})).id for n in range(5)
        ]
        for kwargs in ({"tags": {"t": "x"}}, {"metadata": {"m": 1}}):
            for stream in ("s", None):
                with pytest.raises(InvalidQuery, match="encrypts tags and metadata") as info:
                    await st.list(stream, **kwargs)  # type: ignore[arg-type]
                assert "filter the listed items yourself" in str(info.value)
            with pytest.raises(InvalidQuery, match="encrypts tags and metadata"):
                await st.list("s", include_state=False, **kwargs)  # type: ignore[arg-type]
        # unfiltered paging works, in both orders, through the cursors
        for order, expected in (("desc", ids[::-1]), ("asc", ids)):
            seen: list[str] = []
            page = await st.list("s", limit=2, order=order)  # type: ignore[arg-type]
            while True:
                assert page.skipped == []
                seen += [c.id for c in page.items]
                assert all(c.tags == {"t": "x"} for c in page.items)
                if page.next_cursor is None:
                    break
                with pytest.raises(InvalidQuery):
                    await st.list(
                        "s", limit=2, order=order, after=page.next_cursor, tags={"t": "x"}
                    )  # type: ignore[arg-type]
                page = await st.list("s", limit=2, order=order, after=page.next_cursor)  # type: ignore[arg-type]
            assert seen == expected
        cursor = await st.cursor_at(ids[2])
        assert [c.id for c in (await st.list("s", after=cursor)).items] == ids[1::-1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.asyncio
async def test_without_encrypt_metadata_filters_work(backend: str, place: Place) -> None:
    async with open_at(place(backend), encryption=RING) as store:
        a = await store.save("s", {"n": 1}, tags={"t": "x"}, metadata={"m": 1})
        await store.save("s", {"n": 2}, tags={"t": "y"}, metadata={"m": 2})
        assert [c.id for c in (await store.list("s", tags={"t": "x"})).items] == [a.id]
        # in the backend where it filters metadata, in the core where it does not
        assert [c.id for c in (await store.list("s", metadata={"m": 1})).items] == [a.id]
        page = await store.list(None, metadata={"m": 1}, include_state=False)
        assert [c.id for c in page.items] == [a.id]


# -- encrypt_metadata switched across reopenings ----------------------------------------


@pytest.mark.parametrize("backend", DURABLE)
@pytest.mark.asyncio
async def test_switching_encrypt_metadata_keeps_every_record_readable(
    backend: str, place: Place
) -> None:
    url = place(backend)
    written: dict[str, tuple[dict[str, str], dict[str, Any]]] = {}
    for n, meta in enumerate([False, True, False, True]):
        async with open_at(url, encryption=RING, encrypt_metadata=meta) as store:
            cp = await store.save("s", {"n": n}, tags={"t": f"v{n}"}, metadata={"m": n})
            written[cp.id] = (cp.tags, cp.metadata)
            header, envelope = await raw_parts(store, cp.id)
            assert_sealed(header, envelope, metadata_inside=meta)
            for rid, (tags, metadata) in written.items():
                got = await store.load(rid)
                assert (got.tags, got.metadata) == (tags, metadata)
            page = await store.list("s")
            assert page.skipped == []
            assert {c.id: (c.tags, c.metadata) for c in page.items} == written

    ids = list(written)  # [plain-header, sealed, plain-header, sealed]
    # an update moves the fields to where the current setting puts them
    async with open_at(url, encryption=RING, encrypt_metadata=True) as store:
        await store.update(ids[0], {"n": "u0"})  # was in the header: now sealed
        await store.update(ids[2], {"n": "u2"}, tags={"t": "new2"})
        await store.update(ids[1], {"n": "u1"})  # stays sealed
        for rid in ids[:3]:
            assert_sealed(*(await raw_parts(store, rid)), metadata_inside=True)
        assert (await store.load(ids[0])).tags == {"t": "v0"}
        assert (await store.load(ids[2])).tags == {"t": "new2"}
    written[ids[2]] = ({"t": "new2"}, {"m": 2})
    async with open_at(url, encryption=RING, encrypt_metadata=False) as store:
        await store.update(ids[1], {"n": "v1"})  # was sealed: back into the header
        await store.update(ids[3], {"n": "v3"}, metadata={"m": "x"})
        written[ids[3]] = ({"t": "v3"}, {"m": "x"})
        for rid in (ids[1], ids[3]):
            header, envelope = await raw_parts(store, rid)
            assert_sealed(header, envelope, metadata_inside=False)
            assert (header["tags"], header["meta"]) == written[rid]
        assert (await store.list("s", tags={"t": "v1"})).items[0].id == ids[1]
        for rid, (tags, metadata) in written.items():
            got = await store.load(rid)
            assert (got.tags, got.metadata) == (tags, metadata)
        page = await store.list("s", include_state=False)
        assert {c.id: (c.tags, c.metadata) for c in page.items} == written


# -- plaintext and encrypted stores -----------------------------------------------------


@pytest.mark.parametrize("backend", DURABLE)
@pytest.mark.asyncio
async def test_a_plaintext_store_with_records_refuses_encryption(
    backend: str, place: Place
) -> None:
    url = place(backend)
    async with open_at(url) as store:
        cp = await store.save("s", {"plain": True})
    store = open_at(url, encryption=RING)
    with pytest.raises(StoreFormatError, match="statekeeper rekey") as info:
        await store.open()
    assert cp.id in str(info.value) and "holds plaintext records" in str(info.value)
    assert not store.is_open
    async with open_at(url) as plain:  # the refusal changed nothing
        assert (await plain.load(cp.id)).state == {"plain": True}


@pytest.mark.parametrize("backend", DURABLE)
@pytest.mark.asyncio
async def test_an_empty_plaintext_store_opens_with_encryption(backend: str, place: Place) -> None:
    url = place(backend)
    async with open_at(url) as store:
        plain_id = store.store_id
    async with open_at(url, encryption=RING) as store:
        assert store.store_id == plain_id
        cp = await store.save("s", {"n": 1})
        assert_sealed(*(await raw_parts(store, cp.id)), metadata_inside=False)
    async with open_at(url, encryption=RING) as store:
        assert (await store.load(cp.id)).state == {"n": 1}


@pytest.mark.parametrize("backend", DURABLE)
@pytest.mark.asyncio
async def test_an_encrypted_store_opened_without_encryption_reads_nothing(
    backend: str, place: Place
) -> None:
    url = place(backend)
    async with open_at(url, encryption=RING, encrypt_metadata=True) as store:
        cp = await store.save("s", {"secret": SECRET}, tags={"t": TAG_VALUE})
    async with open_at(url) as store:
        for read in (store.get_latest("s"), store.load(cp.id), store.load_many([cp.id])):
            with pytest.raises(CheckpointDecodeError, match=r"open .*with encryption") as info:
                await read
            assert SECRET not in str(info.value)
        page = await store.list("s")
        assert page.items == []
        assert [s.id for s in page.skipped] == [cp.id]
        assert "with encryption" in page.skipped[0].reason
        report = await store.verify()
        assert not report.ok
        assert cp.id in {p.id for p in report.problems}


# -- key rotation ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", DURABLE)
@pytest.mark.asyncio
async def test_rotation_reads_old_and_new_and_a_dropped_key_is_undecryptable(
    backend: str, place: Place
) -> None:
    url = place(backend)
    async with open_at(url, encryption=Keyring({"k0": K0}, active="k0")) as store:
        old = await store.save("s", {"n": "old"}, tags={"t": "old"})
        assert (await raw_parts(store, old.id))[1][7:9] == b"k0"
        report = await store.verify()
        assert report.ok and report.problems == []
    async with open_at(url, encryption=Keyring({"k1": K1, "k0": K0}, active="k1")) as store:
        new = await store.save("s", {"n": "new"})
        assert (await raw_parts(store, new.id))[1][7:9] == b"k1"
        assert (await store.load(old.id)).state == {"n": "old"}
        assert (await store.get_latest("s")).state == {"n": "new"}  # type: ignore[union-attr]
        assert [c.state for c in (await store.list("s")).items] == [{"n": "new"}, {"n": "old"}]
        report = await store.verify()
        assert report.ok  # a retired key is a notice, not a problem
        assert [(p.kind, p.id) for p in report.problems] == [("retired-key", old.id)]
        assert "'k0'" in report.problems[0].reason and "rekey" in report.problems[0].reason
        # an update re-seals under the active key
        moved = await store.save("t", {"n": "t"})
    async with open_at(url, encryption=Keyring({"k1": K1}, active="k1")) as store:
        assert (await store.load(new.id)).state == {"n": "new"}
        assert (await store.load(moved.id)).state == {"n": "t"}
        with pytest.raises(RecordUndecryptable, match="not in this store's keyring") as info:
            await store.load(old.id)
        assert "'k0'" in str(info.value) and info.value.id == old.id
        page = await store.list("s")
        assert [c.id for c in page.items] == [new.id]
        assert [(s.id, s.error) for s in page.skipped] == [(old.id, "RecordUndecryptable")]
        report = await store.verify()
        assert not report.ok
        assert {(p.kind, p.id) for p in report.problems if p.id == old.id} == {
            ("undecryptable", old.id)
        }
        assert all(p.kind != "retired-key" for p in report.problems)


@pytest.mark.parametrize("backend", DURABLE)
@pytest.mark.asyncio
async def test_an_update_under_a_new_active_key_reseals_the_record(
    backend: str, place: Place
) -> None:
    url = place(backend)
    async with open_at(url, encryption=Keyring({"k0": K0}, active="k0")) as store:
        cp = await store.save("s", {"n": 1}, metadata={"m": 1}, ttl=timedelta(hours=1))
    async with open_at(url, encryption=Keyring({"k1": K1, "k0": K0}, active="k1")) as store:
        await store.update(cp.id, {"n": 2})
        assert (await raw_parts(store, cp.id))[1][7:9] == b"k1"
        report = await store.verify()
        assert report.ok and report.problems == []
    async with open_at(url, encryption=Keyring({"k1": K1}, active="k1")) as store:
        got = await store.load(cp.id)
        assert (got.state, got.metadata) == ({"n": 2}, {"m": 1})


# -- the sealed primitives ------------------------------------------------------------


def test_sealed_primitives_override_every_primitive() -> None:
    from statekeeper._core.primitives import StorePrimitives
    from statekeeper._core.sealing import SealedPrimitives

    names = [
        name
        for name, value in vars(StorePrimitives).items()
        if callable(value) and not (name.startswith("__") and name.endswith("__"))
    ]
    assert "_scan_page" in names and "backdoor_write_raw" in names and "_update" in names
    assert len(names) >= 20
    missing = [name for name in names if name not in vars(SealedPrimitives)]
    assert missing == [], f"SealedPrimitives inherits {missing} from StorePrimitives"
    # and every inherited name of the ancestry that is a coroutine function is its own
    for name in dir(StorePrimitives):
        attr = getattr(StorePrimitives, name)
        if name.startswith("_") and not name.startswith("__") and callable(attr):
            assert name in vars(SealedPrimitives), name
