"""A Redis backend for statekeeper (work in progress)."""
