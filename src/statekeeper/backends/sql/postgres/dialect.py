"""PostgreSQL's :class:`~..dialects.Dialect`: :data:`POSTGRES`, and its connection
settings (:class:`~..server.ServerDialect`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import Executable

from ....errors import BackendError, StatekeeperError
from ..dialects import Family, Session, collision, lock_key, lock_timeout
from ..server import ServerDialect

if TYPE_CHECKING:
    from ..options import SqlOptions
    from ..schema import Statements, Tables

__all__ = ["POSTGRES", "PostgresDialect", "local_settings"]

# A catalog scan, not to_regclass(): a by-name lookup can leave this backend a
# cached "no such table" that outlives the transaction that learned it.
_HAS_TABLE = sa.text(
    "SELECT 1 FROM pg_catalog.pg_tables "
    "WHERE schemaname = COALESCE(:schema, current_schema()) AND tablename = :name"
)
_INDEXES = sa.text(
    "SELECT i.relname, x.indisunique AND x.indisvalid FROM pg_catalog.pg_index x "
    "JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid "
    "JOIN pg_catalog.pg_class t ON t.oid = x.indrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace "
    "WHERE n.nspname = COALESCE(:schema, current_schema()) AND t.relname = :table "
    "AND NOT x.indisprimary"
)
_PK = sa.text(
    "SELECT a.attname FROM pg_catalog.pg_index x "
    "JOIN pg_catalog.pg_class t ON t.oid = x.indrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace "
    "JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid AND a.attnum = ANY(x.indkey) "
    "WHERE n.nspname = COALESCE(:schema, current_schema()) AND t.relname = :table "
    "AND x.indisprimary"
)
_TIMEOUT = {"55P03", "57014"}  # lock_not_available, query_canceled (statement_timeout)
_CONFLICT = {"40P01", "40001"}  # deadlock_detected, serialization_failure


def _sqlstate(orig: BaseException | None) -> str | None:
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if state is None and orig is not None:
        state = getattr(orig.__cause__, "sqlstate", None)
    return state if isinstance(state, str) else None


class PostgresDialect(ServerDialect):
    """PostgreSQL: advisory locks for migrations, ``ON CONFLICT`` skips a taken id,
    transactional DDL, and streams compared in ``"C"`` order for prefix ranges."""

    name: ClassVar[Family] = "postgresql"
    default_driver: ClassVar[str] = "asyncpg"
    extra: ClassVar[str] = "postgres"
    autocommit_reads: ClassVar[bool] = True

    def partial_index(self, where: sa.ColumnElement[bool]) -> dict[str, Any]:
        return {"postgresql_where": where}

    def code_point_order(self, column: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
        # PostgreSQL compares in the database's collation unless told "C".
        return column.collate("C")

    def insert_or_skip(self, st: Statements) -> Executable:
        cp = st.t.checkpoints
        return postgresql.insert(cp).on_conflict_do_nothing(index_elements=[cp.c.id])

    def migration_lock(self, s: Session, tables: Tables, timeout: float) -> None:
        """A session advisory lock, waiting at most ``lock_timeout`` (busy_timeout),
        then 55P03: StoreTimeout. Only a transaction that starts after it is sure to
        see catalog changes another process committed while this one waited. Behind
        a pooler in transaction mode a session lock would stay on a server
        connection other clients get: there the lock is the transaction's, and the
        migration runs in that transaction (``ServerRuntime.locked_write``)."""
        key, _ = lock_key(tables)
        fn = "pg_advisory_xact_lock" if getattr(s, "xact_locks", False) else "pg_advisory_lock"
        s.rows(sa.text(f"SELECT {fn}(:key)"), {"key": key})

    def migration_unlock(self, s: Session, tables: Tables) -> None:
        if not getattr(s, "xact_locks", False):
            s.rows(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": lock_key(tables)[0]})

    def create_schema(self, s: Session, tables: Tables) -> None:
        schema = tables.metadata.schema
        if schema is not None:
            s.ddl(sa.schema.CreateSchema(schema, if_not_exists=True))

    def table_exists(self, s: Session, table: sa.Table) -> bool:
        return bool(s.rows(_HAS_TABLE, {"schema": table.schema, "name": table.name}))

    def extra_indexes(self, table: sa.Table, tables: Tables, version: int) -> list[sa.Index]:
        return [tables.pg_stream_c] if table is tables.checkpoints and version >= 2 else []

    def catalog(self, s: Session, table: sa.Table) -> tuple[dict[str, bool], set[str]]:
        params = {"schema": table.schema, "table": table.name}
        found = {str(name): bool(unique) for name, unique in s.rows(_INDEXES, params)}
        return found, {str(r[0]) for r in s.rows(_PK, params)}

    def is_driver_error(self, exc: BaseException) -> bool:
        """An asyncpg error, raised on the lean path (:mod:`.store`) without SQLAlchemy."""
        return type(exc).__module__.split(".")[0] == "asyncpg"

    def own_error(
        self, orig: BaseException, where: str, detail: str, busy_timeout: float
    ) -> StatekeeperError | None:
        state = _sqlstate(orig)
        if state in _TIMEOUT:
            return lock_timeout(where, detail, busy_timeout, orig)
        if state in _CONFLICT:
            return collision(where, detail)
        if "unsupported startup parameter" in detail:
            return BackendError(
                f"{where} failed: a connection pooler refused a session setting ({detail}); "
                "behind PgBouncer or another pooler, open the store with pooler='transaction' "
                "(docs/sql-backend.md, Poolers)",
                orig=orig,
            )
        return None

    def connect_args(self, options: SqlOptions, *, pooled: bool = False) -> dict[str, Any]:
        args = dict(options.connect_args)
        settings = {"application_name": "statekeeper"}
        if pooled:
            args.setdefault("statement_cache_size", 0)
            args["server_settings"] = {**settings, **args.get("server_settings", {})}
            return args
        settings["lock_timeout"] = f"{options.busy_timeout * 1000:.0f}"
        if options.read_only:
            settings["default_transaction_read_only"] = "on"
        if options.durability == "fast":
            # The commit returns before the WAL reaches disk: a crash of the client
            # loses nothing, a crash of the server may lose the last transactions.
            settings["synchronous_commit"] = "off"
        settings.update(args.get("server_settings", {}))
        args["server_settings"] = settings
        return args

    def snapshot_options(self) -> dict[str, Any]:
        return {"postgresql_readonly": True}


def local_settings(*, busy_timeout: float, fast: bool, read_only: bool) -> str:
    """The statement that gives one PostgreSQL transaction the settings a direct
    connection gets for its session (:meth:`PostgresDialect.connect_args`): behind a pooler
    in transaction mode a session setting would stay on a server connection that
    the pooler hands to other clients, and never reach the next one this client
    gets. ``set_config(name, value, true)`` lasts until the transaction ends."""
    settings = {"lock_timeout": f"{busy_timeout * 1000:.0f}"}
    if fast:
        settings["synchronous_commit"] = "off"
    if read_only:
        settings["transaction_read_only"] = "on"
    calls = ", ".join(f"set_config('{k}', '{v}', true)" for k, v in settings.items())
    return f"SELECT {calls}"


#: The one PostgreSQL dialect object.
POSTGRES = PostgresDialect()
