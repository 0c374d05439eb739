"""SQLAlchemy Core statements compiled once for SQLite's ``sqlite3`` driver.

The SQLite runtime (:mod:`.sqlite`) runs the same Core statements the server
dialects execute, compiled here once per statement to ``qmark`` SQL text and the
positional order of its parameters, and expands ``IN`` lists as SQLAlchemy would.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy.dialects.sqlite import pysqlite
from sqlalchemy.sql import ClauseElement, Executable

__all__ = ["Compiler"]


class Compiler:
    """Core statement -> (SQL text, positional parameter names with defaults), cached."""

    def __init__(self) -> None:
        self.dialect = pysqlite.dialect(paramstyle="qmark")
        self._cache: dict[int, tuple[Executable, str, tuple[tuple[str, Any], ...]]] = {}

    def __call__(self, stmt: Executable) -> tuple[str, tuple[tuple[str, Any], ...]]:
        hit = self._cache.get(id(stmt))
        if hit is None or hit[0] is not stmt:
            compiled = cast(ClauseElement, stmt).compile(dialect=self.dialect)
            defaults = compiled.params
            names = getattr(compiled, "positiontup", None) or ()
            hit = (stmt, compiled.string, tuple((n, defaults.get(n)) for n in names))
            # Keying by id is safe: the entry keeps the statement alive, and the
            # identity is re-checked on every hit.
            self._cache[id(stmt)] = hit
        return hit[1], hit[2]


_POSTCOMPILE = "__[POSTCOMPILE_"


def _expand(
    sql: str, binds: tuple[tuple[str, Any], ...], args: tuple[Any, ...]
) -> tuple[str, tuple[Any, ...]]:
    """Expand the ``IN`` lists of expanding parameters (``bindparam(expanding=True)``)
    into one ``?`` per value, as SQLAlchemy does when it executes a statement.

    Lists are padded with NULL to the next power of two, which matches nothing in an
    ``IN`` list, so that a few statement texts serve every length and stay in
    ``sqlite3``'s statement cache.
    """
    flat: list[Any] = []
    for (name, _), value in zip(binds, args, strict=True):
        token = f"{_POSTCOMPILE}{name}]"
        if token not in sql:
            flat.append(value)
            continue
        values = list(value)
        if not values:
            raise ValueError(f"the IN list {name!r} is empty")
        width = 1 << (len(values) - 1).bit_length()
        values += [None] * (width - len(values))
        sql = sql.replace(token, ", ".join("?" * width), 1)
        flat.extend(values)
    return sql, tuple(flat)
