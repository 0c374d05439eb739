"""The SQL backend's store: :class:`SqlCheckpointStore`, every operation written once.

Each operation is a synchronous function over a :class:`~.dialects.Session`; the
dialect's runtime decides where it runs (SQLite: on its threads or inline,
:mod:`.sqlite`; PostgreSQL and MySQL/MariaDB: ``run_sync`` of a SQLAlchemy async
engine, :mod:`.server`). Ordering (S10): sequences come from a counter row that
each saving transaction locks, on PostgreSQL from its transaction id
(:mod:`.postgres`). ``docs/sql-backend.md`` has URLs, options, schema and tuning.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import lru_cache, partial
from typing import Any, ClassVar, Literal, Self, TypeVar, cast

import sqlalchemy as sa

from ..._core.integrity import repair_records
from ..._core.primitives import StoreIdentity
from ..._core.query import INLINE_PAGE_ROWS, PageScan, ScanQuery, probe_bound
from ..._core.store import BaseCheckpointStore
from ..._registry import builtin_class
from ..._url import StoreURL
from ...config import Capabilities, StoreOptions
from ...errors import CheckpointNotFound, StoreClosed, StoreFormatError
from ...models import Checkpoint, CheckpointHeader, Problem, RepairReport, Skipped
from ...record import NewRecord, StoredRecord, Update, checkpoint_of, read_record
from . import migrations, outcomes, updates, writes
from .dialects import INLINE_WRITE_BYTES, Dialect, Family, Runtime, Session
from .entries import scanned_entries
from .integrity import derived
from .integrity.upkeep import Upkeep
from .options import SqlOptions, family_of
from .schema import Statements, build_tables
from .values import filter_params, prefix_bounds, to_micros

__all__ = ["SqlCheckpointStore", "SqlOptions"]

T = TypeVar("T")
Order = Literal["asc", "desc"]


class SqlCheckpointStore(BaseCheckpointStore[SqlOptions]):
    """A :class:`~statekeeper.CheckpointStore` in an SQL database.

    The base of the dialects' stores (:class:`SqliteCheckpointStore`,
    :class:`PostgresCheckpointStore` and :class:`MysqlCheckpointStore`), each of
    which declares its dialect's capabilities and options and holds its
    :class:`~.dialects.Dialect`. ``SqlCheckpointStore.from_url(url, **options)``
    builds the class the registry names for the URL's scheme, as
    :func:`statekeeper.open_store` does; ``SqlCheckpointStore(url)`` itself raises
    :class:`TypeError` naming those.

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

    #: What differs on this store's database (each dialect's store sets its own).
    dialect: ClassVar[Dialect]

    def __init__(self, url: str | StoreURL, **options: Any) -> None:
        parsed = StoreURL.parse(url)
        if type(self) is SqlCheckpointStore:
            raise TypeError(
                "SqlCheckpointStore is the base of the SQL dialects' stores; build one "
                "with SqlCheckpointStore.from_url(url) or statekeeper.open_store(url), "
                "which pick the dialect's class by the URL's scheme, or with "
                "SqliteCheckpointStore, PostgresCheckpointStore or MysqlCheckpointStore"
            )
        family = family_of(parsed, (type(self).__name__, self.dialect.name))
        # Options may come in the URL's query too; the same option twice is an error.
        super().__init__(**parsed.merge_options(options))
        self.url = parsed.with_(query={})
        self.family: Family = family
        self.table_prefix = self.options.table_prefix
        self._st = _statements(self.table_prefix, self.options.db_schema, self.dialect)
        self.tables = self._st.t
        self._store_id = ""
        self._meta_damage: list[str] = []
        self._runtime: Runtime | None = None

    @classmethod
    def from_url(cls, url: str | StoreURL, **options: Any) -> Self:
        """Build an unopened store; URL query parameters are options.

        On :class:`SqlCheckpointStore` itself this picks the dialect's class by the
        URL's scheme (the built-in class the registry names for it:
        :class:`SqliteCheckpointStore`, :class:`PostgresCheckpointStore` or
        :class:`MysqlCheckpointStore`); on a dialect's class it builds that class.
        """
        if cls is not SqlCheckpointStore:
            return cls(url, **options)
        parsed = StoreURL.parse(url)
        family_of(parsed)  # InvalidURL for a URL that is not SQL
        # by name from the registry: a SQLite store imports no server dialect
        target = builtin_class(parsed.scheme)
        assert issubclass(target, SqlCheckpointStore)
        return cast(Self, target(parsed, **options))

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

    async def _write(self, fn: Callable[[Session], T], size: int | None = None) -> T:
        """``fn`` in a write transaction; ``size``: the state bytes of the one record it
        writes, if it writes one (up to INLINE_WRITE_BYTES: a point write)."""
        rt = self._rt()
        small = size is not None and size <= INLINE_WRITE_BYTES
        return await (rt.point_write(fn) if small else rt.write(fn))

    async def _guard(self, what: str, call: Awaitable[T]) -> T:
        """Await ``call``, turning driver errors into statekeeper errors."""
        try:
            return await call
        except BaseException as exc:
            where = f"{what} on {self.describe()}"
            err = self.dialect.translate_error(exc, where, self.options.busy_timeout)
            if err is None:
                raise
            raise err from exc

    def _upkeep(self) -> Upkeep:
        rt, where = self._rt(), self.describe()
        return Upkeep(rt, self._st, self.dialect, where, self.options.busy_timeout)

    # -- open, migrations ----------------------------------------------------------

    async def _open(self) -> StoreIdentity:
        await self._start()
        try:
            return await self._open_tables()
        except BaseException:
            await self._stop()
            raise

    async def _open_tables(self) -> StoreIdentity:
        opts = self.options
        probe, version = await self._upkeep().open_tables(
            create=opts.create, read_only=opts.read_only
        )
        self._store_id = probe.store_id
        self._meta_damage = probe.damage
        return StoreIdentity(probe.store_id, probe.cursor_key, version)

    async def _close(self) -> None:
        await self._stop()

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
        return (await self._insert_stored(record)).header

    async def _insert_checkpoint(self, record: NewRecord, state: Any) -> Checkpoint:
        # save's path: the one model it returns is built from the stored values
        if type(self)._insert is not SqlCheckpointStore._insert:
            # a subclass's own _insert still decides every save
            return await super()._insert_checkpoint(record, state)
        return checkpoint_of(await self._insert_stored(record), state)

    async def _insert_stored(self, record: NewRecord) -> StoredRecord:
        """:meth:`_insert`'s write: ``record`` saved, as stored (its header model is
        built only if asked for)."""
        self._check_meta()
        op = partial(writes.insert_one, st=self._st, record=record, store_id=self._store_id)
        call = self._write(lambda s: [op(s)], len(record.state))
        return (await outcomes.saving(self._guard("saving", call), [record], self._get_many))[0]

    async def _insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        """One transaction: the batch's sequences taken at once, every id checked, one
        multi-row insert per table, one commit (see :func:`.writes.insert_many`)."""
        self._check_meta()
        op = partial(writes.insert_many, st=self._st, records=records, store_id=self._store_id)
        call = self._guard("saving a batch", self._write(op))
        return [stored.header for stored in await outcomes.saving(call, records, self._get_many)]

    async def _update(self, update: Update) -> CheckpointHeader:
        self._check_meta()
        op = partial(
            updates.update,
            st=self._st,
            parse=self._parse,
            store_id=self._store_id,
            id=update.id,
            state=update.state,
            if_match=update.if_match,
            now=update.now,
            etag=update.etag,
            edits=update.edits,
            codec=update.codec,
        )
        call = self._guard("updating", self._write(op, len(update.state)))
        return await outcomes.updating(
            call, update.id, update.etag, partial(self._get_many, now=update.now)
        )

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        def op(s: Session) -> StoredRecord | None:
            row = s.first(self._st.get, {"id": id, "now": to_micros(now)})
            return None if row is None else self._parse(row[1], id, int(row[0]))

        return await self._guard("loading", self._rt().point_read(op))

    async def _get_many(self, ids: list[str], now: datetime) -> dict[str, StoredRecord]:
        """One statement, ``WHERE id IN (...) AND live``; a damaged record raises. Up to
        :data:`INLINE_PAGE_ROWS` ids are read as a page is, SQLite without the hop
        (``load_many`` of a single id reads it with :meth:`_get`)."""
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
        the page's edge (:func:`~statekeeper._core.query.probe_bound`), in one worker
        hop or round trip (a page of up to :data:`INLINE_PAGE_ROWS`: as point_read)."""
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
        op = partial(
            updates.delete, st=self._st, parse=self._parse, id=id, if_match=if_match, now=now
        )
        return await outcomes.deleting(self._guard("deleting", self._write(op, 0)), id)

    async def _delete_stream(self, stream: str, now: datetime) -> int:
        op = partial(updates.delete_stream, st=self._st, stream=stream, now=now)
        return await self._guard("deleting a stream", self._write(op))

    async def _prune(self, stream: str, keep_last: int, now: datetime) -> int:
        op = partial(updates.prune, st=self._st, stream=stream, keep_last=keep_last, now=now)
        return await self._guard("pruning", self._write(op))

    async def _purge_expired(self, now: datetime) -> int:
        removed = await self._guard(
            "purging", self._write(partial(updates.purge, st=self._st, now=now))
        )
        if removed:
            await self._guard("reclaiming space", self._rt().reclaim())
        return removed

    async def _reclaim(self, full: bool) -> int | None:
        return await self._guard("reclaiming space", self._rt().reclaim(full))

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
        at = {"now": to_micros(self.now())}

        def op(s: Session) -> dict[str, Any]:
            count = s.first(self._st.count, at)
            streams = s.first(self._st.count_streams, at)
            expired = s.first(self._st.count_expired, at)
            hwm = self._high_water(s)
            return {
                "checkpoints": int(count[0]) if count else 0,
                "streams": int(streams[0]) if streams else 0,
                **({"expired": int(expired[0])} if expired and expired[0] else {}),
                # None, never 0, for a missing or damaged counter row: verify says which.
                "high_water_mark": hwm,
                "dialect": self.family,
                "tables": [t.fullname for t in self.tables.all],
            }

        return await self._guard("reading store info", self._read(op))

    # -- verify and repair ---------------------------------------------------------------

    async def _verify(self) -> list[Problem]:
        """Meta rows, tables and indexes, the counter, every row against its record, and
        orphan index rows; reads only (:meth:`.integrity.upkeep.Upkeep.verify`)."""
        version = self._require_open().format_version or migrations.MIGRATIONS[-1].version
        return await self._upkeep().verify(
            version, self._check_counter, self._store_id, self._location
        )

    async def _repair(self, drop_damaged: bool) -> RepairReport:
        """Recreate lost tables and indexes, rebuild the meta rows, row columns, tag and
        fields rows and the counter from the records (:meth:`.integrity.upkeep.Upkeep.repair`),
        then deal with the damaged records."""
        identity = self._require_open()
        version = identity.format_version or migrations.MIGRATIONS[-1].version
        done = await self._upkeep().repair(
            version,
            (identity.store_id, identity.cursor_key),
            self._rebuild_counter,
            self._store_id,
            self._location,
        )
        self._meta_damage = []
        rebuilt, actions = done.summary()
        return await repair_records(
            self, drop_damaged, rebuilt=rebuilt, actions=actions, drop=self._drop_row
        )

    def _high_water(self, s: Session) -> int | None:
        """``info().high_water_mark``: the highest sequence handed out, ``None`` if the
        counter row is missing or damaged (SQLite: :mod:`.sqlite.sequence`)."""
        return derived.read_counter(s, self._st)

    def _check_counter(self, s: Session) -> list[Problem]:
        """``verify`` of what orders sequences (PostgreSQL: :mod:`.postgres.seq_base`)."""
        return derived.check_counter(s, self._st, self.describe())

    def _rebuild_counter(self, s: Session) -> tuple[int, int] | None:
        return derived.rebuild_counter(s, self._st)

    async def _drop_row(self, entry: Skipped) -> bool:
        return await self._upkeep().drop_row(entry.sequence)

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
def _statements(prefix: str, schema: str | None, dialect: Dialect) -> Statements:
    """Shared by every store of one dialect with these tables, so statements compile
    once per process and dialect. Keyed by dialect: the dialect-specific statements
    built on first use must not reach a store of another dialect (issue 11)."""
    return Statements(build_tables(prefix, schema, dialect), dialect)
