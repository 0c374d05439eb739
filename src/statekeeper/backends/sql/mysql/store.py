"""The MySQL/MariaDB store class and its options."""

from __future__ import annotations

from typing import ClassVar

from ....config import StoreOptions
from ..options import SqlOptions
from ..server_store import ServerSqlStore
from .dialect import MYSQL, MysqlDialect

__all__ = ["MysqlCheckpointStore", "MysqlOptions"]


class MysqlOptions(SqlOptions):
    """Options of a MySQL/MariaDB store: those of every SQL dialect."""

    dialect: ClassVar[str] = "MySQL/MariaDB"


class MysqlCheckpointStore(ServerSqlStore):
    """``mysql://`` / ``mariadb://`` (aiomysql), InnoDB.

    Durability is the server's (``innodb_flush_log_at_trx_commit=1``, the
    default); ``durability="fast"`` changes nothing here, since that setting is
    global.
    """

    Options: ClassVar[type[StoreOptions]] = MysqlOptions
    backend_name: ClassVar[str] = "mysql"
    dialect: ClassVar[MysqlDialect] = MYSQL
    options: MysqlOptions
