"""Without the ``encryption`` extra, asking for encryption says how to install it.

Regression: a store built with ``encryption=`` where ``cryptography`` is not
installed raised a bare ``ModuleNotFoundError`` at its first save, after it had
opened, instead of refusing the option when the store was built.
"""

from __future__ import annotations

import os
import sys

import pytest

import statekeeper as sk
from statekeeper.errors import InvalidOptions

RING = sk.Keyring({"k": os.urandom(32)}, active="k")


@pytest.fixture
def no_cryptography(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``cryptography`` unimportable, as where the extra is not installed (a
    ``None`` entry in ``sys.modules`` makes its import raise ImportError)."""
    for name in list(sys.modules):
        if name == "cryptography" or name.startswith("cryptography."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cryptography", None)


@pytest.mark.usefixtures("no_cryptography")
@pytest.mark.parametrize("url", ["memory://", "sqlite:///never-created.db"])
def test_encryption_without_the_extra_is_refused_when_the_store_is_built(url: str) -> None:
    with pytest.raises(InvalidOptions, match=r"pip install 'statekeeper\[encryption\]'"):
        sk.open_store(url, encryption=RING)


@pytest.mark.usefixtures("no_cryptography")
def test_a_plaintext_store_needs_no_cryptography() -> None:
    store = sk.open_store("memory://")
    assert store.options.encryption is None
