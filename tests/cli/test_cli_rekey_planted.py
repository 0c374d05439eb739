"""``statekeeper rekey`` reports a plaintext record below an encrypted one instead of
encrypting it, and ``--encrypt-plaintext`` encrypts it anyway (S16).

Regression: ``rekey`` encrypted every plaintext record it met, so a record planted
among the records of an encrypted store became authentic-looking at the next key
rotation.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from dataclasses import replace
from pathlib import Path

import statekeeper as sk
from cli_helpers import run_cli
from statekeeper.encryption.envelope import key_id_of
from statekeeper.record import StoredRecord, frame

KEY = os.urandom(32)
RING = sk.Keyring({"k1": KEY}, active="k1")
ENV = {"STATEKEEPER_KEYS": f"k1:{base64.b64encode(KEY).decode()}"}


async def seed_with_planted(url: str) -> list[str]:
    """Three encrypted checkpoints, the middle one overwritten with the plaintext
    record a plaintext store with this store's id would have written."""
    async with sk.open_store(url, encryption=RING) as st:
        ids = [(await st.save("s", {"n": n})).id for n in range(3)]
        raw = await st.backdoor_read_raw(ids[1])
        seq = (await st.load(ids[1], include_state=False)).sequence
        sealed = StoredRecord.from_bytes(
            raw, location="test", expect_store_id=st.store_id, expect_sequence=seq
        )
        plain = replace(sealed, state=st.json_codec.encode({"planted": True}), codec="json")
        positional = json.loads(frame.split(raw)[0])["seq"] is None
        await st.backdoor_write_raw(ids[1], plain.to_bytes(st.store_id, positional=positional))
    return ids


async def key_of(url: str, id: str) -> str | None:
    async with sk.open_store(url) as st:  # without the keys: nothing is opened
        head, state = frame.split(await st.backdoor_read_raw(id))
        return key_id_of(json.loads(head)["codec"], state)


def test_rekey_leaves_a_planted_plaintext_record_and_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    ids = asyncio.run(seed_with_planted(url))
    doc = run_cli("rekey", "--url", url, "--json", cwd=tmp_path, env=ENV, expect=1).json()
    assert [f["id"] for f in doc["failed"]] == [ids[1]]
    assert "may be planted" in doc["failed"][0]["reason"]
    assert doc["already_current"] == 2 and doc["rekeyed"] == 0
    assert asyncio.run(key_of(url, ids[1])) is None  # still plaintext, still refused

    doc = run_cli(
        "rekey", "--url", url, "--encrypt-plaintext", "--json", cwd=tmp_path, env=ENV
    ).json()
    assert (doc["rekeyed"], doc["were_plaintext"], doc["failed"]) == (1, 1, [])
    assert asyncio.run(key_of(url, ids[1])) == "k1"


def test_rekey_help_names_the_flag(tmp_path: Path) -> None:
    out = run_cli("rekey", "--help", cwd=tmp_path).out
    assert "--encrypt-plaintext" in out
