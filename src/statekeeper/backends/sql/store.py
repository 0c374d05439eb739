"""``sqlite://``, ``postgresql://`` and ``mysql://``: the SQL backend, on SQLAlchemy Core.

One :class:`SqlCheckpointStore` serves the three dialects. Every operation is
written once, as a synchronous function over a :class:`~.dialects.Session`;
the dialect decides where it runs:

- SQLite: on the connection's own worker thread, one thread hop per operation
  (:mod:`.schema` statements compiled for SQLite, stdlib ``sqlite3``);
- PostgreSQL (asyncpg) and MySQL/MariaDB (aiomysql): inside
  ``AsyncConnection.run_sync`` of a SQLAlchemy async engine.

Ordering (S10): on SQLite and MySQL every save takes its sequence from a per-store
counter row in the same transaction, so the row lock orders commits by sequence; on
PostgreSQL from its transaction id, with a per-stream lock and a listing horizon
(:mod:`.pg`). See
``docs/sql-backend.md`` for URLs, options, the schema, migrations and tuning.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache, partial
from typing import Any, ClassVar, Literal, Self, TypeVar, cast

import sqlalchemy as sa

from ..._integrity import repair_records
from ..._paging import INLINE_PAGE_ROWS, PageScan, probe_bound
from ..._protocol import BaseCheckpointStore, ScanQuery, StoreIdentity, skipped_from
from ..._registry import builtin_class
from ..._url import StoreURL
from ...config import Capabilities, StoreOptions
from ...errors import (
    CheckpointDecodeError,
    CheckpointNotFound,
    ConcurrentModificationError,
    PreconditionFailed,
    StoreClosed,
    StoreFormatError,
    StoreNotFound,
)
from ...models import Checkpoint, CheckpointHeader, Problem, RepairReport, Skipped
from ...record import (
    NewRecord,
    RecordEdits,
    StateDecoder,
    StoredRecord,
    read_checkpoint,
    read_record,
)
from . import dialects, integrity, migrations, schema_check, writes
from .compiler import Compiler
from .dialects import Family, Runtime, Session
from .options import SqlOptions, family_of
from .schema import (
    Statements,
    build_tables,
    expires_micros,
    filter_params,
    prefix_bounds,
    to_micros,
)

__all__ = ["SqlCheckpointStore", "SqlOptions"]

T = TypeVar("T")
Order = Literal["asc", "desc"]

_REBUILD = "repair() rebuilds the meta table from the records"


class SqlCheckpointStore(BaseCheckpointStore[SqlOptions]):
    """A :class:`~statekeeper.CheckpointStore` in an SQL database.

    ``SqlCheckpointStore(url, **options)`` returns the dialect's subclass
    (:class:`SqliteCheckpointStore`, :class:`PostgresCheckpointStore` or
    :class:`MysqlCheckpointStore`, the class the registry names for the URL's
    scheme), which declares that dialect's capabilities and options.

    Strict and tolerant reads are as the base contract says; a row whose record
    cannot be decoded raises :class:`~statekeeper.errors.CheckpointDecodeError`
    in ``get_latest``/``load`` and is reported in ``page.skipped`` by ``list``.
    Every statement is a bound-parameter statement. Sequence order is commit order
    across processes and (PostgreSQL, MySQL) hosts: on SQLite and MySQL sequences
    come from a counter row locked by each saving transaction, which serialises
    saves; on PostgreSQL from the saving transaction's id, saves to one stream
    ordered by its lock and listings of every stream kept below the oldest running
    transaction (``docs/sql-backend.md``).
    Driver errors raise :class:`~statekeeper.errors.BackendError` (``.orig`` is the
    driver's exception) and lock timeouts :class:`~statekeeper.errors.StoreTimeout`.

    ``save_many`` is one transaction (``capabilities.atomic_batches``): one counter
    bump for the whole batch, so its sequences are consecutive and no concurrent
    save lands between them, every id checked, one commit; readers see all of it
    or none. ``load_many`` and ``delete_many`` are one ``IN (...)`` statement each.
    ``list(metadata=)`` is answered from the fields table, an index of the scalar
    top-level metadata values by JSON kind (``capabilities.metadata_filter``), and
    ``list_streams(prefix=)`` from a range of the stream index.

    A task cancelled while its save runs may or may not have saved: the
    transaction runs to its end once it has started.

    ``create=False`` raises :class:`~statekeeper.errors.StoreNotFound` where there
    is no store, creating nothing; ``read_only=True`` also opens read-only
    connections and never migrates. Damage to derived rows (meta, counter, tag
    rows, row columns) is detected, never read as empty: saves refuse until
    :meth:`repair` where a damaged row would make them unsafe, :meth:`verify`
    reports it without writing, and :meth:`repair` rebuilds it from the records
    (see :mod:`.integrity`).
    """

    Options: ClassVar[type[StoreOptions]] = SqlOptions
    capabilities: ClassVar[Capabilities] = Capabilities(
        persistent=True,
        cross_process=True,
        power_loss_durable=True,
        ttl=True,
        raw_access=True,
        atomic_batches=True,
        metadata_filter=True,
    )
    backend_name: ClassVar[str] = "sql"

    def __new__(cls, url: str | StoreURL, **options: Any) -> Self:
        target: type[BaseCheckpointStore[Any]] = cls
        if cls is SqlCheckpointStore:
            # The dialect's class, by name from the registry (imported on first use,
            # so a SQLite store imports no server dialect).
            parsed = StoreURL.parse(url)
            family_of(parsed)
            target = builtin_class(parsed.scheme)
            assert issubclass(target, SqlCheckpointStore)
        return cast(Self, super().__new__(target))

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        parsed = StoreURL.parse(url)
        # Options may come in the URL's query too; the same option twice is an error.
        super().__init__(**parsed.merge_options(options))
        self.url = parsed.with_(query={})
        self.family: Family = family_of(self.url)
        self.table_prefix = self.options.table_prefix
        self._st, self._compiler = _statements(
            self.table_prefix, self.options.db_schema, self.family
        )
        self.tables = self._st.t
        self._store_id = ""
        self._meta_damage: list[str] = []
        self._runtime: Runtime | None = None

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> Self:
        """Build an unopened store; URL query parameters are options."""
        return cls(url, **options)

    def describe(self) -> str:
        where = self.url.with_(password=None, query={}).render()
        if self.table_prefix != "statekeeper_" or self.options.db_schema:
            schema = f"{self.options.db_schema}." if self.options.db_schema else ""
            where += f" (tables {schema}{self.table_prefix}*)"
        return where

    # -- execution: dialect subclasses provide these -------------------------------

    def _make_runtime(self) -> Runtime:
        raise NotImplementedError

    async def _start(self) -> None:
        runtime = self._make_runtime()
        try:
            await self._guard("opening", runtime.start())
        except BaseException:
            await runtime.close()
            raise
        self._runtime = runtime

    async def _stop(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            await runtime.close()

    def _rt(self) -> Runtime:
        if self._runtime is None:
            raise StoreClosed(f"{self.describe()} is not open")
        return self._runtime

    async def _read(self, fn: Callable[[Session], T]) -> T:
        return await self._rt().read(fn)

    async def _write(self, fn: Callable[[Session], T]) -> T:
        return await self._rt().write(fn)

    async def _guard(self, what: str, call: Awaitable[T]) -> T:
        """Await ``call``, turning driver errors into statekeeper errors."""
        try:
            return await call
        except BaseException as exc:
            err = dialects.translate_error(
                exc, f"{what} on {self.describe()}", self.options.busy_timeout
            )
            if err is None:
                raise
            raise err from exc

    # -- open, migrations ----------------------------------------------------------

    async def _open(self) -> StoreIdentity:
        await self._start()
        try:
            return await self._open_tables()
        except BaseException:
            await self._stop()
            raise

    async def _probe(self, attempts: int = 5) -> integrity.MetaProbe:
        where = self.describe()
        probe = self._read(lambda s: integrity.probe_meta(s, self._st, where))
        try:
            return await self._guard("reading the meta table", probe)
        except ConcurrentModificationError:
            # MySQL: another process created a table after this read's snapshot
            # began (its creation is committing meanwhile); a new snapshot sees it.
            if attempts <= 1:
                raise
            await asyncio.sleep(0.05)
            return await self._probe(attempts - 1)

    async def _open_tables(self) -> StoreIdentity:
        opts, where = self.options, self.describe()
        latest = migrations.MIGRATIONS[-1].version
        probe = await self._probe()
        if probe.absent is not None and not opts.create:
            raise StoreNotFound(
                f"there is no statekeeper store at {where}: {probe.absent}. Nothing was "
                "created (create=False or read_only=True); check the URL and table_prefix"
            )
        if not opts.read_only:
            await self._guard("preparing the database", self._rt().prepare())
        version = probe.version
        if probe.absent is not None or (version is not None and version < latest):
            if opts.read_only:
                raise StoreFormatError(
                    f"{where} has schema version {version}, older than the version {latest} "
                    "this statekeeper reads; open it once without read_only=True to "
                    "migrate it, or read it with the statekeeper version that wrote it"
                )
            for migration in migrations.MIGRATIONS:
                if migration.version > (version or 0):
                    await self._migrate(migration)
            probe = await self._probe()
            version = probe.version
        assert version is not None
        if version > latest:
            raise StoreFormatError(
                f"{where} has schema version {version}, but this statekeeper "
                f"reads versions up to {latest}; upgrade statekeeper"
            )
        self._store_id = probe.store_id
        self._meta_damage = probe.damage
        return StoreIdentity(probe.store_id, probe.cursor_key, version)

    async def _close(self) -> None:
        await self._stop()

    async def _migrate(self, migration: migrations.Migration) -> None:
        what = f"migrating to schema version {migration.version}"
        tables, timeout, where = self.tables, self.options.busy_timeout, self.describe()
        call = self._rt().locked_write(
            lambda s: dialects.migration_lock(s, tables, timeout),
            lambda s: migrations.apply_migration(s, self._st, migration, where),
            lambda s: dialects.migration_unlock(s, tables),
        )
        await self._guard(what, call)

    def _check_meta(self) -> None:
        """Refuse to write records while the meta table is damaged (see ``_open``)."""
        if self._meta_damage:
            raise StoreFormatError(
                f"{self.describe()}: the meta table is damaged ({'; '.join(self._meta_damage)}); "
                "reads work, but nothing is written until store.repair() (or "
                "'statekeeper repair URL') rebuilds it from the records"
            )

    # -- record helpers --------------------------------------------------------------

    def _location(self, seq: int) -> str:
        return f"{self.tables.checkpoints.name}[seq={seq}]"

    def _parse(self, blob: bytes, id: str, seq: int) -> StoredRecord:
        return read_record(blob, self._location, store_id=self._store_id, id=id, sequence=seq)

    # -- primitives --------------------------------------------------------------------

    async def _insert(self, record: NewRecord) -> CheckpointHeader:
        self._check_meta()
        op = partial(writes.insert_one, st=self._st, record=record, store_id=self._store_id)
        return await self._guard("saving", self._write(op))

    async def _insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        """One transaction: one counter bump for the batch, every id checked, one
        multi-row insert per table, one commit (see :func:`.writes.insert_many`)."""
        self._check_meta()
        op = partial(writes.insert_many, st=self._st, records=records, store_id=self._store_id)
        return await self._guard("saving a batch", self._write(op))

    async def _update(
        self,
        id: str,
        *,
        state: bytes,
        if_match: str | None,
        now: datetime,
        etag: str,
        edits: RecordEdits | None = None,
        codec: str | None = None,
    ) -> CheckpointHeader:
        self._check_meta()

        def op(s: Session) -> CheckpointHeader:
            seq, current = self._locked_live(s, id, now)
            _check_etag(current, if_match)
            new = current.updated(state, now=now, etag=etag, edits=edits, codec=codec)
            params = {
                "at_seq": seq,
                "new_record": new.to_bytes(self._store_id),
                "new_expires_at": expires_micros(new.header.expires_at),
            }
            s.run(self._st.set_record, params)
            if edits is not None:
                # filters read the tags and fields tables: they change in the same
                # transaction as the record
                tags, fields = edits.tags is not None, edits.metadata is not None
                writes.reindex(s, self._st, new, tags=tags, fields=fields)
            return new.header

        return await self._guard("updating", self._write(op))

    def _locked_live(self, s: Session, id: str, now: datetime) -> tuple[int, StoredRecord]:
        """The live record ``id``, row-locked for the rest of the transaction."""
        row = s.first(self._st.get_for_update, {"id": id})
        if row is None or (row[2] is not None and row[2] <= to_micros(now)):
            raise CheckpointNotFound(id)
        return int(row[0]), self._parse(row[1], id, int(row[0]))

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        def op(s: Session) -> StoredRecord | None:
            row = s.first(self._st.get, {"id": id, "now": to_micros(now)})
            return None if row is None else self._parse(row[1], id, int(row[0]))

        return await self._guard("loading", self._rt().point_read(op))

    async def _get_many(self, ids: list[str], now: datetime) -> dict[str, StoredRecord]:
        """One statement, ``WHERE id IN (...) AND live``; a damaged record raises.

        Up to :data:`INLINE_PAGE_ROWS` ids are as many lookups of the unique id index
        as a page is rows: SQLite reads them as it reads a page, without the hop (the
        LangGraph saver's ``aget_tuple`` is a ``get_latest`` and a ``load_many`` of
        one id)."""
        params = {"ids": ids, "now": to_micros(now)}

        def op(s: Session) -> dict[str, StoredRecord]:
            rows = s.rows(self._st.get_many, params)
            return {str(rid): self._parse(blob, str(rid), int(seq)) for seq, rid, blob in rows}

        rt = self._rt()
        read = rt.point_read if len(ids) <= INLINE_PAGE_ROWS else rt.read
        return await self._guard("loading a batch", read(op))

    async def _delete_many(self, ids: list[str], now: datetime) -> int:
        """One statement, ``DELETE ... WHERE id IN (...) AND live``; index rows cascade."""
        params = {"ids": ids, "now": to_micros(now)}
        return await self._guard(
            "deleting a batch", self._write(lambda s: s.run(self._st.delete_many, params))
        )

    async def _scan(self, query: ScanQuery) -> list[StoredRecord | Skipped]:
        return (await self._scan_entries(query, probe=False))[0]

    async def _scan_page(self, query: ScanQuery, probe: bool) -> PageScan:
        """A listed page's scan and its probe in one worker hop or round trip."""
        page, found = await self._scan_entries(query, probe)
        return PageScan(page, None if found is None else bool(found))

    async def _scan_entries(
        self, query: ScanQuery, probe: bool
    ) -> tuple[list[StoredRecord | Skipped], list[StoredRecord | Skipped] | None]:
        """One keyset scan and, with ``probe``, the one-row probe the other way from
        the page's edge (its first entry, or the bound's neighbour when the page is
        empty: :func:`~statekeeper._paging.probe_bound`), in one worker hop or round
        trip (or none: a page of at most :data:`INLINE_PAGE_ROWS` runs as
        :meth:`Runtime.point_read` does)."""
        tags, meta = dict(query.tags), dict(query.metadata)
        has_stream, bound = query.stream is not None, query.bound
        stmt = self._st.scan(has_stream, query.order, bound is not None, len(tags), len(meta))
        params = filter_params(tags, meta, query.stream)
        params.update(stream=query.stream, bound=bound, limit=query.limit, now=to_micros(query.now))
        if probe:
            back: Order = "desc" if query.order == "asc" else "asc"
            probe_stmt = self._st.scan(has_stream, back, True, len(tags), len(meta))

        # what _parse calls, looked up once a page rather than once a row
        location, store_id = self._location, self._store_id

        def entries(s: Session, stmt: Any, params: dict[str, Any]) -> list[StoredRecord | Skipped]:
            rows = s.rows(stmt, params)
            return cast(
                list[StoredRecord | Skipped], scanned_entries(rows, location, store_id, None)
            )

        def op(
            s: Session,
        ) -> tuple[list[StoredRecord | Skipped], list[StoredRecord | Skipped] | None]:
            page = entries(s, stmt, params)
            if not probe:
                return page, None
            edge = probe_bound(query, page)
            return page, entries(s, probe_stmt, {**params, "bound": edge, "limit": 1})

        # a page of up to INLINE_PAGE_ROWS rows is one bounded index range scan (plus
        # the one-row probe): SQLite runs it without the hop, which costs more per
        # item than the rows' envelopes do (issue 15)
        rt = self._rt()
        read = rt.point_read if query.limit <= INLINE_PAGE_ROWS else rt.read
        return await self._guard("listing", read(op))

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        def op(s: Session) -> StoredRecord | None:
            row = s.first(self._st.latest, {"stream": stream, "now": to_micros(now)})
            return None if row is None else self._parse(row[2], row[1], int(row[0]))

        return await self._guard("reading the latest checkpoint", self._rt().point_read(op))

    async def _delete(self, id: str, *, if_match: str | None, now: datetime) -> bool:
        def op(s: Session) -> bool:
            if if_match is None:
                return s.run(self._st.delete_live_id, {"id": id, "now": to_micros(now)}) > 0
            try:
                seq, current = self._locked_live(s, id, now)
            except CheckpointNotFound:
                return False
            _check_etag(current, if_match)
            return s.run(self._st.delete_seq, {"seq": seq}) > 0

        return await self._guard("deleting", self._write(op))

    async def _delete_stream(self, stream: str, now: datetime) -> int:
        def op(s: Session) -> int:
            live = s.run(self._st.delete_stream_live, {"stream": stream, "now": to_micros(now)})
            s.run(self._st.delete_stream_all, {"stream": stream})
            return live

        return await self._guard("deleting a stream", self._write(op))

    async def _prune(self, stream: str, keep_last: int, now: datetime) -> int:
        def op(s: Session) -> int:
            base = {"stream": stream, "now": to_micros(now)}
            if keep_last == 0:
                return s.run(self._st.delete_stream_live, base)
            row = s.first(self._st.prune_cutoff, {**base, "skip": keep_last - 1})
            if row is None:
                return 0
            return s.run(self._st.prune_below, {**base, "cutoff": row[0]})

        return await self._guard("pruning", self._write(op))

    async def _purge_expired(self, now: datetime) -> int:
        def op(s: Session) -> int:
            return s.run(self._st.purge, {"now": to_micros(now)})

        removed = await self._guard("purging", self._write(op))
        if removed:
            await self._guard("reclaiming space", self._rt().reclaim())
        return removed

    async def _list_streams(self, now: datetime) -> list[str]:
        def op(s: Session) -> list[str]:
            return [str(r[0]) for r in s.rows(self._st.streams, {"now": to_micros(now)})]

        return await self._guard("listing streams", self._read(op))

    async def _list_streams_prefixed(self, now: datetime, prefix: str) -> list[str]:
        """A range of the stream index, ``stream >= :prefix AND stream < :next`` in code
        point order (exact on every dialect; see :func:`.schema.prefix_bounds`)."""
        try:
            prefix.encode("utf-8")
        except UnicodeEncodeError:
            return []  # a lone surrogate: no stream name has one
        lo, hi = prefix_bounds(prefix)
        stmt = self._st.streams_from if hi is None else self._st.streams_between
        params = {"lo": lo, "hi": hi, "now": to_micros(now)}

        def op(s: Session) -> list[str]:
            return [str(r[0]) for r in s.rows(stmt, params)]

        return await self._guard("listing streams", self._read(op))

    async def _info(self) -> dict[str, Any]:
        def op(s: Session) -> dict[str, Any]:
            count = s.first(self._st.count)
            streams = s.first(self._st.count_streams)
            hwm = integrity.read_counter(s, self._st)
            return {
                "checkpoints": int(count[0]) if count else 0,
                "streams": int(streams[0]) if streams else 0,
                # None, never 0, for a missing or damaged counter row: verify says which.
                "high_water_mark": hwm,
                "dialect": self.family,
                "tables": [t.fullname for t in self.tables.all],
            }

        return await self._guard("reading store info", self._read(op))

    # -- verify and repair ---------------------------------------------------------------

    async def _verify(self) -> list[Problem]:
        """Meta rows, the tables and indexes the schema version needs, the counter, every
        row's columns, tag rows and fields rows against its record, and orphan index
        rows; reads only, one snapshot per page of rows."""
        st, rt = self._st, self._rt()
        problems = [
            Problem(kind="state", location=self.tables.meta.name, reason=f"{damage}; {_REBUILD}")
            for damage in (await self._probe()).damage
        ]
        version = self._require_open().format_version or migrations.MIGRATIONS[-1].version
        schema, torn = await self._guard(
            "checking the tables",
            rt.snapshot(lambda s: schema_check.check_schema(s, st, version)),
        )
        problems += schema
        if torn:
            return problems  # the row checks need every table; repair() recreates them
        problems += await self._guard("checking the counter", rt.snapshot(self._check_counter))
        for found in await self._pages(rt.snapshot, integrity.check_rows):
            problems += found
        problems += await self._guard(
            "checking index rows", rt.snapshot(lambda s: integrity.check_orphan_rows(s, st))
        )
        return problems

    async def _repair(self, drop_damaged: bool) -> RepairReport:
        """Recreate lost tables and indexes (:mod:`.schema_check`), rebuild the meta rows,
        row columns, tag and fields rows and the counter from the records (each page of
        rows in its own transaction, its rows locked), then deal with the damaged
        records."""
        st, tables, timeout = self._st, self.tables, self.options.busy_timeout
        version = self._require_open().format_version or migrations.MIGRATIONS[-1].version
        schema = await self._guard(
            "rebuilding the tables",
            self._rt().locked_write(
                lambda s: dialects.migration_lock(s, tables, timeout),
                lambda s: schema_check.rebuild_schema(s, st, version),
                lambda s: dialects.migration_unlock(s, tables),
            ),
        )
        probe = await self._probe()
        if probe.damage:
            # Persist the identity this store was opened with (and reads use).
            identity = self._require_open()
            probe.store_id, probe.cursor_key = identity.store_id, identity.cursor_key
        meta = await self._guard(
            "rebuilding the meta table", self._write(lambda s: integrity.rebuild_meta(s, st, probe))
        )
        self._meta_damage = []
        rows = await self._pages(self._write, integrity.rebuild_rows)
        orphans = await self._guard(
            "deleting orphan index rows",
            self._write(lambda s: (s.run(st.delete_orphan_tags), s.run(st.delete_orphan_fields))),
        )
        counter = await self._guard("rebuilding the counter", self._write(self._rebuild_counter))
        rebuilt, actions = integrity.repair_summary(meta, rows, orphans, counter, schema)
        return await repair_records(
            self, drop_damaged, rebuilt=rebuilt, actions=actions, drop=self._drop_row
        )

    def _check_counter(self, s: Session) -> list[Problem]:
        """``verify``: what orders sequences (the counter row; a dialect may have
        another, see :mod:`.postgres.seq_base`)."""
        return integrity.check_counter(s, self._st, self.describe())

    def _rebuild_counter(self, s: Session) -> tuple[int, int] | None:
        """``repair``: raise what orders sequences; ``(old, new)`` if it changed."""
        return integrity.rebuild_counter(s, self._st)

    async def _drop_row(self, entry: Skipped) -> bool:
        """Delete a damaged record's row by its sequence (the primary key), not by id:
        with the unique index on id lost, an intact row may share the id."""
        seq = entry.sequence
        if seq is None:
            return False
        op = self._write(lambda s: s.run(self._st.delete_seq, {"seq": seq}) > 0)
        await self._guard("dropping a damaged row", op)
        return True

    async def _pages(
        self,
        run: Callable[[Callable[[Session], tuple[T, int | None]]], Awaitable[tuple[T, int | None]]],
        step: integrity.PageStep[T],
    ) -> list[T]:
        """``step`` over every page of checkpoint rows, each page in its own ``run``."""
        st, store_id, out = self._st, self._store_id, []
        after: int | None = 0
        while after is not None:
            result, after = await self._guard(
                "walking the checkpoint rows",
                run(partial(step, st=st, after=after, store_id=store_id, locate=self._location)),
            )
            out.append(result)
        return out

    # -- backdoor and maintenance ------------------------------------------------------

    async def backdoor_read_raw(self, id: str) -> bytes:
        self._require_open()

        def op(s: Session) -> bytes:
            row = s.first(self._st.raw_read, {"id": id})
            if row is None:
                raise CheckpointNotFound(id)
            return bytes(row[0])

        return await self._guard("reading a raw record", self._read(op))

    async def backdoor_write_raw(self, id: str, data: bytes) -> None:
        self._require_open()

        def op(s: Session) -> None:
            if not s.run(self._st.raw_write, {"at_id": id, "new_record": bytes(data)}):
                raise CheckpointNotFound(id)

        await self._guard("writing a raw record", self._write(op))

    async def drop_tables(self) -> None:
        """Drop this store's tables and everything in them. Irreversible.

        For tests and for removing a store from a shared database. Works on an
        open or closed store; the store is closed afterwards.
        """
        await self.close()
        await self._start()
        try:

            def op(s: Session) -> None:
                for table in reversed(self.tables.all):
                    s.ddl(sa.schema.DropTable(table, if_exists=True))

            await self._guard("dropping tables", self._write(op))
        finally:
            await self._stop()


@lru_cache(maxsize=64)
def _statements(prefix: str, schema: str | None, family: Family) -> tuple[Statements, Compiler]:
    """Shared by every store of one dialect with these tables, so statements compile
    once per process and dialect. Keyed by dialect: the dialect-specific statements
    built on first use must not reach a store of another dialect (issue 11)."""
    return Statements(build_tables(prefix, schema, family), family), Compiler()


def scanned_entries(
    rows: Iterable[Sequence[Any]],
    location_of: Callable[[int], str],
    store_id: str | None,
    decoders: Mapping[str, StateDecoder] | None,
) -> list[StoredRecord | Checkpoint | Skipped]:
    """The entries of scanned ``(seq, id, record)`` rows: each record read
    (:func:`~statekeeper.record.read_record`), or with ``decoders`` read and its
    state decoded where it decodes (:func:`~statekeeper.record.read_checkpoint`);
    a record that cannot be read is a :class:`Skipped` entry."""
    out: list[StoredRecord | Checkpoint | Skipped] = []
    append = out.append
    for seq, rid, blob in rows:
        try:
            if decoders is not None:
                got: StoredRecord | Checkpoint = read_checkpoint(
                    blob, location_of, store_id=store_id, id=rid, sequence=seq, decoders=decoders
                )
            else:
                got = read_record(blob, location_of, store_id=store_id, id=rid, sequence=seq)
        except CheckpointDecodeError as exc:
            append(skipped_from(exc, rid, seq))
        else:
            append(got)
    return out


def _check_etag(current: StoredRecord, if_match: str | None) -> None:
    if if_match is not None and current.header.etag != if_match:
        raise PreconditionFailed(
            f"checkpoint {current.id!r} has etag {current.header.etag!r}, not {if_match!r}"
        )
