"""Adapters that put a statekeeper store under an agent framework.

- :mod:`statekeeper.integrations.langgraph` (a package): ``StatekeeperSaver``, a
  LangGraph ``BaseCheckpointSaver`` (extra ``langgraph``).
- :mod:`statekeeper.integrations.agent_framework` (a package):
  ``StatekeeperCheckpointStorage``, a Microsoft Agent Framework ``CheckpointStorage``
  (extra ``agent-framework``).

- :mod:`._background`: the background sweep task both adapters run for their
  retention (``sweep_interval_minutes``, ``sweep_every``).
- :mod:`statekeeper.integrations.importers`: ``statekeeper import``, the frameworks'
  existing checkpoints into any store (Agent Framework here, its checkpoint files
  read with ``aiofiles``; LangGraph's ``SqliteSaver`` and ``PostgresSaver`` in
  :mod:`._import_langgraph`, one body for both; the result types they share in
  :mod:`._import_common`).

This package imports nothing, so that importing one adapter never needs the other
framework installed.
"""
