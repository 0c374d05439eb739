"""LangGraph checkpoints in a statekeeper store (extra ``langgraph``).

::

    from statekeeper.integrations.langgraph import StatekeeperSaver

    async with StatekeeperSaver.from_conn_string("sqlite:///graph.db") as saver:
        graph = builder.compile(checkpointer=saver)

The modules: :mod:`._saver` (the saver), :mod:`._open` (``from_conn_string`` and
a saver opened from a URL), :mod:`._layout` (streams, ids, tags and the record
frames), :mod:`._listing` (``list``), :mod:`._filters` (how ``filter=`` matches
nested metadata), :mod:`._threads` (thread copy, delete and prune) and
:mod:`._bridge` (running calls on the store's event loop).

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

from ._saver import StatekeeperSaver

__all__ = ["StatekeeperSaver"]
