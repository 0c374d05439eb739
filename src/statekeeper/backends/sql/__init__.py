"""``sqlite://``, ``postgresql://`` and ``mysql://``: the SQL backend, on SQLAlchemy Core.
``docs/sql-backend.md`` documents URLs, options, the schema and migrations.

The modules:

- :mod:`.store`: :class:`SqlCheckpointStore`; every operation written once, as a
  synchronous function over a ``Session``; opening, ``verify`` and ``repair``.
- :mod:`.stores`: the per-dialect subclasses (capabilities, runtime, options).
- :mod:`.options`: :class:`SqlOptions` and the URL schemes and drivers.
- :mod:`.writes`: inserts (``save``, ``save_many``) and the tags and fields rows.
- :mod:`.integrity`: damage: the meta probe on open, the read-only checks of
  ``verify`` and the rebuilds of ``repair`` (records are the truth).
- :mod:`.store_ids`: the store id the records carry, which decides over a damaged
  ``store_id`` meta row.
- :mod:`.schema_check`: the tables and indexes a schema version needs, checked by
  ``verify`` and recreated by ``repair``.
- :mod:`.schema`: the tables and every statement, built once with SQLAlchemy Core.
- :mod:`.dialects`: the few things that differ per dialect (sequence, upserts,
  locks, error mapping); statements are built and cached per dialect.
- :mod:`.migrations`: versioned schema steps, applied under a lock on open.
- :mod:`.sqlite`: stdlib ``sqlite3`` on one worker thread per connection.
- :mod:`.server`: PostgreSQL and MySQL/MariaDB through a SQLAlchemy async engine.
- :mod:`.pg`: PostgreSQL's sequences from transaction ids, its listing horizon, and
  the hot statements as prepared asyncpg statements.
- :mod:`.pg_listing`: PostgreSQL's listing pages on that lean path, and the horizon
  of the store's saves in flight that a listing of every stream stays below.
"""

from __future__ import annotations

from .sqlite import SqliteCheckpointStore
from .store import SqlCheckpointStore, SqlOptions
from .stores import MysqlCheckpointStore, PostgresCheckpointStore

__all__ = [
    "MysqlCheckpointStore",
    "PostgresCheckpointStore",
    "SqlCheckpointStore",
    "SqlOptions",
    "SqliteCheckpointStore",
]
