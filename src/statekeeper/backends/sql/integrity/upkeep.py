"""Opening, ``verify`` and ``repair`` of one SQL store's tables: :class:`Upkeep`.

The store builds one :class:`Upkeep` per open runtime and hands it what it uses:
the runtime, the statements, the dialect, the store's name for messages and its
lock timeout.
Opening probes the meta table and migrates under the migration lock
(:mod:`..migrations`); ``verify`` reads one snapshot per step, and ``repair``
rebuilds in one transaction per step (:mod:`.derived`, :mod:`.schema_check`).
What orders sequences (the counter row, or PostgreSQL's ``seq_base``) is the
store's, passed in as ``check_counter`` and ``rebuild_counter``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from ....errors import ConcurrentModificationError, StoreFormatError, StoreNotFound
from ....models import Problem
from .. import migrations
from ..dialects import Dialect, Runtime, Session
from ..schema import Statements
from . import derived, schema_check

__all__ = ["Repaired", "Upkeep", "guarded"]

T = TypeVar("T")

_REBUILD = "repair() rebuilds the meta table from the records"


async def guarded(call: Awaitable[T], dialect: Dialect, what: str, where: str, busy: float) -> T:
    """Await ``call``, turning driver errors into statekeeper errors (by ``dialect``;
    ``busy``: the store's busy_timeout, which a lock timeout names)."""
    try:
        return await call
    except BaseException as exc:
        err = dialect.translate_error(exc, f"{what} on {where}", busy)
        if err is None:
            raise
        raise err from exc


@dataclass
class Repaired:
    """What ``repair`` rebuilt, step by step."""

    meta: list[str]
    rows: list[dict[str, int]]
    orphans: tuple[int, int]
    counter: tuple[int, int] | None
    schema: tuple[list[str], list[str]]

    def summary(self) -> tuple[dict[str, int], list[str]]:
        """``RepairReport.rebuilt`` and ``actions`` for what the rebuild steps did
        (``schema``: what :func:`.schema_check.rebuild_schema` recreated and left)."""
        meta, pages, orphans = self.meta, self.rows, self.orphans
        counter, schema = self.counter, self.schema
        rebuilt: dict[str, int] = {}
        done, left = schema
        actions: list[str] = [*done, *left]
        if done:
            rebuilt["schema"] = len(done)
        columns = sum(p["columns"] for p in pages)
        tagged = sum(p["tag_rows"] for p in pages)
        fielded = sum(p["field_rows"] for p in pages)
        orphan_tags, orphan_fields = orphans
        if meta:
            rebuilt["meta_rows"] = len(meta)
            actions.append(f"rewrote the meta row(s) {', '.join(meta)} from the records")
        if columns:
            rebuilt["row_columns"] = columns
            actions.append(
                f"rewrote the id/stream/expires_at columns of {columns} row(s) from their records"
            )
        if tagged or orphan_tags:
            rebuilt["tag_rows"] = tagged + orphan_tags
            actions.append(
                f"rebuilt the tag rows of {tagged} checkpoint(s) from their records and "
                f"deleted {orphan_tags} orphan tag row(s)"
            )
        if fielded or orphan_fields:
            rebuilt["field_rows"] = fielded + orphan_fields
            actions.append(
                f"rebuilt the fields rows (metadata index) of {fielded} checkpoint(s) from "
                f"their records and deleted {orphan_fields} orphan fields row(s)"
            )
        if counter is not None:
            rebuilt["counter"] = 1
            actions.append(
                f"raised the sequence counter (on PostgreSQL the seq_base offset of transaction "
                f"ids) from {counter[0]} to {counter[1]}, so new sequences stay above every "
                "sequence stored; it is never lowered, but the sequences of checkpoints "
                "deleted above it while it was damaged cannot be known"
            )
        return rebuilt, actions


class Upkeep:
    """The open runtime's table work: probe, open and migrate, verify, repair."""

    def __init__(
        self, rt: Runtime, st: Statements, dialect: Dialect, where: str, busy_timeout: float
    ) -> None:
        self.rt, self.st, self.dialect = rt, st, dialect
        self.where, self.busy_timeout = where, busy_timeout

    def _guard(self, what: str, call: Awaitable[T]) -> Awaitable[T]:
        return guarded(call, self.dialect, what, self.where, self.busy_timeout)

    async def probe(self, attempts: int = 5) -> derived.MetaProbe:
        st, where = self.st, self.where
        try:
            return await self._guard(
                "reading the meta table", self.rt.read(lambda s: derived.probe_meta(s, st, where))
            )
        except ConcurrentModificationError:
            # MySQL: another process created a table after this read's snapshot
            # began (its creation is committing meanwhile); a new snapshot sees it.
            if attempts <= 1:
                raise
            await asyncio.sleep(0.05)
            return await self.probe(attempts - 1)

    async def open_tables(self, *, create: bool, read_only: bool) -> tuple[derived.MetaProbe, int]:
        """The meta table's probe and the schema version, migrated to the latest
        unless ``read_only``; :class:`StoreNotFound` or :class:`StoreFormatError`."""
        where = self.where
        latest = migrations.MIGRATIONS[-1].version
        probe = await self.probe()
        if probe.absent is not None and not create:
            raise StoreNotFound(
                f"there is no statekeeper store at {where}: {probe.absent}. Nothing was "
                "created (create=False or read_only=True); check the URL and table_prefix"
            )
        if not read_only:
            await self._guard("preparing the database", self.rt.prepare())
        version = probe.version
        if probe.absent is not None or (version is not None and version < latest):
            if read_only:
                raise StoreFormatError(
                    f"{where} has schema version {version}, older than the version {latest} "
                    "this statekeeper reads; open it once without read_only=True to "
                    "migrate it, or read it with the statekeeper version that wrote it"
                )
            for migration in migrations.MIGRATIONS:
                if migration.version > (version or 0):
                    await self.migrate(migration)
            probe = await self.probe()
            version = probe.version
        assert version is not None
        if version > latest:
            raise StoreFormatError(
                f"{where} has schema version {version}, but this statekeeper "
                f"reads versions up to {latest}; upgrade statekeeper"
            )
        return probe, version

    async def migrate(self, migration: migrations.Migration) -> None:
        st, where = self.st, self.where
        await self._guard(
            f"migrating to schema version {migration.version}",
            self.locked(lambda s: migrations.apply_migration(s, st, migration, where)),
        )

    def locked(self, fn: Callable[[Session], T]) -> Awaitable[T]:
        """``fn`` in a write transaction under the store's migration lock."""
        tables, timeout = self.st.t, self.busy_timeout
        return self.rt.locked_write(
            lambda s: s.dialect.migration_lock(s, tables, timeout),
            fn,
            lambda s: s.dialect.migration_unlock(s, tables),
        )

    async def verify(
        self,
        version: int,
        check_counter: Callable[[Session], list[Problem]],
        store_id: str,
        locate: Callable[[int], str],
    ) -> list[Problem]:
        """Meta rows, the tables and indexes the schema version needs, the counter, every
        row's columns, tag rows and fields rows against its record, and orphan index
        rows; reads only, one snapshot per page of rows."""
        st, rt = self.st, self.rt
        problems = [
            Problem(kind="state", location=st.t.meta.name, reason=f"{damage}; {_REBUILD}")
            for damage in (await self.probe()).damage
        ]
        schema, torn = await self._guard(
            "checking the tables",
            rt.snapshot(lambda s: schema_check.check_schema(s, st, version)),
        )
        problems += schema
        if torn:
            return problems  # the row checks need every table; repair() recreates them
        problems += await self._guard("checking the counter", rt.snapshot(check_counter))
        for found in await self.pages(rt.snapshot, derived.check_rows, store_id, locate):
            problems += found
        problems += await self._guard(
            "checking index rows", rt.snapshot(lambda s: derived.check_orphan_rows(s, st))
        )
        return problems

    async def repair(
        self,
        version: int,
        identity: tuple[str, bytes],
        rebuild_counter: Callable[[Session], tuple[int, int] | None],
        store_id: str,
        locate: Callable[[int], str],
    ) -> Repaired:
        """Recreate lost tables and indexes (:mod:`.schema_check`), rebuild the meta rows
        (with ``identity``, the store id and cursor key the store was opened with), row
        columns, tag and fields rows and the counter from the records, each page of
        rows in its own transaction, its rows locked."""
        st, write = self.st, self.rt.write
        schema = await self._guard(
            "rebuilding the tables",
            self.locked(lambda s: schema_check.rebuild_schema(s, st, version)),
        )
        probe = await self.probe()
        if probe.damage:
            # Persist the identity this store was opened with (and reads use).
            probe.store_id, probe.cursor_key = identity
        meta = await self._guard(
            "rebuilding the meta table", write(lambda s: derived.rebuild_meta(s, st, probe))
        )
        rows = await self.pages(write, derived.rebuild_rows, store_id, locate)
        orphans = await self._guard(
            "deleting orphan index rows",
            write(lambda s: (s.run(st.delete_orphan_tags), s.run(st.delete_orphan_fields))),
        )
        counter = await self._guard("rebuilding the counter", write(rebuild_counter))
        return Repaired(meta, rows, orphans, counter, schema)

    async def drop_row(self, seq: int | None) -> bool:
        """Delete a damaged record's row by its sequence (the primary key), not by id:
        with the unique index on id lost, an intact row may share the id."""
        if seq is None:
            return False
        st = self.st
        op = self.rt.write(lambda s: s.run(st.delete_seq, {"seq": seq}) > 0)
        await self._guard("dropping a damaged row", op)
        return True

    async def pages(
        self,
        run: Callable[[Callable[[Session], tuple[T, int | None]]], Awaitable[tuple[T, int | None]]],
        step: derived.PageStep[T],
        store_id: str,
        locate: Callable[[int], str],
    ) -> list[T]:
        """``step`` over every page of checkpoint rows, each page in its own ``run``."""
        out: list[T] = []
        after: int | None = 0
        while after is not None:
            result, after = await self._guard(
                "walking the checkpoint rows",
                run(partial(step, st=self.st, after=after, store_id=store_id, locate=locate)),
            )
            out.append(result)
        return out
