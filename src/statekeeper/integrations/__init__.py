"""Adapters that put a statekeeper store under an agent framework.

- :mod:`statekeeper.integrations.langgraph`: ``StatekeeperSaver``, a LangGraph
  ``BaseCheckpointSaver`` (extra ``langgraph``).
- :mod:`statekeeper.integrations.agent_framework`: ``StatekeeperCheckpointStorage``,
  a Microsoft Agent Framework ``CheckpointStorage`` (extra ``agent-framework``).

This package imports nothing, so that importing one adapter never needs the other
framework installed.
"""
