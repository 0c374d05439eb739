"""Scheme -> backend class: lazy built-ins, the ``statekeeper.backends`` entry-point
group, and :func:`register_backend` for code."""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._url import StoreURL
from .errors import BackendNotFound, InvalidURL

if TYPE_CHECKING:
    from ._core.store import BaseCheckpointStore

__all__ = ["ENTRY_POINT_GROUP", "available_backends", "open_store", "register_backend"]

ENTRY_POINT_GROUP = "statekeeper.backends"
ENV_URL = "STATEKEEPER_URL"

_POSTGRES = "statekeeper.backends.sql.postgres:PostgresCheckpointStore"
_MYSQL = "statekeeper.backends.sql.mysql:MysqlCheckpointStore"
#: Each scheme's own class: the SQL schemes name their dialect's store, so opening
#: one imports that dialect and no other.
_BUILTIN: dict[str, str] = {
    "memory": "statekeeper.backends.memory:MemoryCheckpointStore",
    "file": "statekeeper.backends.file:FileCheckpointStore",
    "sqlite": "statekeeper.backends.sql:SqliteCheckpointStore",
    "postgresql": _POSTGRES,
    "postgres": _POSTGRES,
    "mysql": _MYSQL,
    "mariadb": _MYSQL,
}
_HINTS: dict[str, str] = {
    "postgresql": "pip install 'statekeeper[postgres]'",
    "postgres": "pip install 'statekeeper[postgres]'",
    "mysql": "pip install 'statekeeper[mysql]'",
    "mariadb": "pip install 'statekeeper[mysql]'",
    "redis": "pip install statekeeper-redis",
    "rediss": "pip install statekeeper-redis",
}
_registered: dict[str, str | type[BaseCheckpointStore]] = {}
_lock = threading.Lock()


def register_backend(scheme: str, target: str | type[BaseCheckpointStore]) -> None:
    """Register a backend for ``scheme``: a class or a lazy ``"pkg.mod:Class"`` string.

    Code registrations win over entry points, which win over built-ins.
    """
    if not isinstance(scheme, str) or not scheme.isascii() or not scheme.replace("-", "").isalnum():
        raise ValueError(f"invalid scheme {scheme!r}")
    with _lock:
        _registered[scheme.lower()] = target


def _entry_points() -> dict[str, str]:
    # Imported here: importlib.metadata costs more than the rest of this module.
    from importlib.metadata import entry_points

    return {ep.name.lower(): ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_backends() -> dict[str, str]:
    """Every scheme that can be opened, mapped to its ``"pkg.mod:Class"`` target."""
    found: dict[str, str] = dict(_BUILTIN)
    found.update(_entry_points())
    with _lock:
        for scheme, target in _registered.items():
            found[scheme] = (
                target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
            )
    return dict(sorted(found.items()))


def _load(target: str, scheme: str) -> type[BaseCheckpointStore]:
    from ._core.store import BaseCheckpointStore

    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except ImportError as exc:
        hint = _HINTS.get(scheme)
        raise BackendNotFound(
            f"the backend for {scheme!r} ({target}) cannot be imported: {exc}"
            + (f"; install it with: {hint}" if hint else "")
        ) from exc
    except AttributeError as exc:
        raise BackendNotFound(
            f"the backend for {scheme!r} ({target}) does not exist: {exc}"
        ) from exc
    if not (isinstance(obj, type) and issubclass(obj, BaseCheckpointStore)):
        raise BackendNotFound(f"{target} (for {scheme!r}) is not a BaseCheckpointStore subclass")
    return obj


def builtin_class(scheme: str) -> type[BaseCheckpointStore]:
    """The built-in backend class for ``scheme``, whatever is registered for it
    (``SqlCheckpointStore.from_url(url)`` builds its dialect's class through this)."""
    scheme = scheme.lower()
    target = _BUILTIN.get(scheme)
    if target is None:
        raise BackendNotFound(f"statekeeper has no built-in backend for scheme {scheme!r}")
    return _load(target, scheme)


def backend_class(scheme: str) -> type[BaseCheckpointStore]:
    """The backend class for ``scheme`` (importing it on first use)."""
    scheme = scheme.lower()
    with _lock:
        target: str | type[BaseCheckpointStore] | None = _registered.get(scheme)
    if target is None:
        target = _entry_points().get(scheme) or _BUILTIN.get(scheme)
    if target is None:
        installed = ", ".join(available_backends())
        hint = _HINTS.get(scheme)
        raise BackendNotFound(
            f"no statekeeper backend is installed for scheme {scheme!r}; installed schemes: "
            f"{installed}" + (f"; to add it: {hint}" if hint else "")
        )
    return _load(target, scheme) if isinstance(target, str) else target


def open_store(
    url_or_config: str | StoreURL | Mapping[str, Any] | None = None, **options: Any
) -> BaseCheckpointStore:
    """Resolve a store URL (or ``{"url": ..., **options}``) to an unopened store.

    With no URL, ``$STATEKEEPER_URL`` is used. The scheme is resolved and the
    options validated at once (:class:`BackendNotFound`, :class:`InvalidURL`,
    :class:`~statekeeper.errors.InvalidOptions`); nothing is opened or created until
    ``async with store`` or ``await store.open()``.
    """
    if isinstance(url_or_config, Mapping):
        config = dict(url_or_config)
        url_value = config.pop("url", None)
        both = set(config) & set(options)
        if both:
            raise InvalidURL(f"options given both in the config and as keywords: {sorted(both)}")
        options = {**config, **options}
    else:
        url_value = url_or_config
    if url_value is None:
        url_value = os.environ.get(ENV_URL)
        if not url_value:
            raise InvalidURL(f"no store URL given and ${ENV_URL} is not set")
    url = StoreURL.parse(url_value)
    cls = backend_class(url.scheme)
    return cls.from_url(url, **options)
