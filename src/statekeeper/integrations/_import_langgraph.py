"""``statekeeper import`` of LangGraph's own savers: ``SqliteSaver`` and ``PostgresSaver``.

Both sources go through one body, :func:`_import_saver`: the source's rows are
listed as ``(thread, namespace, checkpoint id)`` in creation order within each
thread and namespace (LangGraph's ids sort so), each checkpoint is read strictly
by the framework's own ``get_tuple`` (its pending writes and subgraph namespaces
included), and written through :class:`~statekeeper.integrations.langgraph.StatekeeperSaver`,
so the saver reads it as the framework read it. One that does not load is
reported, never dropped silently; one already in the target is counted and left
alone, so a re-run (after a crash, say) continues where the last one stopped.

The sources are only read: the SQLite file is opened with ``mode=ro``, the
PostgreSQL session is set ``READ ONLY``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StatekeeperError, StoreNotFound
from ._import_common import Advance, ImportResult, chunks

if TYPE_CHECKING:
    from .._core.store import BaseCheckpointStore

Rows = list[tuple[str, str, str]]

_ROWS = (
    "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints "
    "ORDER BY thread_id, checkpoint_ns, checkpoint_id"
)


async def _import_saver(
    rows: Rows,
    get_tuple: Callable[[Any], Any],
    where: str,
    target: BaseCheckpointStore,
    advance: Advance | None,
) -> ImportResult:
    """The one import body: ``get_tuple`` is the source saver's, run on a thread."""
    from .langgraph import StatekeeperSaver

    sink = StatekeeperSaver(target)
    result = ImportResult()
    for batch in chunks(rows):
        for thread_id, ns, checkpoint_id in batch:
            result.seen += 1
            location = f"{where} thread {thread_id!r} ns {ns!r} checkpoint {checkpoint_id!r}"
            config = {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                }
            }
            try:
                item = await asyncio.to_thread(get_tuple, config)
            except Exception as exc:  # the source's own decode failures, reported
                result.problem(location, exc)
                continue
            if item is None:
                result.problem(location, "the source row could not be read back")
                continue
            if await sink.aget_tuple(config) is not None:  # type: ignore[arg-type]
                result.already_present += 1
                continue
            await _put(sink, item)
            result.imported += 1
        if advance is not None:
            advance(len(batch))
    return result


async def _put(sink: Any, item: Any) -> None:
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


def _text_rows(rows: Iterable[Any]) -> Rows:
    return [(str(t), str(ns), str(c)) for t, ns, c in rows]


# -- SqliteSaver ------------------------------------------------------------------------


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
    _sqlite_query(Path(path), _ROWS + " LIMIT 0")


def _sqlite_query(path: Path, sql: str) -> list[Any]:
    if not path.is_file():
        raise StoreNotFound(f"{path} is not a LangGraph SqliteSaver database")
    uri = f"file:{path}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.Error as exc:
        raise StatekeeperError(f"{path} is not a LangGraph SqliteSaver database: {exc}") from exc


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

    source_path = Path(path)
    rows = _text_rows(await asyncio.to_thread(_sqlite_query, source_path, _ROWS))
    conn = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True, check_same_thread=False)
    try:
        source = SqliteSaver(conn)
        return await _import_saver(rows, source.get_tuple, str(source_path), target, advance)
    finally:
        conn.close()


# -- PostgresSaver ----------------------------------------------------------------------


def postgres_conninfo(conn_string: str) -> str:
    """The libpq connection string ``PostgresSaver.from_conn_string`` takes; a
    statekeeper URL's ``+driver`` (``postgresql+asyncpg://``) is dropped, so the
    URL of a statekeeper store on the same server works too."""
    for prefix in ("postgresql+", "postgres+"):
        if conn_string.startswith(prefix):
            _, _, rest = conn_string.partition("://")
            return "postgresql://" + rest
    return conn_string


def _postgres_connect(conn_string: str) -> Any:
    """A read-only psycopg connection as ``PostgresSaver.from_conn_string`` makes
    one (autocommit, no prepared statements, dict rows)."""
    try:
        from psycopg import Connection, OperationalError
        from psycopg.rows import dict_row
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise StatekeeperError(
            "importing a LangGraph PostgresSaver database needs langgraph-checkpoint-postgres "
            "and psycopg: pip install langgraph-checkpoint-postgres 'psycopg[binary]'"
        ) from exc
    try:
        conn = Connection.connect(
            postgres_conninfo(conn_string),
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
        )
    except OperationalError as exc:
        raise StoreNotFound(f"cannot connect to the LangGraph PostgreSQL source: {exc}") from exc
    # set here, not through options=, which would replace the caller's own options
    conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    return conn


def _postgres_rows(conn: Any, *, limit: int | None = None) -> Rows:
    import psycopg

    sql = _ROWS + ("" if limit is None else f" LIMIT {int(limit)}")
    try:
        got = conn.execute(sql).fetchall()
    except psycopg.Error as exc:
        raise StatekeeperError(
            f"the source is not a LangGraph PostgresSaver database (no readable "
            f"checkpoints table; was setup() run?): {exc}"
        ) from exc
    return _text_rows((r["thread_id"], r["checkpoint_ns"], r["checkpoint_id"]) for r in got)


def check_langgraph_postgres_source(conn_string: str) -> None:
    """Raise unless ``conn_string`` reaches a LangGraph ``PostgresSaver`` database:
    :class:`StoreNotFound` when the server cannot be reached,
    :class:`StatekeeperError` when it has no ``checkpoints`` table or
    ``langgraph-checkpoint-postgres`` is missing. Reads no rows."""
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise StatekeeperError(
            "importing a LangGraph PostgresSaver database needs langgraph-checkpoint-postgres: "
            "pip install langgraph-checkpoint-postgres 'psycopg[binary]'"
        ) from exc
    with _postgres_connect(conn_string) as conn:
        _postgres_rows(conn, limit=0)


async def import_langgraph_postgres(
    conn_string: str,
    target: BaseCheckpointStore,
    *,
    advance: Advance | None = None,
) -> ImportResult:
    """Import every checkpoint and pending write of a LangGraph ``PostgresSaver``
    database (``conn_string`` as ``PostgresSaver.from_conn_string`` takes it) into
    ``target`` (an open store with ``codec="raw"``).

    Each checkpoint is read strictly by ``PostgresSaver.get_tuple`` in a read-only
    session; one that does not load is reported. Needs the
    ``langgraph-checkpoint-postgres`` package and ``psycopg``.
    """
    check_langgraph_postgres_source(conn_string)
    from langgraph.checkpoint.postgres import PostgresSaver

    conn = await asyncio.to_thread(_postgres_connect, conn_string)
    try:
        rows = await asyncio.to_thread(_postgres_rows, conn)
        source = PostgresSaver(conn)
        where = _scrubbed(conn_string)
        return await _import_saver(rows, source.get_tuple, where, target, advance)
    finally:
        conn.close()


def _scrubbed(conn_string: str) -> str:
    """The source as reports name it, without a password."""
    from .._url import StoreURL

    try:
        return str(StoreURL.parse(postgres_conninfo(conn_string)))
    except Exception:
        return "the PostgreSQL source"
