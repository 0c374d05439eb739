"""``mysql://`` and ``mariadb://``: the SQL backend on MySQL/MariaDB (InnoDB, aiomysql).

Every operation is the SQL core's (:mod:`statekeeper.backends.sql.store`), run
through a SQLAlchemy async engine (:mod:`statekeeper.backends.sql.server`). The
modules:

- :mod:`.store`: :class:`MysqlCheckpointStore` (what the dialect declares) and
  :class:`MysqlOptions`, its options.
- :mod:`.dialect`: :class:`~.dialect.MysqlDialect`, what MySQL does differently
  (the counter through ``LAST_INSERT_ID``, ``GET_LOCK``, text as UTF-8 bytes,
  error codes, connection settings), and its MariaDB variant.
"""

from __future__ import annotations

from .store import MysqlCheckpointStore, MysqlOptions

__all__ = ["MysqlCheckpointStore", "MysqlOptions"]
