"""PostgreSQL: sequences from transaction ids, a visibility horizon, and a lean path.

**Sequences (S1, S10).** A save is one statement in autocommit, no lock held
between round trips::

    WITH lk AS (per-stream advisory transaction lock),
         x  AS ((pg_current_xact_id() + base) * 1024, read after lk),
         cp AS (INSERT the checkpoint rows at x + 0, x + 1, ...),
         tg AS (INSERT their tag rows), fd AS (INSERT their fields rows)
    SELECT seq FROM cp

``pg_current_xact_id()`` is a 64-bit id, monotonic for the whole cluster and
never reused, so every sequence is above every sequence assigned before it
without a counter row; ``* 1024`` leaves room for a ``save_many`` (at most 1000
items) to take consecutive sequences. The advisory lock of the stream is taken
before the transaction id exists (``x`` reads from ``lk``), so two saves to one
stream commit in sequence order; saves to different streams never wait on each
other. ``base`` (the meta row ``seq_base``) keeps sequences above every stored one
when a store is restored into a cluster whose ids are lower (:func:`ensure_base`).

**Horizon.** Saves to one stream commit in sequence order, so a listing of one
stream is a plain keyset scan. A listing of every stream returns only sequences
below a horizon, computed in the statement that reads the rows, from its snapshot:
below the oldest transaction id that may still be one of this store's saves in
flight. First ``xmin`` of the snapshot (every id below it has ended; no lock table
read); only when that hides a row the page's range holds, the ids of the snapshot
still running are looked up in ``pg_locks``, and those that hold none of this
store's stream locks are passed over (:func:`.pg_listing._in_flight_horizon`): transactions of
other applications, however long, never hold a listing back. No save still in
flight can later commit below an item a reader was shown, so a reader paging with
cursors never misses a committed checkpoint behind its cursor. When the horizon
hides rows such a page may want, the listing waits up to
``SqlOptions.listing_wait`` for the saves that hold it, then raises
:class:`StoreTimeout` (retryable): the page below the horizon would look complete.
``get_latest`` and ``load`` read without a horizon and never wait.

**Lean path.** Those statements run on raw asyncpg connections from a pool the
runtime owns (:class:`PgRuntime`), as prepared statements asyncpg caches per
connection: no SQLAlchemy compilation per call. Schema, migrations, verify,
repair and the other operations stay on SQLAlchemy (:mod:`.server`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

try:
    import asyncpg  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - without the postgres extra
    # SQLite and MySQL stores import this module too (through .stores); a
    # PostgreSQL store checks for the driver (check_driver) before any of this runs.
    asyncpg = None
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import asyncpg as sa_asyncpg

from ...errors import BackendError, PreconditionFailed, StatekeeperError, StoreTimeout
from ...models import CheckpointHeader
from ...record import NewRecord, StoredRecord
from . import dialects
from .schema import Tables, expires_micros, field_rows, stream_hash, tag_rows, to_micros
from .server import SaSession, ServerRuntime

__all__ = ["SEQ_SLOTS", "PgRuntime", "PgStatements", "base_needed", "pg_statements"]

T = TypeVar("T")

#: Sequences per transaction id: room for the largest ``save_many`` (1000 items).
SEQ_SLOTS = 1024
#: Seconds to wait for a free pooled connection (SQLAlchemy's default pool_timeout).
ACQUIRE_TIMEOUT = 30.0
#: Seconds to wait for the server to cancel the statement of a cancelled call.
CANCEL_WAIT = 10.0
#: The meta row holding the store's offset added to transaction ids.
BASE_ROW = "seq_base"

_I32 = 1 << 32
#: Pools inherited through ``fork`` (see :meth:`PgRuntime.pool`).
_FORKED_POOLS: list[Any] = []


def _int4(value: int) -> int:
    value &= _I32 - 1
    return value - _I32 if value >= 1 << 31 else value


def stream_lock(stream: str) -> int:
    """The second key of a stream's advisory lock (a collision only serialises)."""
    return _int4(stream_hash(stream))


def base_needed(max_seq: int, next_xid: int) -> int:
    """The smallest base for which ``(next_xid + base) * SEQ_SLOTS > max_seq``."""
    return max_seq // SEQ_SLOTS - next_xid + 1


@dataclass(frozen=True)
class PgStatements:
    """The lean path's SQL for one store's tables (``$n`` parameters, asyncpg)."""

    store_lock: int
    save: str
    latest: str
    get: str
    read_base: str
    table: str
    tables: Tables


_DIALECT = sa_asyncpg.dialect()  # type: ignore[no-untyped-call]


def _q(tables: Tables) -> Callable[[sa.Table], str]:
    prep = _DIALECT.identifier_preparer
    return lambda table: prep.format_table(table)


@lru_cache(maxsize=64)
def pg_statements(tables: Tables) -> PgStatements:
    q = _q(tables)
    cp, tg, fd, meta = (
        q(tables.checkpoints),
        q(tables.tags),
        q(tables.fields),
        q(tables.meta),
    )
    live = "(expires_at IS NULL OR expires_at > $2)"
    # $1 store lock key, $2 stream lock keys (sorted: no deadlock between batches),
    # $3 base, $4.. the rows; items at x.s0 + ordinality - 1.
    save = f"""
WITH lk AS (SELECT count(pg_advisory_xact_lock($1::int4, k)) AS n FROM unnest($2::int4[]) AS k),
x AS (SELECT (pg_current_xact_id()::text::bigint + $3::bigint) * {SEQ_SLOTS} AS s0 FROM lk),
cp AS (
  INSERT INTO {cp} (seq, id, stream, expires_at, record)
  SELECT x.s0 + r.i - 1, r.id, r.stream, r.exp, r.rec
  FROM x, unnest($4::text[], $5::text[], $6::bigint[], $7::bytea[])
       WITH ORDINALITY AS r(id, stream, exp, rec, i)
  WHERE x.s0 > (SELECT coalesce(max(seq), 0) FROM {cp})
  RETURNING seq
),
tg AS (
  INSERT INTO {tg} (seq, "key", vkey, value, shash)
  SELECT cp.seq, t.k, t.vk, t.v, t.h
  FROM x, unnest($8::int4[], $9::text[], $10::text[], $11::text[], $12::bigint[])
       AS t(i, k, vk, v, h), cp
  WHERE cp.seq = x.s0 + t.i
),
fd AS (
  INSERT INTO {fd} (seq, "key", kind, vkey, value, shash)
  SELECT cp.seq, f.k, f.kd, f.vk, f.v, f.h
  FROM x, unnest($13::int4[], $14::text[], $15::text[], $16::text[], $17::text[], $18::bigint[])
       AS f(i, k, kd, vk, v, h), cp
  WHERE cp.seq = x.s0 + f.i
)
SELECT seq FROM cp ORDER BY seq"""
    return PgStatements(
        store_lock=_int4(dialects.lock_key(tables)[0]),
        save=save,
        latest=f"SELECT seq, id, record FROM {cp} WHERE stream = $1 AND {live} "
        "ORDER BY seq DESC LIMIT 1",
        get=f"SELECT seq, record FROM {cp} WHERE id = $1 AND {live}",
        read_base=f"SELECT value FROM {meta} WHERE name = '{BASE_ROW}'",
        table=cp,
        tables=tables,
    )


def _horizon(base_param: str) -> str:
    """The first horizon: below the oldest transaction id still running anywhere in
    the cluster (``xmin`` of the statement's snapshot). Exact when nothing runs that
    is older than the rows a page wants, and free: no lock table read."""
    return f"(pg_snapshot_xmin(pg_current_snapshot())::text::bigint + {base_param}) * {SEQ_SLOTS}"


class _Connections:
    """A small pool of asyncpg connections, cheaper per checkout than ``asyncpg.Pool``
    (no task, no timeout context per acquire and release: those were a third of the
    client's CPU for one ``get_latest``).

    Up to ``size`` connections, opened on demand, the most recently used first. A
    connection comes back idle unless its user was interrupted (cancelled) or failed
    other than by a database error, or it is still in a transaction; then it is
    closed, never reused in an unknown state.
    """

    def __init__(self, connect_args: Mapping[str, Any], size: int) -> None:
        self._args = dict(connect_args)
        self._size = size
        self._idle: list[asyncpg.Connection] = []
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def acquire(self, within: float) -> asyncpg.Connection:
        """A connection; :class:`TimeoutError` if none is free ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            if self._closed:
                raise BackendError("the store's connections are closed")
            while self._idle:
                con = self._idle.pop()
                if not con.is_closed():
                    return con
                self._open -= 1
            if self._open < self._size:
                self._open += 1
                try:
                    return await asyncpg.connect(**self._args)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(left):
                    await waiter
            except TimeoutError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the wake-up on to the next waiter
                raise
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()
                raise
            finally:
                if not waiter.done():
                    self._waiters.remove(waiter)

    async def release(self, con: asyncpg.Connection, error: BaseException | None) -> None:
        reusable = error is None or isinstance(error, asyncpg.PostgresError | StatekeeperError)
        if reusable and not self._closed and not con.is_closed() and not con.is_in_transaction():
            self._idle.append(con)
            self._wake()
            return
        try:
            # Cancelled mid-statement: asyncpg is sending the server a cancel request.
            # Wait for it (as asyncpg's own pool does), or the statement would run on
            # (a save waiting for its stream's lock would land after all): closing
            # the socket alone does not stop a backend that is not reading it.
            protocol = getattr(con, "_protocol", None)
            if protocol is not None and protocol._is_cancelling():
                await asyncio.shield(protocol._wait_for_cancellation(CANCEL_WAIT))
        except (Exception, asyncio.CancelledError):
            pass  # the caller raises its own error; the connection goes regardless
        finally:
            self._open -= 1
            con.terminate()
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        self._open -= len(idle)
        for con in idle:
            try:
                await con.close(timeout=5)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                con.terminate()
        self._wake()


class PgRuntime(ServerRuntime):
    """:class:`ServerRuntime` plus asyncpg connections for the hot statements."""

    def __init__(self, *args: Any, asyncpg_args: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        connect_args = dict(asyncpg_args)
        connect_args.pop("min_size", None)
        self._size = int(connect_args.pop("max_size", 5))
        self._asyncpg_args = connect_args
        self._pool: _Connections | None = None
        self._pool_pid = os.getpid()

    async def start(self) -> None:
        await super().start()
        # Connect now, so that a wrong URL fails the open, not the first save.
        async with self.connection() as con:
            version = con.get_server_version()
        if version.major < 13:
            raise BackendError(
                f"PostgreSQL {version.major}.{version.minor} is too old: statekeeper needs "
                "PostgreSQL 13 or later (pg_current_xact_id, pg_current_snapshot)"
            )

    def pool(self) -> _Connections:
        if self._pool is not None and self._pool_pid != os.getpid():
            # Forked: the sockets are the parent's; forget them unclosed, and keep them
            # from the garbage collector, whose finaliser would abort them noisily.
            _FORKED_POOLS.append(self._pool)
            self._pool = None
        if self._pool is None:
            self._pool_pid = os.getpid()
            self._pool = _Connections(self._asyncpg_args, self._size)
        return self._pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; :class:`StoreTimeout` if none frees up in time (as
        SQLAlchemy's pool does for the other operations)."""
        pool = self.pool()
        try:
            con = await pool.acquire(ACQUIRE_TIMEOUT)
        except TimeoutError as exc:
            raise StoreTimeout(
                f"no database connection became free within {ACQUIRE_TIMEOUT:g}s; raise pool_size",
                orig=exc,
            ) from exc
        try:
            yield con
        except BaseException as exc:
            await pool.release(con, exc)
            raise
        await pool.release(con, None)

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        async with self.connection() as con:
            return list(await con.fetch(sql, *args))

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        async with self.connection() as con:
            return await con.fetchrow(sql, *args)

    async def in_transaction(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        async with self.connection() as con, con.transaction():
            return await fn(con)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        try:
            if pool is not None and self._pool_pid == os.getpid():
                await pool.close()
        finally:
            await super().close()


# -- saves --------------------------------------------------------------------------------


def save_args(
    pst: PgStatements, stored: Sequence[StoredRecord], store_id: str, base: int
) -> tuple[Any, ...]:
    """The parameters of :attr:`PgStatements.save` for ``stored`` (sequences 0..n-1
    stand for their offsets; the database assigns the real ones)."""
    locks = sorted({stream_lock(r.stream) for r in stored})
    ids, streams, exps, recs = [], [], [], []
    t_cols: tuple[list[Any], ...] = ([], [], [], [], [])
    f_cols: tuple[list[Any], ...] = ([], [], [], [], [], [])
    for i, r in enumerate(stored):
        h = r.header
        ids.append(h.id)
        streams.append(h.stream)
        exps.append(expires_micros(h.expires_at))
        recs.append(r.to_bytes(store_id, positional=True))
        if h.tags:
            for row in tag_rows(i, h.stream, dict(h.tags)):
                for col, name in zip(t_cols, ("seq", "key", "vkey", "value", "shash"), strict=True):
                    col.append(row[name])
        if h.metadata:
            for row in field_rows(i, h.stream, dict(h.metadata)):
                names = ("seq", "key", "kind", "vkey", "value", "shash")
                for col, name in zip(f_cols, names, strict=True):
                    col.append(row[name])
    return (pst.store_lock, locks, base, ids, streams, exps, recs, *t_cols, *f_cols)


async def save(
    rt: PgRuntime,
    pst: PgStatements,
    records: Sequence[NewRecord],
    store_id: str,
    base: int,
) -> list[CheckpointHeader]:
    """Insert ``records`` at consecutive sequences in one statement (one round trip).

    An id that is taken (by a live or an expired checkpoint) aborts the statement,
    so nothing is written; the slow path then deletes expired holders under the
    streams' locks and retries once, or raises :class:`PreconditionFailed`.
    """
    stored = [r.seal(i) for i, r in enumerate(records)]
    args = save_args(pst, stored, store_id, base)
    try:
        rows = await rt.fetch(pst.save, *args)
    except asyncpg.UniqueViolationError:
        rows = await rt.in_transaction(lambda con: _save_replacing(con, pst, records, args))
    return _headers(records, rows, pst)


async def _save_replacing(
    con: asyncpg.Connection,
    pst: PgStatements,
    records: Sequence[NewRecord],
    args: tuple[Any, ...],
) -> list[asyncpg.Record]:
    # The streams' locks first: the DELETE would give this transaction its id, and
    # the id must come after the locks (per-stream commit order).
    await con.fetch(
        "SELECT count(pg_advisory_xact_lock($1::int4, k)) FROM unnest($2::int4[]) AS k",
        args[0],
        args[1],
    )
    ids = [r.id for r in records]
    taken = await con.fetch(
        f"SELECT seq, id, expires_at FROM {pst.table} WHERE id = ANY($1::text[]) FOR UPDATE",
        ids,
    )
    by_id = {r.id: r for r in records}
    expired = []
    for seq, rid, expires_at in taken:
        record = by_id[str(rid)]
        if expires_at is None or expires_at > to_micros(record.now):
            raise PreconditionFailed(f"checkpoint id {record.id!r} already exists")
        expired.append(int(seq))
    if expired:
        await con.execute(f"DELETE FROM {pst.table} WHERE seq = ANY($1::bigint[])", expired)
    try:
        return list(await con.fetch(pst.save, *args))
    except asyncpg.UniqueViolationError as exc:
        # Taken meanwhile by a save that began after this one looked.
        raise PreconditionFailed(f"an id of this save was taken meanwhile: {exc}") from exc


def _headers(
    records: Sequence[NewRecord], rows: Sequence[asyncpg.Record], pst: PgStatements
) -> list[CheckpointHeader]:
    if len(rows) != len(records):
        # The guard refused: (transaction id + base) is not above every stored sequence.
        raise BackendError(
            f"{pst.table}: the next sequence would not be above every stored sequence (the "
            f"meta row {BASE_ROW!r} is too low for this cluster's transaction ids), so nothing "
            "was saved; reopen the store or run store.repair(), which raises it"
        )
    return [r.seal(int(row[0])).header for r, row in zip(records, rows, strict=True)]


# -- reads -----------------------------------------------------------------------------------


async def read_state(rt: PgRuntime, pst: PgStatements) -> tuple[str | None, int, int]:
    """``(seq_base row or None, max stored seq, next transaction id)``, one snapshot."""
    row = await rt.fetchrow(
        f"SELECT ({pst.read_base}), (SELECT coalesce(max(seq), 0) FROM {pst.table}), "
        "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
    )
    assert row is not None
    return (None if row[0] is None else str(row[0])), int(row[1]), int(row[2])


def parse_base(raw: str | None) -> int | None:
    if raw is None:
        return None
    text = raw.strip()
    if not text.lstrip("-").isdigit() or len(text) > 20:
        return None
    return int(text)


def raise_base(s: SaSession, tables: Tables) -> int:
    """Under the migration lock: set ``seq_base`` to at least what this cluster's
    transaction ids need to stay above every stored sequence; the value set."""
    meta, cp = tables.meta, tables.checkpoints
    raw = s.first(sa.select(meta.c.value).where(meta.c.name == BASE_ROW))
    top = s.first(sa.select(sa.func.coalesce(sa.func.max(cp.c.seq), 0)))
    nxt = s.first(sa.text("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))
    assert top is not None and nxt is not None
    current = parse_base(None if raw is None else str(raw[0]))
    base = max(current or 0, base_needed(int(top[0]), int(nxt[0])))
    if raw is None:
        s.run(meta.insert().values(name=BASE_ROW, value=str(base)))
    elif current != base:
        s.run(meta.update().where(meta.c.name == BASE_ROW).values(value=str(base)))
    return base


def base_problem(raw: str | None, base: int | None, need: int) -> str:
    """Why the ``seq_base`` row cannot give safe sequences, and how to repair it."""
    if raw is None:
        what = f"the meta row {BASE_ROW!r} is missing"
    elif base is None:
        what = f"the meta row {BASE_ROW!r} holds {raw!r}, not an integer"
    else:
        what = (
            f"the meta row {BASE_ROW!r} is {base}, too low for this cluster's transaction "
            f"ids (at least {need} is needed to stay above every stored sequence)"
        )
    return f"{what}; opening the store writable, or store.repair(), raises it"
