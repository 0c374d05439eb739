"""The sealed state of an encrypted record: AES-256-GCM, bound to its checkpoint.

A record of an encrypted store names the codec ``aes256gcm:<inner codec>`` in its
header, and its state bytes are this envelope::

    b"SKE1" | alg (1 byte, 1 = AES-256-GCM) | flags (1 byte) | key id length (1 byte)
    | key id (ASCII) | nonce (12 bytes, fresh from os.urandom per write)
    | ciphertext and 16-byte tag

Flag 1 (*metadata inside*): the plaintext is ``len (4 bytes, big-endian) | JSON
[tags, metadata] | state`` and the header's own tags and metadata are empty.

The associated data, authenticated but not stored, is::

    b"statekeeper/aead/1" NUL store id NUL checkpoint id NUL stream NUL inner codec
    NUL the envelope's bytes before the nonce

so a ciphertext copied to another store, another id or another stream, or under an
edited flag, algorithm or key id, fails its tag; so does a flipped byte. The envelope
sits inside the record frame, under its checksum, like any state.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import msgspec

from .keys import Keyring

__all__ = [
    "SEALED_PREFIX",
    "Opened",
    "Refused",
    "Sealer",
    "inner_codec",
    "key_id_of",
]

#: The codec names of sealed records start with this.
SEALED_PREFIX = "aes256gcm:"
_MAGIC = b"SKE1"
_ALG = 1
_FLAG_META = 1
_NONCE = 12
_TAG = 16
_AAD_HEAD = b"statekeeper/aead/1\x00"
_encode_json = msgspec.json.Encoder().encode
_decode_meta = msgspec.json.Decoder(tuple[dict[str, str], dict[str, Any]]).decode
_urandom = os.urandom


class Refused(Exception):
    """Why a sealed state does not open: ``kind`` is ``"plaintext"`` (not sealed),
    ``"unknown-key"`` or ``"undecryptable"`` (malformed, or its tag fails)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Opened:
    """A state opened: its inner codec and bytes, and the tags and metadata the
    envelope carried (``None`` when they are in the header)."""

    codec: str
    state: bytes
    key_id: str
    tags: dict[str, str] | None = None
    metadata: dict[str, Any] | None = None


def inner_codec(codec: str) -> str | None:
    """The codec inside a sealed record's codec name; ``None`` for a plaintext one."""
    return codec[len(SEALED_PREFIX) :] if codec.startswith(SEALED_PREFIX) else None


def key_id_of(codec: str, state: bytes) -> str | None:
    """The key id a record's envelope names (``None``: not sealed, or no envelope
    to read one from); nothing is decrypted."""
    head = _head(state) if codec.startswith(SEALED_PREFIX) else None
    return None if head is None else head[2]


def _head(envelope: bytes) -> tuple[int, int, str, int] | None:
    """``(algorithm, flags, key id, where the nonce starts)`` of ``envelope``, read
    from its bytes before the nonce; ``None`` where those are not all there."""
    if len(envelope) < 7 or not envelope.startswith(_MAGIC):
        return None
    end = 7 + envelope[6]
    if len(envelope) < end:
        return None
    return envelope[4], envelope[5], envelope[7:end].decode("ascii", "replace"), end


class Sealer:
    """Seals and opens the states of one store (its id is in every tag)."""

    __slots__ = ("_aad", "_keyring", "_metadata", "_prefix")

    def __init__(self, keyring: Keyring, store_id: str, *, metadata: bool) -> None:
        self._keyring = keyring
        self._metadata = metadata
        self._aad = _AAD_HEAD + store_id.encode("ascii") + b"\x00"
        kid = keyring.active.encode("ascii")
        self._prefix = _MAGIC + bytes((_ALG, _FLAG_META if metadata else 0, len(kid))) + kid

    @property
    def keyring(self) -> Keyring:
        return self._keyring

    @property
    def seals_metadata(self) -> bool:
        """Whether new records carry their tags and metadata inside the envelope."""
        return self._metadata

    @staticmethod
    def carries_metadata(envelope: bytes) -> bool:
        """Whether ``envelope`` carries its record's tags and metadata (its flag;
        the tag authenticates the flag when the envelope is opened)."""
        return len(envelope) > 5 and envelope.startswith(_MAGIC) and bool(envelope[5] & _FLAG_META)

    def seal(
        self,
        id: str,
        stream: str,
        codec: str,
        state: bytes,
        tags: dict[str, str],
        metadata: dict[str, Any],
    ) -> tuple[str, bytes]:
        """``(sealed codec name, envelope)`` of ``state`` (in ``codec``) for checkpoint
        ``id`` of ``stream``, under the active key and a fresh nonce. With
        ``encrypt_metadata`` the envelope also carries ``tags`` and ``metadata``."""
        prefix = self._prefix
        if self._metadata:
            meta = _encode_json((tags, metadata))
            state = struct.pack(">I", len(meta)) + meta + state
        nonce = _urandom(_NONCE)
        aad = self._bind(id, stream, codec, prefix)
        sealed = self._keyring.cipher(self._keyring.active).encrypt(nonce, state, aad)
        return SEALED_PREFIX + codec, prefix + nonce + sealed

    def open(self, id: str, stream: str, codec: str, envelope: bytes) -> Opened:
        """The state sealed in ``envelope`` for checkpoint ``id`` of ``stream``, or
        :class:`Refused` saying why not."""
        inner = inner_codec(codec)
        if inner is None:
            raise Refused(
                "plaintext",
                "record is not encrypted (plaintext in a store opened with encryption); "
                "it is never read as data: run 'statekeeper rekey' to encrypt a store "
                "that was plaintext, or delete the record if you did not write it",
            )
        if len(envelope) < 7 or not envelope.startswith(_MAGIC):
            raise Refused("undecryptable", "malformed encryption envelope")
        if envelope[4] != _ALG:
            raise Refused(
                "undecryptable", f"unknown encryption algorithm {envelope[4]} in the envelope"
            )
        head = _head(envelope)
        if head is None or len(envelope) < head[3] + _NONCE + _TAG:
            raise Refused("undecryptable", "truncated encryption envelope")
        _, flags, kid, head_end = head
        if kid not in self._keyring:
            raise Refused(
                "unknown-key",
                f"record is encrypted under key id {kid!r}, which is not in this store's "
                f"keyring (its ids: {list(self._keyring.key_ids)})",
            )
        nonce = envelope[head_end : head_end + _NONCE]
        aad = self._bind(id, stream, inner, envelope[:head_end])
        try:
            plain = self._keyring.cipher(kid).decrypt(nonce, envelope[head_end + _NONCE :], aad)
        except Exception:  # cryptography's InvalidTag: the only failure of decrypt
            raise Refused(
                "undecryptable",
                f"decryption under key {kid!r} failed: the ciphertext was altered, or was "
                "moved here from another checkpoint, stream or store",
            ) from None
        if not flags & _FLAG_META:
            return Opened(inner, plain, kid)
        (size,) = struct.unpack_from(">I", plain)
        tags, metadata = _decode_meta(plain[4 : 4 + size])
        return Opened(inner, plain[4 + size :], kid, tags, metadata)

    def _bind(self, id: str, stream: str, codec: str, prefix: bytes) -> bytes:
        return b"".join(
            (
                self._aad,
                id.encode("ascii"),
                b"\x00",
                stream.encode("utf-8", "surrogatepass"),
                b"\x00",
                codec.encode("utf-8"),
                b"\x00",
                prefix,
            )
        )
