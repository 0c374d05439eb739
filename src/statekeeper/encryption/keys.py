"""Keys: :class:`Keyring` (key ids to 32-byte keys, one of them active) and the
:class:`KeyProvider` protocol a plugin implements to fetch a keyring (from a KMS).

A key never appears in a repr, an error message or a log line: everything here
that describes a keyring names its key ids only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..errors import InvalidOptions

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["KEY_BYTES", "KeyProvider", "Keyring", "aesgcm"]

#: AES-256: every key is exactly 32 bytes.
KEY_BYTES = 32
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class Keyring:
    """Key ids mapped to 32-byte AES-256 keys, and the id of the active one.

    New records are sealed under ``active``; records under any key of the ring
    open (the others are *retired*: still readable, reported by ``verify`` and
    moved to the active key by ``statekeeper rekey``). A key id is 1 to 64 of
    ``A-Z a-z 0-9 . _ -``; it is written in every record's envelope, so keep an id
    for one key forever and never reuse it for another.

    ``repr`` and every error name the key ids only, never a key.
    """

    __slots__ = ("_active", "_ciphers", "_keys")

    def __init__(self, keys: Mapping[str, bytes], *, active: str) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise InvalidOptions(
                "a Keyring needs at least one key: Keyring({'k1': key}, active='k1')"
            )
        clean: dict[str, bytes] = {}
        for kid, key in keys.items():
            if not isinstance(kid, str) or not _KEY_ID.fullmatch(kid):
                raise InvalidOptions(f"key id {kid!r} is not 1-64 characters of A-Z a-z 0-9 . _ -")
            if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
                size = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
                raise InvalidOptions(f"key {kid!r} must be {KEY_BYTES} bytes (AES-256), got {size}")
            clean[kid] = bytes(key)
        if active not in clean:
            raise InvalidOptions(
                f"active key {active!r} is not in the keyring (its ids: {sorted(clean)})"
            )
        self._keys = clean
        self._active = active
        self._ciphers: dict[str, AESGCM] = {}

    @property
    def active(self) -> str:
        """The id of the key new records are sealed under."""
        return self._active

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id of the ring, sorted."""
        return tuple(sorted(self._keys))

    def rotated(self, key_id: str, key: bytes) -> Keyring:
        """A new keyring: this one with ``key`` added under ``key_id`` and made
        active, every key of this one kept, retired (its records still open).
        :class:`~statekeeper.errors.InvalidOptions` if ``key_id`` is in the ring."""
        if key_id in self._keys:
            raise InvalidOptions(f"key id {key_id!r} is already in the keyring")
        return Keyring({**self._keys, key_id: key}, active=key_id)

    def __contains__(self, kid: object) -> bool:
        return kid in self._keys

    def cipher(self, kid: str) -> AESGCM:
        """The AES-256-GCM cipher of key ``kid`` (built once); ``KeyError`` if unknown."""
        cipher = self._ciphers.get(kid)
        if cipher is None:
            cipher = self._ciphers[kid] = aesgcm()(self._keys[kid])
        return cipher

    def __repr__(self) -> str:
        return f"Keyring(key_ids={list(self.key_ids)!r}, active={self._active!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Keyring):
            return NotImplemented
        return self._active == other._active and self._keys == other._keys

    def __hash__(self) -> int:
        return hash((self._active, tuple(sorted(self._keys))))

    def __copy__(self) -> Keyring:
        return self  # immutable: a copy (of the options that hold it) shares it

    def __deepcopy__(self, memo: dict[int, object]) -> Keyring:
        return self

    def __reduce__(self) -> tuple[object, ...]:
        # pickling would write the keys wherever the pickle goes; refuse it
        raise TypeError("a Keyring is not picklable: it would carry its keys along")


def aesgcm() -> type[AESGCM]:
    """pyca/cryptography's AES-256-GCM, or :class:`~statekeeper.errors.InvalidOptions`
    saying how to install it (the ``encryption`` extra)."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise InvalidOptions(
            "encryption at rest needs the cryptography package, which is not installed: "
            "pip install 'statekeeper[encryption]'"
        ) from None
    return AESGCM


@runtime_checkable
class KeyProvider(Protocol):
    """Where a store's keys come from, for keys held elsewhere (a KMS, a vault).

    ``open_store(url, encryption=provider)`` calls :meth:`keyring` once, when the
    store is built. A plugin registers a factory under the entry-point group
    ``statekeeper.keys``: ``encryption="<name>"`` calls it with ``None``,
    ``encryption="<name>:<argument>"`` with the argument, and it returns a
    :class:`Keyring` or a :class:`KeyProvider`. Raise
    :class:`~statekeeper.errors.InvalidOptions` with a reason that names no key.
    """

    def keyring(self) -> Keyring:
        """The keyring the store seals and opens its records with (called once,
        when the store is built); raise :class:`~statekeeper.errors.InvalidOptions`,
        naming no key, when the keys cannot be had."""
        ...
