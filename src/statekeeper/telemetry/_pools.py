"""Connection-pool metrics of the server backends (SPEC S18).

A store whose connections are pooled says how its pools stand with a method
``_pool_usage() -> list[PoolUsage]`` (the SQL server stores do: SQLAlchemy's
pool, and PostgreSQL's own small asyncpg pool of the lean path), read through
public APIs only. A store is watched from its first traced operation; the
observable instruments are read at each collection of the metric reader, and a
collected store drops out (a weak reference).

This module imports OpenTelemetry only in :func:`watch`, which runs once
telemetry is on.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from . import _names as names

__all__ = ["PoolUsage", "watch"]


class PoolUsage(NamedTuple):
    """One pool of a store: its name, connections in use and idle, and callers
    waiting for one (``None`` where the pool does not say)."""

    pool: str
    used: int
    idle: int
    waiting: int | None = None


class _Watched:
    """The stores one meter watches, and its two observable instruments."""

    def __init__(self, meter: Any) -> None:
        from opentelemetry.metrics import Observation

        self._observation = Observation
        self.stores: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        meter.create_observable_up_down_counter(
            names.POOL_CONNECTIONS,
            callbacks=[self._connections],
            unit="{connection}",
            description="Connections of the store's pools, by state (used, idle).",
        )
        meter.create_observable_up_down_counter(
            names.POOL_PENDING,
            callbacks=[self._pending],
            unit="{request}",
            description="Callers waiting for a connection of the store's pool.",
        )

    def _usages(self) -> Iterable[tuple[dict[str, Any], PoolUsage]]:
        for store, attributes in list(self.stores.items()):
            usage: Callable[[], list[PoolUsage]] = store._pool_usage
            for one in usage():
                yield {**attributes, names.POOL_NAME: one.pool}, one

    def _connections(self, options: Any) -> Iterable[Any]:
        for attributes, one in self._usages():
            yield self._observation(one.used, {**attributes, names.POOL_STATE: "used"})
            yield self._observation(one.idle, {**attributes, names.POOL_STATE: "idle"})

    def _pending(self, options: Any) -> Iterable[Any]:
        for attributes, one in self._usages():
            if one.waiting is not None:
                yield self._observation(one.waiting, attributes)


_watched: dict[Any, _Watched] = {}  # by meter (identity; the key keeps it alive)


def watch(meter: Any, store: Any, attributes: dict[str, Any]) -> None:
    """Report ``store``'s pools through ``meter`` from now on (if it has any)."""
    if not callable(getattr(store, "_pool_usage", None)):
        return
    watched = _watched.get(meter)
    if watched is None:
        watched = _watched[meter] = _Watched(meter)
    watched.stores[store] = attributes
