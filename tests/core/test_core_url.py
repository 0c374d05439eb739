from __future__ import annotations

import pytest

from statekeeper import StoreURL
from statekeeper.errors import InvalidURL


def test_parses_scheme_driver_credentials_host_port_path_and_query() -> None:
    url = StoreURL.parse("postgresql+asyncpg://alice:s3cr%40t@db.example:6543/app?pool_size=5")
    assert (url.scheme, url.driver, url.full_scheme) == (
        "postgresql",
        "asyncpg",
        "postgresql+asyncpg",
    )
    assert (url.username, url.password) == ("alice", "s3cr@t")
    assert (url.host, url.port, url.path) == ("db.example", 6543, "/app")
    assert dict(url.query) == {"pool_size": "5"}


def test_password_is_hidden_in_str_and_repr_but_available_to_render() -> None:
    url = StoreURL.parse("postgresql://alice:hunter2@h/db")
    assert "hunter2" not in str(url) and "hunter2" not in repr(url)
    assert "***" in str(url)
    assert "hunter2" in url.render(hide_password=False)


@pytest.mark.parametrize(
    "text",
    ["memory://", "file:///abs/dir", "file:rel/dir", "sqlite:///state.db", "sqlite:////abs/x.db"],
)
def test_round_trips_builtin_spellings(text: str) -> None:
    assert str(StoreURL.parse(text)) == text


def test_relative_file_url_has_no_authority() -> None:
    url = StoreURL.parse("file:rel/dir")
    assert not url.has_authority and url.path == "rel/dir"
    assert StoreURL.parse("file:///abs").has_authority


def test_is_immutable() -> None:
    url = StoreURL.parse("memory://")
    with pytest.raises(AttributeError):
        url.scheme = "file"  # type: ignore[misc]
    assert url.with_(query={"a": "1"}).query["a"] == "1"
    assert dict(url.query) == {}


@pytest.mark.parametrize(
    "bad", ["", "no-scheme", "://x", "1abc://x", "post gres://x", "pg://h:99999999/x", "a\x00b://"]
)
def test_rejects_what_is_not_a_url(bad: str) -> None:
    with pytest.raises(InvalidURL):
        StoreURL.parse(bad)


def test_duplicate_query_option_is_an_error() -> None:
    with pytest.raises(InvalidURL, match="twice"):
        StoreURL.parse("memory://?max_depth=3&max_depth=4")


def test_unparseable_url_error_hides_the_password() -> None:
    with pytest.raises(InvalidURL) as info:
        StoreURL.parse("pg://bob:topsecret@h:notaport/x")
    assert "topsecret" not in str(info.value)
