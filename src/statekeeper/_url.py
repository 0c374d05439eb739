"""Store URLs: ``scheme[+driver]://[user[:password]@]host[:port]/path?option=value``.

Also ``file:relative/dir`` (no authority) and ``sqlite:///relative.db`` /
``sqlite:////abs.db`` in SQLAlchemy's spelling. A ``StoreURL`` is immutable and
never prints its password.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from .errors import InvalidOptions, InvalidURL

__all__ = ["StoreURL"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9.\-]*(\+[A-Za-z][A-Za-z0-9_.\-]*)?$")


@dataclass(frozen=True, repr=False)
class StoreURL:
    """A parsed, immutable store URL.

    ``str(url)`` and ``repr(url)`` hide the password as ``***``; use
    :meth:`render` with ``hide_password=False`` when a driver needs the real one.
    """

    scheme: str
    driver: str | None = None
    username: str | None = None
    password: str | None = field(default=None, compare=True)
    host: str | None = None
    port: int | None = None
    path: str = ""
    query: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    has_authority: bool = True

    @classmethod
    def parse(cls, url: str | StoreURL) -> StoreURL:
        """Parse ``url``; raise :class:`~statekeeper.errors.InvalidURL` if it is not one."""
        if isinstance(url, StoreURL):
            return url
        if not isinstance(url, str) or not url:
            raise InvalidURL(f"a store URL must be a non-empty string, got {url!r}")
        if "\x00" in url:
            raise InvalidURL("a store URL must not contain NUL")
        scheme_part, sep, _ = url.partition(":")
        if not sep or not _SCHEME.match(scheme_part):
            raise InvalidURL(
                f"{_mask(url)!r} is not a store URL; expected scheme://..., "
                "for example sqlite:///state.db or memory://"
            )
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise InvalidURL(f"cannot parse store URL {_mask(url)!r}: {exc}") from exc
        scheme, _, driver = parts.scheme.lower().partition("+")
        query: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
            if key in query:
                raise InvalidURL(f"option {key!r} is given twice in {_mask(url)!r}")
            query[key] = value
        return cls(
            scheme=scheme,
            driver=driver or None,
            username=unquote(parts.username) if parts.username is not None else None,
            password=unquote(parts.password) if parts.password is not None else None,
            host=parts.hostname,
            port=port,
            path=unquote(parts.path),
            query=MappingProxyType(query),
            has_authority=url[len(scheme_part) + 1 :].startswith("//"),
        )

    @property
    def full_scheme(self) -> str:
        """``scheme+driver`` when a driver was named, else ``scheme``."""
        return f"{self.scheme}+{self.driver}" if self.driver else self.scheme

    def merge_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The URL's query parameters plus keyword ``options``, for a backend's options model.

        Giving the same option in both places raises
        :class:`~statekeeper.errors.InvalidOptions` rather than picking one silently.
        """
        both = set(self.query) & set(options)
        if both:
            raise InvalidOptions(f"options given both in the URL and as keywords: {sorted(both)}")
        return {**self.query, **options}

    def with_(self, **changes: Any) -> StoreURL:
        """A copy with some fields changed (``query`` may be a plain dict)."""
        if "query" in changes and not isinstance(changes["query"], MappingProxyType):
            changes["query"] = MappingProxyType(dict(changes["query"]))
        return replace(self, **changes)

    def render(self, *, hide_password: bool = True) -> str:
        """The URL as a string; the password is ``***`` unless ``hide_password=False``."""
        out = self.full_scheme + ":"
        if self.has_authority:
            out += "//"
            if self.username is not None:
                out += quote(self.username, safe="")
                if self.password is not None:
                    out += ":" + ("***" if hide_password else quote(self.password, safe=""))
                out += "@"
            if self.host:
                out += f"[{self.host}]" if ":" in self.host else self.host
            if self.port is not None:
                out += f":{self.port}"
        out += quote(self.path, safe="/:@!$&'()*+,;=~")
        if self.query:
            out += "?" + "&".join(
                f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in self.query.items()
            )
        return out

    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return f"StoreURL({self.render()!r})"


def _mask(url: str) -> str:
    """Hide a password in a URL that may not parse."""
    return re.sub(r"(//[^/:@]*:)[^@/]*@", r"\1***@", url)
