"""PostgreSQL listings: the keyset pages of :mod:`.pg`'s lean path, and the horizon
that keeps a listing of every stream from passing a save still in flight.

A page of one stream is a plain keyset scan (saves to one stream commit in sequence
order). A page of every stream stays below the horizon, which only this store's
saves in flight hold back (see the :mod:`.pg` module docstring, "Horizon"); a
listing held back longer than ``listing_wait`` raises a retryable
:class:`~statekeeper.errors.StoreTimeout` rather than return a page that would
look complete without them.
"""

from __future__ import annotations

import asyncio
import re
import time
from functools import lru_cache
from typing import Any, Literal, cast

import sqlalchemy as sa

from ...errors import StoreTimeout
from . import pg
from .pg import SEQ_SLOTS, PgRuntime, pg_statements
from .schema import Statements

__all__ = ["paired_scan_rows", "paired_scan_sql", "scan_rows", "scan_sql"]


def _in_flight_horizon(base_param: str, lock_param: str) -> str:
    """The horizon of this store's saves in flight: below the oldest transaction id
    of the statement's snapshot that may still be one of them.

    A transaction id in the snapshot's in-progress list (``pg_snapshot_xip``) is
    passed over only when, in one read of the lock table (``lk``, materialised: the
    ``pg_locks`` view is a fresh read per reference), it still holds its own id's
    lock (it is running) and holds no stream lock of this store (``$lock``, the
    first key of every save's advisory lock). A save takes its stream's lock before
    it has an id and releases its id's lock before the stream's, so while it runs
    with an id it holds both: never passed over. An id that ended after the snapshot
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
        WHERE a.locktype = 'advisory' AND a.objsubid = 2 AND a.classid = {lock_param}::int4::oid
          AND a.virtualtransaction = t.virtualtransaction))
 ) + {base_param}) * {SEQ_SLOTS}"""


@lru_cache(maxsize=256)
def scan_sql(
    st: Statements,
    has_stream: bool,
    order: Literal["asc", "desc"],
    has_bound: bool,
    ntags: int,
    nmeta: int,
) -> tuple[str, tuple[str, ...]]:
    """A listing page, and its parameter names in ``$n`` order.

    A page of one stream is the plain keyset scan: saves to one stream commit in
    sequence order (its advisory lock), so no horizon is needed there. A page of
    every stream stays below the horizon ``hz.h``, and its first row is the
    horizon's: ``(horizon, highest hidden sequence as text or NULL, NULL)``: the
    newest committed row in the page's range at or above the horizon (filters are
    not checked there; a row the filters would drop only costs a wait). The page's
    rows follow.

    The horizon is the first one (:func:`.pg._horizon`, no lock table read) unless that
    hides a row in the page's range; only then is it the horizon of this store's
    saves in flight (:func:`_in_flight_horizon`), which transactions of other
    applications never hold back. Both are computed from the snapshot the page's
    rows are read with.
    """
    stmt = st.scan(has_stream, order, has_bound, ntags, nmeta, horizon=not has_stream)
    compiled = cast(sa.Select[Any], stmt).compile(dialect=pg._DIALECT)
    names = tuple(compiled.positiontup or ())
    if has_stream:
        return compiled.string, names
    n = len(names)
    table = pg._q(st.t)(st.t.checkpoints)
    hidden = ["c.seq >= q.h"]
    extra = ["base", "lock"]
    base, lock = f"${n + 1}::bigint", f"${n + 2}"
    if has_bound:
        hidden.append(f"c.seq {'>' if order == 'asc' else '<'} ${n + 3}")
        extra.append("bound")
    sql = (
        "WITH sn AS MATERIALIZED (SELECT pg_current_snapshot() AS s), "
        f"lo AS MATERIALIZED (SELECT q.h, (SELECT max(c.seq) FROM {table} c WHERE "
        f"{' AND '.join(hidden)}) AS m FROM (SELECT {pg._horizon(base)} AS h) AS q), "
        "lk AS MATERIALIZED (SELECT locktype, classid, objsubid, transactionid, "
        "virtualtransaction, mode, granted FROM pg_locks), "
        "hz AS MATERIALIZED (SELECT CASE WHEN lo.m IS NULL THEN lo.h "
        f"ELSE {_in_flight_horizon(base, lock)} END AS h, lo.m FROM lo, sn) "
        "SELECT hz.h, (CASE WHEN hz.m >= hz.h THEN hz.m END)::text, NULL::bytea FROM hz "
        f"UNION ALL SELECT * FROM ({compiled.string}) AS page"
    )
    return sql, (*names, *extra)


@lru_cache(maxsize=256)
def paired_scan_sql(
    st: Statements, order: Literal["asc", "desc"], ntags: int, nmeta: int
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """A page of one stream past a bound, and in the same statement the one-row
    probe the other way that :func:`statekeeper._paging.list_page` asks for next
    (does anything precede the page?), with the parameter names of each part.

    Rows are ``(part, seq, id, record)``, part 0 the page and 1 the probe. The
    probe's bound is the page's bound moved one step back (``<= bound`` for an
    ``asc`` page): what ``list_page`` asks, the items beyond the page's first
    entry, since none lies between the bound and that entry.
    """
    page, page_names = scan_sql(st, True, order, True, ntags, nmeta)
    back: Literal["asc", "desc"] = "desc" if order == "asc" else "asc"
    probe, probe_names = scan_sql(st, True, back, True, ntags, nmeta)
    n = len(page_names)
    probe = re.sub(r"\$(\d+)", lambda m: f"${int(m.group(1)) + n}", probe)
    sql = f"SELECT 0 AS part, * FROM ({page}) AS page UNION ALL SELECT 1, * FROM ({probe}) AS probe"
    return sql, page_names, probe_names


async def scan_rows(
    rt: PgRuntime,
    st: Statements,
    *,
    stream: str | None,
    order: Literal["asc", "desc"],
    bound: int | None,
    limit: int,
    params: dict[str, Any],
    ntags: int,
    nmeta: int,
    base: int,
    wait: float,
) -> list[tuple[int, str, bytes]]:
    """One page of ``(seq, id, record)``; of every stream, below the horizon (see
    the module docstring). For a page of one stream past a bound, see
    :func:`paired_scan_rows`.

    While the horizon hides a row such a page could show (any row of a ``desc``
    page, or an ``asc`` page that is short), retry for up to ``wait`` seconds, until
    the horizon passes every row hidden at the first try: rows committed after the
    call began need not be waited for, so steady saves cannot keep it waiting. If
    it has not passed them by then, raise :class:`StoreTimeout` (retryable): the
    page below the horizon would look complete without them.
    """
    sql, names = scan_sql(st, stream is not None, order, bound is not None, ntags, nmeta)
    values = {**params, "stream": stream, "bound": bound, "limit": limit, "base": base}
    values["lock"] = pg_statements(st.t).store_lock
    args = [values[name] for name in names]
    if stream is not None:
        return [(int(r[0]), str(r[1]), bytes(r[2])) for r in await rt.fetch(sql, *args)]
    deadline = time.monotonic() + wait
    delay = 0.0005
    target: int | None = None  # the newest row hidden at the first try
    while True:
        rows = await rt.fetch(sql, *args)
        horizon, hidden = int(rows[0][0]), rows[0][1]
        if target is None and hidden is not None:
            target = int(hidden)
        page = [(int(r[0]), str(r[1]), bytes(r[2])) for r in rows[1:]]
        if target is None or horizon > target or (order == "asc" and len(page) >= limit):
            page.sort(key=lambda r: r[0], reverse=order == "desc")
            return page
        if time.monotonic() >= deadline:
            raise await _held_back(rt, st, wait, horizon)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.01)


async def _held_back(rt: PgRuntime, st: Statements, wait: float, horizon: int) -> StoreTimeout:
    """The error of a listing that waited ``wait`` seconds in vain, naming the server
    processes whose saves held it (one more round trip, on this path only)."""
    pids = await rt.fetchrow(
        "SELECT array_agg(DISTINCT pid ORDER BY pid) FROM pg_locks WHERE locktype = "
        "'advisory' AND objsubid = 2 AND granted AND classid = $1::int4::oid",
        pg_statements(st.t).store_lock,
    )
    who = "" if pids is None or not pids[0] else f" (server pids {', '.join(map(str, pids[0]))})"
    return StoreTimeout(
        f"{pg_statements(st.t).table}: a listing of every stream waited {wait:g}s "
        f"(listing_wait) for saves to this store still in flight{who}, which hold back "
        f"sequences from {horizon} on; without them the page would look complete, so "
        "nothing was returned. Retry the call, or raise listing_wait"
    )


async def paired_scan_rows(
    rt: PgRuntime,
    st: Statements,
    *,
    stream: str,
    order: Literal["asc", "desc"],
    bound: int,
    limit: int,
    params: dict[str, Any],
    ntags: int,
    nmeta: int,
) -> tuple[list[tuple[int, str, bytes]], list[tuple[int, str, bytes]]]:
    """A page of one stream past ``bound`` and its probe (:func:`paired_scan_sql`),
    in one round trip: ``(page rows, probe rows)``."""
    sql, page_names, probe_names = paired_scan_sql(st, order, ntags, nmeta)
    step = 1 if order == "asc" else -1
    values = {**params, "stream": stream, "bound": bound, "limit": limit}
    probe = {**values, "bound": bound + step, "limit": 1}
    args = [values[name] for name in page_names] + [probe[name] for name in probe_names]
    parts: tuple[list[tuple[int, str, bytes]], list[tuple[int, str, bytes]]] = ([], [])
    for part, seq, rid, blob in await rt.fetch(sql, *args):
        parts[part].append((int(seq), str(rid), bytes(blob)))
    parts[0].sort(key=lambda r: r[0], reverse=order == "desc")
    return parts
