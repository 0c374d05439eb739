"""OpenTelemetry traces and metrics for every store (SPEC S18), off by default.

Turn it on for one store with ``open_store(url, telemetry=True)`` (or
``telemetry=Telemetry(...)``), or for every store of the process with
:func:`enable`. It goes through OpenTelemetry's API only (the ``otel`` extra:
``pip install 'statekeeper[otel]'``); the application brings the SDK and its
exporters. Turned on without the extra, the store's construction (or
:func:`enable`) raises ``ImportError`` naming it.

What is recorded, see docs/observability.md: a span per public operation, after
the database semantic conventions, with statekeeper's own attributes; a span
event per skipped record; ``db.client.operation.duration`` and statekeeper's
metrics. The caller's current span is the parent, also across the store's worker
threads and the adapters' loop bridges. States, keys and passwords are never
recorded; stream names and ids only with ``Telemetry(record_streams=True)``.

Off, an operation costs one attribute check more, and importing statekeeper
imports nothing of OpenTelemetry.

The modules:

- ``_options``: :class:`Telemetry`, the options model;
- ``_switch``: on or off: :func:`enable`, :func:`disable`, the per-call check and
  ``OPERATIONS``, the public operations that are instrumented;
- ``_names``: the attribute, event and metric names;
- ``_otel``: the traced run (imported only once telemetry is on);
- ``_pools``: the connection-pool metrics of the server backends.
"""

from __future__ import annotations

from ._names import (
    CHECKPOINT_SIZE,
    GROUP_COMMIT_SIZE,
    OPERATION_DURATION,
    POOL_CONNECTIONS,
    REKEY_RECORDS,
    SKIPPED_RECORDS,
    SWEEP_REMOVALS,
)
from ._options import Telemetry
from ._pools import PoolUsage
from ._switch import OPERATIONS, disable, enable, enabled

__all__ = [
    "CHECKPOINT_SIZE",
    "GROUP_COMMIT_SIZE",
    "OPERATIONS",
    "OPERATION_DURATION",
    "POOL_CONNECTIONS",
    "REKEY_RECORDS",
    "SKIPPED_RECORDS",
    "SWEEP_REMOVALS",
    "PoolUsage",
    "Telemetry",
    "disable",
    "enable",
    "enabled",
]
