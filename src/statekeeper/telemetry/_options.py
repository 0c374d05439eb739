"""``Telemetry``: what a store's spans and metrics may record, and where they go."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["Telemetry"]


class Telemetry(BaseModel):
    """Telemetry options (SPEC S18): ``open_store(url, telemetry=Telemetry(...))``,
    or :func:`statekeeper.telemetry.enable` for every store of the process.

    ``telemetry=True`` is ``Telemetry()``. States are never recorded, and neither
    are keys or passwords, whatever the options.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    #: Put stream names and checkpoint ids on spans and span events
    #: (``statekeeper.stream``, ``statekeeper.checkpoint.id``, and the skipped
    #: records' ids, locations and reasons). Off by default: they can be personal
    #: data (a user id in a thread id).
    record_streams: bool = False
    #: The OpenTelemetry ``TracerProvider`` to use; ``None``: the global one
    #: (``opentelemetry.trace.set_tracer_provider``, before or after the store is made).
    tracer_provider: Any = None
    #: The OpenTelemetry ``MeterProvider`` to use; ``None``: the global one.
    meter_provider: Any = None
