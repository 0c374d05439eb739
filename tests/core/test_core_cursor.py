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


def test_fingerprints_and_cursors_keep_their_bytes() -> None:
    """Cursors a user stored must stay valid across releases: the fingerprint's
    canonical JSON, its digest, and the cursor's layout and MAC are pinned here
    (computed before the fingerprint cache and the one-shot HMAC, which must not
    change a byte). The cache gives the same digest on a second call."""
    pinned = [
        (("s", "asc", None), "4f4ed1b6d813f1a84e1458dbc4474ac655765c2973be5862db34a6d92be85d66"),
        (
            ("s/ü", "desc", {"b": "2", "a": "1"}),
            "52c0755ed21a4279d0d438659323eb325b4786046cf204e99841ff340b8d7386",
        ),
        (
            ("x", "desc", {"k": "v"}, {"n": 1, "f": -0.0, "t": True}),
            "98e781dcaa46b822755cdbf32eea46eb5e8bfa6c5ec3e1fb600bac1bf27e1f28",
        ),
    ]
    for args, digest in pinned:
        for _ in range(2):  # the second from the cache, where there is one
            assert query_fingerprint(*args).hex() == digest  # type: ignore[arg-type]
    # 0.0 and -0.0 are equal keys but different filters: never the same digest
    assert query_fingerprint("x", "asc", None, {"f": 0.0}) != query_fingerprint(
        "x", "asc", None, {"f": -0.0}
    )
    signer = CursorSigner(b"k" * 32)
    fingerprint = query_fingerprint("s", "asc", None)
    assert signer.make(42, fingerprint) == "AQAAAAAAAAAqMpP7Rlbih7bq73T6"
    assert signer.position("AQAAAAAAAAAqMpP7Rlbih7bq73T6", fingerprint) == 42
