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
when a store is restored into a cluster whose ids are lower (:mod:`.seq_base`).

**Horizon.** Saves to one stream commit in sequence order, so a listing of one
stream is a plain keyset scan. A listing of every stream returns only sequences
below a horizon, computed in the statement that reads the rows, from its snapshot:
below the oldest transaction id that may still be one of this store's saves in
flight. First ``xmin`` of the snapshot (every id below it has ended; no lock table
read); only when that hides a row the page's range holds, the ids of the snapshot
still running are looked up in ``pg_locks``, and those that hold none of this
store's stream locks are passed over (:func:`.statements._in_flight_horizon`): transactions of
other applications, however long, never hold a listing back. No save still in
flight can later commit below an item a reader was shown, so a reader paging with
cursors never misses a committed checkpoint behind its cursor. When the horizon
hides rows such a page may want, the listing waits up to
``PostgresOptions.listing_wait`` for the saves that hold it, then raises
:class:`StoreTimeout` (retryable): the page below the horizon would look complete.
``get_latest`` and ``load`` read without a horizon and never wait.

**Lean path.** Those statements (:mod:`.statements`, compiled once) run on raw
asyncpg connections from a pool the runtime owns (:class:`~.runtime.PgRuntime`),
as prepared statements asyncpg caches per connection: no SQLAlchemy compilation
per call. Schema, migrations, verify, repair and the other operations stay on
SQLAlchemy (:mod:`..server`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from ....errors import BackendError, PreconditionFailed
from ....record import NewRecord, StoredRecord, header_values
from ..values import expires_micros, field_rows, stream_hash, tag_rows, to_micros
from .runtime import PgRuntime
from .statements import BASE_ROW, PgStatements, int4

__all__ = ["read_state", "save", "save_args", "stream_lock"]

_TAG_COLS = ("seq", "key", "vkey", "value", "shash")
_FIELD_COLS = ("seq", "key", "kind", "vkey", "value", "shash")


def stream_lock(stream: str) -> int:
    """The second key of a stream's advisory lock (a collision only serialises)."""
    return int4(stream_hash(stream))


def save_args(
    pst: PgStatements, stored: Sequence[StoredRecord], store_id: str, base: int
) -> dict[str, Any]:
    """The parameters of :attr:`PgStatements.save` for ``stored`` (sequences 0..n-1
    stand for their offsets; the database assigns the real ones)."""
    ids, streams, exps, recs = [], [], [], []
    tags: dict[str, list[Any]] = {name: [] for name in _TAG_COLS}
    fields: dict[str, list[Any]] = {name: [] for name in _FIELD_COLS}
    for i, r in enumerate(stored):
        h = header_values(r)  # no header model is built for the arguments
        ids.append(h["id"])
        streams.append(h["stream"])
        exps.append(expires_micros(h["expires_at"]))
        recs.append(r.to_bytes(store_id, positional=True))
        if h["tags"]:
            for row in tag_rows(i, h["stream"], h["tags"]):
                for name, col in tags.items():
                    col.append(row[name])
        if h["metadata"]:
            for row in field_rows(i, h["stream"], h["metadata"]):
                for name, col in fields.items():
                    col.append(row[name])
    return {
        "store_lock": pst.store_lock,
        "locks": sorted({stream_lock(r.stream) for r in stored}),
        "base": base,
        "ids": ids,
        "streams": streams,
        "exps": exps,
        "recs": recs,
        **{f"t_{name}": col for name, col in tags.items()},
        **{f"f_{name}": col for name, col in fields.items()},
    }


async def save(
    rt: PgRuntime,
    pst: PgStatements,
    records: Sequence[NewRecord],
    store_id: str,
    base: int,
) -> list[StoredRecord]:
    """Insert ``records`` at consecutive sequences in one statement (one round trip);
    the records as stored.

    An id that is taken (by a live or an expired checkpoint) aborts the statement,
    so nothing is written; the slow path then deletes expired holders under the
    streams' locks and retries once, or raises :class:`PreconditionFailed`.
    """
    stored = [r.seal(i) for i, r in enumerate(records)]
    args = save_args(pst, stored, store_id, base)
    try:
        rows = await rt.fetch(pst.save, args, write=True)
    except asyncpg.UniqueViolationError:
        rows = await rt.in_transaction(lambda con: _save_replacing(con, pst, records, args))
    return _stored(records, rows, pst)


async def _save_replacing(
    con: asyncpg.Connection,
    pst: PgStatements,
    records: Sequence[NewRecord],
    args: dict[str, Any],
) -> list[asyncpg.Record]:
    # The streams' locks first: the DELETE would give this transaction its id, and
    # the id must come after the locks (per-stream commit order).
    await con.fetch(pst.lock_streams.sql, *pst.lock_streams.args(args))
    ids = [r.id for r in records]
    taken = await con.fetch(pst.ids_taken.sql, *pst.ids_taken.args({"ids": ids}))
    by_id = {r.id: r for r in records}
    expired = []
    for seq, rid, expires_at in taken:
        record = by_id[str(rid)]
        if expires_at is None or expires_at > to_micros(record.now):
            raise PreconditionFailed(f"checkpoint id {record.id!r} already exists")
        expired.append(int(seq))
    if expired:
        await con.execute(pst.delete_seqs.sql, *pst.delete_seqs.args({"seqs": expired}))
    try:
        return list(await con.fetch(pst.save.sql, *pst.save.args(args)))
    except asyncpg.UniqueViolationError as exc:
        # Taken meanwhile by a save that began after this one looked.
        raise PreconditionFailed(f"an id of this save was taken meanwhile: {exc}") from exc


def _stored(
    records: Sequence[NewRecord], rows: Sequence[asyncpg.Record], pst: PgStatements
) -> list[StoredRecord]:
    if len(rows) != len(records):
        # The guard refused: (transaction id + base) is not above every stored sequence.
        raise BackendError(
            f"{pst.table}: the next sequence would not be above every stored sequence (the "
            f"meta row {BASE_ROW!r} is too low for this cluster's transaction ids), so nothing "
            "was saved; reopen the store or run store.repair(), which raises it"
        )
    return [r.seal(int(row[0])) for r, row in zip(records, rows, strict=True)]


async def read_state(rt: PgRuntime, pst: PgStatements) -> tuple[str | None, int, int]:
    """``(seq_base row or None, max stored seq, next transaction id)``, one snapshot."""
    row = await rt.fetchrow(pst.read_state, {})
    assert row is not None
    return (None if row[0] is None else str(row[0])), int(row[1]), int(row[2])
