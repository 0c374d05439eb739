"""The envelope alone, for :mod:`skbench.encryption`: ``Sealer.seal`` and
``Sealer.open`` of each size's encoded state (with and without metadata inside) and
AES-256-GCM itself on the same bytes, timed in tight loops; and the same calls as
closures for the *in place* stores, which make one before each store call."""

from __future__ import annotations

import os
import time
import timeit
from collections.abc import Callable
from typing import Any

__all__ = ["measure_raw", "raw_calls"]

RAW_SAMPLES = 25


def _keyring() -> Any:
    import statekeeper as sk

    return sk.Keyring({"bench-1": os.urandom(32)}, active="bench-1")


def measure_raw(
    states: dict[str, Any], tags: dict[str, str], raw_seconds: float, results: Any
) -> None:
    """The envelope alone: :class:`Sealer` seal and open of each size's encoded state,
    with and without metadata inside, and AES-256-GCM encrypt and decrypt of the
    same bytes (the floor: the cipher, nothing of the envelope)."""
    import statekeeper as sk

    codec = sk.open_store("memory://").codec
    for label, state in states.items():
        for name, fn in raw_calls(codec.name, codec.encode(state), tags).items():
            number = max(1, round(raw_seconds / max(_once(fn), 1e-9)))
            samples = [
                t / number * 1e9 for t in timeit.repeat(fn, number=number, repeat=RAW_SAMPLES)
            ]
            results.raw.setdefault(name, {})[label] = samples


def raw_calls(codec: str, data: bytes, tags: dict[str, str]) -> dict[str, Callable[[], object]]:
    """The calls :func:`measure_raw` times on ``data``, each checked once."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from statekeeper.encryption.envelope import Sealer

    keyring = _keyring()
    sealer = Sealer(keyring, "store-0123456789abcdef", metadata=False)
    meta_sealer = Sealer(keyring, "store-0123456789abcdef", metadata=True)
    cipher = AESGCM(os.urandom(32))
    nonce, aad = os.urandom(12), b"a" * 80
    ident, stream = "0193f0c2a1b27c3d9e4f5a6b7c8d9e0f", "save-1KB"
    meta = {"step": 1, "source": "loop"}
    sealed_codec, envelope = sealer.seal(ident, stream, codec, data, tags, meta)
    meta_codec, meta_envelope = meta_sealer.seal(ident, stream, codec, data, tags, meta)
    if sealer.open(ident, stream, sealed_codec, envelope).state != data:
        raise AssertionError("the envelope did not open to its state")
    if meta_sealer.open(ident, stream, meta_codec, meta_envelope).metadata != meta:
        raise AssertionError("the envelope did not open to its metadata")
    ciphertext = cipher.encrypt(nonce, data, aad)
    return {
        "seal": lambda: sealer.seal(ident, stream, codec, data, tags, meta),
        "open": lambda: sealer.open(ident, stream, sealed_codec, envelope),
        "seal, metadata inside": lambda: meta_sealer.seal(ident, stream, codec, data, tags, meta),
        "open, metadata inside": lambda: meta_sealer.open(ident, stream, meta_codec, meta_envelope),
        "AES-256-GCM encrypt": lambda: cipher.encrypt(nonce, data, aad),
        "AES-256-GCM decrypt": lambda: cipher.decrypt(nonce, ciphertext, aad),
    }


def _once(fn: Any) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(10):
        fn()
    return (time.perf_counter() - t0) / 10
