"""Deliberately broken variants ("mutants") that the reliability tests must catch.

A test that has never been seen to fail proves nothing. Every checker in the
suite is run against at least one mutant here, and the suite asserts that the
checker *fails* on it, so the tests keep their teeth.

Two kinds:

- :class:`SnapshotStore`, a small persistent backend (the memory backend's logic,
  persisted to one JSON snapshot per store, replaced atomically and fsynced after
  every write, under a cross-process file lock). Honest with ``bug=none``, it
  passes the same checks as the real backends. Each other ``bug`` breaks one
  promise the way real backends get it wrong.
- Patches of the shared base class or the record envelope, which break *any*
  backend in the process that installs them (a child workload installs one
  with ``--setup mutants:<name>``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

from filelock import FileLock

from statekeeper import Capabilities, StoreOptions, StoreURL
from statekeeper._core.primitives import StoreIdentity
from statekeeper._core.query import ScanQuery
from statekeeper._core.store import BaseCheckpointStore
from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.backends.memory.storage import Entry
from statekeeper.errors import CheckpointNotFound, PreconditionFailed
from statekeeper.models import Checkpoint, CheckpointHeader, Skipped
from statekeeper.record import NewRecord, StoredRecord, Update

Bug = Literal[
    "none",
    "max_plus_one",  # next sequence = max(existing) + 1: reuses a deleted newest sequence
    "fallback_latest",  # get_latest skips an unreadable newest and returns an older one
    "ignore_checksum",  # the reader does not verify the CRC: corruption reads as data
    "torn_write",  # rewrites the snapshot in place: a crash leaves half a file
    "lost_update",  # compare-and-set checks the etag outside the lock
    "stale_latest",  # get_latest answers from a per-process cache, never invalidated
    "dup_pages",  # the cursor bound is inclusive: pages repeat their boundary item
]


class SnapshotOptions(StoreOptions):
    bug: Bug = "none"


class SnapshotStore(MemoryCheckpointStore):
    """``snap:///abs/dir?bug=...``: a persistent, cross-process test backend."""

    Options: ClassVar[type[StoreOptions]] = SnapshotOptions
    capabilities: ClassVar[Capabilities] = Capabilities(
        persistent=True, cross_process=True, power_loss_durable=True, ttl=True, raw_access=True
    )
    backend_name: ClassVar[str] = "snap"

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(**options)
        self.dir = Path(path)
        self.file = self.dir / "snapshot.json"
        self.bug: Bug = self.options.bug  # type: ignore[attr-defined]
        self._lock = FileLock(str(self.dir / ".lock"))
        self._cache: dict[str, tuple[float, StoredRecord | None]] = {}

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> SnapshotStore:
        return cls(url.path, **{**url.query, **options})

    def describe(self) -> str:
        return f"snap://{self.dir}"

    # -- persistence ---------------------------------------------------------------

    def _read(self) -> None:
        if not self.file.exists():
            return
        doc = json.loads(self.file.read_bytes())
        data = MemoryStorage(doc["store_id"], bytes.fromhex(doc["key"]), doc["hwm"])
        for rid, seq, stream, blob, tags, expires in doc["entries"]:
            exp = datetime.fromisoformat(expires) if expires else None
            data.by_id[rid] = Entry(seq, stream, base64.b64decode(blob), tags, exp)
            data.by_seq[seq] = rid
        data.all_seqs = sorted(data.by_seq)
        for seq in data.all_seqs:
            data.stream_seqs.setdefault(data.by_id[data.by_seq[seq]].stream, []).append(seq)
        self.storage = data

    def _write(self) -> None:
        d = self.storage
        doc = {
            "store_id": d.store_id,
            "key": d.cursor_key.hex(),
            "hwm": d.high_water_mark,
            "entries": [
                [
                    rid,
                    e.sequence,
                    e.stream,
                    base64.b64encode(e.blob).decode(),
                    e.tags,
                    e.expires_at.isoformat() if e.expires_at else None,
                ]
                for rid, e in d.by_id.items()
            ],
        }
        data = json.dumps(doc).encode()
        if self.bug == "torn_write":
            with open(self.file, "r+b" if self.file.exists() else "wb") as f:
                half = len(data) // 2
                f.write(data[:half])
                f.flush()
                f.write(data[half:])
                f.truncate()
            return
        tmp = self.dir / f"snapshot.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.file)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    async def _locked(self, fn: Callable[[], Any], *, write: bool) -> Any:
        if not write:
            # the snapshot is replaced by rename, so a reader needs no lock; with it,
            # readers would queue behind every writer's fsync
            self._read()
            return await fn()
        with self._lock:
            self._read()
            result = await fn()
            self._write()
            return result

    # -- primitives ----------------------------------------------------------------

    async def _open(self) -> StoreIdentity:
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._read()
            if not self.file.exists():
                self._write()
        return StoreIdentity(self.storage.store_id, self.storage.cursor_key, 1)

    def _parse(self, id: str, entry: Entry) -> StoredRecord:
        blob = entry.blob
        if self.bug == "ignore_checksum":
            blob = _recrc(blob)
        return StoredRecord.from_bytes(
            blob,
            location=f"{self.file}#seq={entry.sequence}",
            expect_store_id=self.storage.store_id,
            expect_id=id,
            expect_sequence=entry.sequence,
        )

    async def _insert(self, record: NewRecord) -> CheckpointHeader:
        async def go() -> CheckpointHeader:
            if self.bug == "max_plus_one":
                self.storage.high_water_mark = max(self.storage.all_seqs, default=0)
            return await MemoryCheckpointStore._insert(self, record)

        result: CheckpointHeader = await self._locked(go, write=True)
        return result

    async def _update(self, update: Update) -> CheckpointHeader:
        sup = super()._update
        id, if_match = update.id, update.if_match
        if self.bug == "lost_update" and if_match is not None:
            current = await self._get(id, update.now)
            if current is None:
                raise CheckpointNotFound(id)
            if current.header.etag != if_match:
                raise PreconditionFailed(f"{id!r} has another etag")
            await asyncio.sleep(0.005)  # the window in which another writer's CAS is lost
            update = replace(update, if_match=None)

        async def go() -> CheckpointHeader:
            return await sup(update)

        result: CheckpointHeader = await self._locked(go, write=True)
        return result

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        sup = super()._get
        result: StoredRecord | None = await self._locked(lambda: sup(id, now), write=False)
        return result

    async def _scan(self, query: ScanQuery) -> list[StoredRecord | Skipped]:
        if self.bug == "dup_pages" and query.bound is not None:
            query = replace(query, bound=query.bound + (-1 if query.order == "asc" else 1))
        sup = super()._scan
        result: list[StoredRecord | Skipped] = await self._locked(lambda: sup(query), write=False)
        return result

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        if self.bug == "fallback_latest":
            for entry in await self._scan(ScanQuery(stream, "desc", None, 50, {}, now)):
                if isinstance(entry, StoredRecord):
                    return entry
            return None
        if self.bug == "stale_latest":  # a per-process cache that is never invalidated
            hit = self._cache.get(stream)
            if hit is not None:
                return hit[1]
        sup = super()._latest
        result: StoredRecord | None = await self._locked(lambda: sup(stream, now), write=False)
        self._cache[stream] = (time.monotonic(), result)
        return result

    async def _delete(self, id: str, *, if_match: str | None, now: datetime) -> bool:
        sup = super()._delete
        result: bool = await self._locked(lambda: sup(id, if_match=if_match, now=now), write=True)
        return result

    async def _delete_stream(self, stream: str, now: datetime) -> int:
        sup = super()._delete_stream
        result: int = await self._locked(lambda: sup(stream, now), write=True)
        return result

    async def _prune(self, stream: str, keep_last: int, now: datetime) -> int:
        sup = super()._prune
        result: int = await self._locked(lambda: sup(stream, keep_last, now), write=True)
        return result

    async def _purge_expired(self, now: datetime) -> int:
        sup = super()._purge_expired
        result: int = await self._locked(lambda: sup(now), write=True)
        return result

    async def _list_streams(self, now: datetime) -> list[str]:
        sup = super()._list_streams
        result: list[str] = await self._locked(lambda: sup(now), write=False)
        return result

    async def backdoor_read_raw(self, id: str) -> bytes:
        sup = super().backdoor_read_raw
        result: bytes = await self._locked(lambda: sup(id), write=False)
        return result

    async def backdoor_write_raw(self, id: str, data: bytes) -> None:
        sup = super().backdoor_write_raw
        await self._locked(lambda: sup(id, data), write=True)


SNAP_TARGET = "mutants:SnapshotStore"


def _recrc(blob: bytes) -> bytes:
    """``blob`` with its CRC recomputed: what a reader that ignores the checksum sees."""
    newline = blob.find(b"\n", 0, 64)
    parts = blob[:newline].split(b" ")
    if newline < 0 or len(parts) != 4:
        return blob
    body = blob[newline + 1 :]
    hlen = int(parts[1])
    crc = zlib.crc32(body[hlen:], zlib.crc32(body[:hlen]))
    return b" ".join([*parts[:3], b"%08x" % crc]) + b"\n" + body


# -- patches that break any backend in the process --------------------------------------

_ORIGINAL: dict[str, Any] = {}


def ignore_checksum() -> None:
    """Make ``StoredRecord.from_bytes`` accept any CRC (a reader that ignores the checksum)."""
    original = StoredRecord.from_bytes.__func__  # type: ignore[attr-defined]
    _ORIGINAL.setdefault("from_bytes", StoredRecord.from_bytes)

    def from_bytes(cls: type[StoredRecord], data: bytes, **kw: Any) -> StoredRecord:
        raw = bytes(data) if isinstance(data, bytes | bytearray | memoryview) else data
        result: StoredRecord = original(cls, _recrc(raw) if isinstance(raw, bytes) else raw, **kw)
        return result

    StoredRecord.from_bytes = classmethod(from_bytes)  # type: ignore[assignment,method-assign]


def fallback_latest() -> None:
    """Make every backend's ``get_latest`` fall back past an unreadable newest checkpoint."""
    _ORIGINAL.setdefault("get_latest", BaseCheckpointStore.get_latest)

    async def get_latest(self: BaseCheckpointStore, stream: str) -> Checkpoint | None:
        page = await self.list(stream, limit=50, order="desc")
        return page.items[0] if page.items else None

    BaseCheckpointStore.get_latest = get_latest  # type: ignore[method-assign]


def lost_update() -> None:
    """Make every backend's ``update(if_match=)`` check the etag outside the write."""
    original = BaseCheckpointStore.update
    _ORIGINAL.setdefault("update", original)

    async def update(
        self: BaseCheckpointStore,
        id: str,
        state: Any,
        *,
        if_match: str | None = None,
    ) -> Checkpoint:
        if if_match is not None:
            current = await self.load(id)
            if current.etag != if_match:
                raise PreconditionFailed(f"{id!r} has etag {current.etag!r}")
            await asyncio.sleep(0.003)
        return await original(self, id, state, if_match=None)

    BaseCheckpointStore.update = update  # type: ignore[method-assign]


def restore() -> None:
    """Undo the process-wide patches (for in-process tests)."""
    if "from_bytes" in _ORIGINAL:
        StoredRecord.from_bytes = _ORIGINAL.pop("from_bytes")  # type: ignore[method-assign]
    if "get_latest" in _ORIGINAL:
        BaseCheckpointStore.get_latest = _ORIGINAL.pop("get_latest")  # type: ignore[method-assign]
    if "update" in _ORIGINAL:
        BaseCheckpointStore.update = _ORIGINAL.pop("update")  # type: ignore[method-assign]
    if "next_sequence" in _ORIGINAL:
        from statekeeper.backends.sql.sqlite.dialect import SqliteDialect

        SqliteDialect.next_sequence = _ORIGINAL.pop("next_sequence")  # type: ignore[method-assign]
    if "pg_statements" in _ORIGINAL:
        from statekeeper.backends.sql.postgres import statements

        statements.pg_statements = _ORIGINAL.pop("pg_statements")
        statements._horizon = _ORIGINAL.pop("pg_horizon")
        statements.scan_sql.cache_clear()


# -- mutants of the SQL backend (installed in a workload child with --setup) -------------


def sql_max_plus_one() -> None:
    """The SQL backend takes the next sequence as ``max(seq) + 1`` of the rows that exist,
    instead of from its persisted counter: a deleted newest sequence comes back."""
    import sqlalchemy as sa

    from statekeeper.backends.sql.sqlite.dialect import SqliteDialect

    _ORIGINAL.setdefault("next_sequence", SqliteDialect.next_sequence)

    def next_sequence(self: Any, s: Any, st: Any, count: int = 1) -> int:
        seq = st.t.checkpoints.c.seq
        row = s.first(sa.select(sa.func.coalesce(sa.func.max(seq), 0) + count))
        return int(row[0])

    SqliteDialect.next_sequence = next_sequence  # type: ignore[method-assign]


def pg_unordered_sequences() -> None:
    """PostgreSQL sequences from transaction ids without what makes them safe: no
    per-stream lock and no listing horizon, and every other save works between
    taking its id and committing. A save can then commit below an item a reader
    already saw (what a bare SERIAL does too)."""
    import dataclasses

    from statekeeper.backends.sql.postgres import statements

    original = statements.pg_statements
    _ORIGINAL.setdefault("pg_statements", original)
    _ORIGINAL.setdefault("pg_horizon", statements._horizon)
    lock = "count(pg_advisory_xact_lock(CAST($1 AS int4), k))"
    slow_x = (
        "x AS (SELECT q.s0 FROM (SELECT (pg_current_xact_id()::text::bigint + CAST($3 AS "
        "bigint)) * 1024 AS s0 FROM lk) q, LATERAL (SELECT pg_sleep(CASE WHEN (q.s0 / 1024) "
        "% 2 = 1 THEN 0.3 ELSE 0 END)) z),"
    )

    def pg_statements(st: Any) -> Any:
        pst = original(st)
        head, rest = pst.save.sql.split("x AS (", 1)
        rest = rest.split("\n", 1)[1]
        assert lock in head
        sql = head.replace(lock, "count(k) + 0 * CAST($1 AS int4)") + slow_x + "\n" + rest
        return dataclasses.replace(pst, save=dataclasses.replace(pst.save, sql=sql))

    statements.pg_statements = pg_statements  # type: ignore[assignment]
    statements._horizon = lambda base_param: f"(9223372036854775807 + 0 * {base_param})"
    statements.scan_sql.cache_clear()
