"""Run the conformance kit encrypted (SPEC S16): options with a fresh test keyring.

Encryption lives in the core, so a backend gets it for free, and the kit proves it:
name an encrypted option set, and every kit test (the state machine too) runs once
plaintext and once encrypted::

    from statekeeper.testing import CheckpointStoreTests, encrypted_options

    class TestMyStoreConformance(CheckpointStoreTests):
        option_sets = {"plain": {}, "encrypted": encrypted_options()}

        @pytest.fixture
        def store_factory(self, tmp_path):
            return lambda **options: MyCheckpointStore(tmp_path / "store", **options)

The kit's encryption tests (``test_encrypted_*``) skip in a plaintext set and run
in an encrypted one: no plaintext state in the stored bytes (with
``capabilities.raw_access``), a tampered, moved or planted plaintext record
refused by every read (and ``get_latest`` never falls back), an unknown key
refused, and everything readable again after a reopen and a key rotation.
``encrypted_options(metadata=True)`` seals tags and metadata too
(``encrypt_metadata=True``): the kit's tests that filter on tags or metadata then
check that such filters raise :class:`~statekeeper.errors.InvalidQuery` instead.

The keys are random (``os.urandom``), made when the options are built, and live in
this process only. Nothing here imports pytest or the kit.
"""

from __future__ import annotations

import os
from typing import Any

from ..encryption.keys import KEY_BYTES, Keyring

__all__ = ["KIT_KEY_ID", "encrypted_options", "kit_keyring", "rotated_keyring"]

#: The key id of the kit's test keyrings.
KIT_KEY_ID = "kit-k1"


def kit_keyring(key_id: str = KIT_KEY_ID) -> Keyring:
    """A new keyring of one random 32-byte key, ``key_id``, active."""
    return Keyring({key_id: os.urandom(KEY_BYTES)}, active=key_id)


def rotated_keyring(keyring: Keyring, new_key_id: str) -> Keyring:
    """``keyring`` with one more random key, ``new_key_id``, made active: every key
    of ``keyring`` stays, retired (its records still open). Raises
    :class:`~statekeeper.errors.InvalidOptions` (a ``ValueError``) if the id is taken."""
    return keyring.rotated(new_key_id, os.urandom(KEY_BYTES))


def encrypted_options(*, metadata: bool = False, keyring: Keyring | None = None) -> dict[str, Any]:
    """Store options that encrypt: ``{"encryption": keyring}`` (a fresh
    :func:`kit_keyring` unless given), plus ``"encrypt_metadata": True`` with
    ``metadata=True``. Pass it as one of the kit's ``option_sets``."""
    options: dict[str, Any] = {"encryption": kit_keyring() if keyring is None else keyring}
    if metadata:
        options["encrypt_metadata"] = True
    return options
