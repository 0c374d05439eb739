"""Every statement of PostgreSQL's lean path, built in this one place.

The lean path runs on raw asyncpg connections (:mod:`.runtime`), so its statements
are compiled once, here, for asyncpg's ``$n`` parameters: SQLAlchemy numbers the
parameters (:func:`compile_pg`, as :mod:`..sqlite.compiler` does for SQLite's ``?``), and
callers pass values by name (:meth:`PgSql.args`). Where the statement is the same
as on every dialect (``get_latest``, ``load``, a listed page) it is the Core
statement of :class:`~..schema.Statements` itself; what only PostgreSQL has (the
save from a transaction id, the listing horizon, the sequence base) is written
here, with named parameters, as SQLAlchemy ``text()`` or Core.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import asyncpg as sa_asyncpg
from sqlalchemy.sql import ClauseElement, Executable, visitors

from ..dialects import lock_key
from ..schema import Statements, Tables

__all__ = [
    "BASE_ROW",
    "SEQ_SLOTS",
    "PgSql",
    "PgStatements",
    "compile_pg",
    "int4",
    "paired_scan_sql",
    "pg_statements",
    "scan_sql",
]

#: Sequences per transaction id: room for the largest ``save_many`` (1000 items).
SEQ_SLOTS = 1024
#: The meta row holding the store's offset added to transaction ids.
BASE_ROW = "seq_base"

_I32 = 1 << 32
_DIALECT = sa_asyncpg.dialect()  # type: ignore[no-untyped-call]
Order = Literal["asc", "desc"]


def int4(value: int) -> int:
    """``value``'s low 32 bits as a signed ``int4`` (an advisory lock key)."""
    value &= _I32 - 1
    return value - _I32 if value >= 1 << 31 else value


@dataclass(frozen=True, slots=True)
class PgSql:
    """One statement compiled for asyncpg: its SQL and its parameters in ``$n`` order."""

    sql: str
    #: ``(name, default)`` of ``$1``, ``$2``, ...
    binds: tuple[tuple[str, Any], ...]
    #: Where no parameter has a default: them all from a mapping in one C call (a
    #: page's or a save's dozen parameters, on every call).
    _pick: Callable[[Mapping[str, Any]], Any] | None = field(default=None, compare=False)

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        """The positional arguments for ``values`` (by name; defaults fill the rest)."""
        if self._pick is not None:
            got = self._pick(values)
            return list(got) if len(self.binds) > 1 else [got]
        return [values.get(name, default) for name, default in self.binds]


def compile_pg(stmt: Executable, order: tuple[str, ...] | None = None) -> PgSql:
    """``stmt`` (Core or ``text()`` with ``:name`` parameters) compiled for asyncpg.

    ``order``: the parameters' names in ``$n`` order, which the hot paths pass
    positionally (no mapping per call); checked here, once.
    """
    compiled = cast(ClauseElement, stmt).compile(dialect=_DIALECT)
    defaults = compiled.params
    names = tuple(getattr(compiled, "positiontup", None) or ())
    if order is not None and names != order:
        raise AssertionError(f"parameters {names}, not {order}: {compiled.string}")
    binds = tuple((n, defaults.get(n)) for n in names)
    pick = None
    if names and all(default is None for _, default in binds):
        pick = operator.itemgetter(*names)
    return PgSql(compiled.string, binds, pick)


def _horizon(base_param: str) -> str:
    """The first horizon: below the oldest transaction id still running anywhere in
    the cluster (``xmin`` of the statement's snapshot). Exact when nothing runs that
    is older than the rows a page wants, and free: no lock table read."""
    return f"(pg_snapshot_xmin(pg_current_snapshot())::text::bigint + {base_param}) * {SEQ_SLOTS}"


def _in_flight_horizon(base_param: str, lock_param: str) -> str:
    """The horizon of this store's saves in flight: below the oldest transaction id
    of the statement's snapshot that may still be one of them.

    A transaction id in the snapshot's in-progress list (``pg_snapshot_xip``) is
    passed over only when, in one read of the lock table (``lk``, materialised: the
    ``pg_locks`` view is a fresh read per reference), it still holds its own id's
    lock (it is running) and holds no stream lock of this store (``lock_param``, the
    first key of every save's advisory lock). A save takes its stream's lock before
    it has an id and releases its id's lock before the stream's, so while it runs
    with an id it holds both: never passed over. The two locks are matched by the
    holder's ``pid``, never by ``virtualtransaction``: the lock table read copies
    that from the backend's live local transaction id, which a commit resets
    before it releases the locks, so one read can show a committing save's two
    locks under two virtual transactions (and the save's rows, invisible to this
    snapshot, would be passed for good). A pid runs one transaction at a time and
    releases all of one's locks before it takes the next one's, so within one read
    its locks are one transaction's. An id that ended after the snapshot
    was taken may have been a save whose rows this snapshot cannot see, so it holds
    the horizon too (this statement only: the next try has a newer snapshot). Ids
    not yet assigned when the snapshot was taken are at or above its ``xmax``.
    """
    return f"""((SELECT coalesce(min(x::text::bigint), pg_snapshot_xmax(sn.s)::text::bigint)
  FROM pg_snapshot_xip(sn.s) AS x
  WHERE NOT EXISTS (
    SELECT 1 FROM lk t
    WHERE t.locktype = 'transactionid' AND t.mode = 'ExclusiveLock' AND t.granted
      AND t.transactionid = x::xid
      AND NOT EXISTS (
        SELECT 1 FROM lk a
        WHERE a.locktype = 'advisory' AND a.objsubid = 2 AND a.classid = {lock_param}::oid
          AND a.pid = t.pid))
 ) + {base_param}) * {SEQ_SLOTS}"""


_BASE = "CAST(:base AS bigint)"
_LOCK = "CAST(:lock AS int4)"
_STREAM_LOCKS = (
    "count(pg_advisory_xact_lock(CAST(:store_lock AS int4), k)) AS n "
    "FROM unnest(CAST(:locks AS int4[])) AS k"
)


def _save(tables: Tables, q: Any) -> sa.TextClause:
    """The save of a batch in one statement (see :mod:`.sequences`): the streams' locks
    (sorted: no deadlock between batches), then the transaction id, then the rows
    at ``x.s0 + ordinality - 1``, refused where ``x.s0`` is not above every stored
    sequence (a too low ``seq_base``)."""
    cp, tg, fd = q(tables.checkpoints), q(tables.tags), q(tables.fields)
    return sa.text(f"""
WITH lk AS (SELECT {_STREAM_LOCKS}),
x AS (SELECT (pg_current_xact_id()::text::bigint + {_BASE}) * {SEQ_SLOTS} AS s0 FROM lk),
cp AS (
  INSERT INTO {cp} (seq, id, stream, expires_at, record)
  SELECT x.s0 + r.i - 1, r.id, r.stream, r.exp, r.rec
  FROM x, unnest(CAST(:ids AS text[]), CAST(:streams AS text[]), CAST(:exps AS bigint[]),
                 CAST(:recs AS bytea[])) WITH ORDINALITY AS r(id, stream, exp, rec, i)
  WHERE x.s0 > (SELECT coalesce(max(seq), 0) FROM {cp})
  RETURNING seq
),
tg AS (
  INSERT INTO {tg} (seq, "key", vkey, value, shash)
  SELECT cp.seq, t.k, t.vk, t.v, t.h
  FROM x, unnest(CAST(:t_seq AS int4[]), CAST(:t_key AS text[]), CAST(:t_vkey AS text[]),
                 CAST(:t_value AS text[]), CAST(:t_shash AS bigint[])) AS t(i, k, vk, v, h), cp
  WHERE cp.seq = x.s0 + t.i
),
fd AS (
  INSERT INTO {fd} (seq, "key", kind, vkey, value, shash)
  SELECT cp.seq, f.k, f.kd, f.vk, f.v, f.h
  FROM x, unnest(CAST(:f_seq AS int4[]), CAST(:f_key AS text[]), CAST(:f_kind AS text[]),
                 CAST(:f_vkey AS text[]), CAST(:f_value AS text[]), CAST(:f_shash AS bigint[]))
       AS f(i, k, kd, vk, v, h), cp
  WHERE cp.seq = x.s0 + f.i
)
SELECT seq FROM cp ORDER BY seq""")


@dataclass(frozen=True)
class PgStatements:
    """The lean path's statements for one store's tables, compiled for asyncpg."""

    store_lock: int
    save: PgSql
    #: ``(stream, now)``, in that order.
    latest: PgSql
    #: ``(id, now)``, in that order.
    get: PgSql
    #: ``(seq_base row or NULL, max stored seq, next transaction id)``, one snapshot.
    read_state: PgSql
    #: The streams' advisory locks (``store_lock``, ``locks``), for a save that replaces.
    lock_streams: PgSql
    #: ``(seq, id, expires_at)`` of the rows holding ``ids``, row-locked.
    ids_taken: PgSql
    delete_seqs: PgSql
    #: The server processes holding this store's stream locks (``lock``).
    lock_holders: PgSql
    table: str
    tables: Tables


@lru_cache(maxsize=64)
def pg_statements(st: Statements) -> PgStatements:
    """The lean path's statements for the tables of ``st`` (PostgreSQL's statements)."""
    tables = st.t
    q = _DIALECT.identifier_preparer.format_table
    cp, meta = tables.checkpoints, tables.meta
    ids = sa.bindparam("ids", type_=ARRAY(sa.Text()))
    seqs = sa.bindparam("seqs", type_=ARRAY(sa.BigInteger()))
    base_row = sa.select(meta.c.value).where(meta.c.name == BASE_ROW).scalar_subquery()
    top = sa.select(sa.func.coalesce(sa.func.max(cp.c.seq), 0)).scalar_subquery()
    nxt: sa.ColumnClause[int] = sa.literal_column(
        "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
    )
    return PgStatements(
        store_lock=int4(lock_key(tables)[0]),
        save=compile_pg(_save(tables, q)),
        # LIMIT 1 in the text, as a plan cached for the prepared statement should know
        latest=compile_pg(
            st.latest.limit(sa.literal_column("1", sa.Integer())), order=("stream", "now")
        ),
        get=compile_pg(st.get, order=("id", "now")),
        read_state=compile_pg(sa.select(base_row, top, nxt)),
        lock_streams=compile_pg(sa.text(f"SELECT {_STREAM_LOCKS}")),
        ids_taken=compile_pg(
            sa.select(cp.c.seq, cp.c.id, cp.c.expires_at)
            .where(cp.c.id == sa.any_(ids))
            .with_for_update()
        ),
        delete_seqs=compile_pg(cp.delete().where(cp.c.seq == sa.any_(seqs))),
        lock_holders=compile_pg(
            sa.text(
                "SELECT array_agg(DISTINCT pid ORDER BY pid) FROM pg_locks WHERE locktype = "
                f"'advisory' AND objsubid = 2 AND granted AND classid = {_LOCK}::oid"
            )
        ),
        table=q(cp),
        tables=tables,
    )


def _materialized(select: Any, name: str) -> Any:
    return select.cte(name).prefix_with("MATERIALIZED")


def _cols(*names: str) -> list[sa.ColumnClause[Any]]:
    return [sa.column(n) for n in names]


@lru_cache(maxsize=256)
def scan_sql(
    st: Statements, has_stream: bool, order: Order, has_bound: bool, ntags: int, nmeta: int
) -> PgSql:
    """A listing page.

    A page of one stream is the plain keyset scan (:meth:`Statements.scan`): saves
    to one stream commit in sequence order (its advisory lock), so no horizon is
    needed there. A page of every stream stays below the horizon ``hz.h``, and its
    first row is the horizon's: ``(horizon, highest hidden sequence as text or NULL,
    NULL)``: the newest committed row in the page's range at or above the horizon
    (filters are not checked there; a row the filters would drop only costs a
    wait). The page's rows follow.

    The horizon is the first one (:func:`_horizon`, no lock table read) unless that
    hides a row in the page's range; only then is it the horizon of this store's
    saves in flight (:func:`_in_flight_horizon`), which transactions of other
    applications never hold back. Both are computed from the snapshot the page's
    rows are read with. Parameters beyond the page's: ``base``, ``lock``.
    """
    page = st.scan(has_stream, order, has_bound, ntags, nmeta, horizon=not has_stream)
    if has_stream:
        return compile_pg(page)
    table = _DIALECT.identifier_preparer.format_table(st.t.checkpoints)
    hidden = "c.seq >= q.h"
    if has_bound:
        hidden += f" AND c.seq {'>' if order == 'asc' else '<'} :bound"
    sn = _materialized(sa.text("SELECT pg_current_snapshot() AS s").columns(*_cols("s")), "sn")
    lo = _materialized(
        sa.text(
            f"SELECT q.h, (SELECT max(c.seq) FROM {table} c WHERE {hidden}) AS m "
            f"FROM (SELECT {_horizon(_BASE)} AS h) AS q"
        ).columns(*_cols("h", "m")),
        "lo",
    )
    lk = _materialized(
        sa.text(
            "SELECT locktype, classid, objsubid, transactionid, pid, mode, granted FROM pg_locks"
        ).columns(*_cols("locktype")),
        "lk",
    )
    horizon = f"CASE WHEN lo.m IS NULL THEN lo.h ELSE {_in_flight_horizon(_BASE, _LOCK)} END"
    # text(), not literal_column(): its :base and :lock are parameters
    hz = _materialized(
        sa.select(sa.text(f"{horizon} AS h"), lo.c.m).select_from(lo, sn).add_cte(lk), "hz"
    )
    head: Any = sa.select(
        sa.literal_column("hz.h"),
        sa.literal_column("(CASE WHEN hz.m >= hz.h THEN hz.m END)::text"),
        sa.literal_column("NULL::bytea"),
    ).select_from(hz)
    return compile_pg(sa.union_all(head, sa.select(cast(sa.Select[Any], page).subquery("page"))))


def _renamed(stmt: Executable, prefix: str) -> Executable:
    """``stmt`` with each parameter ``name`` renamed ``prefix + name``."""

    def rename(element: Any, **_: Any) -> Any:
        if isinstance(element, sa.BindParameter):
            return sa.bindparam(prefix + element.key, element.value, type_=element.type)
        return None

    return cast(Executable, visitors.replacement_traverse(cast(Any, stmt), {}, rename))


@lru_cache(maxsize=256)
def paired_scan_sql(st: Statements, order: Order, ntags: int, nmeta: int) -> PgSql:
    """A page of one stream past a bound, and in the same statement the one-row
    probe the other way that :func:`statekeeper._core.paging.list_page` asks for next
    (does anything precede the page?).

    Rows are ``(part, seq, id, record)``, part 0 the page and 1 the probe. The
    probe's parameters are the page's prefixed ``probe_``; its bound is the page's
    bound moved one step back (``<= bound`` for an ``asc`` page): what
    ``list_page`` asks, the items beyond the page's first entry, since none lies
    between the bound and that entry.
    """
    back: Order = "desc" if order == "asc" else "asc"
    page = cast(sa.Select[Any], st.scan(True, order, True, ntags, nmeta))
    probe = cast(sa.Select[Any], _renamed(st.scan(True, back, True, ntags, nmeta), "probe_"))
    part = sa.literal_column
    return compile_pg(
        sa.union_all(
            sa.select(part("0").label("part"), page.subquery("page")),
            sa.select(part("1"), probe.subquery("probe")),
        )
    )
