"""MySQL's :class:`~..dialects.Dialect`: :data:`MYSQL`, with :data:`MARIADB` its
variant for a MariaDB server, their column types and connection settings."""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.sql import Executable
from sqlalchemy.types import TypeDecorator

from ....errors import BackendError, StatekeeperError, StoreTimeout
from ..dialects import Dialect, Family, Session, collision, counter_damage, lock_key, lock_timeout
from ..schema import COUNTER_NAME
from ..server import ServerDialect

if TYPE_CHECKING:
    from ..options import SqlOptions
    from ..schema import Statements, Tables

__all__ = ["MARIADB", "MYSQL", "MysqlDialect"]

_HAS_TABLE = sa.text(
    "SELECT 1 FROM information_schema.tables "
    "WHERE table_schema = COALESCE(:schema, DATABASE()) AND table_name = :name"
)
_HAS_INDEX = sa.text(
    "SELECT 1 FROM information_schema.statistics WHERE table_schema = "
    "COALESCE(:schema, DATABASE()) AND table_name = :table AND index_name = :name LIMIT 1"
)
_INDEXES = sa.text(
    "SELECT index_name, MIN(non_unique) = 0 FROM information_schema.statistics "
    "WHERE table_schema = COALESCE(:schema, DATABASE()) AND table_name = :table "
    "AND index_name <> 'PRIMARY' GROUP BY index_name"
)
_PK = sa.text(
    "SELECT column_name FROM information_schema.statistics "
    "WHERE table_schema = COALESCE(:schema, DATABASE()) AND table_name = :table "
    "AND index_name = 'PRIMARY'"
)
_TIMEOUT = {1205, 3024}  # lock wait timeout, max_execution_time exceeded
# deadlock; a table created after this transaction's snapshot ("please retry")
_CONFLICT = {1213, 1412}
_DUPLICATE = 1062


class _Utf8Binary(TypeDecorator[str]):
    """MySQL: text stored as UTF-8 bytes, compared byte for byte.

    MySQL's text collations are case-insensitive or pad trailing spaces, so
    ``"a"``, ``"A"`` and ``"a "`` would be one stream, one id or one tag value.
    ``VARBINARY`` compares bytes, like PostgreSQL and SQLite compare text. Values
    are bound as text (the connection is utf8mb4), which the server converts.
    """

    impl = sa.VARBINARY
    cache_ok = True

    def bind_processor(self, dialect: sa.Dialect) -> None:
        return None  # not VARBINARY's, which would call bytes(str)

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> str | None:
        return None if value is None else bytes(value).decode("utf-8")


class _Base64Blob(TypeDecorator[bytes]):
    """MySQL: a ``LONGBLOB`` bound as base64 text and decoded by the server.

    aiomysql 0.3 cannot bind ``bytes`` with PyMySQL >= 1.2.3 (aio-libs/aiomysql
    #1080); text always binds, and base64 is smaller on the wire than the hex
    literal PyMySQL itself would send.
    """

    impl = sa.LargeBinary
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        from sqlalchemy.dialects.mysql import LONGBLOB

        return dialect.type_descriptor(LONGBLOB())

    def bind_expression(self, bindvalue: Any) -> Any:
        return sa.func.from_base64(bindvalue, type_=self)

    def bind_processor(self, dialect: sa.Dialect) -> Callable[[bytes | None], str | None]:
        def process(value: bytes | None) -> str | None:
            return None if value is None else base64.b64encode(value).decode("ascii")

        return process


def _errno(orig: BaseException | None) -> int | None:
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _bump(st: Statements) -> Executable:
    counter = st.t.counter
    return (
        counter.update()
        .where(counter.c.name == COUNTER_NAME)
        .values(hwm=sa.func.last_insert_id(counter.c.hwm + st.step))
    )


def _session_read_only(dbapi_conn: Any, record: Any) -> None:
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("SET SESSION TRANSACTION READ ONLY")
    finally:
        cursor.close()


class MysqlDialect(ServerDialect):
    """MySQL (InnoDB): ``GET_LOCK`` for migrations, the counter through
    ``LAST_INSERT_ID(expr)``, a duplicate-key error that keeps the transaction, text
    as UTF-8 bytes, and no ``CREATE INDEX IF NOT EXISTS``."""

    name: ClassVar[Family] = "mysql"
    default_driver: ClassVar[str] = "aiomysql"
    extra: ClassVar[str] = "mysql"
    url_query: ClassVar[Mapping[str, str]] = {"charset": "utf8mb4"}
    #: MariaDB has ``CREATE INDEX IF NOT EXISTS``; MySQL has not.
    index_if_not_exists: ClassVar[bool] = False

    def text(self, chars: int) -> sa.types.TypeEngine[str]:
        return _Utf8Binary(4 * chars)

    def blob(self) -> sa.types.TypeEngine[bytes]:
        # MySQL's plain BLOB stops at 64 KiB.
        return _Base64Blob()

    def table_options(self) -> dict[str, Any]:
        return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}

    def next_sequence(self, s: Session, st: Statements, count: int = 1) -> int:
        # LAST_INSERT_ID(expr) makes the server report expr as the statement's
        # insert id, so the new value comes back in the same round trip.
        value = s.lastrowid(self.statement(st, "bump", _bump), {"step": count})
        # A separate check here: a subquery inside the UPDATE would take InnoDB
        # next-key locks on the checkpoints table and deadlock concurrent savers.
        # This plain read runs after the counter lock is ours, so it sees every
        # committed save.
        top = s.first(st.max_seq)
        if not value or (top is not None and int(value) <= int(top[0])):
            raise BackendError(counter_damage(s, st))
        return int(value)

    def insert_checkpoint(self, s: Session, st: Statements, row: Mapping[str, Any]) -> bool:
        try:
            s.run(st.insert_cp, row)
        except sa.exc.IntegrityError as exc:
            # 1062: duplicate entry. InnoDB rolls back the statement only.
            if _errno(exc.orig) == _DUPLICATE and s.first(st.raw_read, {"id": row["id"]}):
                return False
            raise
        return True

    def migration_lock(self, s: Session, tables: Tables, timeout: float) -> None:
        _, name = lock_key(tables)
        row = s.first(
            sa.text("SELECT GET_LOCK(:name, :timeout)"),
            {"name": name, "timeout": max(1, math.ceil(timeout))},
        )
        if row is None or row[0] != 1:
            raise StoreTimeout(
                f"another process held the migration lock {name!r} for more than "
                f"{timeout:g}s; retry, or raise busy_timeout"
            )

    def migration_unlock(self, s: Session, tables: Tables) -> None:
        s.rows(sa.text("SELECT RELEASE_LOCK(:name)"), {"name": lock_key(tables)[1]})

    def table_exists(self, s: Session, table: sa.Table) -> bool:
        return bool(s.rows(_HAS_TABLE, {"schema": table.schema, "name": table.name}))

    def run_ddl(self, s: Session, element: Any) -> None:
        """Without ``CREATE INDEX IF NOT EXISTS`` (MySQL) the catalog is asked first."""
        if (
            not self.index_if_not_exists
            and isinstance(element, sa.schema.CreateIndex)
            and element.element.info.get("dialect") in (None, self.name)
        ):
            index = element.element
            table = index.table
            assert table is not None
            params = {"schema": table.schema, "table": table.name, "name": index.name}
            if s.rows(_HAS_INDEX, params):
                return
            element = sa.schema.CreateIndex(index)
        super().run_ddl(s, element)

    def catalog(self, s: Session, table: sa.Table) -> tuple[dict[str, bool], set[str]]:
        params = {"schema": table.schema, "table": table.name}
        found = {str(name): bool(unique) for name, unique in s.rows(_INDEXES, params)}
        return found, {str(r[0]) for r in s.rows(_PK, params)}

    def own_error(
        self, orig: BaseException, where: str, detail: str, busy_timeout: float
    ) -> StatekeeperError | None:
        errno = _errno(orig)
        if errno in _TIMEOUT:
            return lock_timeout(where, detail, busy_timeout, orig)
        if errno in _CONFLICT:
            return collision(where, detail)
        return None

    def connect_args(self, options: SqlOptions, *, pooled: bool = False) -> dict[str, Any]:
        args = dict(options.connect_args)
        wait = max(1, math.ceil(options.busy_timeout))  # MySQL takes whole seconds
        args.setdefault("init_command", f"SET SESSION innodb_lock_wait_timeout = {wait}")
        return args

    def watch_engine(self, engine: sa.Engine, *, read_only: bool) -> None:
        """Read-only: ``SET SESSION TRANSACTION READ ONLY`` on every connection."""
        if read_only:
            sa.event.listen(engine, "connect", _session_read_only)

    def on_connection(self, conn: sa.Connection) -> Dialect:
        return MARIADB if getattr(conn.dialect, "is_mariadb", False) else self


class MariadbDialect(MysqlDialect):
    """MariaDB: MySQL's, with ``CREATE INDEX IF NOT EXISTS``."""

    index_if_not_exists: ClassVar[bool] = True


#: The one MySQL dialect object, and its MariaDB variant (chosen per connection).
MYSQL = MysqlDialect()
MARIADB = MariadbDialect()
