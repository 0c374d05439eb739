"""``mysql://`` and ``mariadb://``: the SQL backend on MySQL/MariaDB (InnoDB, aiomysql).

Every operation is the SQL core's (:mod:`statekeeper.backends.sql.store`), run
through a SQLAlchemy async engine (:mod:`statekeeper.backends.sql.server`). The
modules:

- :mod:`.store`: :class:`MysqlCheckpointStore` (what the dialect declares) and
  :class:`MysqlOptions`, its options.
"""

from __future__ import annotations

from .store import MysqlCheckpointStore, MysqlOptions

__all__ = ["MysqlCheckpointStore", "MysqlOptions"]
