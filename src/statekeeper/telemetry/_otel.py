"""The traced run of one operation: its span, its metrics (SPEC S18).

Imported only once telemetry is turned on (:mod:`._switch`); it is the only module
of statekeeper that imports OpenTelemetry, and only its API.

What a span holds, after OpenTelemetry's database semantic conventions:
``db.system.name``, ``db.operation.name``, ``db.namespace`` and ``server.address``
/ ``server.port`` where the store has them, ``error.type`` on failure; and
statekeeper's own (prefix ``statekeeper.``), read from the operation's arguments,
its result and the runtime's :class:`~statekeeper._runtime.context.Notes`. States
are never recorded; stream names and ids only with ``record_streams``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Coroutine, Mapping
from time import perf_counter
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from .._runtime.context import NOTES, Notes
from ..models import CheckpointHeader, Page, SweepReport
from . import _names as names
from ._options import Telemetry
from ._pools import watch

__all__ = ["run"]

#: Where an operation's arguments name what it works on: (kind, position, keyword).
TARGETS: dict[str, tuple[str, int, str]] = {
    "save": ("stream", 0, "stream"),
    "get_latest": ("stream", 0, "stream"),
    "list": ("stream", 0, "stream"),
    "delete_stream": ("stream", 0, "stream"),
    "prune": ("stream", 0, "stream"),
    "load": ("id", 0, "id"),
    "cursor_at": ("id", 0, "id"),
    "update": ("id", 0, "id"),
    "delete": ("id", 0, "id"),
}
_ATTR = {"stream": names.STREAM, "id": names.CHECKPOINT_ID}

#: db.system.name: the conventions' well-known values where there is one; the
#: memory and file stores have none, so they are named ``statekeeper.<backend>``.
_SYSTEMS = {
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "mysql": "mysql",
    "mariadb": "mariadb",
    "redis": "redis",
}

#: The bucket boundaries the conventions advise for ``db.client.operation.duration``.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
_VERSION = "0.1.0"


class _Instruments:
    """The tracer and the instruments of one pair of providers."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        self.tracer = trace.get_tracer("statekeeper", _VERSION, tracer_provider)
        meter = metrics.get_meter("statekeeper", _VERSION, meter_provider)
        self.duration = meter.create_histogram(
            names.OPERATION_DURATION,
            unit="s",
            description="Duration of statekeeper store operations.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.size = meter.create_histogram(
            names.CHECKPOINT_SIZE,
            unit="By",
            description="Encoded size of each checkpoint state written or read.",
        )
        self.skipped = meter.create_counter(
            names.SKIPPED_RECORDS,
            unit="{record}",
            description="Records a tolerant listing left out, by reason.",
        )
        self.group = meter.create_histogram(
            names.GROUP_COMMIT_SIZE,
            unit="{write}",
            description="Writes that shared one commit (group commit).",
        )
        self.meter = meter
        self.rekey = meter.create_counter(
            names.REKEY_RECORDS,
            unit="{record}",
            description="Records examined by rekey.",
        )
        self.sweep = meter.create_counter(
            names.SWEEP_REMOVALS,
            unit="{checkpoint}",
            description="Checkpoints removed by retention sweeps (dry runs count nothing).",
        )


# Keyed by the providers themselves (by identity): the key keeps them alive, so a
# collected provider's id can never hand its instruments to a new one.
_instruments: dict[tuple[Any, Any], _Instruments] = {}


def _instruments_of(options: Telemetry) -> _Instruments:
    key = (options.tracer_provider, options.meter_provider)
    found = _instruments.get(key)
    if found is None:
        found = _instruments[key] = _Instruments(options.tracer_provider, options.meter_provider)
    return found


class _Static:
    """What a store's spans and metrics always carry."""

    __slots__ = ("attributes", "metric", "suffix")

    def __init__(self, store: Any) -> None:
        backend = str(getattr(store, "backend_name", "unknown"))
        url = getattr(store, "url", None)
        if getattr(url, "scheme", None) == "mariadb":
            backend = "mariadb"
        attributes: dict[str, Any] = {
            names.DB_SYSTEM: _SYSTEMS.get(backend, f"statekeeper.{backend}"),
        }
        namespace: str | None = None
        host = getattr(url, "host", None)
        if host:
            attributes[names.SERVER_ADDRESS] = host
            port = getattr(url, "port", None)
            if port:
                attributes[names.SERVER_PORT] = port
            namespace = str(getattr(url, "path", "")).strip("/") or None
        elif isinstance(getattr(store, "path", None), str):
            namespace = store.path
        if namespace:
            attributes[names.DB_NAMESPACE] = namespace
        self.attributes = attributes
        self.metric = dict(attributes)
        self.suffix = f" {namespace}" if namespace else ""


_statics: weakref.WeakKeyDictionary[Any, _Static] = weakref.WeakKeyDictionary()


def _static_of(store: Any, tools: _Instruments) -> _Static:
    found = _statics.get(store)
    if found is None:
        found = _statics[store] = _Static(store)
        watch(tools.meter, store, found.metric)  # its pools, if it has any
    return found


def run(
    name: str,
    options: Telemetry,
    method: Callable[..., Coroutine[Any, Any, Any]],
    store: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Coroutine[Any, Any, Any]:
    """The coroutine of ``method(store, *args, **kwargs)`` run under a span."""
    return _traced(name, options, method, store, args, kwargs)


async def _traced(
    name: str,
    options: Telemetry,
    method: Callable[..., Coroutine[Any, Any, Any]],
    store: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    if NOTES.get() is not None:
        # An operation made of others (verify reads through list and load): one
        # span for what the caller asked, whose notes the inner reads add to.
        return await method(store, *args, **kwargs)
    tools = _instruments_of(options)
    static = _static_of(store, tools)
    attributes = dict(static.attributes)
    attributes[names.DB_OPERATION] = name
    _arguments(name, options, args, kwargs, attributes)
    if name == "rekey":
        args, kwargs = _count_rekey(tools, static, args, kwargs)
    notes = Notes()
    token = NOTES.set(notes)
    metric = dict(static.metric)
    metric[names.DB_OPERATION] = name
    start = perf_counter()
    with tools.tracer.start_as_current_span(
        name + static.suffix,
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,  # its message may hold state: only the type is kept
        set_status_on_exception=False,
    ) as span:
        ended: dict[str, Any] = {}
        try:
            result = await method(store, *args, **kwargs)
        except BaseException as exc:
            error = type(exc).__qualname__
            span.set_status(Status(StatusCode.ERROR))
            ended[names.ERROR_TYPE] = metric[names.ERROR_TYPE] = error
            raise
        else:
            _result(span, tools, static, options, result, ended)
            return result
        finally:
            NOTES.reset(token)
            tools.duration.record(perf_counter() - start, metric)
            _noted(tools, static, name, notes, ended)
            span.set_attributes(ended)


def _arguments(
    name: str,
    options: Telemetry,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    attributes: dict[str, Any],
) -> None:
    """The attributes the arguments give: the page size, and (only with
    ``record_streams``) the stream or the id."""
    if name == "list":
        attributes[names.PAGE_LIMIT] = kwargs.get("limit", 20)
    target = TARGETS.get(name)
    if target is None or not options.record_streams:
        return
    kind, position, keyword = target
    value = args[position] if len(args) > position else kwargs.get(keyword)
    if isinstance(value, str):
        attributes[_ATTR[kind]] = value


def _result(
    span: Any,
    tools: _Instruments,
    static: _Static,
    options: Telemetry,
    result: Any,
    ended: dict[str, Any],
) -> None:
    """The attributes the result gives (into ``ended``); a span event per skipped
    record."""
    if isinstance(result, CheckpointHeader):  # save, update, get_latest, load
        ended[names.SEQUENCE] = result.sequence
        if options.record_streams:
            ended[names.CHECKPOINT_ID] = result.id
    elif isinstance(result, Page):
        ended[names.ITEMS] = len(result.items)
        skipped = result.skipped
        ended[names.SKIPPED] = len(skipped)
        for entry in skipped:
            reason = entry.error
            event: dict[str, Any] = {names.ERROR_TYPE: reason}
            if entry.sequence is not None:
                event[names.SEQUENCE] = entry.sequence
            if options.record_streams:
                event[names.SKIP_REASON] = entry.reason
                event[names.SKIP_LOCATION] = entry.location
                if entry.id is not None:
                    event[names.CHECKPOINT_ID] = entry.id
            span.add_event(names.SKIPPED_EVENT, event)
            tools.skipped.add(1, {**static.metric, names.SKIP_REASON: reason})
    elif isinstance(result, list | dict):  # save_many, load_many, list_streams
        ended[names.ITEMS] = len(result)
    elif isinstance(result, SweepReport):
        ended[names.REMOVED] = result.checkpoints_removed
        ended[names.STREAMS_REMOVED] = result.streams_removed
        ended[names.DRY_RUN] = result.dry_run
        if not result.dry_run and result.checkpoints_removed:
            tools.sweep.add(result.checkpoints_removed, static.metric)
    elif isinstance(result, bool):  # delete
        ended[names.REMOVED] = int(result)
    elif isinstance(result, int):  # delete_many, delete_stream, prune, purge_expired, compact
        ended[names.REMOVED] = result


def _noted(
    tools: _Instruments, static: _Static, name: str, notes: Notes, ended: dict[str, Any]
) -> None:
    """What the runtime noted (into ``ended``): where it ran, the group commit, the
    state sizes."""
    ended[names.EXECUTION] = "worker" if notes.worker else "inline"
    if notes.group:
        ended[names.GROUP_SIZE] = notes.group
        tools.group.record(notes.group, static.metric)
    if notes.bytes:
        ended[names.STATE_BYTES] = notes.bytes
    if notes.sizes:
        metric = {**static.metric, names.DB_OPERATION: name}
        for size in notes.sizes:
            tools.size.record(size, metric)


def _count_rekey(
    tools: _Instruments, static: _Static, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``rekey_store``'s ``progress`` callback, counting into the rekey counter too."""
    given = args[0] if args else kwargs.pop("progress", None)
    counter, attributes = tools.rekey, static.metric

    def progress(count: int) -> None:
        counter.add(count, attributes)
        if given is not None:
            given(count)

    return (progress, *args[1:]), kwargs
