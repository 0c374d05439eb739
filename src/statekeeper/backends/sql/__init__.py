"""``sqlite://``, ``postgresql://`` and ``mysql://``: the SQL backend, on SQLAlchemy Core.
``docs/sql-backend.md`` documents URLs, options, the schema and migrations.

The modules:

- :mod:`.store`: :class:`SqlCheckpointStore` and its per-dialect subclasses; every
  operation written once, as a synchronous function over a ``Session``.
- :mod:`.schema`: the tables and every statement, built once with SQLAlchemy Core.
- :mod:`.dialects`: the few things that differ per dialect (sequence, upserts,
  locks, error mapping), with statements cached per dialect.
- :mod:`.migrations`: versioned schema steps, applied under a lock on open.
- :mod:`.sqlite`: stdlib ``sqlite3`` on one worker thread per connection.
- :mod:`.server`: PostgreSQL and MySQL/MariaDB through a SQLAlchemy async engine.
"""

from __future__ import annotations

from .store import (
    MysqlCheckpointStore,
    PostgresCheckpointStore,
    SqlCheckpointStore,
    SqliteCheckpointStore,
    SqlOptions,
)

__all__ = [
    "MysqlCheckpointStore",
    "PostgresCheckpointStore",
    "SqlCheckpointStore",
    "SqlOptions",
    "SqliteCheckpointStore",
]
