"""Kit tests for encryption at rest (SPEC S16), run in an encrypted option set only.

Each test skips, with a reason, in a plaintext set (:meth:`KitBase.require_encryption`);
those that read or plant stored bytes need ``capabilities.raw_access`` too. A record
is rebuilt with a valid checksum around the altered envelope (:func:`_reframe`), so
what refuses it is the encryption, not the record checksum.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from .._core.store import BaseCheckpointStore
from ..encryption.envelope import key_id_of
from ..encryption.providers import resolve_keyring
from ..errors import (
    CheckpointDecodeError,
    RecordNotEncrypted,
    RecordUndecryptable,
    StoreFormatError,
)
from ..models import Checkpoint, NewCheckpoint, Page
from ..record import StoredRecord
from ._base import KitBase, ids
from .encryption import kit_keyring, rotated_keyring

asyncio_test = pytest.mark.asyncio(loop_scope="function")

#: Marker strings whose bytes must never be found at rest in an encrypted store.
STATE_MARKER = "kit-secret-state-7f3a9c"
TAG_MARKER = "kit-secret-tag-51d2"
META_MARKER = "kit-secret-meta-c0e8"


async def _record(store: BaseCheckpointStore, cp: Checkpoint) -> tuple[bytes, StoredRecord]:
    raw = await store.backdoor_read_raw(cp.id)
    return raw, StoredRecord.from_bytes(raw, location="kit", expect_sequence=cp.sequence)


async def _reframe(store: BaseCheckpointStore, cp: Checkpoint, **changes: Any) -> None:
    """Overwrite ``cp``'s stored record with ``changes`` (state, codec) under a valid
    checksum, through the backdoor."""
    _, record = await _record(store, cp)
    await store.backdoor_write_raw(
        cp.id, dataclasses.replace(record, **changes).to_bytes(store.store_id)
    )


class EncryptionTests(KitBase):
    def _assert_refused(
        self, page: Page, readable: list[str], refused: str, error: type[Exception]
    ) -> None:
        assert ids(page) == readable
        assert [(s.id, s.error) for s in page.skipped] == [(refused, error.__name__)], (
            "the listing did not report the refused record in skipped"
        )

    @asyncio_test
    async def test_encrypted_records_keep_no_plaintext_at_rest(
        self, store: BaseCheckpointStore
    ) -> None:
        """The stored bytes of a save and of an update hold no marker of the state (nor
        of tags and metadata, where sealed), name a sealed codec, and two saves of one
        state differ (a fresh nonce each)."""
        self.require_encryption(store)
        self.require_raw_access(store)
        tags, metadata = {"t": TAG_MARKER}, {"m": META_MARKER}
        state = {"secret": STATE_MARKER, "n": 1}
        first = await store.save("job", state, tags=tags, metadata=metadata)
        second = await store.save("job", state, tags=tags, metadata=metadata)
        updated = await store.update(first.id, {"secret": STATE_MARKER, "n": 2})
        sealed_fields = self.seals_metadata(store)
        envelopes = []
        for cp in (first, second):
            raw, record = await _record(store, cp)
            assert STATE_MARKER.encode() not in raw, "the state is stored in plaintext"
            assert record.codec.startswith("aes256gcm:"), f"stored codec {record.codec!r}"
            assert (
                key_id_of(record.codec, record.state)
                == resolve_keyring(store.options.encryption).active
            )
            if sealed_fields:
                assert TAG_MARKER.encode() not in raw and META_MARKER.encode() not in raw
                assert (record.header.tags, record.header.metadata) == ({}, {})
            envelopes.append(record.state)
        assert envelopes[0] != envelopes[1], "two saves of one state gave one ciphertext"
        loaded = await store.load(first.id)
        assert (loaded.state, loaded.tags, loaded.metadata) == (
            {"secret": STATE_MARKER, "n": 2},
            tags,
            metadata,
        )
        assert loaded.etag == updated.etag
        assert (await store.load(second.id)).state == state

    @asyncio_test
    async def test_encrypted_tampered_ciphertext_is_refused_without_fallback(
        self, store: BaseCheckpointStore
    ) -> None:
        """A flipped ciphertext byte (under a valid record checksum) fails its tag:
        strict reads raise naming it, get_latest never gives the older checkpoint, the
        listing reports it in skipped, and so after a reopen."""
        self.require_encryption(store)
        self.require_raw_access(store)
        older = await store.save("job", {"n": 0})
        newest = await store.save("job", {"n": 1})
        _, record = await _record(store, newest)
        state = record.state
        flipped = state[:-1] + bytes([state[-1] ^ 0x01])
        await _reframe(store, newest, state=flipped)
        for _ in range(2):
            with pytest.raises(RecordUndecryptable) as caught:
                await store.get_latest("job")
            assert caught.value.id == newest.id
            with pytest.raises(RecordUndecryptable):
                await store.load(newest.id)
            with pytest.raises(RecordUndecryptable):
                await store.load(newest.id, include_state=False)
            self._assert_refused(
                await store.list("job"), [older.id], newest.id, RecordUndecryptable
            )
            store = await self.reopen(store)
        assert (await store.load(older.id)).state == {"n": 0}

    @asyncio_test
    async def test_encrypted_ciphertext_moved_to_another_checkpoint_is_refused(
        self, store: BaseCheckpointStore
    ) -> None:
        """An envelope copied to another checkpoint of its stream, or to one of another
        stream, fails there (the tag binds the id and the stream); where it came
        from, it still opens."""
        self.require_encryption(store)
        self.require_raw_access(store)
        source = await store.save("job", {"n": "source"})
        sibling = await store.save("job", {"n": "sibling"})
        elsewhere = await store.save("other", {"n": "elsewhere"})
        _, record = await _record(store, source)
        for target in (sibling, elsewhere):
            await _reframe(store, target, state=record.state, codec=record.codec)
            with pytest.raises(RecordUndecryptable) as caught:
                await store.load(target.id)
            assert caught.value.id == target.id
            with pytest.raises(RecordUndecryptable):
                await store.get_latest(target.stream)
        assert (await store.load(source.id)).state == {"n": "source"}
        self._assert_refused(await store.list("job"), [source.id], sibling.id, RecordUndecryptable)

    @asyncio_test
    async def test_encrypted_store_refuses_a_planted_plaintext_record(
        self, store: BaseCheckpointStore
    ) -> None:
        """A plaintext record planted in an encrypted store (well-formed, checksummed)
        is never read as data: RecordNotEncrypted from strict reads, skipped in a
        listing, a ``"plaintext"`` problem for verify."""
        self.require_encryption(store)
        self.require_raw_access(store)
        older = await store.save("job", {"n": 0})
        newest = await store.save("job", {"n": 1})
        _, record = await _record(store, newest)
        inner = record.codec.removeprefix("aes256gcm:")
        await _reframe(store, newest, state=b'{"planted": true}', codec=inner)
        with pytest.raises(RecordNotEncrypted) as caught:
            await store.get_latest("job")
        assert caught.value.id == newest.id
        with pytest.raises(RecordNotEncrypted):
            await store.load(newest.id)
        self._assert_refused(await store.list("job"), [older.id], newest.id, RecordNotEncrypted)
        report = await store.verify()
        assert not report.ok
        assert [(p.kind, p.id) for p in report.problems if p.kind == "plaintext"] == [
            ("plaintext", newest.id)
        ], report.problems

    @asyncio_test
    async def test_encrypted_records_under_an_unknown_key_are_refused(
        self, store: BaseCheckpointStore
    ) -> None:
        """Reopened with a keyring that lacks the records' key, every read refuses them
        (naming the key id, never a key) and get_latest gives nothing older."""
        self.require_encryption(store)
        saved = await self.save_steps(store, "job", 2)
        store = await self.reopen(store, encryption=kit_keyring("kit-stranger"))
        with pytest.raises(RecordUndecryptable) as caught:
            await store.get_latest("job")
        assert caught.value.id == saved[-1].id
        assert "kit-stranger" in str(caught.value) or "not in this store's keyring" in str(
            caught.value
        )
        with pytest.raises(RecordUndecryptable):
            await store.load(saved[0].id)
        page = await store.list("job")
        assert ids(page) == []
        assert [s.id for s in page.skipped] == [cp.id for cp in reversed(saved)]
        assert {s.error for s in page.skipped} == {RecordUndecryptable.__name__}

    @asyncio_test
    async def test_encrypted_reopen_and_rotation_keep_everything_readable(
        self, store: BaseCheckpointStore
    ) -> None:
        """Saves, an update and a batch read back the same after a reopen, and after a
        reopen under a rotated keyring (the old key retired); new records are then
        sealed under the new key, and verify names the retired ones as notices."""
        self.require_encryption(store)
        saved = [
            await store.save("a", {"i": 0}, tags={"k": "v"}, metadata={"m": 1}),
            await store.save("b", {"i": 1}),
        ]
        saved[0] = await store.load((await store.update(saved[0].id, {"i": 2})).id)
        saved += await store.save_many(
            [NewCheckpoint(stream="a", state={"i": 3}), NewCheckpoint(stream="b", state={"i": 4})]
        )
        want = {cp.id: await store.load(cp.id) for cp in saved}
        keyring = resolve_keyring(store.options.encryption)
        rotated = rotated_keyring(keyring, "kit-k-next")
        for options in ({}, {"encryption": rotated}):
            store = await self.reopen(store, **options)
            for cid, cp in want.items():
                assert await store.load(cid) == cp
            assert sorted(await store.list_streams()) == ["a", "b"]
            assert {cp.id for cp in (await store.list(None)).items} == set(want)
        fresh = await store.save("a", {"i": 5})
        assert (await store.get_latest("a")) == await store.load(fresh.id)
        if store.capabilities.raw_access:
            _, record = await _record(store, fresh)
            assert key_id_of(record.codec, record.state) == "kit-k-next"
        report = await store.verify()
        retired = {p.id for p in report.problems if p.kind == "retired-key"}
        assert report.ok, report.problems
        assert retired == set(want), "verify did not name the records under the retired key"

    @asyncio_test
    async def test_encrypted_records_are_refused_by_a_plaintext_store(
        self, store: BaseCheckpointStore
    ) -> None:
        """Opened without encryption, a store holding encrypted records reads none of
        them as data: strict reads raise a decode error, listings skip them."""
        self.require_encryption(store)
        cp = await store.save("job", {"n": STATE_MARKER})
        store = await self.reopen(store, encryption=None, encrypt_metadata=False)
        with pytest.raises(CheckpointDecodeError) as caught:
            await store.get_latest("job")
        assert caught.value.id == cp.id
        assert "encrypt" in str(caught.value)
        page = await store.list("job")
        assert (ids(page), [s.id for s in page.skipped]) == ([], [cp.id])

    @asyncio_test
    async def test_encrypted_open_refuses_a_store_whose_newest_record_is_plaintext(
        self, store: BaseCheckpointStore
    ) -> None:
        """A store written in plaintext is refused by an encrypted open (StoreFormatError,
        naming the way out), not silently mixed."""
        self.require_encryption(store)
        plain = await self.reopen(store, encryption=None, encrypt_metadata=False)
        await plain.save("job", {"n": "plaintext"})
        await plain.close()
        with pytest.raises(StoreFormatError) as caught:
            await self.open_store()
        assert "rekey" in str(caught.value)
