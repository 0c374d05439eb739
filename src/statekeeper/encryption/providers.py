"""The built-in key providers (entry-point group ``statekeeper.keys``) and the
resolution of a store's ``encryption=`` option to a :class:`~.keys.Keyring`.

- ``encryption="env"`` reads ``STATEKEEPER_KEYS``: ``id:base64key`` pairs separated
  by commas, the first one active (``k2:...,k1:...``).
- ``encryption="keyfile:/path"`` reads the same format from a file (a mounted
  secret), so the keys stay out of the process environment.
- ``encryption="<name>[:<argument>]"`` calls the factory a plugin registers under
  ``statekeeper.keys`` with the argument (or ``None``).
"""

from __future__ import annotations

import base64
import binascii
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from ..errors import InvalidOptions
from .keys import KeyProvider, Keyring

__all__ = ["ENV_VAR", "env_keys", "keyfile_keys", "parse_keys", "resolve_keyring"]

#: The environment variable ``encryption="env"`` reads.
ENV_VAR = "STATEKEEPER_KEYS"
_GROUP = "statekeeper.keys"


def parse_keys(text: str, source: str) -> Keyring:
    """The keyring of ``id:base64key,id:base64key`` (the first active); ``source``
    names where the text came from in errors, which never quote a key."""
    pairs = [part.strip() for part in text.split(",") if part.strip()]
    if not pairs:
        raise InvalidOptions(f"{source} holds no keys; expected 'id:base64key[,id:base64key...]'")
    keys: dict[str, bytes] = {}
    for n, pair in enumerate(pairs, 1):
        kid, sep, encoded = pair.partition(":")
        kid = kid.strip()
        if not sep or not kid:
            raise InvalidOptions(f"{source}: entry {n} is not 'id:base64key'")
        if kid in keys:
            raise InvalidOptions(f"{source}: key id {kid!r} appears twice")
        try:
            keys[kid] = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidOptions(f"{source}: the key of {kid!r} is not valid base64") from None
    try:
        return Keyring(keys, active=next(iter(keys)))
    except InvalidOptions as exc:  # a bad id or key length: say where it came from
        raise InvalidOptions(f"{source}: {exc}") from None


def env_keys(argument: str | None = None) -> Keyring:
    """``encryption="env"``: the keyring in ``STATEKEEPER_KEYS`` (or in the variable
    named by the argument, ``env:MY_KEYS``)."""
    name = argument or ENV_VAR
    text = os.environ.get(name)
    if text is None:
        raise InvalidOptions(
            f"encryption='env' reads {name}, which is not set "
            "(format: 'id:base64key[,id:base64key...]', the first key active)"
        )
    return parse_keys(text, name)


def keyfile_keys(argument: str | None = None) -> Keyring:
    """``encryption="keyfile:/path"``: the keyring in that file (the ``env`` format)."""
    if not argument:
        raise InvalidOptions("encryption='keyfile:<path>' needs the path of the key file")
    try:
        text = Path(argument).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidOptions(f"cannot read the key file {argument}: {exc.strerror}") from None
    return parse_keys(text, f"key file {argument}")


def resolve_keyring(option: Any) -> Keyring:
    """The keyring an ``encryption=`` option names: a :class:`Keyring`, a
    :class:`KeyProvider`, or ``"<provider>[:<argument>]"`` looked up in the
    ``statekeeper.keys`` entry points (``env`` and ``keyfile`` are built in)."""
    if isinstance(option, Keyring):
        return option
    if isinstance(option, KeyProvider):
        return _keyring_of(option.keyring(), "the key provider")
    if not isinstance(option, str) or not option.strip():
        raise InvalidOptions(
            "encryption must be a Keyring, a KeyProvider, or a provider name such as 'env'"
        )
    name, _, argument = option.strip().partition(":")
    found = [ep for ep in entry_points(group=_GROUP) if ep.name == name]
    if not found:
        known = sorted({ep.name for ep in entry_points(group=_GROUP)})
        raise InvalidOptions(
            f"no key provider {name!r} (installed under {_GROUP!r}: {', '.join(known) or 'none'})"
        )
    factory = found[0].load()
    return _keyring_of(factory(argument or None), f"key provider {name!r}")


def _keyring_of(value: Any, what: str) -> Keyring:
    if isinstance(value, Keyring):
        return value
    if isinstance(value, KeyProvider):
        return _keyring_of(value.keyring(), what)
    raise InvalidOptions(f"{what} returned {type(value).__name__}, not a Keyring")
