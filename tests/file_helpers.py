"""Helpers shared by the file backend's tests."""

from __future__ import annotations

from typing import Any

from statekeeper.backends.file import FileCheckpointStore


def count_hops(store: FileCheckpointStore) -> list[str]:
    """Record the name of every worker hop ``store`` makes from now on (the list grows)."""
    hops: list[str] = []
    run = store._run

    async def counted(what: str, func: Any, *args: Any) -> Any:
        hops.append(what)
        return await run(what, func, *args)

    store._run = counted  # type: ignore[method-assign]
    return hops
