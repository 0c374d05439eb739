"""``statekeeper import``: bring a framework's existing checkpoints into any store.

Each importer reads the source with the framework's own reader, strictly and one
item at a time, so an unreadable item is reported (never dropped silently) and the
rest still comes across; and it writes through the matching integration, so the
integration reads the imported checkpoints exactly as the framework read them.
Re-running an import is safe: an item already in the store (same id, same
stream) is counted as already present and left alone.

- :func:`import_agent_framework`: an Agent Framework ``FileCheckpointStorage``
  directory, into :class:`~statekeeper.integrations.agent_framework.StatekeeperCheckpointStorage`.
- :func:`import_langgraph_sqlite`: a LangGraph ``SqliteSaver`` database, into
  :class:`~statekeeper.integrations.langgraph.StatekeeperSaver`.

Order: the target store orders by its own sequence, so the import order decides
which checkpoint the integration calls newest. Agent Framework files carry only a
timestamp, so they are imported oldest timestamp first (ties by file name), which
makes the newest by sequence the one ``FileCheckpointStorage.get_latest`` would
pick. LangGraph checkpoint ids sort in creation order within a thread, and each
thread and namespace is imported in that order, parents before children.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._protocol import BaseCheckpointStore
from ..errors import CheckpointDecodeError, StatekeeperError, StoreNotFound

__all__ = [
    "ImportProblem",
    "ImportResult",
    "check_agent_framework_source",
    "check_langgraph_sqlite_source",
    "import_agent_framework",
    "import_langgraph_sqlite",
]

Advance = Callable[[int], None]


@dataclass(frozen=True)
class ImportProblem:
    """A source item that was not imported, and why."""

    location: str
    reason: str
    error: str

    def as_json(self) -> dict[str, str]:
        return {"location": self.location, "reason": self.reason, "error": self.error}


@dataclass
class ImportResult:
    """What an import did: items seen in the source, imported now, present from an
    earlier run, and the problems (unreadable items, conflicts)."""

    seen: int = 0
    imported: int = 0
    already_present: int = 0
    problems: list[ImportProblem] = field(default_factory=list)

    def problem(self, location: str, exc: BaseException | str) -> None:
        if isinstance(exc, BaseException):
            self.problems.append(ImportProblem(location, str(exc), type(exc).__name__))
        else:
            self.problems.append(ImportProblem(location, exc, "Conflict"))


def _chunks(items: list[Any], size: int = 500) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


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

    Each ``*.json`` file is loaded strictly by the framework's own
    ``FileCheckpointStorage.load`` under ``allowed_checkpoint_types``; a file that
    does not load, a link, or anything not a regular file is reported. The source
    is only read (a missing directory raises :class:`StoreNotFound`, and is not
    created).
    """
    from agent_framework import FileCheckpointStorage, WorkflowCheckpointException

    from .agent_framework import StatekeeperCheckpointStorage

    root = Path(directory)
    files = await asyncio.to_thread(_checkpoint_files, root)
    allowed = list(allowed_checkpoint_types)
    source = FileCheckpointStorage(root, allowed_checkpoint_types=allowed)
    sink = StatekeeperCheckpointStorage(target, allowed_checkpoint_types=allowed)
    result = ImportResult()
    loaded: list[tuple[str, str, Any]] = []
    for path, regular in files:
        result.seen += 1
        if not regular:
            result.problem(str(path), "not a regular file (links and devices are not followed)")
            continue
        try:
            checkpoint = await source.load(path.stem)
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
    for batch in _chunks(loaded):
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


# -- LangGraph ------------------------------------------------------------------------


_LANGGRAPH_ROWS = (
    "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints "
    "ORDER BY thread_id, checkpoint_ns, checkpoint_id"
)


def check_langgraph_sqlite_source(path: str | os.PathLike[str]) -> None:
    """Raise unless ``path`` is a LangGraph ``SqliteSaver`` database that this
    environment can read: :class:`StoreNotFound` for no such file,
    :class:`StatekeeperError` for a file that is not such a database or a missing
    ``langgraph-checkpoint-sqlite``. Opens it read-only and reads no rows.
    :func:`import_langgraph_sqlite` checks this first; a caller that creates the
    target store calls it before doing so."""
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise StatekeeperError(
            "importing a LangGraph SqliteSaver database needs langgraph-checkpoint-sqlite: "
            "pip install langgraph-checkpoint-sqlite"
        ) from exc
    _langgraph_query(Path(path), _LANGGRAPH_ROWS + " LIMIT 0")


def _langgraph_query(path: Path, sql: str) -> list[Any]:
    if not path.is_file():
        raise StoreNotFound(f"{path} is not a LangGraph SqliteSaver database")
    uri = f"file:{path}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.Error as exc:
        raise StatekeeperError(f"{path} is not a LangGraph SqliteSaver database: {exc}") from exc


def _langgraph_rows(path: Path) -> list[tuple[str, str, str]]:
    """(thread_id, checkpoint_ns, checkpoint_id) of every checkpoint, in creation
    order within each thread and namespace, read-only."""
    return [(str(t), str(ns), str(c)) for t, ns, c in _langgraph_query(path, _LANGGRAPH_ROWS)]


async def import_langgraph_sqlite(
    path: str | os.PathLike[str],
    target: BaseCheckpointStore,
    *,
    advance: Advance | None = None,
) -> ImportResult:
    """Import every checkpoint and pending write of a LangGraph ``SqliteSaver``
    database into ``target`` (an open store with ``codec="raw"``).

    Each checkpoint is read strictly by ``SqliteSaver.get_tuple`` (the database is
    opened read-only); one that does not load is reported. Needs the
    ``langgraph-checkpoint-sqlite`` package.
    """
    check_langgraph_sqlite_source(path)
    from langgraph.checkpoint.sqlite import SqliteSaver

    from .langgraph import StatekeeperSaver

    source_path = Path(path)
    rows = await asyncio.to_thread(_langgraph_rows, source_path)
    conn = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True, check_same_thread=False)
    try:
        source = SqliteSaver(conn)
        sink = StatekeeperSaver(target)
        result = ImportResult()
        for batch in _chunks(rows):
            for thread_id, ns, checkpoint_id in batch:
                result.seen += 1
                where = f"{source_path} thread {thread_id!r} ns {ns!r} checkpoint {checkpoint_id!r}"
                config = {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": checkpoint_id,
                    }
                }
                try:
                    item = source.get_tuple(config)  # type: ignore[arg-type]
                except Exception as exc:  # the source's own decode failures, reported
                    result.problem(where, exc)
                    continue
                if item is None:
                    result.problem(where, "the source row could not be read back")
                    continue
                if await sink.aget_tuple(config) is not None:  # type: ignore[arg-type]
                    result.already_present += 1
                    continue
                await _put_langgraph(sink, item)
                result.imported += 1
            if advance is not None:
                advance(len(batch))
        return result
    finally:
        conn.close()


async def _put_langgraph(sink: Any, item: Any) -> None:
    """Write one source ``CheckpointTuple`` and its pending writes through the saver."""
    configurable = dict(item.config["configurable"])
    parent = item.parent_config
    put_config = {
        "configurable": {
            "thread_id": configurable["thread_id"],
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            **(
                {"checkpoint_id": parent["configurable"]["checkpoint_id"]}
                if parent is not None
                else {}
            ),
        }
    }
    new_versions = dict(item.checkpoint.get("channel_versions", {}))
    saved = await sink.aput(put_config, item.checkpoint, item.metadata, new_versions)
    by_task: dict[tuple[str, str], list[tuple[str, Any]]] = {}
    for task_id, channel, value, *rest in item.pending_writes or ():
        task_path = rest[0] if rest else ""
        by_task.setdefault((task_id, task_path), []).append((channel, value))
    for (task_id, task_path), writes in by_task.items():
        await sink.aput_writes(saved, writes, task_id, task_path)
