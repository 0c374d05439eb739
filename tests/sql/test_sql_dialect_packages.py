"""The dialect packages: each dialect's options class, the registry's classes, the
imports of a SQLite store, and PostgreSQL's statements built in one place.

None of these needs a server: they check types, imports and compiled SQL.
"""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

import statekeeper as sk
from statekeeper.backends.sql import (
    MysqlCheckpointStore,
    MysqlOptions,
    PostgresCheckpointStore,
    PostgresOptions,
    SqlCheckpointStore,
    SqliteCheckpointStore,
    SqliteOptions,
    SqlOptions,
)
from statekeeper.backends.sql.options import DIALECT_OPTIONS
from statekeeper.backends.sql.postgres import statements
from statekeeper.backends.sql.postgres.dialect import POSTGRES
from statekeeper.backends.sql.postgres.statements import PgSql
from statekeeper.backends.sql.schema import Statements, build_tables
from statekeeper.config import validate_options
from statekeeper.errors import InvalidOptions, InvalidURL

OPTIONS: dict[str, type[SqlOptions]] = {
    "SQLite": SqliteOptions,
    "PostgreSQL": PostgresOptions,
    "MySQL/MariaDB": MysqlOptions,
}


@pytest.mark.parametrize("name", sorted(DIALECT_OPTIONS))
def test_an_option_of_one_dialect_is_declared_by_that_dialect_only(name: str) -> None:
    owner = DIALECT_OPTIONS[name][0]
    for dialect, options in OPTIONS.items():
        assert (name in options.model_fields) is (dialect.startswith(owner)), (dialect, name)
    assert name not in SqlOptions.model_fields


@pytest.mark.parametrize(
    ("options", "name", "message"),
    [
        (SqliteOptions, "listing_wait", "PostgreSQL's (its listing horizon); SQLite listings"),
        (MysqlOptions, "listing_wait", "PostgreSQL's (its listing horizon); MySQL/MariaDB"),
        (PostgresOptions, "inline_reads", "SQLite's (point reads on the event loop's thread)"),
        (MysqlOptions, "inline_reads", "a server's reads are network round trips, so drop it"),
        (PostgresOptions, "inline_writes", "SQLite's (single-record writes on the event loop"),
        (MysqlOptions, "inline_writes", "a server's writes are network round trips, so drop"),
    ],
)
def test_the_options_type_refuses_another_dialects_option_naming_it(
    options: type[SqlOptions], name: str, message: str
) -> None:
    """The refusal comes from the options class itself, not from the store."""
    with pytest.raises(InvalidOptions, match=re.escape(message)):
        validate_options(options, {name: "1"})


def test_the_stores_take_their_dialects_options() -> None:
    assert isinstance(
        SqlCheckpointStore.from_url("postgresql://u@h/db?listing_wait=2").options, PostgresOptions
    )
    assert isinstance(SqlCheckpointStore.from_url("mysql://u@h/db").options, MysqlOptions)
    assert isinstance(SqlCheckpointStore.from_url("sqlite:///x.db").options, SqliteOptions)
    with pytest.raises(InvalidOptions, match="SQLite's"):
        SqlCheckpointStore.from_url("postgresql://u@h/db", inline_reads=False)


@pytest.mark.parametrize(
    ("url", "cls"),
    [
        ("sqlite:///x.db", SqliteCheckpointStore),
        ("postgresql://u@h/db", PostgresCheckpointStore),
        ("postgres://u@h/db", PostgresCheckpointStore),
        ("mysql://u@h/db", MysqlCheckpointStore),
        ("mariadb://u@h/db", MysqlCheckpointStore),
    ],
)
def test_sql_store_of_a_url_is_the_class_the_registry_names(url: str, cls: type) -> None:
    scheme = url.split(":", 1)[0]
    module, _, name = sk.available_backends()[scheme].partition(":")
    assert (module.rsplit(".", 1)[-1], name) in {
        ("sql", "SqliteCheckpointStore"),
        ("postgres", "PostgresCheckpointStore"),
        ("mysql", "MysqlCheckpointStore"),
    }
    assert type(SqlCheckpointStore.from_url(url)) is cls
    assert type(sk.open_store(url)) is cls
    assert type(cls.from_url(url)) is cls


def test_the_sql_base_class_is_not_a_store_of_its_own() -> None:
    """``SqlCheckpointStore`` is the dialects' base: built directly it says what to
    build instead, and a dialect's class refuses another dialect's URL."""
    with pytest.raises(TypeError, match=r"SqlCheckpointStore\.from_url\(url\)"):
        SqlCheckpointStore("sqlite:///x.db")
    with pytest.raises(InvalidURL, match="SqliteCheckpointStore opens sqlite URLs"):
        SqliteCheckpointStore("postgresql://u@h/db")
    with pytest.raises(InvalidURL, match="not an SQL store URL"):
        SqlCheckpointStore.from_url("file:///tmp/x")


def test_opening_a_sqlite_store_imports_no_server_dialect(tmp_path: Path) -> None:
    """Neither a driver, nor the server runtimes, nor SQLAlchemy's server dialects."""
    code = f"""
import asyncio, sys
import statekeeper

async def main():
    async with statekeeper.open_store("sqlite:///{tmp_path / "s.db"}") as store:
        await store.save("s", 1)
        assert (await store.get_latest("s")).state == 1

asyncio.run(main())
bad = ("asyncpg", "aiomysql", "pymysql", "sqlalchemy.ext.asyncio",
       "sqlalchemy.dialects.postgresql", "sqlalchemy.dialects.mysql",
       "statekeeper.backends.sql.postgres", "statekeeper.backends.sql.mysql",
       "statekeeper.backends.sql.server")
print(sorted(m for m in sys.modules if m.startswith(bad)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- PostgreSQL's statements --------------------------------------------------------------

_ST = Statements(build_tables("statekeeper_", None, POSTGRES), POSTGRES)


def _lean() -> list[tuple[str, PgSql]]:
    pst = statements.pg_statements(_ST)
    found = [
        (name, getattr(pst, name)) for name in vars(pst) if isinstance(getattr(pst, name), PgSql)
    ]
    shapes = itertools.product((True, False), ("asc", "desc"), (True, False), (0, 1, 2), (0, 1))
    for stream, order, bound, ntags, nmeta in shapes:
        found.append(
            (
                f"scan {stream, order, bound, ntags, nmeta}",
                statements.scan_sql(_ST, stream, order, bound, ntags, nmeta),
            )
        )
    for order, ntags, nmeta in itertools.product(("asc", "desc"), (0, 1, 2), (0, 1)):
        found.append(
            (f"paired {order, ntags, nmeta}", statements.paired_scan_sql(_ST, order, ntags, nmeta))
        )
    return found


@pytest.mark.parametrize(("name", "stmt"), _lean(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_lean_statement_numbers_every_parameter_and_names_it(name: str, stmt: PgSql) -> None:
    """SQLAlchemy numbered the parameters: ``$1``..``$n``, one name each, and no
    ``:name`` was left in the text unbound (a ``literal_column`` would leave it)."""
    numbers = {int(n) for n in re.findall(r"\$(\d+)", stmt.sql)}
    assert numbers == set(range(1, len(stmt.binds) + 1)), name
    assert len({n for n, _ in stmt.binds}) == len(stmt.binds), name
    assert not re.search(r"(?<![:\w]):[A-Za-z_]\w*", stmt.sql), name


def test_a_paired_page_probes_with_parameters_of_its_own() -> None:
    stmt = statements.paired_scan_sql(_ST, "asc", 1, 0)
    names = [n for n, _ in stmt.binds]
    page = [n for n in names if not n.startswith("probe_")]
    assert [n for n in names if n.startswith("probe_")] == [f"probe_{n}" for n in page]
    values = {n: i for i, n in enumerate(page)} | {f"probe_{n}": -i for i, n in enumerate(page)}
    assert stmt.args(values) == [values[n] for n in names]


# -- no dialect branch in the SQL core ------------------------------------------------------

SQL_ROOT = Path(sk.__file__).parent / "backends" / "sql"
_DIALECT_PACKAGES = ("sqlite", "postgres", "mysql")
_DIALECT_WORDS = {"sqlite", "postgresql", "postgres", "mysql", "mariadb"}
_LOOKUPS = ("getattr", "hasattr")


def _dialect_branches(source: str) -> list[str]:
    """The places in ``source`` that decide by dialect: a comparison with a dialect's
    name (``s.family == "mysql"``, ``in ("sqlite", ...)``), and any name, attribute or
    ``getattr`` of ``mariadb``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for part in ast.walk(node):
                word = (
                    part.value.lower()
                    if isinstance(part, ast.Constant) and isinstance(part.value, str)
                    else None
                )
                if word in _DIALECT_WORDS:
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
                    break
        elif isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if "mariadb" in name.lower():
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "getattr",
            "hasattr",
        ):
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if any(isinstance(a, str) and "mariadb" in a.lower() for a in args):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_sql_core_has_no_dialect_branch() -> None:
    """What differs per dialect is a method of its ``Dialect`` (issue 32): no module of
    the SQL core (outside ``sqlite/``, ``postgres/`` and ``mysql/``) asks which
    dialect it runs on."""
    core = [
        path
        for path in sorted(SQL_ROOT.rglob("*.py"))
        if path.relative_to(SQL_ROOT).parts[0] not in _DIALECT_PACKAGES
    ]
    assert len(core) > 10
    branches = {
        str(path.relative_to(SQL_ROOT)): found
        for path in core
        if (found := _dialect_branches(path.read_text()))
    }
    assert branches == {}


def test_the_branch_check_sees_a_branch() -> None:
    source = """
if s.family == "mysql":
    pass
if dialect in ("sqlite", "postgresql"):
    pass
x = s.mariadb
y = getattr(conn.dialect, "is_mariadb", False)
if family != "postgresql":
    pass
ok = {"mariadb": "mysql"}
"""
    assert [line.split(":")[0] for line in _dialect_branches(source)] == [
        "line 2",
        "line 4",
        "line 6",
        "line 7",
        "line 8",
    ]
