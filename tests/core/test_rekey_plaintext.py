"""``rekey`` never makes a planted plaintext record look authentic (S16).

Regression: ``rekey_store`` encrypted every plaintext record it met, so in a store
that was already encrypted, a plaintext record planted by whoever can write the
storage became a sealed, authentic-looking checkpoint at the next key rotation.
Now only the plaintext a migration explains is encrypted by default: all of a
plaintext store, and the plaintext after the last encrypted record (what a
migration killed part way leaves, since the walk goes in sequence order).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import statekeeper as sk
from statekeeper._core.rekey import rekey_store
from statekeeper.encryption.envelope import key_id_of
from statekeeper.errors import RecordNotEncrypted
from statekeeper.record import StoredRecord, frame

K0 = sk.Keyring({"k0": os.urandom(32)}, active="k0")
BACKENDS = ["sqlite", "file"]

Opener = Callable[..., Any]


@pytest.fixture
def url_of(tmp_path: Path) -> Callable[[str], str]:
    def url(kind: str) -> str:
        return f"sqlite:///{tmp_path}/s.db" if kind == "sqlite" else f"file://{tmp_path}/store"

    return url


@asynccontextmanager
async def opened(url: str, **options: Any) -> AsyncIterator[sk.BaseCheckpointStore]:
    async with sk.open_store(url, **options) as store:
        yield store


async def key_ids(url: str) -> dict[int, str | None]:
    """Each record's key id by sequence (``None``: plaintext), read as stored (by a
    store opened without the keys, whose header listing opens nothing)."""
    found: dict[int, str | None] = {}
    async with opened(url) as st:
        for cp in (await st.list(None, limit=1000, order="asc", include_state=False)).items:
            found[cp.sequence] = await key_of(st, cp.id)
    return found


async def key_of(store: sk.BaseCheckpointStore, id: str) -> str | None:
    raw = await store.backdoor_read_raw(id)
    head, state = frame.split(raw)
    return key_id_of(json.loads(head)["codec"], state)


async def plant_plaintext(store: sk.BaseCheckpointStore, victim: str) -> None:
    """Overwrite ``victim`` with the plaintext record a plaintext store with this
    store's id would have written (valid frame, checksum and header)."""
    raw = await store.backdoor_read_raw(victim)
    head, _ = frame.split(raw)
    seq = (await store.load(victim, include_state=False)).sequence
    sealed = StoredRecord.from_bytes(
        raw, location="test", expect_store_id=store.store_id, expect_sequence=seq
    )
    plain = replace(sealed, state=store.json_codec.encode({"planted": 1}), codec="json")
    positional = json.loads(head)["seq"] is None
    await store.backdoor_write_raw(victim, plain.to_bytes(store.store_id, positional=positional))


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.asyncio
async def test_a_plaintext_record_below_an_encrypted_one_is_reported_not_encrypted(
    kind: str, url_of: Callable[[str], str]
) -> None:
    url = url_of(kind)
    async with opened(url, encryption=K0) as st:
        ids = [(await st.save("s", {"n": n})).id for n in range(4)]
        await plant_plaintext(st, ids[1])
    report = await rekey_store(sk.open_store(url, encryption=K0))
    assert not report.ok
    assert [(f.id, f.error) for f in report.failed] == [(ids[1], "RecordNotEncrypted")]
    assert "may be planted" in report.failed[0].reason
    assert "--encrypt-plaintext" in report.failed[0].reason
    assert report.current == 3 and report.rekeyed == 0
    assert (await key_ids(url))[2] is None  # left as it was: still refused by reads
    async with opened(url, encryption=K0) as st:
        with pytest.raises(RecordNotEncrypted):
            await st.load(ids[1])


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.asyncio
async def test_encrypt_plaintext_true_encrypts_it_anyway(
    kind: str, url_of: Callable[[str], str]
) -> None:
    url = url_of(kind)
    async with opened(url, encryption=K0) as st:
        ids = [(await st.save("s", {"n": n})).id for n in range(3)]
        await plant_plaintext(st, ids[0])
    report = await rekey_store(sk.open_store(url, encryption=K0), encrypt_plaintext=True)
    assert report.ok and (report.rekeyed, report.encrypted, report.current) == (1, 1, 2)
    assert set((await key_ids(url)).values()) == {"k0"}


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.asyncio
async def test_plaintext_after_the_last_encrypted_record_is_an_interrupted_migration(
    kind: str, url_of: Callable[[str], str]
) -> None:
    url = url_of(kind)
    async with opened(url) as st:
        for n in range(3):
            await st.save("s", {"n": n})
    assert (await rekey_store(sk.open_store(url, encryption=K0))).encrypted == 3
    async with opened(url) as st:  # a plaintext writer after the first run
        for n in range(2):
            await st.save("s", {"n": 10 + n})
    report = await rekey_store(sk.open_store(url, encryption=K0))
    assert report.ok and (report.encrypted, report.current) == (2, 3)
    assert set((await key_ids(url)).values()) == {"k0"}


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.asyncio
async def test_encrypt_plaintext_false_encrypts_none(
    kind: str, url_of: Callable[[str], str]
) -> None:
    url = url_of(kind)
    async with opened(url) as st:
        for n in range(2):
            await st.save("s", {"n": n})
    report = await rekey_store(sk.open_store(url, encryption=K0), encrypt_plaintext=False)
    assert (report.encrypted, len(report.failed)) == (0, 2)
    assert all("encrypt_plaintext is off" in f.reason for f in report.failed)
    assert set((await key_ids(url)).values()) == {None}
