"""Encryption at rest (SPEC S16): AES-256-GCM for every backend, in the core.

``open_store(url, encryption=sk.Keyring({"k1": key}, active="k1"))`` (or
``encryption="env"``, which reads ``STATEKEEPER_KEYS``) seals every state a store
writes, bound to the store id, the checkpoint id and the stream, under a fresh
nonce; ``encrypt_metadata=True`` seals tags and metadata too. The store refuses a
record that is plaintext or does not open, and never reads it as data. See
``docs/encryption.md`` for the threat model, keys and rotation.

Modules
=======

- ``keys``: :class:`Keyring` and the :class:`KeyProvider` protocol.
- ``providers``: the built-in key providers (``env``, ``keyfile``) and the
  resolution of ``encryption=`` through the ``statekeeper.keys`` entry points.
- ``envelope``: the sealed state's bytes, its associated data, and
  :class:`~statekeeper.encryption.envelope.Sealer`, which seals and opens them.

The store side lives in ``statekeeper._core.sealing`` (the sealed primitives) and
``statekeeper._core.rekey`` (rotation and migration).
"""

from __future__ import annotations

from .keys import KeyProvider, Keyring
from .providers import ENV_VAR, parse_keys

__all__ = ["ENV_VAR", "KeyProvider", "Keyring", "parse_keys"]
