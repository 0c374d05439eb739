"""Encryption at rest (S16) against an attacker who can write the store: every edit
of an envelope, every envelope moved to another checkpoint, stream or store, and
a planted plaintext record is refused (``RecordUndecryptable``,
``RecordNotEncrypted``) by the strict reads and reported by the listing, and
``get_latest`` never answers the older checkpoint instead. The frames are rebuilt
with :func:`statekeeper.record.frame.join`, so their checksums are right: only the
tag stands in the way. Also: no plaintext reaches the disk, and the update path's
guard against a record re-created in another stream between its read and write."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import statekeeper as sk
from sql_helpers import drop_store, new_prefix
from statekeeper.backends.memory import MemoryCheckpointStore
from statekeeper.encryption import Keyring
from statekeeper.errors import (
    CheckpointDecodeError,
    PreconditionFailed,
    RecordNotEncrypted,
    RecordUndecryptable,
    StoreFormatError,
)
from statekeeper.record import StoredRecord, Update, frame
from statekeeper.testing import service_url

K0 = os.urandom(32)
K1 = os.urandom(32)
RING = Keyring({"k1": K1, "k0": K0}, active="k1")
BACKENDS = ["memory", "file", "sqlite"]
SECRET = "MARKER-SECRET-c0ffee"
TAG_VALUE = "MARKER-TAG-5eed"
META_VALUE = "MARKER-META-d00d"


SERVERS = {"postgresql": "postgres", "mysql": "mysql"}
#: the tests that need no reopening also run on the SQL servers, where they are set
ANYWHERE = [*BACKENDS, *SERVERS]


def url_of(backend: str, path: Path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    return {
        "memory": "memory://",
        "file": f"file://{path}/files",
        "sqlite": f"sqlite:///{path}/store.db",
    }[backend]


Opener = Callable[..., sk.BaseCheckpointStore]


@pytest.fixture
def opener(tmp_path: Path) -> Iterator[Opener]:
    """``opener(backend, place="a", **options)``: an unopened store of ``backend``,
    the same store for the same ``place``; on a server (its URL from the
    environment, else the test skips) under a fresh table prefix, dropped after."""
    made: list[tuple[str, str]] = []
    prefixes: dict[tuple[str, str], str] = {}

    def open_(backend: str, place: str = "a", **options: Any) -> sk.BaseCheckpointStore:
        if backend not in SERVERS:
            return sk.open_store(url_of(backend, tmp_path / place), **options)
        url = service_url(SERVERS[backend])
        if (backend, place) not in prefixes:
            prefixes[backend, place] = new_prefix()
            made.append((url, prefixes[backend, place]))
        return sk.open_store(url, table_prefix=prefixes[backend, place], **options)

    yield open_
    for url, prefix in made:
        drop_store(url, prefix)


async def read_parts(store: sk.BaseCheckpointStore, id: str) -> tuple[bytes, bytes]:
    """The header bytes and the envelope of record ``id``, as stored."""
    return frame.split(await store.backdoor_read_raw(id))


async def write_parts(store: sk.BaseCheckpointStore, id: str, head: bytes, state: bytes) -> None:
    """Store ``head`` and ``state`` as record ``id``, in a frame whose checksum is right."""
    await store.backdoor_write_raw(id, frame.join(head, state))


def kid_at(envelope: bytes) -> slice:
    return slice(7, 7 + envelope[6])


def nonce_at(envelope: bytes) -> int:
    return 7 + envelope[6]


def flip(data: bytes, at: int, bit: int = 1) -> bytes:
    edited = bytearray(data)
    edited[at] ^= bit
    return bytes(edited)


def with_kid(envelope: bytes, kid: bytes) -> bytes:
    span = kid_at(envelope)
    return envelope[:6] + bytes((len(kid),)) + kid + envelope[span.stop :]


async def assert_refused(
    store: sk.BaseCheckpointStore,
    stream: str,
    victim: str,
    older: str,
    error: type[CheckpointDecodeError],
    reason: str,
) -> None:
    """Every strict read of ``victim`` (the newest of ``stream``) raises ``error``;
    the listing reports it skipped; the ``older`` checkpoint stays readable and is
    never what ``get_latest`` answers."""
    with pytest.raises(error, match=reason) as info:
        await store.get_latest(stream)
    assert type(info.value) is error and info.value.id == victim
    assert SECRET not in str(info.value)
    for include_state in (True, False):
        with pytest.raises(error, match=reason):
            await store.load(victim, include_state=include_state)
        with pytest.raises(error, match=reason):
            await store.load_many([older, victim], include_state=include_state)
        for listed_stream in (stream, None):
            page = await store.list(listed_stream, include_state=include_state)
            assert victim not in [c.id for c in page.items]
            assert older in [c.id for c in page.items]
            found = [s for s in page.skipped if s.id == victim]
            assert len(found) == 1 and found[0].error == error.__name__
            assert reason.split(".*")[0] in found[0].reason
    assert (await store.load(older)).state == {"n": "older"}
    with pytest.raises(error):  # still: nothing fell back to the older record
        await store.get_latest(stream)


Tamper = Callable[[sk.BaseCheckpointStore, str], Awaitable[None]]


def edit_envelope(edit: Callable[[bytes], bytes]) -> Tamper:
    async def tamper(store: sk.BaseCheckpointStore, victim: str) -> None:
        head, envelope = await read_parts(store, victim)
        edited = edit(envelope)
        assert edited != envelope
        await write_parts(store, victim, head, edited)

    return tamper


UNDECRYPTABLE = "decryption under key .* failed"
EDITS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "ciphertext-byte": (lambda e: flip(e, nonce_at(e) + 12), UNDECRYPTABLE),
    "last-ciphertext-byte": (lambda e: flip(e, len(e) - 17, 0x80), UNDECRYPTABLE),
    "tag-byte": (lambda e: flip(e, len(e) - 1), UNDECRYPTABLE),
    "nonce": (lambda e: flip(e, nonce_at(e)), UNDECRYPTABLE),
    "nonce-last-byte": (lambda e: flip(e, nonce_at(e) + 11, 0x40), UNDECRYPTABLE),
    "key-id-in-ring": (lambda e: with_kid(e, b"k0"), "decryption under key 'k0' failed"),
    "key-id-not-in-ring": (
        lambda e: with_kid(e, b"k9"),
        "key id 'k9', which is not in this store's keyring",
    ),
    "longer-key-id": (lambda e: with_kid(e, b"k1x"), "not in this store's keyring"),
    "flags-metadata-bit": (lambda e: flip(e, 5), UNDECRYPTABLE),
    "flags-high-bit": (lambda e: flip(e, 5, 0x80), UNDECRYPTABLE),
    "algorithm": (lambda e: flip(e, 4, 2), "unknown encryption algorithm"),
    "magic": (lambda e: b"SKE2" + e[4:], "malformed encryption envelope"),
    "truncated": (lambda e: e[: nonce_at(e) + 20], "truncated encryption envelope"),
    "appended": (lambda e: e + b"\x00", UNDECRYPTABLE),
    "empty": (lambda e: b"", "malformed encryption envelope"),
}


SERVER_EDITS = [
    "ciphertext-byte",
    "nonce",
    "key-id-in-ring",
    "key-id-not-in-ring",
    "flags-metadata-bit",
]


@pytest.mark.parametrize(
    ("backend", "edit"),
    [(b, e) for b in BACKENDS for e in sorted(EDITS)]
    + [(b, e) for b in SERVERS for e in SERVER_EDITS],
)
@pytest.mark.parametrize("meta", [False, True], ids=["meta-header", "meta-sealed"])
@pytest.mark.asyncio
async def test_an_edited_envelope_is_refused(
    backend: str, meta: bool, edit: str, opener: Opener
) -> None:
    change, reason = EDITS[edit]
    async with opener(backend, encryption=RING, encrypt_metadata=meta) as st:
        older = await st.save("s", {"n": "older"})
        victim = await st.save("s", {"n": "newer", "secret": SECRET}, tags={"t": TAG_VALUE})
        await edit_envelope(change)(st, victim.id)
        await assert_refused(st, "s", victim.id, older.id, RecordUndecryptable, reason)
        report = await st.verify()
        assert not report.ok
        assert ("undecryptable", victim.id) in {(p.kind, p.id) for p in report.problems}


@pytest.mark.parametrize("backend", ANYWHERE)
@pytest.mark.asyncio
async def test_an_envelope_moved_to_another_checkpoint_of_the_stream_is_refused(
    backend: str, opener: Opener
) -> None:
    async with opener(backend, encryption=RING) as st:
        older = await st.save("s", {"n": "older"})
        victim = await st.save("s", {"n": "newer"})
        _, old_envelope = await read_parts(st, older.id)
        head, _ = await read_parts(st, victim.id)
        # the rollback: the newest record made to carry the older state
        await write_parts(st, victim.id, head, old_envelope)
        await assert_refused(st, "s", victim.id, older.id, RecordUndecryptable, UNDECRYPTABLE)


@pytest.mark.parametrize("backend", ANYWHERE)
@pytest.mark.asyncio
async def test_an_envelope_moved_to_another_stream_is_refused(backend: str, opener: Opener) -> None:
    async with opener(backend, encryption=RING) as st:
        # the same id in another stream: only the stream differs in what the tag binds
        elsewhere = await st.save("other", {"n": "elsewhere"}, id="the-id")
        _, envelope = await read_parts(st, elsewhere.id)
        assert await st.delete("the-id")
        older = await st.save("s", {"n": "older"})
        victim = await st.save("s", {"n": "newer"}, id="the-id")
        head, _ = await read_parts(st, victim.id)
        await write_parts(st, victim.id, head, envelope)
        await assert_refused(st, "s", victim.id, older.id, RecordUndecryptable, UNDECRYPTABLE)
        # and a record of another stream with another id
        other = await st.save("other", {"n": "other"})
        _, envelope = await read_parts(st, other.id)
        await write_parts(st, victim.id, head, envelope)
        await assert_refused(st, "s", victim.id, older.id, RecordUndecryptable, UNDECRYPTABLE)


@pytest.mark.parametrize("backend", ANYWHERE)
@pytest.mark.asyncio
async def test_an_envelope_moved_from_another_store_with_the_same_keyring_is_refused(
    backend: str, opener: Opener
) -> None:
    # the same id and stream in both stores: only the store id differs in the binding
    async with opener(backend, "b", encryption=RING) as other:
        twin = await other.save("s", {"n": "twin"}, id="the-id")
        _, envelope = await read_parts(other, twin.id)
        other_id = other.store_id
    async with opener(backend, "a", encryption=RING) as st:
        assert st.store_id != other_id
        older = await st.save("s", {"n": "older"})
        victim = await st.save("s", {"n": "newer"}, id="the-id")
        head, _ = await read_parts(st, victim.id)
        await write_parts(st, victim.id, head, envelope)
        await assert_refused(st, "s", victim.id, older.id, RecordUndecryptable, UNDECRYPTABLE)


def edit_header(head: bytes, **fields: Any) -> bytes:
    values = json.loads(head)
    assert set(fields) <= set(values)
    return json.dumps({**values, **fields}, separators=(",", ":")).encode()


@pytest.mark.parametrize("backend", ANYWHERE)
@pytest.mark.asyncio
async def test_an_edited_inner_codec_in_the_header_is_refused(backend: str, opener: Opener) -> None:
    async with opener(backend, encryption=RING) as st:
        older = await st.save("s", {"n": "older"})
        victim = await st.save("s", {"n": "newer"})
        raw_name = sk.open_store("memory://", codec="raw").codec.name
        head, envelope = await read_parts(st, victim.id)
        # the inner codec is bound too: the envelope cannot be read as another codec
        await write_parts(st, victim.id, edit_header(head, codec="aes256gcm:" + raw_name), envelope)
        await assert_refused(st, "s", victim.id, older.id, RecordUndecryptable, UNDECRYPTABLE)
        # and a header that claims plaintext does not make the envelope data
        await write_parts(st, victim.id, edit_header(head, codec=st.json_codec.name), envelope)
        await assert_refused(st, "s", victim.id, older.id, RecordNotEncrypted, "not encrypted")


@pytest.mark.parametrize("backend", ANYWHERE)
@pytest.mark.asyncio
async def test_a_record_relabelled_to_another_stream_is_refused(
    backend: str, opener: Opener
) -> None:
    async with opener(backend, encryption=RING) as st:
        older = await st.save("s", {"n": "older"})
        other = await st.save("t", {"n": "other"})
        victim = await st.save("s", {"n": "newer"})
        head, envelope = await read_parts(st, victim.id)
        await write_parts(st, victim.id, edit_header(head, stream="t"), envelope)
        with pytest.raises(RecordUndecryptable, match=UNDECRYPTABLE):
            await st.load(victim.id)
        with pytest.raises(CheckpointDecodeError):  # the backend may see the edit first
            await st.get_latest("s")
        latest_t = await st.get_latest("t")
        assert latest_t is not None and latest_t.id == other.id
        page = await st.list("s")
        assert [c.id for c in page.items] == [older.id]
        assert [s.id for s in page.skipped] == [victim.id]


@pytest.mark.parametrize("backend", ANYWHERE)
@pytest.mark.asyncio
async def test_a_whole_record_from_another_store_is_refused(backend: str, opener: Opener) -> None:
    async with opener(backend, "b", encryption=RING) as other:
        twin = await other.save("s", {"n": "twin"}, id="the-id")
        raw = await other.backdoor_read_raw(twin.id)
    async with opener(backend, "a", encryption=RING) as st:
        older = await st.save("s", {"n": "older"})
        victim = await st.save("s", {"n": "newer"}, id="the-id")
        await st.backdoor_write_raw(victim.id, raw)
        with pytest.raises(CheckpointDecodeError):
            await st.get_latest("s")
        with pytest.raises(CheckpointDecodeError):
            await st.load(victim.id)
        page = await st.list("s")
        assert [c.id for c in page.items] == [older.id]
        assert [s.id for s in page.skipped] == [victim.id]


async def planted_plaintext(store: sk.BaseCheckpointStore, victim: str, state: Any) -> None:
    """Overwrite ``victim`` with what a plaintext store with this store's id would
    have written: the same header fields, a plaintext codec and state."""
    raw = await store.backdoor_read_raw(victim)
    head, _ = frame.split(raw)
    positional = json.loads(head)["seq"] is None
    sealed = StoredRecord.from_bytes(
        raw,
        location="test",
        expect_store_id=store.store_id,
        expect_sequence=(await store.load(victim, include_state=False)).sequence,
    )
    plain = replace(sealed, state=store.json_codec.encode(state), codec=store.json_codec.name)
    await store.backdoor_write_raw(victim, plain.to_bytes(store.store_id, positional=positional))


@pytest.mark.parametrize("backend", ANYWHERE)
@pytest.mark.parametrize("meta", [False, True], ids=["meta-header", "meta-sealed"])
@pytest.mark.asyncio
async def test_a_planted_plaintext_record_is_never_read(
    backend: str, meta: bool, opener: Opener
) -> None:
    async with opener(backend, encryption=RING, encrypt_metadata=meta) as st:
        older = await st.save("s", {"n": "older"})
        victim = await st.save("s", {"n": "newer"})
        await planted_plaintext(st, victim.id, {"n": "planted", "secret": SECRET})
        head, state = await read_parts(st, victim.id)
        assert json.loads(head)["codec"] == st.json_codec.name and SECRET.encode() in state
        await assert_refused(st, "s", victim.id, older.id, RecordNotEncrypted, "not encrypted")
        with pytest.raises(RecordNotEncrypted, match="statekeeper rekey"):
            await st.load(victim.id)
        report = await st.verify()
        assert not report.ok
        assert ("plaintext", victim.id) in {(p.kind, p.id) for p in report.problems}
        # an update refuses it too: its header's tags and metadata (the attacker's)
        # are never sealed as if they were real (a regression)
        for kwargs in ({}, {"tags": {"t": "x"}, "metadata": {"m": 1}}):
            with pytest.raises(RecordNotEncrypted, match="not encrypted"):
                await st.update(victim.id, {"n": "again"}, **kwargs)  # type: ignore[arg-type]
        assert json.loads((await read_parts(st, victim.id))[0])["codec"] == st.json_codec.name


@pytest.mark.parametrize("backend", ["file", "sqlite"])
@pytest.mark.asyncio
async def test_a_planted_plaintext_record_survives_reopening_refused(
    backend: str, tmp_path: Path
) -> None:
    url = url_of(backend, tmp_path)
    async with sk.open_store(url, encryption=RING) as st:
        older = await st.save("s", {"n": "older"})
        victim = await st.save("s", {"n": "newer"})
        newest = await st.save("t", {"n": "newest"})
        await planted_plaintext(st, victim.id, {"n": "planted"})
    async with sk.open_store(url, encryption=RING) as st:
        await assert_refused(st, "s", victim.id, older.id, RecordNotEncrypted, "not encrypted")
        await planted_plaintext(st, newest.id, {"n": "planted"})
    # the store's newest record is plaintext now: it refuses to open encrypted
    with pytest.raises(StoreFormatError, match="rekey") as info:
        await sk.open_store(url, encryption=RING).open()
    assert newest.id in str(info.value)


# -- no plaintext at rest --------------------------------------------------------------


def bytes_at_rest(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("meta", [False, True], ids=["meta-header", "meta-sealed"])
@pytest.mark.parametrize("codec", ["json", "raw"])
@pytest.mark.asyncio
async def test_no_plaintext_reaches_the_store(
    backend: str, meta: bool, codec: str, tmp_path: Path
) -> None:
    def state(n: int) -> Any:
        return f"{SECRET}-{n}".encode() if codec == "raw" else {"s": f"{SECRET}-{n}"}

    url = url_of(backend, tmp_path)
    ids: list[str] = []
    store = sk.open_store(url, encryption=RING, encrypt_metadata=meta, codec=codec)
    async with store:
        tags, metadata = {"t": TAG_VALUE}, {"m": META_VALUE}
        cp = await store.save("s", state(0), tags=tags, metadata=metadata)
        ids.append(cp.id)
        await store.update(cp.id, state(1), tags=tags, metadata=metadata)
        many = await store.save_many(
            [sk.NewCheckpoint(stream="s", state=state(2), tags=tags, metadata=metadata)]
        )
        ids.append(many[0].id)
        imported = await store.import_checkpoint(cp.model_copy(update={"id": "imported"}), state(3))
        ids.append(imported.id)
        for rid in ids:
            raw = await store.backdoor_read_raw(rid)
            assert SECRET.encode() not in raw
            assert (TAG_VALUE.encode() in raw) is not meta
            assert (META_VALUE.encode() in raw) is not meta
        assert (await store.load(cp.id)).state == state(1)
    if backend != "memory":
        on_disk = bytes_at_rest(tmp_path)
        assert on_disk  # the store is there
        assert SECRET.encode() not in on_disk
        if meta:
            assert TAG_VALUE.encode() not in on_disk
            assert META_VALUE.encode() not in on_disk


# -- the update path's guard -----------------------------------------------------------


class RecreatingStore(MemoryCheckpointStore):
    """A memory store whose next ``_get`` of ``doomed`` lets a concurrent writer
    delete it and save the same id in ``into`` right after the read, as a writer
    between the update's read and its write would."""

    doomed: str | None = None
    into = "elsewhere"
    reads = 0

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        record = await super()._get(id, now)
        self.reads += 1
        if id == self.doomed:
            self.doomed = None
            assert await self.delete(id)
            await self.save(self.into, {"n": "re-created"}, id=id, tags={"t": "new"})
        return record


@pytest.mark.parametrize("meta", [False, True], ids=["meta-header", "meta-sealed"])
@pytest.mark.asyncio
async def test_an_update_never_seals_for_the_stream_the_record_left(meta: bool) -> None:
    async with RecreatingStore(encryption=RING, encrypt_metadata=meta) as store:
        cp = await store.save("s", {"n": "first"}, tags={"t": "old"})
        sealed = store._sealed
        assert sealed is not None and sealed.inner is store
        store.doomed, store.reads = cp.id, 0
        header = await sealed._update(
            Update(
                id=cp.id,
                state=store.codec.encode({"n": "updated"}),
                codec=store.codec.name,
                now=store.now(),
                etag="e-updated",
            )
        )
        assert store.reads == 2  # read, lost the race, read again
        assert header.stream == "elsewhere" and header.etag == "e-updated"
        got = await store.load(cp.id)  # sealed for the stream it is in: it opens
        assert (got.stream, got.state, got.tags) == ("elsewhere", {"n": "updated"}, {"t": "new"})
        assert (await store.get_latest("elsewhere")).id == cp.id  # type: ignore[union-attr]
        assert await store.get_latest("s") is None
        assert (await store.verify()).ok


@pytest.mark.asyncio
async def test_an_update_with_if_match_loses_the_race_with_precondition_failed() -> None:
    async with RecreatingStore(encryption=RING) as store:
        cp = await store.save("s", {"n": "first"})
        store.doomed = cp.id
        with pytest.raises(PreconditionFailed):
            await store.update(cp.id, {"n": "updated"}, if_match=cp.etag)
        got = await store.load(cp.id)
        assert (got.stream, got.state) == ("elsewhere", {"n": "re-created"})


@pytest.mark.asyncio
async def test_an_update_through_the_public_method_follows_the_record() -> None:
    async with RecreatingStore(encryption=RING, encrypt_metadata=True) as store:
        cp = await store.save("s", {"n": "first"}, metadata={"m": 1})
        store.doomed = cp.id
        up = await store.update(cp.id, {"n": "updated"})
        assert (up.stream, up.tags) == ("elsewhere", {"t": "new"})
        got = await store.load(cp.id)
        assert (got.stream, got.state, got.tags, got.metadata) == (
            "elsewhere",
            {"n": "updated"},
            {"t": "new"},
            {},
        )
