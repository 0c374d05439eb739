"""``sqlite://``, ``postgresql://`` and ``mysql://``: the SQL backend, on SQLAlchemy Core.
``docs/sql-backend.md`` documents URLs, options, the schema and migrations.

The SQL core (this package's modules) is every operation, written once; the
dialect packages :mod:`.sqlite`, :mod:`.postgres` and :mod:`.mysql` hold what
differs: each its store class, its options class and its
:class:`~.dialects.Dialect`, whose methods the core calls. Opening a SQLite store imports
no server dialect: :class:`PostgresCheckpointStore`, :class:`MysqlCheckpointStore`
and their options are imported from here on first use. The modules:

- :mod:`.store`: :class:`SqlCheckpointStore`; every operation written once, as a
  synchronous function over a ``Session``, and where it runs.
- :mod:`.integrity`: damage: opening (the meta probe, migrations), ``verify`` and
  ``repair`` of one store's tables (records are the truth).
- :mod:`.server_store`: the base of the server dialects' stores.
- :mod:`.options`: :class:`SqlOptions` (what every dialect takes, and the refusal
  of another dialect's option) and the URL schemes and drivers.
- :mod:`.writes`: inserts (``save``, ``save_many``) and the tags and fields rows.
- :mod:`.updates`: ``update``, ``delete``, ``delete_stream``, ``prune``, ``purge``.
- :mod:`.entries`: scanned rows read back into a listing's entries.
- :mod:`.schema`: the tables and every statement, built once with SQLAlchemy Core.
- :mod:`.values`: the values the tables hold (expiry, hashes, index keys, filter
  parameters, prefix bounds).
- :mod:`.dialects`: the dialect interface, :class:`~.dialects.Dialect` (what
  differs per database, as methods), and the ``Session`` and ``Runtime`` every
  operation runs on.
- :mod:`.migrations`: versioned schema steps, applied under a lock on open.
- :mod:`.sqlite`: SQLite: :class:`SqliteCheckpointStore`, its options, and stdlib
  ``sqlite3`` on worker threads of its own.
- :mod:`.server`: PostgreSQL and MySQL/MariaDB through a SQLAlchemy async engine,
  and :class:`~.server.ServerDialect`, what their connections differ in.
- :mod:`.faults`: refused and lost connections, and the one retry of a read.
- :mod:`.outcomes`: a write whose reply a lost connection hid: the lookup of a
  save or update, or ``OutcomeUnknown``.
- :mod:`.postgres`: PostgreSQL: sequences from transaction ids, the listing
  horizon, and the hot statements as prepared asyncpg statements.
- :mod:`.mysql`: MySQL/MariaDB: :class:`MysqlCheckpointStore` and its dialect.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .options import SqlOptions
from .sqlite import SqliteCheckpointStore, SqliteOptions
from .store import SqlCheckpointStore

if TYPE_CHECKING:  # for type checkers and the reference docs; imported on first use
    from .mysql import MysqlCheckpointStore, MysqlOptions
    from .postgres import PostgresCheckpointStore, PostgresOptions

__all__ = [
    "MysqlCheckpointStore",
    "MysqlOptions",
    "PostgresCheckpointStore",
    "PostgresOptions",
    "SqlCheckpointStore",
    "SqlOptions",
    "SqliteCheckpointStore",
    "SqliteOptions",
]

_SERVER_DIALECTS = {
    "PostgresCheckpointStore": ".postgres",
    "PostgresOptions": ".postgres",
    "MysqlCheckpointStore": ".mysql",
    "MysqlOptions": ".mysql",
}


def __getattr__(name: str) -> Any:
    """A server dialect's class, imported on first use."""
    module = _SERVER_DIALECTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
