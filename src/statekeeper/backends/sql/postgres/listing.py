"""PostgreSQL listings: the keyset pages of the lean path, and the horizon
that keeps a listing of every stream from passing a save still in flight.

A page of one stream is a plain keyset scan (saves to one stream commit in sequence
order). A page of every stream stays below the horizon, which only this store's
saves in flight hold back (see the :mod:`.sequences` module docstring, "Horizon"); a
listing held back longer than ``listing_wait`` raises a retryable
:class:`~statekeeper.errors.StoreTimeout` rather than return a page that would
look complete without them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from ....errors import StoreTimeout
from ..schema import Statements
from .runtime import PgRuntime
from .statements import PgStatements, paired_scan_sql, scan_sql

__all__ = ["paired_scan_rows", "scan_rows"]

Row = tuple[int, str, bytes]


async def scan_rows(
    rt: PgRuntime,
    st: Statements,
    pst: PgStatements,
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
) -> list[Row]:
    """One page of ``(seq, id, record)``; of every stream, below the horizon (see
    :func:`.statements.scan_sql`). For a page of one stream past a bound, see
    :func:`paired_scan_rows`.

    While the horizon hides a row such a page could show (any row of a ``desc``
    page, or an ``asc`` page that is short), retry for up to ``wait`` seconds, until
    the horizon passes every row hidden at the first try: rows committed after the
    call began need not be waited for, so steady saves cannot keep it waiting. If
    it has not passed them by then, raise :class:`StoreTimeout` (retryable): the
    page below the horizon would look complete without them.
    """
    stmt = scan_sql(st, stream is not None, order, bound is not None, ntags, nmeta)
    values = {**params, "stream": stream, "bound": bound, "limit": limit, "base": base}
    values["lock"] = pst.store_lock
    if stream is not None:
        return [(int(r[0]), str(r[1]), bytes(r[2])) for r in await rt.fetch(stmt, values)]
    deadline = time.monotonic() + wait
    delay = 0.0005
    target: int | None = None  # the newest row hidden at the first try
    while True:
        rows = await rt.fetch(stmt, values)
        horizon, hidden = int(rows[0][0]), rows[0][1]
        if target is None and hidden is not None:
            target = int(hidden)
        page = [(int(r[0]), str(r[1]), bytes(r[2])) for r in rows[1:]]
        if target is None or horizon > target or (order == "asc" and len(page) >= limit):
            page.sort(key=lambda r: r[0], reverse=order == "desc")
            return page
        if time.monotonic() >= deadline:
            raise await _held_back(rt, pst, wait, horizon)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.01)


async def _held_back(rt: PgRuntime, pst: PgStatements, wait: float, horizon: int) -> StoreTimeout:
    """The error of a listing that waited ``wait`` seconds in vain, naming the server
    processes whose saves held it (one more round trip, on this path only)."""
    pids = await rt.fetchrow(pst.lock_holders, {"lock": pst.store_lock})
    who = "" if pids is None or not pids[0] else f" (server pids {', '.join(map(str, pids[0]))})"
    return StoreTimeout(
        f"{pst.table}: a listing of every stream waited {wait:g}s "
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
) -> tuple[list[Row], list[Row]]:
    """A page of one stream past ``bound`` and its probe (:func:`.statements.paired_scan_sql`),
    in one round trip: ``(page rows, probe rows)``."""
    stmt = paired_scan_sql(st, order, ntags, nmeta)
    step = 1 if order == "asc" else -1
    values = {**params, "stream": stream, "bound": bound, "limit": limit}
    probe = {**values, "bound": bound + step, "limit": 1}
    values.update({f"probe_{name}": value for name, value in probe.items()})
    parts: tuple[list[Row], list[Row]] = ([], [])
    for part, seq, rid, blob in await rt.fetch(stmt, values):
        parts[part].append((int(seq), str(rid), bytes(blob)))
    parts[0].sort(key=lambda r: r[0], reverse=order == "desc")
    return parts
