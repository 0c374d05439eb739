from __future__ import annotations

import base64

import pytest

from statekeeper.cursor import CursorSigner, query_fingerprint
from statekeeper.errors import InvalidCursor, InvalidQuery

KEY = b"k" * 32
FP = query_fingerprint("s", "desc", {"a": "1"})


def test_round_trip_and_url_safe() -> None:
    signer = CursorSigner(KEY)
    token = signer.make(123456789, FP)
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert signer.position(token, FP) == 123456789


def test_invalid_cursor_is_a_value_error_and_an_invalid_query() -> None:
    assert issubclass(InvalidCursor, InvalidQuery) and issubclass(InvalidCursor, ValueError)


@pytest.mark.parametrize(
    "fp",
    [
        query_fingerprint("other", "desc", {"a": "1"}),
        query_fingerprint("s", "asc", {"a": "1"}),
        query_fingerprint("s", "desc", {}),
        query_fingerprint(None, "desc", {"a": "1"}),
    ],
)
def test_cursor_is_bound_to_the_query(fp: bytes) -> None:
    token = CursorSigner(KEY).make(5, FP)
    with pytest.raises(InvalidCursor, match="this query"):
        CursorSigner(KEY).position(token, fp)


def test_foreign_store_cursor_is_refused() -> None:
    token = CursorSigner(b"x" * 32).make(5, FP)
    with pytest.raises(InvalidCursor):
        CursorSigner(KEY).position(token, FP)


def test_forged_position_is_refused() -> None:
    signer = CursorSigner(KEY)
    raw = bytearray(base64.urlsafe_b64decode(signer.make(5, FP) + "=="))
    raw[8] ^= 0x01  # change the position, keep the MAC
    forged = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    with pytest.raises(InvalidCursor):
        signer.position(forged, FP)


@pytest.mark.parametrize("junk", ["", "!!!", "a" * 100, 12, None, "AAAA", "é"])
def test_junk_is_refused(junk: object) -> None:
    with pytest.raises(InvalidCursor):
        CursorSigner(KEY).position(junk, FP)


def test_tag_order_does_not_change_the_fingerprint() -> None:
    assert query_fingerprint("s", "asc", {"a": "1", "b": "2"}) == query_fingerprint(
        "s", "asc", {"b": "2", "a": "1"}
    )
