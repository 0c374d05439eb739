"""What ``verify`` and ``repair`` check beyond the store's own records: the
frameworks' layouts on top of it.

A LangGraph thread keeps each checkpoint's pending writes in a record of its own;
a prune or delete through the store leaves those behind
(:mod:`statekeeper.integrations.langgraph._orphans`). ``verify`` reports each one
(kind ``"orphan"``) and ``repair`` removes them. Only a store that has LangGraph
streams imports the adapter; without LangGraph installed such a store is reported
``"unchecked"`` rather than called sound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models import Problem

if TYPE_CHECKING:
    from .._core.store import BaseCheckpointStore

#: The prefix of every stream the LangGraph saver writes (its ``_layout.ROOT``).
_LANGGRAPH_ROOT = "langgraph/"


async def _langgraph(store: BaseCheckpointStore) -> Any:
    """The adapter's orphans module, None without LangGraph streams, or a Problem
    saying they could not be checked."""
    if not await store.list_streams(prefix=_LANGGRAPH_ROOT):
        return None
    try:
        from ..integrations.langgraph import _orphans
    except ImportError:
        return Problem(
            kind="unchecked",
            location=f"streams {_LANGGRAPH_ROOT}*",
            reason=(
                "LangGraph threads whose pending writes were not checked: "
                "install statekeeper[langgraph] to check them"
            ),
        )
    return _orphans


async def framework_problems(store: BaseCheckpointStore) -> list[Problem]:
    """What ``verify`` adds to the store's report: LangGraph writes records whose
    checkpoint is gone (or that they could not be checked)."""
    found = await _langgraph(store)
    if found is None or isinstance(found, Problem):
        return [] if found is None else [found]
    problems: list[Problem] = await found.orphaned_writes(store)
    return problems


async def remove_orphans(store: BaseCheckpointStore) -> dict[str, int]:
    """What ``repair`` adds: the orphaned LangGraph writes records removed, as a
    ``rebuilt`` count (empty when there were none)."""
    found = await _langgraph(store)
    if found is None or isinstance(found, Problem):
        return {}
    removed: int = await found.remove_orphaned_writes(store)
    return {"langgraph_orphaned_writes": removed} if removed else {}
