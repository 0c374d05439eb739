"""Encryption at rest (S16), the keys: Keyring validation, the built-in key
providers (``env``, ``keyfile``), the resolution of ``encryption=``, and that no
error, repr or description ever spells a key (as bytes, base64 or hex)."""

from __future__ import annotations

import base64
import json
import os
import pickle
from pathlib import Path

import pytest

import statekeeper as sk
from statekeeper.encryption import ENV_VAR, KeyProvider, Keyring, parse_keys
from statekeeper.errors import InvalidOptions
from statekeeper.record import frame

K0 = bytes(range(32))
K1 = bytes(range(100, 132))
K2 = b"\xa5" * 16 + b"\x5a" * 16


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


def spellings(key: bytes) -> list[str]:
    """Every way a key could leak into text: base64 (with and without padding),
    hex (both cases), its bytes repr and its raw bytes as text."""
    encoded = b64(key)
    return [
        encoded,
        encoded.rstrip("="),
        key.hex(),
        key.hex().upper(),
        repr(key),
        repr(key)[2:-1],
        key.decode("latin-1"),
    ]


def assert_no_key(text: str, *keys: bytes) -> None:
    for key in keys:
        for spelling in spellings(key):
            assert spelling not in text, f"a key leaked into: {text!r}"


@pytest.fixture
def no_env_keys(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(ENV_VAR, raising=False)
    return monkeypatch


# -- Keyring --------------------------------------------------------------------------


def test_a_keyring_holds_its_ids_and_active_key() -> None:
    ring = Keyring({"k1": K1, "k0": K0}, active="k1")
    assert ring.active == "k1"
    assert ring.key_ids == ("k0", "k1")
    assert "k0" in ring and "k1" in ring and "k2" not in ring
    # the cipher is AES-256-GCM under that key: what it seals, it opens
    sealed = ring.cipher("k0").encrypt(b"\x00" * 12, b"hello", b"aad")
    assert ring.cipher("k0").decrypt(b"\x00" * 12, sealed, b"aad") == b"hello"
    assert ring.cipher("k0") is ring.cipher("k0")
    with pytest.raises(KeyError):
        ring.cipher("nope")


def test_an_empty_keyring_is_refused() -> None:
    with pytest.raises(InvalidOptions, match="at least one key"):
        Keyring({}, active="k1")


def test_a_keyring_of_a_non_mapping_is_refused() -> None:
    with pytest.raises(InvalidOptions, match="at least one key"):
        Keyring([("k1", K1)], active="k1")  # type: ignore[arg-type]


@pytest.mark.parametrize("kid", ["", "has space", "x" * 65, "é", "a/b", "k:1", "k,1"])
def test_a_bad_key_id_is_refused(kid: str) -> None:
    with pytest.raises(InvalidOptions, match="is not 1-64 characters") as info:
        Keyring({kid: K1}, active=kid)
    assert_no_key(str(info.value), K1)


def test_a_non_string_key_id_is_refused() -> None:
    with pytest.raises(InvalidOptions, match="is not 1-64 characters"):
        Keyring({1: K1}, active="1")  # type: ignore[dict-item]


def test_the_longest_key_id_and_every_allowed_character_work() -> None:
    kid = ("Az09._-" * 10)[:64]
    assert Keyring({kid: K1}, active=kid).active == kid


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64])
def test_a_key_of_the_wrong_length_is_refused_without_quoting_it(size: int) -> None:
    key = bytes(range(size)) if size <= 32 else K1 + bytes(range(size - 32))
    with pytest.raises(InvalidOptions, match=f"must be 32 bytes.*got {size}") as info:
        Keyring({"k1": key}, active="k1")
    if size:
        assert_no_key(str(info.value), key)
    assert "'k1'" in str(info.value)


def test_a_key_that_is_not_bytes_is_refused_without_quoting_it() -> None:
    text_key = b64(K1)
    with pytest.raises(InvalidOptions, match="got str") as info:
        Keyring({"k1": text_key}, active="k1")  # type: ignore[dict-item]
    assert_no_key(str(info.value), K1)
    assert text_key not in str(info.value)


def test_an_active_id_outside_the_ring_is_refused() -> None:
    with pytest.raises(InvalidOptions, match=r"active key 'k9' is not in the keyring") as info:
        Keyring({"k1": K1, "k0": K0}, active="k9")
    assert "['k0', 'k1']" in str(info.value)
    assert_no_key(str(info.value), K0, K1)


def test_a_bytearray_key_works_and_equals_the_bytes_key() -> None:
    mutable = bytearray(K1)
    ring = Keyring({"k1": mutable}, active="k1")  # type: ignore[dict-item]
    assert ring == Keyring({"k1": K1}, active="k1")
    mutable[0] ^= 0xFF  # the ring copied it: editing the caller's buffer changes nothing
    assert ring == Keyring({"k1": K1}, active="k1")


def test_repr_and_str_name_the_ids_only() -> None:
    ring = Keyring({"k1": K1, "k0": K0}, active="k1")
    assert repr(ring) == "Keyring(key_ids=['k0', 'k1'], active='k1')"
    assert_no_key(repr(ring), K0, K1)
    assert_no_key(str(ring), K0, K1)
    assert_no_key(f"{ring!r} {ring}", K0, K1)


def test_a_keyring_is_not_picklable() -> None:
    ring = Keyring({"k1": K1}, active="k1")
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(TypeError, match="not picklable") as info:
            pickle.dumps(ring, protocol=protocol)
        assert_no_key(str(info.value), K1)


def test_keyring_equality_and_hash() -> None:
    a = Keyring({"k1": K1, "k0": K0}, active="k1")
    same = Keyring({"k0": K0, "k1": K1}, active="k1")
    assert a == same and hash(a) == hash(same)
    assert a != Keyring({"k1": K1, "k0": K0}, active="k0")  # another active key
    assert a != Keyring({"k1": K1, "k0": K2}, active="k1")  # another key under an id
    assert a != Keyring({"k1": K1}, active="k1")  # fewer keys
    assert a != "Keyring(key_ids=['k0', 'k1'], active='k1')"
    assert a.__eq__(object()) is NotImplemented
    assert len({a, same}) == 1


def test_a_keyring_is_a_key_provider_of_nothing_but_a_class_with_keyring_is() -> None:
    class Vault:
        def keyring(self) -> Keyring:
            return Keyring({"k1": K1}, active="k1")

    assert isinstance(Vault(), KeyProvider)
    assert not isinstance(object(), KeyProvider)


# -- parse_keys and encryption="env" ----------------------------------------------------


def test_parse_keys_makes_the_first_key_active() -> None:
    ring = parse_keys(f"k2:{b64(K2)},k1:{b64(K1)},k0:{b64(K0)}", "test")
    assert ring == Keyring({"k2": K2, "k1": K1, "k0": K0}, active="k2")
    assert parse_keys(f"k0:{b64(K0)},k2:{b64(K2)}", "test").active == "k0"


def test_parse_keys_ignores_whitespace_and_empty_entries() -> None:
    text = f"  k1 :  {b64(K1)} ,\n\t k0:{b64(K0)}\n,, "
    assert parse_keys(text, "test") == Keyring({"k1": K1, "k0": K0}, active="k1")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no keys"),
        (" , ,\n", "holds no keys"),
        (b64(K1), "entry 1 is not 'id:base64key'"),
        (f"k1:{b64(K1)},{b64(K0)}", "entry 2 is not 'id:base64key'"),
        (f":{b64(K1)}", "entry 1 is not 'id:base64key'"),
        (f"k1:{b64(K1)},k1:{b64(K0)}", "key id 'k1' appears twice"),
        (f"k1:{b64(K1)[:-2]}!!", "the key of 'k1' is not valid base64"),
        (f"k1:{b64(K1)[:-1]}", "the key of 'k1' is not valid base64"),
        (f"k1:{b64(K1)[:20]}", "not valid base64|must be 32 bytes"),
        (f"k1:{b64(K1[:31])}", "key 'k1' must be 32 bytes.*got 31"),
        (f"k1:{b64(K1 + K0)}", "key 'k1' must be 32 bytes.*got 64"),
        (f"bad id:{b64(K1)}", "is not 1-64 characters"),
    ],
)
def test_parse_keys_errors_say_why_and_never_quote_a_key(text: str, message: str) -> None:
    with pytest.raises(InvalidOptions, match=message) as info:
        parse_keys(text, "SOURCE_NAME")
    error = str(info.value)
    assert_no_key(error, K0, K1, K1[:31], K1 + K0)
    for fragment in (b64(K1)[:20], b64(K1[:31]), b64(K1 + K0)[:20]):
        assert fragment not in error


def test_parse_keys_names_its_source() -> None:
    with pytest.raises(InvalidOptions, match=r"^SOURCE_NAME: key id 'k1' appears twice"):
        parse_keys(f"k1:{b64(K1)},k1:{b64(K1)}", "SOURCE_NAME")
    # the Keyring's own refusals (length, id) name the source too (a regression)
    with pytest.raises(InvalidOptions, match=r"^SOURCE_NAME: key 'k1' must be 32 bytes"):
        parse_keys(f"k1:{b64(K1[:31])}", "SOURCE_NAME")
    with pytest.raises(InvalidOptions, match=r"^SOURCE_NAME: key id 'a b' is not 1-64"):
        parse_keys(f"a b:{b64(K1)}", "SOURCE_NAME")


def test_env_reads_statekeeper_keys_first_active(no_env_keys: pytest.MonkeyPatch) -> None:
    no_env_keys.setenv(ENV_VAR, f" k1:{b64(K1)} , k0:{b64(K0)} ")
    store = sk.open_store("memory://", encryption="env")
    assert store._encryption is not None
    assert store._encryption.keyring == Keyring({"k1": K1, "k0": K0}, active="k1")
    assert store._encryption.metadata is False


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "holds no keys"),
        ("k1", "entry 1 is not"),
        (f"k1:{b64(K1)},k1:{b64(K0)}", "appears twice"),
        (f"k1:{b64(K1)}$", "not valid base64"),
        (f"k1:{b64(K1[:16])}", "must be 32 bytes"),
    ],
)
def test_env_errors_name_the_variable_and_no_key(
    no_env_keys: pytest.MonkeyPatch, value: str, message: str
) -> None:
    no_env_keys.setenv(ENV_VAR, value)
    with pytest.raises(InvalidOptions, match=message) as info:
        sk.open_store("memory://", encryption="env")
    assert ENV_VAR in str(info.value)
    assert_no_key(str(info.value), K0, K1, K1[:16])


def test_env_with_the_variable_unset_says_so(no_env_keys: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidOptions, match=f"reads {ENV_VAR}, which is not set"):
        sk.open_store("memory://", encryption="env")


def test_env_names_another_variable(no_env_keys: pytest.MonkeyPatch) -> None:
    no_env_keys.setenv("OTHER_KEYS_VAR", f"other:{b64(K2)}")
    store = sk.open_store("memory://", encryption="env:OTHER_KEYS_VAR")
    assert store._encryption is not None
    assert store._encryption.keyring == Keyring({"other": K2}, active="other")
    with pytest.raises(InvalidOptions, match="reads MISSING_KEYS_VAR, which is not set"):
        sk.open_store("memory://", encryption="env:MISSING_KEYS_VAR")


def test_keyfile_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"k1:{b64(K1)},\nk0:{b64(K0)}\n", encoding="utf-8")
    store = sk.open_store("memory://", encryption=f"keyfile:{path}")
    assert store._encryption is not None
    assert store._encryption.keyring == Keyring({"k1": K1, "k0": K0}, active="k1")


def test_keyfile_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(InvalidOptions, match=f"cannot read the key file {missing}"):
        sk.open_store("memory://", encryption=f"keyfile:{missing}")
    with pytest.raises(InvalidOptions, match="needs the path of the key file"):
        sk.open_store("memory://", encryption="keyfile")
    bad = tmp_path / "bad"
    bad.write_text(f"k1:{b64(K1[:31])}", encoding="utf-8")
    with pytest.raises(InvalidOptions, match=f"key file {bad}.*must be 32 bytes") as info:
        sk.open_store("memory://", encryption=f"keyfile:{bad}")
    assert_no_key(str(info.value), K1[:31])


def test_an_unknown_provider_lists_the_installed_ones() -> None:
    with pytest.raises(InvalidOptions, match="no key provider 'vault-of-nothing'") as info:
        sk.open_store("memory://", encryption="vault-of-nothing:arg")
    assert "env" in str(info.value) and "keyfile" in str(info.value)
    assert "statekeeper.keys" in str(info.value)


def test_a_key_provider_instance_gives_the_keyring() -> None:
    calls: list[int] = []

    class Vault:
        def keyring(self) -> Keyring:
            calls.append(1)
            return Keyring({"vault": K2}, active="vault")

    store = sk.open_store("memory://", encryption=Vault())
    assert store._encryption is not None
    assert store._encryption.keyring.active == "vault"
    assert calls == [1]  # called once, when the store is built


def test_a_key_provider_that_returns_no_keyring_is_refused() -> None:
    class Broken:
        def keyring(self) -> Keyring:
            return "k1:" + b64(K1)  # type: ignore[return-value]

    with pytest.raises(InvalidOptions, match="returned str, not a Keyring") as info:
        sk.open_store("memory://", encryption=Broken())
    assert_no_key(str(info.value), K1)


def test_a_key_provider_may_return_a_key_provider() -> None:
    class Inner:
        def keyring(self) -> Keyring:
            return Keyring({"deep": K0}, active="deep")

    class Outer:
        def keyring(self) -> Keyring:
            return Inner()  # type: ignore[return-value]

    store = sk.open_store("memory://", encryption=Outer())
    assert store._encryption is not None and store._encryption.keyring.active == "deep"


def test_encrypt_metadata_without_encryption_is_refused() -> None:
    with pytest.raises(InvalidOptions, match="encrypt_metadata=True needs encryption="):
        sk.open_store("memory://", encrypt_metadata=True)
    with pytest.raises(InvalidOptions, match="encrypt_metadata=True needs encryption="):
        sk.open_store("memory://?encrypt_metadata=true")


@pytest.mark.parametrize("value", [42, K1, b64(K1).encode(), {"k1": K1}, ["env"], 1.5])
def test_a_bad_type_for_encryption_is_refused(value: object) -> None:
    with pytest.raises(InvalidOptions, match="encryption must be a Keyring") as info:
        sk.open_store("memory://", encryption=value)
    assert_no_key(str(info.value), K1)


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_provider_name_is_refused(value: str) -> None:
    with pytest.raises(InvalidOptions, match="encryption must be a Keyring"):
        sk.open_store("memory://", encryption=value)


@pytest.mark.parametrize(
    "url",
    [
        "memory://?encryption=env",
        "sqlite:///{tmp}/x.db?encryption=env",
        "sqlite:///{tmp}/y.db?encryption=env&encrypt_metadata=true",
        "file:///{tmp}/dir?encryption=env&encrypt_metadata=1",
    ],
)
@pytest.mark.asyncio
async def test_options_in_the_url_query_work(
    no_env_keys: pytest.MonkeyPatch, tmp_path: Path, url: str
) -> None:
    no_env_keys.setenv(ENV_VAR, f"k1:{b64(K1)}")
    store = sk.open_store(url.format(tmp=tmp_path))
    assert store._encryption is not None
    assert store._encryption.keyring == Keyring({"k1": K1}, active="k1")
    assert store._encryption.metadata is ("encrypt_metadata" in url)
    async with store:
        cp = await store.save("s", {"secret": "MARKER-URL"}, tags={"t": "TAGVALUE"})
        raw = await store.backdoor_read_raw(cp.id)
        assert (await store.load(cp.id)).state == {"secret": "MARKER-URL"}
    assert b"MARKER-URL" not in raw
    head, _ = frame.split(raw)
    assert json.loads(head)["codec"] == "aes256gcm:" + store.codec.name
    assert (b"TAGVALUE" in raw) is ("encrypt_metadata" not in url)


@pytest.mark.asyncio
async def test_a_store_describes_itself_without_its_keys(
    no_env_keys: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_env_keys.setenv(ENV_VAR, f"k1:{b64(K1)},k0:{b64(K0)}")
    stores = [
        sk.open_store(f"sqlite:///{tmp_path}/a.db?encryption=env"),
        sk.open_store(f"file:///{tmp_path}/b", encryption="env", encrypt_metadata=True),
        sk.open_store("memory://", encryption=Keyring({"k1": K1, "k0": K0}, active="k1")),
        sk.open_store("memory://", encryption=f"env:{ENV_VAR}"),
    ]
    for store in stores:
        texts = [repr(store), str(store), store.describe(), repr(store.options)]
        texts.append(str(store.options))
        async with store:
            texts += [repr(store), store.describe(), repr(await store.info())]
            texts.append(repr(await store.verify()))
        for text in texts:
            assert_no_key(text, K0, K1)


def test_rotated_adds_an_active_key_and_keeps_the_others_retired() -> None:
    old, new = os.urandom(32), os.urandom(32)
    ring = Keyring({"k0": old}, active="k0")
    rotated = ring.rotated("k1", new)
    assert rotated == Keyring({"k0": old, "k1": new}, active="k1")
    assert ring == Keyring({"k0": old}, active="k0")  # a new ring; this one unchanged
    with pytest.raises(InvalidOptions, match="'k0' is already in the keyring"):
        rotated.rotated("k0", os.urandom(32))
    with pytest.raises(InvalidOptions, match="must be 32 bytes"):
        ring.rotated("k2", b"short")
