"""Encryption at rest, per backend, read behind the store's back (SPEC S16).

Every backend (file, SQLite, PostgreSQL, MySQL, the Redis plugin) is opened with
``encryption=`` and given states (json and raw codec) that carry a unique marker,
with tags and metadata that carry a second one; then everything the backend stores
is read raw, bytes of files, every row of every table, every value of every key,
and the state marker must be nowhere. With ``encrypt_metadata=True`` neither must
the metadata marker; with ``encrypt_metadata=False`` it is expected in plaintext
(the documented trade-off: tags and metadata stay filterable), and the test says so.

Then a plaintext record is planted over the newest record through the backend's
own storage (the file's bytes, the row's blob, the Redis key; not the core's
backdoor), carrying the store's id and the record's id, as a plaintext store would
have written it: strict reads raise ``RecordNotEncrypted`` and never answer with the
older checkpoint, a listing skips it and ``verify()`` names it ``"plaintext"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import pytest_asyncio
import sqlalchemy as sa
from reliability_support import Backend
from sqlalchemy.ext.asyncio import create_async_engine

import statekeeper
from statekeeper import BaseCheckpointStore
from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.encryption import Keyring
from statekeeper.errors import (
    CheckpointDecodeError,
    RecordNotEncrypted,
    StoreClosed,
    StoreFormatError,
)
from statekeeper.record import StoredRecord
from statekeeper.testing import service_url

pytestmark = [pytest.mark.reliability, pytest.mark.asyncio]

KINDS = ["file", "sqlite", "postgres", "mysql", "redis"]
STREAM = "job"

#: (where, bytes): one stored thing, named for the failure message.
Blob = tuple[str, bytes]


def keyring() -> Keyring:
    return Keyring({"k1": os.urandom(32)}, active="k1")


def header_of(raw: bytes) -> dict[str, Any]:
    """The header JSON of record bytes (``SK1 <hlen> <slen> <crc>\\n<header><state>``)."""
    line, rest = raw.split(b"\n", 1)
    header_len = int(line.split(b" ")[1])
    return json.loads(rest[:header_len])  # type: ignore[no-any-return]


@dataclass
class Site:
    """One store location of one backend, and its storage read and written directly."""

    kind: str
    url: str
    root: Path
    prefix: str = ""  # the SQL table prefix or the Redis key prefix
    base: str = ""  # the server URL without the store's options
    _redis: Any = field(default=None, repr=False)

    def open(self, **options: Any) -> BaseCheckpointStore:
        return statekeeper.open_store(self.url, **options)

    @property
    def sqlite_path(self) -> Path:
        return self.root / "store.db"

    # -- everything stored ---------------------------------------------------------

    async def dump(self) -> list[Blob]:
        """Every byte the backend stores for this store, as (where, bytes)."""
        if self.kind == "file":
            return [
                (str(p), p.read_bytes())
                for p in sorted((self.root / "store").rglob("*"))
                if p.is_file()
            ]
        if self.kind == "sqlite":
            return self.sqlite_files() + await asyncio.to_thread(self._sqlite_rows)
        if self.kind in ("postgres", "mysql"):
            return await self._server_rows()
        return await self._redis_values()

    def sqlite_files(self) -> list[Blob]:
        """The database file and its -wal and -shm files, those that exist now."""
        out = []
        for suffix in ("", "-wal", "-shm"):
            path = Path(f"{self.sqlite_path}{suffix}")
            if path.exists():
                out.append((str(path), path.read_bytes()))
        return out

    def _sqlite_rows(self) -> list[Blob]:
        conn = sqlite3.connect(self.sqlite_path)
        try:
            names = [
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            assert "statekeeper_checkpoints" in names, names
            out = []
            for name in names:
                for row in conn.execute(f'SELECT * FROM "{name}"'):
                    out.append((f"sqlite table {name}", _cells(row)))
            return out
        finally:
            conn.close()

    async def _server_rows(self) -> list[Blob]:
        mysql = self.kind == "mysql"
        schema = "DATABASE()" if mysql else "current_schema()"
        quote = "`" if mysql else '"'
        engine = create_async_engine(self.base)
        try:
            async with engine.connect() as conn:
                listed = await conn.execute(
                    sa.text(
                        "SELECT table_name FROM information_schema.tables "
                        f"WHERE table_schema = {schema}"
                    )
                )
                names = [str(r[0]) for r in listed if str(r[0]).startswith(self.prefix)]
                assert f"{self.prefix}checkpoints" in names, names
                out = []
                for name in names:
                    rows = await conn.execute(sa.text(f"SELECT * FROM {quote}{name}{quote}"))
                    out += [(f"{self.kind} table {name}", _cells(row)) for row in rows]
                return out
        finally:
            await engine.dispose()

    async def _redis_values(self) -> list[Blob]:
        client = self.redis()
        out: list[Blob] = []
        keys = [k async for k in client.scan_iter(match="{" + self.prefix + "}:*", count=1000)]
        assert keys, f"no key under {self.prefix!r}"
        for key in keys:
            kind = (await client.type(key)).decode()
            where = f"redis {kind} {key.decode()}"
            values: list[bytes]
            if kind == "string":
                values = [await client.get(key)]
            elif kind == "hash":
                values = [b for kv in (await client.hgetall(key)).items() for b in kv]
            elif kind == "zset":
                values = [m for m, _ in await client.zrange(key, 0, -1, withscores=True)]
            elif kind == "set":
                values = list(await client.smembers(key))
            elif kind == "list":
                values = list(await client.lrange(key, 0, -1))
            elif kind == "stream":
                entries = await client.xrange(key)
                values = [b for _, fields in entries for kv in fields.items() for b in kv]
            else:
                pytest.fail(f"{where}: a key of a type this test does not read")
            out += [(where, key), *((where, v) for v in values)]
        return out

    # -- one record's bytes ----------------------------------------------------------

    async def read_record(self, id: str) -> tuple[bytes, int | None]:
        """Record ``id``'s stored bytes, and the sequence stored beside them (SQL)."""
        if self.kind == "file":
            return self._record_file(id).read_bytes(), None
        if self.kind == "redis":
            blob = await self.redis().get(f"{{{self.prefix}}}:r:{id}")
            assert blob is not None, f"no Redis key for {id}"
            return bytes(blob), None
        rows = await self._sql("SELECT record, seq FROM {t} WHERE id = :id", {"id": id})
        assert len(rows) == 1, rows
        return bytes(rows[0][0]), int(rows[0][1])

    async def write_record(self, id: str, data: bytes) -> None:
        """Overwrite record ``id``'s stored bytes in place."""
        if self.kind == "file":
            await asyncio.to_thread(_overwrite, self._record_file(id), data)
            return
        if self.kind == "redis":
            key = f"{{{self.prefix}}}:r:{id}"
            assert await self.redis().set(key, data, xx=True, keepttl=True)
            return
        # aiomysql fails to escape bytes in a text statement: MySQL gets them in hex
        mysql = self.kind == "mysql"
        value = "UNHEX(:r)" if mysql else ":r"
        params: dict[str, Any] = {"r": data.hex() if mysql else data, "id": id}
        await self._sql(f"UPDATE {{t}} SET record = {value} WHERE id = :id", params)

    def _record_file(self, id: str) -> Path:
        found = list((self.root / "store" / "records").rglob(f"*.{id}.ckpt"))
        assert len(found) == 1, found
        return found[0]

    async def _sql(self, statement: str, params: dict[str, Any]) -> list[Any]:
        table = "statekeeper_checkpoints" if self.kind == "sqlite" else f"{self.prefix}checkpoints"
        text = statement.format(t=table)
        if self.kind == "sqlite":

            def run() -> list[Any]:
                conn = sqlite3.connect(self.sqlite_path, isolation_level=None, timeout=30)
                try:
                    return list(conn.execute(text, params).fetchall())
                finally:
                    conn.close()

            return await asyncio.to_thread(run)
        engine = create_async_engine(self.base)
        try:
            async with engine.begin() as conn:
                result = await conn.execute(sa.text(text), params)
                return list(result.all()) if result.returns_rows else []
        finally:
            await engine.dispose()

    def redis(self) -> Any:
        if self._redis is None:
            import redis.asyncio as aioredis

            self._redis = aioredis.Redis.from_url(self.base)
        return self._redis

    async def aclose(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


def _overwrite(path: Path, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _cells(row: Any) -> bytes:
    """A row as bytes: binary columns as they are, the others as their text."""
    parts = []
    for cell in row:
        if isinstance(cell, bytes | bytearray | memoryview):
            parts.append(bytes(cell))
        else:
            parts.append(str(cell).encode())
    return b"\x00".join(parts)


def site_of(backend: Backend, root: Path) -> Site:
    query = {k: v[0] for k, v in parse_qs(urlsplit(backend.url).query).items()}
    if backend.kind in ("postgres", "mysql"):
        base = service_url(backend.kind)
        return Site(backend.kind, backend.url, root, query["table_prefix"], base)
    if backend.kind == "redis":
        return Site(backend.kind, backend.url, root, query["key_prefix"], service_url("redis"))
    return Site(backend.kind, backend.url, root)


@pytest.fixture(params=KINDS)
def site(
    request: pytest.FixtureRequest, backend_factory: Callable[..., Backend], tmp_path: Path
) -> Site:
    """A fresh, isolated store location on each backend (skips without its server)."""
    kind = request.param
    backend = backend_factory(kind)  # the table / key prefix is this test's own
    root = tmp_path / f"{kind}0"  # where backend_factory put it (file, SQLite)
    return site_of(backend, root)


def found(blobs: list[Blob], marker: bytes) -> list[str]:
    """Where ``marker`` occurs among ``blobs``."""
    return sorted({where for where, data in blobs if marker in data})


def markers() -> tuple[str, str]:
    token = secrets.token_hex(8)
    return f"STATE-{token}-MARK", f"META-{token}-MARK"


# -- 1. no plaintext at rest --------------------------------------------------------


async def fill(site: Site, keys: Keyring, meta: bool, state_marker: str, meta_marker: str) -> None:
    """Saves, an update, a batch (json codec) and a raw-codec save with the markers.

    For SQLite, the files are also checked while the store is open (the saves are
    then in the -wal file, not yet checkpointed into the database file)."""
    options: dict[str, Any] = {"encryption": keys, "encrypt_metadata": meta}
    tags, metadata = {"owner": meta_marker}, {"note": meta_marker, "n": 1}
    async with site.open(**options) as store:
        first = await store.save(
            STREAM, {"secret": state_marker, "n": 1}, tags=tags, metadata=metadata
        )
        await store.save(STREAM, {"secret": state_marker, "n": 2}, tags=tags, metadata=metadata)
        await store.update(
            first.id, {"secret": state_marker, "n": 3}, metadata={"note": meta_marker, "n": 3}
        )
        await store.save_many(
            [
                statekeeper.NewCheckpoint(
                    stream=f"{STREAM}-{i}",
                    state={"secret": state_marker, "i": i},
                    tags=tags,
                    metadata=metadata,
                )
                for i in range(3)
            ]
        )
        if site.kind == "sqlite":
            files = site.sqlite_files()
            names = {Path(where).name for where, _ in files}
            assert {"store.db", "store.db-wal", "store.db-shm"} <= names, names
            wal = dict(files)[f"{site.sqlite_path}-wal"]
            assert len(wal) > 0, "the saves should be in the -wal file while the store is open"
            assert found(files, state_marker.encode()) == []
            if meta:
                assert found(files, meta_marker.encode()) == []
    async with site.open(codec="raw", **options) as store:
        raw = await store.save("raw", b"raw:" + state_marker.encode(), tags=tags, metadata=metadata)
        await store.update(raw.id, b"raw2:" + state_marker.encode())


@pytest.mark.parametrize("meta", [True, False], ids=["encrypt_metadata", "plain_metadata"])
async def test_no_plaintext_at_rest(site: Site, meta: bool) -> None:
    keys = keyring()
    state_marker, meta_marker = markers()
    try:
        await fill(site, keys, meta, state_marker, meta_marker)
        blobs = await site.dump()
        assert found(blobs, state_marker.encode()) == []
        if meta:
            assert found(blobs, meta_marker.encode()) == []
        else:
            # the trade-off of encrypt_metadata=False: tags and metadata stay in the
            # clear (the backend indexes and filters them); the state never does
            assert found(blobs, meta_marker.encode()), "tags/metadata are plaintext by design"

        # what was stored is what the markers say: read back through the store
        async with site.open(encryption=keys, codec="raw") as store:
            latest = await store.get_latest(STREAM)
            assert latest is not None
            assert latest.state == {"secret": state_marker, "n": 2}
            assert latest.tags == {"owner": meta_marker}
            assert latest.metadata == {"note": meta_marker, "n": 1}
            raw = await store.get_latest("raw")
            assert raw is not None
            assert raw.state == b"raw2:" + state_marker.encode()
            assert (await store.verify()).ok
    finally:
        await site.aclose()


async def test_sqlite_files_hold_no_plaintext_after_close(
    backend_factory: Callable[..., Backend], tmp_path: Path
) -> None:
    """After close the WAL is checkpointed into the database file: still no marker."""
    site = site_of(backend_factory("sqlite"), tmp_path / "sqlite0")
    state_marker, meta_marker = markers()
    await fill(site, keyring(), True, state_marker, meta_marker)
    files = site.sqlite_files()
    assert any(Path(w).name == "store.db" for w, _ in files)
    assert found(files, state_marker.encode()) == []
    assert found(files, meta_marker.encode()) == []


# -- PostgreSQL's write-ahead log ------------------------------------------------------


async def _pg_scalar(url: str, statement: str) -> str:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return str((await conn.execute(sa.text(statement))).scalar_one())
    finally:
        await engine.dispose()


@pytest_asyncio.fixture
async def pg_wal(backend_factory: Callable[..., Backend], tmp_path: Path) -> Site:
    """A PostgreSQL site whose server's WAL directory this process can read (or skip)."""
    site = site_of(backend_factory("postgres"), tmp_path / "postgres0")
    data_dir = Path(await _pg_scalar(site.base, "SHOW data_directory"))
    wal_dir = data_dir / "pg_wal"
    if not os.access(wal_dir, os.R_OK | os.X_OK):
        pytest.skip(
            f"the server's WAL directory {wal_dir} is not readable by this process "
            "(the server runs elsewhere or as another user); only the WAL scan is skipped"
        )
    return site


async def test_postgres_wal_holds_no_state_plaintext(pg_wal: Site) -> None:
    site = pg_wal
    wal_dir = Path(await _pg_scalar(site.base, "SHOW data_directory")) / "pg_wal"
    first = await _pg_scalar(site.base, "SELECT pg_walfile_name(pg_current_wal_lsn())")
    state_marker, meta_marker = markers()
    # plaintext metadata: its marker must show up in the WAL, which proves the scan
    # reads the segments the saves went to
    await fill(site, keyring(), False, state_marker, meta_marker)
    last = await _pg_scalar(site.base, "SELECT pg_walfile_name(pg_current_wal_lsn())")
    # segment names sort in WAL order (timeline, log, segment as fixed-width hex)
    segments = [p for p in sorted(wal_dir.iterdir()) if first <= p.name <= last]
    assert segments, f"no WAL segment from {first} to {last} in {wal_dir}"
    blobs = [(str(p), p.read_bytes()) for p in segments]
    assert found(blobs, meta_marker.encode()), "the scan must see this test's writes"
    assert found(blobs, state_marker.encode()) == []


# -- 2. planted plaintext ---------------------------------------------------------------


async def plaintext_twin(root: Path, state: dict[str, Any]) -> StoredRecord:
    """A record a plaintext store wrote for ``state`` (its state bytes and codec)."""
    async with statekeeper.open_store(f"file://{root}") as plain:
        cp = await plain.save(STREAM, state)
        raw = await plain.backdoor_read_raw(cp.id)
    record = StoredRecord.from_bytes(raw, location="the plaintext twin")
    assert not record.codec.startswith("aes256gcm:")
    return record


@pytest.mark.parametrize("meta", [True, False], ids=["encrypt_metadata", "plain_metadata"])
async def test_planted_plaintext_is_refused(site: Site, meta: bool, tmp_path: Path) -> None:
    keys = keyring()
    state_marker, _ = markers()
    planted_state = {"secret": state_marker, "planted": True}
    twin = await plaintext_twin(tmp_path / "twin", planted_state)
    try:
        async with site.open(encryption=keys, encrypt_metadata=meta) as store:
            older = await store.save(STREAM, {"n": 1}, tags={"t": "x"})
            newest = await store.save(STREAM, {"n": 2}, tags={"t": "x"})

            sealed, seq = await site.read_record(newest.id)
            header = header_of(sealed)
            assert header["codec"].startswith("aes256gcm:")
            record = StoredRecord.from_bytes(
                sealed,
                location="the sealed record",
                expect_store_id=store.store_id,
                expect_id=newest.id,
                expect_sequence=seq,
            )
            plain = StoredRecord(
                header=record.header, state=twin.state, codec=twin.codec, ttl=record.ttl
            ).to_bytes(store.store_id, positional=header["seq"] is None)
            assert state_marker.encode() in plain
            await site.write_record(newest.id, plain)
            assert (await site.read_record(newest.id))[0] == plain

            with pytest.raises(RecordNotEncrypted) as caught:
                await store.get_latest(STREAM)
            assert caught.value.id == newest.id
            with pytest.raises(RecordNotEncrypted):
                await store.load(newest.id)
            assert (await store.load(older.id)).state == {"n": 1}
            page = await store.list(STREAM)
            assert [cp.id for cp in page.items] == [older.id]
            assert [s.id for s in page.skipped] == [newest.id]
            report = await store.verify()
            assert not report.ok
            plaintext = [p for p in report.problems if p.kind == "plaintext"]
            assert [p.id for p in plaintext] == [newest.id], report.problems

        # reopened with encryption: refused, its newest record is plaintext
        with pytest.raises(StoreFormatError, match="plaintext"):
            async with site.open(encryption=keys):
                pass
        # the planted record is a sound plaintext record: a plaintext store reads it,
        # and refuses the sealed one beside it
        async with site.open() as store:
            latest = await store.get_latest(STREAM)
            assert latest is not None
            assert latest.id == newest.id
            assert latest.state == planted_state
            with pytest.raises(CheckpointDecodeError, match="encrypt"):
                await store.load(older.id)
    finally:
        await site.aclose()


# -- reopening: the check of the newest record may read the store id ------------------------


class _AsksStoreId(MemoryCheckpointStore):
    """A backend whose scan reads ``self.store_id``, as the Redis plugin's does."""

    async def _scan(self, query: Any) -> list[Any]:
        assert self.store_id
        return await super()._scan(query)


async def test_an_encrypted_store_with_records_reopens_when_its_scan_reads_the_store_id() -> None:
    """Regression: ``open()`` checked the newest record before the store id was
    readable, so an encrypted Redis store with records did not reopen (StoreClosed)."""
    data, keys = MemoryStorage(), keyring()
    async with _AsksStoreId(storage=data, encryption=keys) as store:
        saved = await store.save(STREAM, {"n": 1})
        store_id = store.store_id
    reopened = _AsksStoreId(storage=data, encryption=keys)
    async with reopened:
        assert reopened.store_id == store_id
        assert (await reopened.load(saved.id)).state == {"n": 1}
    with pytest.raises(StoreClosed):
        _ = reopened.store_id
