"""Microsoft Agent Framework's ``CheckpointStorage`` over a statekeeper store.

``StatekeeperCheckpointStorage(store)`` implements the ``CheckpointStorage``
protocol of ``agent-framework-core`` 1.x (``save``, ``load``, ``list_checkpoints``,
``list_checkpoint_ids``, ``delete``, ``get_latest``) on any statekeeper backend::

    storage = StatekeeperCheckpointStorage("sqlite:///checkpoints.db")
    workflow = WorkflowBuilder(start_executor=start, checkpoint_storage=storage).build()

**Mapping.** A workflow name is a stream (``"af:<workflow_name>"``) and a
checkpoint is one record of it. The checkpoint id maps to the store id
``"af:<checkpoint_id>"``; an id (or a workflow name) that does not fit the store's
rules is hashed (``"af.<sha256>"``, stream ``"af#<sha256>"``), and the original is
kept in the record's metadata. ``namespace=`` replaces ``"af"``, so several
storages can share one store without seeing each other.

**Encoding.** A checkpoint is encoded exactly as the framework's own
``FileCheckpointStorage`` encodes it (``encode_checkpoint_value`` of
``WorkflowCheckpoint.to_dict()``, as JSON) and those UTF-8 bytes are stored
verbatim with ``codec="raw"``: statekeeper adds no second encoding.

**Strict, flat-cost latest.** :meth:`~StatekeeperCheckpointStorage.get_latest` is
one ``store.get_latest`` on the workflow's stream and one decode, whatever the
number of checkpoints. The newest checkpoint is the one with the highest store
sequence (the order of the saves), not the latest ``timestamp``; if it cannot be
read or decoded, ``get_latest`` raises ``WorkflowCheckpointException`` and never
returns an older one.

**Lifecycle.** Agent Framework builds storages synchronously and never closes
them, so the store is opened lazily: on the first call, once, under a lock, on the
event loop of that call, and it stays bound to that loop. Pass a URL or an unopened
store (opened on first use and closed by :meth:`~StatekeeperCheckpointStorage.aclose`)
or an open store (which stays yours to close).

**Concurrency.** Safe for concurrent tasks on one event loop. Calls from another
event loop while the first one is running raise ``RuntimeError``; when the first
loop has been closed (successive ``asyncio.run`` calls), a store this storage
opened is reopened on the new loop.

**Retention.** ``retention=statekeeper.Retention(keep_last=, max_age=, idle=,
sweep_every=)`` bounds the storage's workflows (the store's rules of SPEC S17,
each workflow a stream; only this storage's namespace is swept): ``sweep()``
applies it once, ``sweep_every`` in the background from the first call until
``aclose``.

**Modules.** :mod:`._storage` (``StatekeeperCheckpointStorage``: the protocol's
methods over the store), :mod:`._codec` (the mapping of workflow names and
checkpoint ids to streams and store ids, and the framework's JSON encoding in and
out of records, with the allowlist check; and ``framework_encoding``, the one import
of the framework's encoder, which agent-framework-core does not export),
:mod:`._lifecycle` (the store opened lazily on the first call's event loop,
reopened after that loop closed, closed by ``aclose``) and :mod:`._retention`
(the sweep of the storage's workflows).
"""

from __future__ import annotations

from ._codec import FORMAT
from ._storage import StatekeeperCheckpointStorage

__all__ = ["FORMAT", "StatekeeperCheckpointStorage"]
