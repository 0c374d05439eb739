"""``statekeeper import``: bring a framework's existing checkpoints into any store.

Each importer reads the source with the framework's own reader, strictly and one
item at a time, so an unreadable item is reported (never dropped silently) and the
rest still comes across; and it writes through the matching integration, so the
integration reads the imported checkpoints exactly as the framework read them.
Re-running an import is safe: an item already in the store (same id, same
stream) is counted as already present and left alone.

- :func:`import_agent_framework`: an Agent Framework ``FileCheckpointStorage``
  directory, into :class:`~statekeeper.integrations.agent_framework.StatekeeperCheckpointStorage`.
- :func:`import_langgraph_sqlite`: a LangGraph ``SqliteSaver`` database, and
  :func:`import_langgraph_postgres`: a LangGraph ``PostgresSaver`` database, into
  :class:`~statekeeper.integrations.langgraph.StatekeeperSaver` (both in
  :mod:`._import_langgraph`, one body for the two sources).

Order: the target store orders by its own sequence, so the import order decides
which checkpoint the integration calls newest. Agent Framework files carry only a
timestamp, so they are imported oldest timestamp first (ties by file name), which
makes the newest by sequence the one ``FileCheckpointStorage.get_latest`` would
pick. LangGraph checkpoint ids sort in creation order within a thread, and each
thread and namespace is imported in that order, parents before children.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._core.store import BaseCheckpointStore
from ..errors import CheckpointDecodeError, StatekeeperError, StoreNotFound
from ._import_common import Advance, ImportProblem, ImportResult, chunks
from ._import_langgraph import (
    check_langgraph_postgres_source,
    check_langgraph_sqlite_source,
    import_langgraph_postgres,
    import_langgraph_sqlite,
    postgres_conninfo,
)

__all__ = [
    "ImportProblem",
    "ImportResult",
    "check_agent_framework_source",
    "check_langgraph_postgres_source",
    "check_langgraph_sqlite_source",
    "import_agent_framework",
    "import_langgraph_postgres",
    "import_langgraph_sqlite",
    "postgres_conninfo",
]

# -- Agent Framework ------------------------------------------------------------------


def check_agent_framework_source(directory: str | os.PathLike[str]) -> None:
    """Raise unless ``directory`` can be imported: :class:`StoreNotFound` when it is
    not a directory (it may hold no checkpoints yet), :class:`StatekeeperError` when
    ``agent-framework-core`` is missing. Only reads. :func:`import_agent_framework`
    checks this first; a caller that creates the target store calls it before doing
    so, so that a mistyped source leaves nothing behind."""
    try:
        import agent_framework  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise StatekeeperError(
            "importing Agent Framework checkpoints needs agent-framework-core: "
            "pip install 'statekeeper[agent-framework]'"
        ) from exc
    root = Path(directory)
    if not root.is_dir():
        raise StoreNotFound(f"{root} is not a directory of Agent Framework checkpoints")


async def import_agent_framework(
    directory: str | os.PathLike[str],
    target: BaseCheckpointStore,
    *,
    allowed_checkpoint_types: Iterable[str] = (),
    advance: Advance | None = None,
) -> ImportResult:
    """Import every checkpoint of a ``FileCheckpointStorage`` directory into ``target``
    (an open store with ``codec="raw"``).

    Each ``*.json`` file is read with ``aiofiles`` and decoded strictly, as the
    framework's own ``FileCheckpointStorage.load`` decodes it (its JSON, then
    ``decode_checkpoint_value`` under ``allowed_checkpoint_types``, refused in its
    words); a file that
    does not load, a link, or anything not a regular file is reported. The source
    is only read (a missing directory raises :class:`StoreNotFound`, and is not
    created).
    """
    from agent_framework import WorkflowCheckpointException

    from .agent_framework import StatekeeperCheckpointStorage
    from .agent_framework._codec import CheckpointCodec

    root = Path(directory)
    files = await asyncio.to_thread(_checkpoint_files, root)
    allowed = list(allowed_checkpoint_types)
    # the encoding FileCheckpointStorage writes is the one our records hold
    source = CheckpointCodec("af", allowed)
    sink = StatekeeperCheckpointStorage(target, allowed_checkpoint_types=allowed)
    result = ImportResult()
    loaded: list[tuple[str, str, Any]] = []
    for path, regular in files:
        result.seen += 1
        if not regular:
            result.problem(str(path), "not a regular file (links and devices are not followed)")
            continue
        try:
            checkpoint = source.decode_value(_parse(await _read_file(path), path.stem), path.stem)
        except (WorkflowCheckpointException, OSError, ValueError) as exc:
            result.problem(str(path), exc)
            continue
        if checkpoint.checkpoint_id != path.stem:
            result.problem(
                str(path), f"the file holds checkpoint {checkpoint.checkpoint_id!r}, not its name"
            )
            continue
        loaded.append((str(checkpoint.timestamp), path.name, checkpoint))
    loaded.sort(key=lambda entry: (entry[0], entry[1]))
    for batch in chunks(loaded):
        ids = {sink.store_id_for(cp.checkpoint_id): cp for _, _, cp in batch}
        present = await _present(target, list(ids))
        for store_id, checkpoint in ids.items():
            header = present.get(store_id)
            if header is not None:
                if header.stream == sink.stream_for(checkpoint.workflow_name):
                    result.already_present += 1
                else:
                    result.problem(
                        f"{root / checkpoint.checkpoint_id}.json",
                        f"id {checkpoint.checkpoint_id!r} is already in the store under "
                        f"another workflow; left alone",
                    )
            else:
                try:
                    await sink.save(checkpoint)
                    result.imported += 1
                except WorkflowCheckpointException as exc:
                    result.problem(f"{root / checkpoint.checkpoint_id}.json", exc)
        if advance is not None:
            advance(len(batch))
    return result


async def _read_file(path: Path) -> bytes:
    """A foreign file's bytes, read off the event loop: ``aiofiles`` runs the
    blocking calls in the loop's executor. A one-off read per file of an import,
    never a store's hot path (the stores read through their own worker threads)."""
    import aiofiles  # only when an import reads files

    async with aiofiles.open(path, "rb") as file:
        return await file.read()


def _parse(data: bytes, checkpoint_id: str) -> Any:
    """A checkpoint file's JSON, refused in ``FileCheckpointStorage.load``'s words."""
    from agent_framework import WorkflowCheckpointException

    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise WorkflowCheckpointException(
            f"Checkpoint file for {checkpoint_id} is not valid UTF-8 and cannot be loaded."
        ) from exc
    except json.JSONDecodeError as exc:
        raise WorkflowCheckpointException(
            f"Checkpoint file for {checkpoint_id} is not valid JSON and cannot be loaded."
        ) from exc


def _checkpoint_files(root: Path) -> list[tuple[Path, bool]]:
    """The ``*.json`` entries of ``root`` in name order, each with whether it is a
    regular file (``FileCheckpointStorage`` would create a missing directory, so
    its absence is checked here first)."""
    check_agent_framework_source(root)
    return [(path, stat.S_ISREG(os.lstat(path).st_mode)) for path in sorted(root.glob("*.json"))]


async def _present(target: BaseCheckpointStore, ids: list[str]) -> dict[str, Any]:
    """Headers of the ids already live in ``target``; a damaged one counts as present
    (importing over it would silently replace an acknowledged checkpoint)."""
    try:
        return await target.load_many(ids, include_state=False)
    except CheckpointDecodeError:
        found: dict[str, Any] = {}
        for id in ids:
            try:
                found[id] = await target.load(id, include_state=False)
            except CheckpointDecodeError as exc:
                raise StatekeeperError(
                    f"the target store has a damaged checkpoint {id!r} that this import would "
                    f"write over; run 'statekeeper verify' and 'statekeeper repair' first: {exc}"
                ) from exc
            except StatekeeperError:
                continue
        return found
