"""LangGraph checkpoints in a statekeeper store (extra ``langgraph``).

::

    from statekeeper.integrations.langgraph import StatekeeperSaver

    async with StatekeeperSaver.from_conn_string("sqlite:///graph.db") as saver:
        graph = builder.compile(checkpointer=saver)

The modules, each taking what it uses (the store, the saver's serde), never the
saver itself:

- :mod:`._saver`: the saver, LangGraph's sync and async methods;
- :mod:`._open`: ``from_conn_string``, the store opened and closed around a saver;
- :mod:`._bridge`: running calls on the store's event loop from any loop or thread;
- :mod:`._layout`: streams, store ids and the record frames (the LangGraph ids
  travel in the frame: a record has no tags and no store metadata), and the
  first layout, still read;
- :mod:`._records`: the serde applied to records, checkpoint and metadata
  decoded apart so a listing matches a filter before it decodes a checkpoint;
- :mod:`._listing`: ``list``, a query planned once and read page by page;
- :mod:`._merge`: a thread's namespaces (streams) listed as one, by sequence;
- :mod:`._filters`: how ``filter=`` matches metadata, nested keys included;
- :mod:`._writes`: ``put_writes``, one writes record per checkpoint, merged by
  etag compare-and-set;
- :mod:`._threads`: the upsert, and thread delete, delete for runs, copy;
- :mod:`._policy`: ``ttl=`` (LangGraph's ``checkpointer.ttl`` dict) and
  ``keep_last=``, checked strictly into a :class:`ThreadRetention`;
- :mod:`._retention`: ``prune`` and the sweep of whole threads (idle threads
  deleted or kept to their latest, ``keep_last`` per namespace, pending writes
  with their checkpoints), and what holds while it runs (the background
  sweep is :mod:`statekeeper.integrations._background`, shared with Agent
  Framework's storage).
- :mod:`._orphans`: pending-writes records whose checkpoint is gone (pruned or
  deleted through the store), for ``statekeeper verify`` and ``repair``.

See :class:`StatekeeperSaver` for the contract and ``docs/langgraph.md`` for what
changes against LangGraph's own savers (strict latest, sequence order).
"""

from __future__ import annotations

try:
    import langgraph.checkpoint.base  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "statekeeper.integrations.langgraph needs LangGraph: pip install 'statekeeper[langgraph]'"
    ) from exc

from ._retention import ThreadSweepReport
from ._saver import StatekeeperSaver

__all__ = ["StatekeeperSaver", "ThreadSweepReport"]
