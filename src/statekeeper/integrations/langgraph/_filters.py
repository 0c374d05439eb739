"""How ``StatekeeperSaver.list(filter=...)`` matches a checkpoint's metadata.

LangGraph's own savers disagree on nested metadata, so the saver answers both
idioms, each as the saver that defines it answers it:

- **A dotted key** is a path, as ``SqliteSaver`` reads it (``json_extract(metadata,
  '$.user.access-level')``): ``{"user.access-level": "admin"}`` matches metadata
  ``{"user": {"access-level": "admin"}}``. Where no such path exists, a top-level
  key spelled with the dots is compared instead, as ``InMemorySaver`` compares it.
- **An object or array value** matches by containment, as ``PostgresSaver``'s
  ``metadata @> filter`` does: ``{"user": {"access-level": "admin"}}`` matches
  ``{"user": {"access-level": "admin", "name": "ann"}}``; an array matches an
  array holding each of its elements (in any order). Where the filter's object is
  the whole stored object, this is also what ``SqliteSaver`` answers.
- **A scalar** matches an equal value, and ``None`` matches a missing key too, as
  ``InMemorySaver`` and ``SqliteSaver`` (``IS NULL``) answer. Equal is Python's
  ``==``, as both compare: ``1`` matches ``1.0``, and ``True`` matches ``1`` and
  ``1.0`` (``False``, ``0``). ``PostgresSaver`` (jsonb) agrees on numbers but keeps
  booleans apart from them; where the peers disagree the saver answers as
  ``InMemorySaver`` and ``SqliteSaver`` do. The same at the top level, nested and
  dotted. (The store's own ``list(metadata=)`` compares by JSON kind, SPEC S14;
  this is the adapter's rule, for LangGraph's filters.)

Every filter is matched here, on the decoded LangGraph metadata of each
checkpoint of the listing (its checkpoint is decoded only if it matches), as
LangGraph's SQL savers match it on each row of the thread. Nothing is ever
dropped for being unanswerable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING = object()


def matches(metadata: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    """Whether ``metadata`` (LangGraph's decoded metadata) matches every key of
    ``query``; see the module docstring."""
    for key, want in query.items():
        found = _lookup(metadata, key)
        if want is None:
            if found is not _MISSING and found is not None:
                return False
        elif found is _MISSING or not _contains(found, want):
            return False
    return True


def _lookup(metadata: Mapping[str, Any], key: Any) -> Any:
    if isinstance(key, str) and "." in key:
        node: Any = metadata
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            return node
    return metadata.get(key, _MISSING)


def _contains(found: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        return isinstance(found, Mapping) and all(
            k in found and _contains(found[k], v) for k, v in want.items()
        )
    if isinstance(want, list | tuple):
        return isinstance(found, list | tuple) and all(
            any(_contains(f, w) for f in found) for w in want
        )
    return bool(found == want)
