"""``postgresql://`` and ``postgres://``: the SQL backend on PostgreSQL (asyncpg).

Sequences come from transaction ids, listings of every stream stay below a
horizon, and the hot operations run on a lean path of prepared asyncpg
statements (the :mod:`.sequences` docstring explains all three). Everything else
is the SQL core's (:mod:`statekeeper.backends.sql.store`) on a SQLAlchemy engine.
The modules:

- :mod:`.store`: :class:`PostgresCheckpointStore`, the SQL core's store with the
  lean path for ``save``, ``save_many``, ``get_latest``, ``load`` and ``list``.
- :mod:`.options`: :class:`PostgresOptions` (``listing_wait``).
- :mod:`.dialect`: :class:`~.dialect.PostgresDialect`, what PostgreSQL does
  differently (advisory locks, ``ON CONFLICT``, the catalog, error codes, the
  connection settings and those of one transaction behind a pooler).
- :mod:`.statements`: every statement of the lean path, built in this one place
  (Core statements of :mod:`..schema` where the dialects share them) and compiled
  once for asyncpg's ``$n`` parameters.
- :mod:`.sequences`: saves at sequences from the saving transaction's id, one
  statement per save or batch; the slow path that replaces expired ids.
- :mod:`.seq_base`: the ``seq_base`` meta row that keeps those sequences above
  every stored one; its checks in ``verify`` and its repair.
- :mod:`.listing`: listed pages, a page and its probe in one round trip, and the
  wait of a listing of every stream for this store's saves in flight.
- :mod:`.runtime`: :class:`~.runtime.PgRuntime`, the SQLAlchemy runtime plus a
  small pool of asyncpg connections (public asyncpg API only).
"""

from __future__ import annotations

from .options import PostgresOptions
from .store import PostgresCheckpointStore

__all__ = ["PostgresCheckpointStore", "PostgresOptions"]
