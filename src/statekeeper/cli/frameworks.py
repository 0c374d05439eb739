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
    from ..errors import StatekeeperError
    from ..models import Problem  # pydantic: only when a command runs

    try:
        if not await store.list_streams(prefix=_LANGGRAPH_ROOT):
            return None, []
    except StatekeeperError as exc:
        # a damaged store (verify reports the damage itself): not checked, and said so
        unreadable = Problem(
            kind="unchecked",
            location=f"streams {_LANGGRAPH_ROOT}*",
            reason=f"LangGraph pending writes not checked: the streams cannot be listed ({exc})",
        )
        return None, [unreadable]
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
    from ..errors import StatekeeperError
    from ..models import Problem

    orphans, unchecked = await _langgraph(store)
    if orphans is None:
        return unchecked
    try:
        problems: list[Problem] = await orphans.orphaned_writes(store)
    except StatekeeperError as exc:
        reason = f"LangGraph pending writes not checked: {exc}"
        return [Problem(kind="unchecked", location=f"streams {_LANGGRAPH_ROOT}*", reason=reason)]
    return problems


async def remove_orphans(store: BaseCheckpointStore) -> dict[str, int]:
    """What ``repair`` adds: the orphaned LangGraph writes records removed, as a
    ``rebuilt`` count (empty when there were none or they cannot be checked: a
    store that stays damaged says so in its own report, and verify after it)."""
    from ..errors import StatekeeperError

    orphans, _ = await _langgraph(store)
    if orphans is None:
        return {}
    try:
        removed: int = await orphans.remove_orphaned_writes(store)
    except StatekeeperError:
        return {}  # still damaged: repair's own report says so, and verify says "unchecked"
    return {"langgraph_orphaned_writes": removed} if removed else {}
