"""The PostgreSQL store class: the SQL core's operations, with sequences from
transaction ids and the lean path for the hot operations."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, cast

from ...._core.primitives import StoreIdentity
from ...._core.query import ScanQuery, probe_bound, probe_query
from ...._url import StoreURL
from ....config import StoreOptions
from ....models import CheckpointHeader, Problem, RepairReport, Skipped
from ....record import NewRecord, StoredRecord
from .. import outcomes
from ..dialects import Runtime, Session
from ..entries import scanned_entries
from ..server import server_url
from ..server_store import ServerSqlStore
from ..values import filter_params, to_micros
from . import listing, seq_base, sequences, statements
from .dialect import POSTGRES, PostgresDialect, local_settings
from .options import PostgresOptions
from .runtime import PgRuntime

__all__ = ["PostgresCheckpointStore"]


class PostgresCheckpointStore(ServerSqlStore):
    """``postgresql://`` (asyncpg): the store to share between hosts.

    ``durability="fast"`` sets ``synchronous_commit=off``. Power-loss durability
    under ``"full"`` is the server's (``fsync=on``, the default).

    Sequences come from the saving transaction's id, not from a counter row, so
    saves to different streams never wait on each other; saves to one stream
    commit in sequence order (a per-stream advisory lock), so its listings page
    safely as they are. Listings of every stream return only sequences below the
    oldest transaction id of this store's saves still in flight (the horizon), so a
    reader paging with cursors never misses a checkpoint committed behind its
    cursor; transactions of other applications never hold it back. A listing that
    the store's own saves hold back waits at most ``listing_wait`` for them, then
    raises :class:`~statekeeper.errors.StoreTimeout` (retryable), never a page that
    looks complete without them. ``save``, ``save_many``,
    ``get_latest``, ``load`` and ``list`` run as prepared asyncpg statements
    (:mod:`.statements`, :mod:`.sequences`).
    """

    Options: ClassVar[type[StoreOptions]] = PostgresOptions
    backend_name: ClassVar[str] = "postgresql"
    dialect: ClassVar[PostgresDialect] = POSTGRES
    options: PostgresOptions

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        super().__init__(url, **options)
        self._pst = statements.pg_statements(self._st)
        self._base = 0

    def _make_runtime(self) -> Runtime:
        opts = self.options
        pooled = opts.pooler == "transaction"
        connect_args = self._connect_args(pooled)
        # what a direct connection asks the server for (open checks it arrived)
        lock_timeout = str(self._connect_args()["server_settings"]["lock_timeout"])
        u = self.url
        size = opts.pool_size or 5
        asyncpg_args = {
            "host": u.host,
            "port": u.port,
            "user": u.username,
            "password": u.password,
            "database": u.path.lstrip("/") or None,
            "min_size": 1,
            "max_size": size,
            **connect_args,
        }
        local = (
            local_settings(
                busy_timeout=opts.busy_timeout,
                fast=opts.durability == "fast",
                read_only=opts.read_only,
            )
            if pooled
            else None
        )
        return PgRuntime(
            server_url(self.url, self.dialect, self.driver),
            self.dialect,
            pool_size=size,
            echo=opts.echo,
            connect_args=connect_args,
            read_only=opts.read_only,
            local=local,
            asyncpg_args=asyncpg_args,
            lock_timeout=lock_timeout,
        )

    def _pg(self) -> PgRuntime:
        rt = self._rt()
        assert isinstance(rt, PgRuntime)
        return rt

    async def _open(self) -> StoreIdentity:
        identity = await super()._open()
        try:
            await self._guard("reading the sequence base", self._load_base())
        except BaseException:
            await self._stop()
            raise
        return identity

    async def _load_base(self) -> None:
        """Read ``seq_base``; raise it (under the migration lock) where this cluster's
        transaction ids would not give sequences above every stored one."""
        raw, top, nxt = await sequences.read_state(self._pg(), self._pst)
        base = seq_base.parse_base(raw)
        need = seq_base.base_needed(top, nxt)
        if base is not None and base >= need:
            self._base = base
            return
        if self.options.read_only:
            # Reads only need the horizon; verify() reports the row.
            self._base = max(base or 0, need)
            return
        tables, timeout = self.tables, self.options.busy_timeout
        self._base = await self._rt().locked_write(
            lambda s: s.dialect.migration_lock(s, tables, timeout),
            lambda s: seq_base.raise_base(s, tables),
            lambda s: s.dialect.migration_unlock(s, tables),
        )

    def _check_counter(self, s: Session) -> list[Problem]:
        return seq_base.check_base(s, self._st)

    def _rebuild_counter(self, s: Session) -> tuple[int, int] | None:
        return seq_base.rebuild_base(s, self._st)

    async def _repair(self, drop_damaged: bool) -> RepairReport:
        report = await super()._repair(drop_damaged)
        await self._guard("reading the sequence base", self._load_base())
        return report

    async def _insert_stored(self, record: NewRecord) -> StoredRecord:
        self._check_meta()
        call = sequences.save(self._pg(), self._pst, [record], self._store_id, self._base)
        return (await outcomes.saving(self._guard("saving", call), [record], self._get_many))[0]

    async def _insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        """One statement: the streams' locks, one transaction id for the batch (so its
        sequences are consecutive), every row; an id conflict rolls it all back."""
        self._check_meta()
        call = sequences.save(self._pg(), self._pst, records, self._store_id, self._base)
        saved = await outcomes.saving(self._guard("saving a batch", call), records, self._get_many)
        return [stored.header for stored in saved]

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        call = self._pg().fetchrow_in_order(self._pst.latest, stream, to_micros(now))
        row = await self._guard("reading the latest checkpoint", call)
        return None if row is None else self._parse(row[2], row[1], int(row[0]))

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        call = self._pg().fetchrow_in_order(self._pst.get, id, to_micros(now))
        row = await self._guard("loading", call)
        return None if row is None else self._parse(row[1], id, int(row[0]))

    async def _scan_entries(
        self, query: ScanQuery, probe: bool
    ) -> tuple[list[StoredRecord | Skipped], list[StoredRecord | Skipped] | None]:
        """One keyset scan, one round trip. A page of one stream past a bound also
        runs, in the same statement, the one-row probe ``list_page`` asks for (as
        :meth:`SqlCheckpointStore._scan_entries` does; see there); a page of every
        stream probes with a second statement, which applies the listing horizon."""
        tags, meta = dict(query.tags), dict(query.metadata)
        params = filter_params(tags, meta, query.stream)
        params["now"] = to_micros(query.now)
        stream, bound, order = query.stream, query.bound, query.order
        if probe and stream is not None and bound is not None:
            call = listing.paired_scan_rows(
                self._pg(),
                self._st,
                stream=stream,
                order=order,
                bound=bound,
                limit=query.limit,
                params=params,
                ntags=len(tags),
                nmeta=len(meta),
            )
            rows, probe_rows = await self._guard("listing", call)
            # the statement probed from where list_page would (positions past either
            # end of the stream all mean the same, so its unclamped bound agrees)
            return self._entries(rows), self._entries(probe_rows)
        call_one = listing.scan_rows(
            self._pg(),
            self._st,
            self._pst,
            stream=stream,
            order=order,
            bound=bound,
            limit=query.limit,
            params=params,
            ntags=len(tags),
            nmeta=len(meta),
            base=self._base,
            wait=self.options.listing_wait,
        )
        page = self._entries(await self._guard("listing", call_one))
        if not probe:
            return page, None
        return page, await self._scan(probe_query(query, probe_bound(query, page)))

    def _entries(self, rows: list[tuple[int, str, bytes]]) -> list[StoredRecord | Skipped]:
        return cast(
            list[StoredRecord | Skipped],
            scanned_entries(rows, self._location, self._store_id, None),
        )

    async def _info(self) -> dict[str, Any]:
        info = await super()._info()
        call = sequences.read_state(self._pg(), self._pst)
        _, _, nxt = await self._guard("reading store info", call)
        # Every sequence assigned so far is below this; none at or above it exists yet.
        info["high_water_mark"] = (nxt + self._base) * statements.SEQ_SLOTS - 1
        return info
