"""Adapters: one per store under test (statekeeper and the peers)."""
