"""``sqlite://``: the SQLite dialect of the SQL backend, on the stdlib ``sqlite3``
driver and statekeeper's own threads (:mod:`statekeeper._runtime`).

The modules, from the store down:

- :mod:`.store`: :class:`SqliteCheckpointStore`, SQLite's capabilities, and its
  runtime built from the options.
- :mod:`.dialect`: :class:`~.dialect.SqliteDialect`, what SQLite does differently
  (the SQL core's :class:`~..dialects.Dialect`).
- :mod:`.options`: :class:`SqliteOptions` (``inline_reads``), and the refusal of
  other dialects' options and of ``sqlite+aiosqlite://``.
- :mod:`.runtime`: :class:`SqliteRuntime`, the connections of one store: the writer,
  the reader threads, and the point reads on the event loop's thread under an
  inline budget; closing, and abandoning a store collected unclosed.
- :mod:`.workers`: the connection-owning threads, and the writer's group commit
  (one transaction, a savepoint per write, one COMMIT; SPEC S15).
- :mod:`.session`: :class:`SqliteSession`, the ``Session`` over one connection that
  every operation of :mod:`..store` runs on.
- :mod:`.compiler`: the SQL core's statements compiled once for ``sqlite3``.
- :mod:`.connect`: the file's path from the URL, the connection settings, WAL, and
  the writer's wait for the write lock.

Nothing here imports PostgreSQL or MySQL code.
"""

from __future__ import annotations

from .connect import OpenMode, sqlite_path
from .options import SqliteOptions
from .runtime import SqliteRuntime
from .session import SqliteSession
from .store import SqliteCheckpointStore

__all__ = [
    "OpenMode",
    "SqliteCheckpointStore",
    "SqliteOptions",
    "SqliteRuntime",
    "SqliteSession",
    "sqlite_path",
]
