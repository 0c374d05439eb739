"""The names of statekeeper's span attributes, span events and metrics (SPEC S18).

Those of OpenTelemetry's semantic conventions keep the conventions' names; ours
start with ``statekeeper.``. docs/observability.md lists them with their meaning.
"""

from __future__ import annotations

__all__ = [
    "CHECKPOINT_ID",
    "CHECKPOINT_SIZE",
    "DB_NAMESPACE",
    "DB_OPERATION",
    "DB_SYSTEM",
    "DRY_RUN",
    "ERROR_TYPE",
    "EXECUTION",
    "GROUP_COMMIT_SIZE",
    "GROUP_SIZE",
    "ITEMS",
    "OPERATION_DURATION",
    "PAGE_LIMIT",
    "POOL_CONNECTIONS",
    "POOL_NAME",
    "POOL_PENDING",
    "POOL_STATE",
    "REKEY_RECORDS",
    "REMOVED",
    "SEQUENCE",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "SKIPPED",
    "SKIPPED_EVENT",
    "SKIPPED_RECORDS",
    "SKIP_LOCATION",
    "SKIP_REASON",
    "STATE_BYTES",
    "STREAM",
    "STREAMS_REMOVED",
    "SWEEP_REMOVALS",
]

# -- span attributes of the database semantic conventions ---------------------------
DB_SYSTEM = "db.system.name"
DB_OPERATION = "db.operation.name"
DB_NAMESPACE = "db.namespace"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

# -- statekeeper's span attributes --------------------------------------------------
#: The sequence of the checkpoint saved, updated or read.
SEQUENCE = "statekeeper.sequence"
#: The encoded bytes of the states written or read (summed over a batch or a page).
STATE_BYTES = "statekeeper.state.bytes"
#: ``list``'s ``limit``.
PAGE_LIMIT = "statekeeper.page.limit"
#: How many items a page, a batch or a list of streams returned.
ITEMS = "statekeeper.items"
#: How many records a page left out (each is a ``statekeeper.skipped`` event).
SKIPPED = "statekeeper.skipped"
#: How many checkpoints a delete, prune, purge or sweep removed (a dry sweep: would).
REMOVED = "statekeeper.removed"
#: How many whole streams a sweep removed as idle, and whether it was a dry run.
STREAMS_REMOVED = "statekeeper.sweep.streams_removed"
DRY_RUN = "statekeeper.sweep.dry_run"
#: ``"inline"``: the operation ran on the caller's event loop thread; ``"worker"``:
#: some of it ran on one of the store's worker threads.
EXECUTION = "statekeeper.execution"
#: The number of writes that shared the commit this write rode in.
GROUP_SIZE = "statekeeper.group_commit.size"
#: Only with ``record_streams``.
STREAM = "statekeeper.stream"
CHECKPOINT_ID = "statekeeper.checkpoint.id"

# -- the span event of a skipped record -------------------------------------------
SKIPPED_EVENT = "statekeeper.skipped"
#: The reason of a skip: the exception class a strict read would raise on the
#: metric and the event; the sentence on the event only with ``record_streams``.
SKIP_REASON = "statekeeper.skip.reason"
SKIP_LOCATION = "statekeeper.skip.location"

# -- metrics ----------------------------------------------------------------------
OPERATION_DURATION = "db.client.operation.duration"
CHECKPOINT_SIZE = "statekeeper.checkpoint.size"
SKIPPED_RECORDS = "statekeeper.skipped_records"
GROUP_COMMIT_SIZE = "statekeeper.group_commit.size"
REKEY_RECORDS = "statekeeper.rekey.records"
#: The checkpoints sweeps removed (SPEC S17); a dry run counts nothing.
SWEEP_REMOVALS = "statekeeper.sweep.removals"
#: The conventions' pool metrics: connections by ``db.client.connection.state``
#: (used, idle), and callers waiting for one, by ``db.client.connection.pool.name``.
POOL_CONNECTIONS = "db.client.connection.count"
POOL_PENDING = "db.client.connection.pending_requests"
POOL_STATE = "db.client.connection.state"
POOL_NAME = "db.client.connection.pool.name"
