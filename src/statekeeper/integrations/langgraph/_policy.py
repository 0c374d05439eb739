"""The saver's retention policy: LangGraph's ``checkpointer.ttl`` shape, plus ``keep_last``.

LangGraph's platform configures thread TTL in ``langgraph.json``::

    "checkpointer": {"ttl": {"strategy": "delete", "default_ttl": 43200,
                             "sweep_interval_minutes": 60}}

:func:`thread_retention` takes that dict (and ``keep_last=``) and checks it
strictly: an unknown key, a strategy other than ``"delete"`` or
``"keep_latest"``, or a number of minutes that is not positive raises
:class:`~statekeeper.errors.InvalidOptions` naming it, before any store is
opened. ``sweep_limit`` (the platform's threads per sweep) is accepted too, so
a ``langgraph.json`` block can be passed as it is. ``default_ttl`` may be left
out only to run ``keep_last=`` in the background
(``ttl={"sweep_interval_minutes": 60}, keep_last=20``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from statekeeper.errors import InvalidOptions

Strategy = Literal["delete", "keep_latest"]
STRATEGIES: tuple[Strategy, ...] = ("delete", "keep_latest")
_TTL_KEYS = ("strategy", "default_ttl", "sweep_interval_minutes", "sweep_limit")


@dataclass(frozen=True, slots=True)
class ThreadRetention:
    """What a sweep of the saver's threads does (see :meth:`StatekeeperSaver.asweep`).

    - ``idle``: a thread none of whose checkpoints or pending writes, in any
      namespace, was written for this long is idle; ``None``: no thread is.
    - ``strategy``: what happens to an idle thread: ``"delete"`` removes it whole,
      ``"keep_latest"`` keeps the newest checkpoint of each namespace and its
      pending writes.
    - ``keep_last``: every thread keeps the newest ``keep_last`` checkpoints of
      each namespace (and their pending writes); ``None``: no limit.
    - ``sweep_every``: the background sweep's interval; ``None``: none runs.
    - ``sweep_limit``: at most this many threads deleted or trimmed per sweep.
    """

    idle: timedelta | None = None
    strategy: Strategy = "delete"
    keep_last: int | None = None
    sweep_every: timedelta | None = None
    sweep_limit: int | None = None

    @property
    def empty(self) -> bool:
        """Whether a sweep under this policy removes nothing."""
        return self.idle is None and self.keep_last is None


def _minutes(key: str, value: object) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOptions(f"ttl[{key!r}] is a number of minutes, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidOptions(f"ttl[{key!r}] must be a positive number of minutes, got {value!r}")
    return timedelta(minutes=value)


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an ``int`` of at least 1, else :class:`InvalidOptions`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptions(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


def thread_retention(
    ttl: Mapping[str, Any] | None, keep_last: int | None
) -> ThreadRetention | None:
    """The policy of ``ttl=`` (LangGraph's ``checkpointer.ttl`` dict) and ``keep_last=``,
    or ``None`` when neither is given. Strict: see the module docstring."""
    if ttl is None and keep_last is None:
        return None
    if keep_last is not None:
        keep_last = positive_int("keep_last", keep_last)
    if ttl is None:
        return ThreadRetention(keep_last=keep_last)
    if not isinstance(ttl, Mapping):
        raise InvalidOptions(
            f"ttl is a dict like LangGraph's checkpointer.ttl "
            f'({{"strategy": "delete", "default_ttl": 43200}}), got {ttl!r}'
        )
    unknown = sorted(str(k) for k in ttl if k not in _TTL_KEYS)
    if unknown:
        raise InvalidOptions(
            f"ttl has unknown keys {unknown}; it takes {', '.join(_TTL_KEYS)} "
            "(LangGraph's checkpointer.ttl)"
        )
    strategy = ttl.get("strategy", "delete")
    if strategy not in STRATEGIES:
        raise InvalidOptions(f"ttl['strategy'] must be 'delete' or 'keep_latest', got {strategy!r}")
    idle = ttl.get("default_ttl")
    every = ttl.get("sweep_interval_minutes")
    if idle is None and ("strategy" in ttl or every is None):
        raise InvalidOptions(
            "ttl needs 'default_ttl': the minutes after which an idle thread is swept "
            "(only ttl={'sweep_interval_minutes': m} with keep_last= goes without it)"
        )
    if idle is None and keep_last is None:
        raise InvalidOptions(
            "ttl without 'default_ttl' sweeps nothing: give default_ttl, or keep_last="
        )
    limit = ttl.get("sweep_limit")
    return ThreadRetention(
        idle=None if idle is None else _minutes("default_ttl", idle),
        strategy=strategy,
        keep_last=keep_last,
        sweep_every=None if every is None else _minutes("sweep_interval_minutes", every),
        sweep_limit=None if limit is None else positive_int("ttl['sweep_limit']", limit),
    )


def without_interval(ttl: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``ttl`` without ``sweep_interval_minutes`` (whoever opened the store runs the
    background sweep), or ``None`` when nothing else is left."""
    if ttl is None:
        return None
    return {k: v for k, v in ttl.items() if k != "sweep_interval_minutes"} or None


def no_background(policy: ThreadRetention | None) -> None:
    """Refuse a background sweep over a store the caller opened (and will close)."""
    if policy is not None and policy.sweep_every is not None:
        raise InvalidOptions(
            "ttl['sweep_interval_minutes'] runs a sweep in the background while the "
            "saver owns its store: use StatekeeperSaver.from_conn_string(url, ttl=...) "
            "or StatekeeperSaver(url, ttl=...); over a store you opened, call "
            "saver.asweep() on your own schedule"
        )
