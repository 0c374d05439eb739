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

if TYPE_CHECKING:
    from .._core.store import BaseCheckpointStore
    from ..models import Problem

#: The prefix of every stream the LangGraph saver writes (its ``_layout.ROOT``).
_LANGGRAPH_ROOT = "langgraph/"


async def _langgraph(store: BaseCheckpointStore) -> tuple[Any, list[Problem]]:
    """``(the adapter's orphans module, [])`` for a store with LangGraph streams;
    ``(None, [])`` without them; ``(None, [a Problem])`` when LangGraph is not
    installed to check them."""
    from ..models import Problem  # pydantic: only when a command runs

    if not await store.list_streams(prefix=_LANGGRAPH_ROOT):
        return None, []
    try:
        from ..integrations.langgraph import _orphans
    except ImportError:
        unchecked = Problem(
            kind="unchecked",
            location=f"streams {_LANGGRAPH_ROOT}*",
            reason=(
                "LangGraph threads whose pending writes were not checked: "
                "install statekeeper[langgraph] to check them"
            ),
        )
        return None, [unchecked]
    return _orphans, []


async def framework_problems(store: BaseCheckpointStore) -> list[Problem]:
    """What ``verify`` adds to the store's report: LangGraph writes records whose
    checkpoint is gone (or that they could not be checked)."""
    orphans, unchecked = await _langgraph(store)
    if orphans is None:
        return unchecked
    problems: list[Problem] = await orphans.orphaned_writes(store)
    return problems


async def remove_orphans(store: BaseCheckpointStore) -> dict[str, int]:
    """What ``repair`` adds: the orphaned LangGraph writes records removed, as a
    ``rebuilt`` count (empty when there were none or they cannot be checked)."""
    orphans, _ = await _langgraph(store)
    if orphans is None:
        return {}
    removed: int = await orphans.remove_orphaned_writes(store)
    return {"langgraph_orphaned_writes": removed} if removed else {}
