"""The :class:`~..dialects.Session` of SQLite: one ``sqlite3`` connection, and the
statements of :mod:`..schema` compiled once for SQLite (:mod:`.compiler`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy.sql import Executable

from .compiler import _POSTCOMPILE, Compiler, _expand
from .dialect import SQLITE, SqliteDialect

__all__ = ["SqliteSession"]


class SqliteSession:
    """:class:`~.dialects.Session` over one ``sqlite3`` connection."""

    dialect: SqliteDialect = SQLITE

    def __init__(self, conn: sqlite3.Connection, compiler: Compiler) -> None:
        self.conn = conn
        self._compile = compiler
        #: run_many's row picker of each statement text, made once
        self._pickers: dict[str, itemgetter[Any]] = {}

    def _bind(
        self, stmt: Executable, params: Mapping[str, Any] | None
    ) -> tuple[str, tuple[Any, ...]]:
        sql, binds = self._compile(stmt)
        if not params:
            return sql, tuple([default for _, default in binds])
        get = params.get
        args = tuple([get(n, d) for n, d in binds])  # a list is built faster than a generator
        if _POSTCOMPILE in sql:
            return _expand(sql, binds, args)
        return sql, args

    def rows(
        self, stmt: Executable, params: Mapping[str, Any] | None = None
    ) -> Sequence[Sequence[Any]]:
        sql, args = self._bind(stmt, params)
        # fetchall() also runs a RETURNING statement to completion, which COMMIT needs.
        return self.conn.execute(sql, args).fetchall()

    def first(
        self, stmt: Executable, params: Mapping[str, Any] | None = None
    ) -> Sequence[Any] | None:
        rows = self.rows(stmt, params)
        return rows[0] if rows else None

    def run(self, stmt: Executable, params: Mapping[str, Any] | None = None) -> int:
        sql, args = self._bind(stmt, params)
        return self.conn.execute(sql, args).rowcount

    def run_many(self, stmt: Executable, params: Sequence[Mapping[str, Any]]) -> None:
        sql, binds = self._compile(stmt)
        if len(binds) == 1:
            (name, _), *_ = binds
            self.conn.executemany(sql, [(p[name],) for p in params])
            return
        # one C-level lookup per row (a save_many inserts up to 1000 rows per table)
        pick = self._pickers.get(sql)
        if pick is None:
            pick = self._pickers[sql] = itemgetter(*(n for n, _ in binds))
        self.conn.executemany(sql, [pick(p) for p in params])

    def lastrowid(self, stmt: Executable, params: Mapping[str, Any] | None = None) -> int:
        sql, args = self._bind(stmt, params)
        return self.conn.execute(sql, args).lastrowid or 0

    def ddl(self, element: Any) -> None:
        self.conn.execute(str(element.compile(dialect=self._compile.dialect)))
