"""Telemetry on or off: the one check every public operation makes (SPEC S18).

:func:`instrument` registers a class (``BaseCheckpointStore``) whose methods of
:data:`OPERATIONS` are wrapped the first time telemetry is turned on in the process
(a store made with ``telemetry=``, or :func:`~statekeeper.telemetry.enable`), and
never unwrapped. Until then the methods are the class's own coroutine functions:
a process that never turns telemetry on pays nothing, not even a check. Once
wrapped, a store with telemetry off (its ``_telemetry`` is ``None`` and
``enable`` is not in force) costs one attribute read and one global read per call
before the method's own coroutine; on, the wrapper runs the traced run
(:mod:`._otel`, imported then). A wrapped method is still a coroutine function
(marked on Python 3.12+; a thin ``async def`` around the same wrapper on 3.11).

To instrument a new public operation of ``BaseCheckpointStore``, add its name to
:data:`OPERATIONS` (and, if its arguments name a stream or an id, to
``_otel.TARGETS``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .._runtime.context import carry_on
from ._options import Telemetry

__all__ = ["OPERATIONS", "disable", "enable", "enabled", "instrument", "resolve", "traced"]

#: The public operations of ``BaseCheckpointStore`` that each get a span and a
#: duration. ``rekey`` is :func:`statekeeper._core.rekey.rekey_store`.
OPERATIONS: tuple[str, ...] = (
    "save",
    "get_latest",
    "load",
    "load_many",
    "list",
    "list_streams",
    "cursor_at",
    "update",
    "delete",
    "delete_many",
    "delete_stream",
    "save_many",
    "prune",
    "purge_expired",
    "verify",
    "repair",
    "info",
    "sweep",
    "compact",
)

F = TypeVar("F", bound=Callable[..., Any])
Run = Callable[..., Coroutine[Any, Any, Any]]


class _State:
    """The process's switch: ``default`` (set by :func:`enable`) and the traced run."""

    __slots__ = ("default", "run")

    def __init__(self) -> None:
        self.default: Telemetry | None = None
        self.run: Run | None = None


_STATE = _State()

_MISSING_EXTRA = (
    "telemetry needs OpenTelemetry's API, which is not installed: "
    "pip install 'statekeeper[otel]' (and an OpenTelemetry SDK to export with)"
)


#: The classes :func:`instrument` registered, wrapped once telemetry is first on.
_CLASSES: list[type[Any]] = []


def _load() -> Run:
    """The traced run (:func:`._otel.run`), importing OpenTelemetry and wrapping the
    registered classes' operations the first time; a clear ``ImportError`` naming
    the extra when it is not installed."""
    if _STATE.run is None:
        try:
            from ._otel import run
        except ImportError as exc:
            raise ImportError(_MISSING_EXTRA) from exc
        _STATE.run = run
        carry_on()  # worker threads run calls in their callers' contexts from now on
        for cls in _CLASSES:
            _install(cls)
    return _STATE.run


def resolve(option: bool | Telemetry) -> Telemetry | None:
    """A store's ``telemetry=`` option, resolved at its construction: ``None`` when
    off; on, the options, once OpenTelemetry's API is known to be importable."""
    if option is False:
        return None
    options = Telemetry() if option is True else option
    _load()
    return options


def enable(options: Telemetry | None = None) -> None:
    """Turn telemetry on for every store of the process, made before or after this
    call (a store's own ``telemetry=`` options win over these). Raises
    ``ImportError`` naming the ``otel`` extra when OpenTelemetry's API is missing."""
    _load()
    _STATE.default = options or Telemetry()


def disable() -> None:
    """Undo :func:`enable`: stores without ``telemetry=`` of their own record
    nothing from their next operation on (one already running finishes its span)."""
    _STATE.default = None


def enabled() -> Telemetry | None:
    """The options :func:`enable` set, or ``None``."""
    return _STATE.default


def _wrap(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    state = _STATE

    @functools.wraps(method)
    def operation(self: Any, *args: Any, **kwargs: Any) -> Any:
        options = self._telemetry or state.default
        if options is None:
            return method(self, *args, **kwargs)
        assert state.run is not None, "telemetry turned on without loading OpenTelemetry"
        return state.run(name, options, method, self, args, kwargs)

    if hasattr(inspect, "markcoroutinefunction"):  # Python 3.12+: still a coroutine function
        inspect.markcoroutinefunction(operation)
        return operation

    # Python 3.11 has no marker: a thin coroutine function around the same body, so
    # that inspect.iscoroutinefunction, asyncio.iscoroutinefunction and mock's
    # create_autospec (an AsyncMock per operation) see what the method is
    @functools.wraps(method)
    async def awaited(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await operation(self, *args, **kwargs)

    return awaited


C = TypeVar("C", bound=type[Any])


def instrument(cls: C) -> C:
    """Class decorator: the :data:`OPERATIONS` that ``cls`` defines are wrapped once
    telemetry is first turned on in the process, at once if it already is (see the
    module). A subclass that overrides one and calls ``super()`` keeps one span."""
    _CLASSES.append(cls)
    if _STATE.run is not None:
        _install(cls)
    return cls


def _install(cls: type[Any]) -> None:
    for name in OPERATIONS:
        method = cls.__dict__.get(name)
        if method is not None and not getattr(method, "_statekeeper_traced", False):
            wrapped = _wrap(name, method)
            wrapped._statekeeper_traced = True  # type: ignore[attr-defined]
            setattr(cls, name, wrapped)


def traced(name: str) -> Callable[[F], F]:
    """The same wrapper for a coroutine function whose first argument is a store
    (``rekey_store``)."""

    def decorate(fn: F) -> F:
        state = _STATE

        @functools.wraps(fn)
        def operation(store: Any, *args: Any, **kwargs: Any) -> Any:
            options = getattr(store, "_telemetry", None) or state.default
            if options is None:
                return fn(store, *args, **kwargs)
            assert state.run is not None, "telemetry turned on without loading OpenTelemetry"
            return state.run(name, options, fn, store, args, kwargs)

        return operation  # type: ignore[return-value]

    return decorate
