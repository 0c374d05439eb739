"""The one rule for encryption on the command line (SPEC §4): with
``$STATEKEEPER_KEYS`` set every command opens its stores with ``encryption="env"``,
without it none does, and either way it says what to do when the store and the
keys do not match. ``copy`` opens both sides with the keys unless told otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import statekeeper
from cli_helpers import run_cli, seed
from statekeeper._core.rekey import rekey_store
from statekeeper.cli.commands import app
from statekeeper.encryption import Keyring

K0 = bytes(range(32))
K1 = bytes(range(100, 132))
B64_K0 = base64.b64encode(K0).decode()
B64_K1 = base64.b64encode(K1).decode()
KEYS = {"STATEKEEPER_KEYS": f"k1:{B64_K1},k0:{B64_K0}"}
ONLY_K1 = {"STATEKEEPER_KEYS": f"k1:{B64_K1}"}
ENVELOPE = b"SKE1"

runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    full = {"STATEKEEPER_URL": None, "STATEKEEPER_KEYS": None, "COLUMNS": "200", **(env or {})}
    result = runner.invoke(app, list(args), env=full)
    return result.exit_code, result.stdout, result.stderr


def flat(text: str) -> str:
    return " ".join(text.split())


def make(url: str, keyring: Keyring | None) -> None:
    async def main() -> None:
        async with statekeeper.open_store(url, encryption=keyring) as store:
            await seed(store)

    asyncio.run(main())


def raw_key_ids(url: str) -> set[str | None]:
    """The key id every record names (``None``: plaintext), read without keys."""

    async def main() -> set[str | None]:
        async with statekeeper.open_store(url, read_only=True) as store:
            page = await store.list(None, limit=100, include_state=False)
            ids = [h.id for h in page.items] + [s.id for s in page.skipped if s.id]
            found: set[str | None] = set()
            for rid in ids:
                raw = await store.backdoor_read_raw(rid)
                at = raw.find(ENVELOPE)
                found.add(None if at < 0 else raw[at + 7 : at + 7 + raw[at + 6]].decode())
            return found

    return asyncio.run(main())


@pytest.fixture
def encrypted(tmp_path: Path) -> str:
    """An SQLite store of the seeded checkpoints, under key k1."""
    url = f"sqlite:///{tmp_path / 'enc.db'}"
    make(url, Keyring({"k1": K1}, active="k1"))
    return url


# -- with the keys every command reads it ------------------------------------------------


def test_every_reading_command_reads_an_encrypted_store_with_the_keys(encrypted: str) -> None:
    code, out, _ = invoke("ls", "--url", encrypted, "--json", "--with-state", env=KEYS)
    page = json.loads(out)
    assert code == 0 and page["skipped"] == [] and len(page["items"]) == 8
    assert {i["id"]: i["state"] for i in page["items"]}["users-2"] == {"name": "user2"}

    code, out, _ = invoke("show", "orders-3", "--url", encrypted, "--json", env=KEYS)
    cp = json.loads(out)["checkpoint"]
    assert code == 0 and cp["state"]["step"] == 3 and cp["tags"] == {"kind": "step"}

    code, out, _ = invoke("latest", "orders", "--url", encrypted, "--json", env=KEYS)
    assert code == 0 and json.loads(out)["checkpoint"]["id"] == "orders-5"

    code, out, _ = invoke("streams", "--url", encrypted, "--json", env=KEYS)
    assert code == 0 and all(s["unreadable"] == 0 for s in json.loads(out)["streams"])

    code, out, _ = invoke("verify", "--url", encrypted, "--json", env=KEYS)
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["problems"] == [] and report["records"] == 8


def test_info_shows_the_active_key_id_and_never_a_key(encrypted: str) -> None:
    code, out, _ = invoke("info", "--url", encrypted, "--json", env=KEYS)
    doc = json.loads(out)
    assert code == 0
    assert doc["encryption"] == {"enabled": True, "active_key": "k1", "encrypt_metadata": False}
    code, text, err = invoke("info", "--url", encrypted, env=KEYS)
    assert code == 0 and "on, active key 'k1'" in text
    for key in (B64_K0, B64_K1, K1.hex()):
        assert key not in out + text + err
    code, out, _ = invoke("info", "--url", encrypted, "--json")
    assert code == 0 and json.loads(out)["encryption"]["enabled"] is False
    code, text, _ = invoke("info", "--url", encrypted)
    assert "off (opened without keys)" in text


def test_an_empty_variable_means_no_keys(encrypted: str) -> None:
    code, out, _ = invoke("info", "--url", encrypted, "--json", env={"STATEKEEPER_KEYS": ""})
    assert code == 0 and json.loads(out)["encryption"]["enabled"] is False


def test_an_encryption_option_in_the_url_wins_over_the_variable(
    encrypted: str, tmp_path: Path
) -> None:
    keyfile = tmp_path / "keys"
    keyfile.write_text(f"k1:{B64_K1}\n")
    url = f"{encrypted}?encryption=keyfile:{keyfile}"
    # a variable with a key that does not open these records is not used
    code, out, _ = invoke(
        "latest", "orders", "--url", url, "--json", env={"STATEKEEPER_KEYS": f"k9:{B64_K0}"}
    )
    assert code == 0 and json.loads(out)["checkpoint"]["id"] == "orders-5"
    code, out, _ = invoke("info", "--url", url, "--json")
    assert json.loads(out)["encryption"]["active_key"] == "k1"


# -- without them, each command says what to do --------------------------------------------


def test_without_the_keys_every_command_says_to_set_them(encrypted: str) -> None:
    code, out, _ = invoke("ls", "--url", encrypted)
    assert code == 1 and "set STATEKEEPER_KEYS=" in flat(out)
    code, out, _ = invoke("ls", "--url", encrypted, "--json")
    page = json.loads(out)
    assert code == 1 and page["items"] == [] and len(page["skipped"]) == 8
    for args in (["show", "orders-1"], ["latest", "orders"]):
        code, out, err = invoke(*args, "--url", encrypted, "--json")
        error = json.loads(out)["error"]
        assert code == 1 and error["type"] == "CheckpointDecodeError", error
        assert "encrypted" in error["message"] and "set STATEKEEPER_KEYS=" in error["message"]
        assert "set STATEKEEPER_KEYS=" in flat(err)
    code, out, _ = invoke("verify", "--url", encrypted)
    assert code == 1 and "set STATEKEEPER_KEYS=" in flat(out)
    # headers are not encrypted (without encrypt_metadata): streams counts them
    code, out, _ = invoke("streams", "--url", encrypted, "--json")
    assert code == 0 and sum(s["checkpoints"] for s in json.loads(out)["streams"]) == 8


def test_a_plaintext_store_with_keys_set_says_rekey_or_unset(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    make(url, None)
    code, out, err = invoke("ls", "--url", url, "--json", env=KEYS)
    error = json.loads(out)["error"]
    assert code == 1 and error["type"] == "StoreFormatError"
    assert "holds plaintext records" in error["message"]
    assert f"rekey --url {url}" in error["message"] and "unset STATEKEEPER_KEYS" in error["message"]
    assert "holds plaintext records" in err  # on stderr too
    code, out, _ = invoke("ls", "--url", url, "--json")
    assert code == 0 and len(json.loads(out)["items"]) == 8


# -- verify's kinds -------------------------------------------------------------------


def test_verify_names_undecryptable_and_plaintext_records(encrypted: str, tmp_path: Path) -> None:
    # under k1, which the keys given do not hold: undecryptable, and what to do
    code, out, _ = invoke(
        "verify", "--url", encrypted, "--json", env={"STATEKEEPER_KEYS": f"k0:{B64_K0}"}
    )
    report = json.loads(out)
    assert code == 1 and {p["kind"] for p in report["problems"]} == {"undecryptable"}
    code, out, _ = invoke("verify", "--url", encrypted, env={"STATEKEEPER_KEYS": f"k0:{B64_K0}"})
    text = flat(out)
    assert "(cannot be decrypted)" in text and "add the key it names" in text
    assert "repair what can be rebuilt" not in text  # repair does not bring a key back

    # a plaintext record put back among the encrypted ones (its bytes from before
    # the store was encrypted)
    url = f"sqlite:///{tmp_path / 'was-plain.db'}"
    make(url, None)

    async def plant() -> None:
        async with statekeeper.open_store(url) as store:
            raw = await store.backdoor_read_raw("orders-2")
        await rekey_store(statekeeper.open_store(url, encryption=Keyring({"k1": K1}, active="k1")))
        async with statekeeper.open_store(url) as store:
            await store.backdoor_write_raw("orders-2", raw)

    asyncio.run(plant())
    code, out, _ = invoke("verify", "--url", url, "--json", env=KEYS)
    report = json.loads(out)
    kinds = [(p["kind"], p["id"]) for p in report["problems"]]
    assert code == 1 and ("plaintext", "orders-2") in kinds, kinds
    code, out, _ = invoke("verify", "--url", url, env=KEYS)
    text = flat(out)
    assert "(plaintext in an encrypted store)" in text and "or planted" in text


# -- copy -----------------------------------------------------------------------------


def _states(url: str, env: dict[str, str] | None) -> list[tuple[str, str, object]]:
    code, out, _ = invoke("ls", "--url", url, "--json", "--with-state", "--limit", "100", env=env)
    assert code == 0, out
    return [(i["id"], i["etag"], i["state"]) for i in json.loads(out)["items"]]


def test_copy_with_keys_encrypts_the_destination_and_round_trips(
    encrypted: str, tmp_path: Path
) -> None:
    expected = _states(encrypted, KEYS)
    # both sides get the keys: a new destination is encrypted, the safe default
    enc_copy = f"sqlite:///{tmp_path / 'copy.db'}"
    code, out, _ = invoke("copy", encrypted, enc_copy, "--json", env=KEYS)
    assert code == 0 and json.loads(out)["copied"] == 8
    assert raw_key_ids(enc_copy) == {"k1"} and _states(enc_copy, ONLY_K1) == expected

    # encrypted -> plaintext, on purpose
    plain = f"file://{tmp_path / 'plain'}"
    code, out, _ = invoke("copy", "--plaintext-dst", encrypted, plain, "--json", env=KEYS)
    assert code == 0 and json.loads(out)["copied"] == 8
    assert raw_key_ids(plain) == {None} and _states(plain, None) == expected

    # and back: plaintext -> encrypted
    back = f"sqlite:///{tmp_path / 'back.db'}"
    code, out, _ = invoke("copy", "--plaintext-src", plain, back, "--json", env=KEYS)
    assert code == 0 and json.loads(out)["copied"] == 8
    assert raw_key_ids(back) == {"k1"} and _states(back, ONLY_K1) == expected

    # without the flag a plaintext source is refused, saying which flag to use
    code, out, _ = invoke("copy", plain, f"sqlite:///{tmp_path / 'x.db'}", "--json", env=KEYS)
    error = json.loads(out)["error"]
    assert code == 1 and "(SRC)" in error["message"] and "--plaintext-src" in error["message"]
    # and a plaintext destination that already holds records
    code, out, _ = invoke("copy", encrypted, plain, "--json", env=KEYS)
    error = json.loads(out)["error"]
    assert code == 1 and "(DST)" in error["message"] and "--plaintext-dst" in error["message"]
    # without any keys an encrypted source copies nothing and says why
    code, out, _ = invoke("copy", encrypted, f"sqlite:///{tmp_path / 'y.db'}")
    assert code == 1 and "set STATEKEEPER_KEYS=" in flat(out)


# -- start-up -----------------------------------------------------------------------------

_RUN_AND_LIST = (
    "import sys\n"
    "out = sys.argv.pop(1)\n"
    "from statekeeper.cli.entry import main\n"
    "try:\n"
    "    main()\n"
    "except SystemExit:\n"
    "    pass\n"
    "import json; open(out, 'w').write(json.dumps(sorted(sys.modules)))\n"
)


def _modules(tmp_path: Path, env: dict[str, str] | None, *args: str) -> set[str]:
    listing = tmp_path / "modules.json"
    entry = [sys.executable, "-c", _RUN_AND_LIST, str(listing)]
    run_cli(*args, entry=entry, cwd=tmp_path, expect=None, env=env, unset=("STATEKEEPER_KEYS",))
    return {m.split(".")[0] for m in json.loads(listing.read_text())}


def test_the_cipher_is_imported_only_with_the_keys(encrypted: str, tmp_path: Path) -> None:
    assert "cryptography" not in _modules(tmp_path, None, "--help")
    plain = f"sqlite:///{tmp_path / 'plain.db'}"
    make(plain, None)
    assert "cryptography" not in _modules(tmp_path, None, "latest", "orders", "--url", plain)
    assert "cryptography" in _modules(tmp_path, KEYS, "latest", "orders", "--url", encrypted)


def test_the_demo_with_keys_set_writes_an_encrypted_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    # the killed child and the resuming parent both open the store with the keys
    doc = run_cli("demo", "--url", url, "--steps", "4", "--json", cwd=tmp_path, env=KEYS).json()
    assert doc["ok"] is True, doc
    assert raw_key_ids(url) == {"k1"}
    code, out, _ = invoke("verify", "--url", url)
    text = flat(out)
    assert code == 1 and "set STATEKEEPER_KEYS=" in text
    assert "repair what can be rebuilt" not in text  # repair cannot give it the keys
