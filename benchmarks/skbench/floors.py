"""The physical floors, measured in the same run as the stores.

A floor is the cheapest way to do what a store must do, with nothing else: the
bare durable write of the same bytes, the bare SQLite transaction, a dict lookup,
a network round trip. Our figures are reported as multiples of these, which says
how much of a cost is the contract and how much is the machine.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import timeit
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

FloorOp = Callable[[int], Awaitable[Any]]


def _durable_write(directory: Path, data: bytes) -> FloorOp:
    """Write a temp file, fsync it, rename it into place, fsync the directory."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    names = itertools.count()

    async def op(_: int) -> None:
        i = next(names)  # a new file every time, as a store adding a record does
        tmp = directory / f".{i}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, directory / f"{i}.rec")
        os.fsync(dir_fd)

    op.dir_fd = dir_fd  # type: ignore[attr-defined]
    return op


def _plain_write(directory: Path, data: bytes) -> FloorOp:
    """The same without either fsync (what durability="fast" may skip)."""
    names = itertools.count()

    async def op(_: int) -> None:
        i = next(names)
        tmp = directory / f".{i}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, directory / f"{i}.rec")

    return op


def _sqlite_insert(path: Path, synchronous: str, data: bytes) -> tuple[FloorOp, sqlite3.Connection]:
    """``BEGIN IMMEDIATE; INSERT; COMMIT`` in WAL mode, from the calling thread."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS t (seq INTEGER PRIMARY KEY, stream TEXT NOT NULL, data BLOB)"
    )

    async def op(i: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (stream, data) VALUES (?, ?)", ("bench-main", data))
        conn.execute("COMMIT")

    return op, conn


async def record_bytes(stream: str = "bench-main") -> bytes:
    """The envelope bytes statekeeper stores for one ~1 KB state (what the floors write)."""
    import statekeeper

    from .payload import make_state

    async with statekeeper.open_store("memory://") as store:
        cp = await store.save(stream, make_state(1), metadata={"step": 1})
        return bytes(await store.backdoor_read_raw(cp.id))


class WriteFloors:
    """The three bare writes issue 15 compares single saves with, opened under
    ``workdir``: ``durable`` (write, fsync, rename, fsync the directory), ``plain``
    (write, rename) and ``sqlite_full`` (``BEGIN IMMEDIATE; INSERT; COMMIT`` at
    ``synchronous=FULL``), each writing ``data``."""

    def __init__(self, workdir: Path, data: bytes) -> None:
        for name in ("floor-durable", "floor-plain"):
            (workdir / name).mkdir()
        self.durable = _durable_write(workdir / "floor-durable", data)
        self.plain = _plain_write(workdir / "floor-plain", data)
        self.sqlite_full, self._conn = _sqlite_insert(workdir / "floor-full.db", "FULL", data)

    def close(self) -> None:
        os.close(self.durable.dir_fd)  # type: ignore[attr-defined]
        self._conn.close()


def dict_lookup_seconds(size: int = 100_000) -> float:
    """One ``d[key]`` of a str-keyed dict, per call (the memory backend's floor)."""
    table = {f"id-{i}": i for i in range(size)}
    key = f"id-{size // 2}"
    number = 2_000_000
    best = min(timeit.repeat("d[k]", globals={"d": table, "k": key}, number=number, repeat=5))
    return best / number


class Floors:
    """The write floors and the network round trip, kept open across sizes so they
    can be measured in the same interleaved rounds as the stores' saves and reads."""

    def __init__(self, workdir: Path, record_bytes: bytes, redis_url: str) -> None:
        self.workdir = workdir
        self.record = record_bytes
        self.redis_url = redis_url
        self._conns: list[sqlite3.Connection] = []
        self._dir_fd: int | None = None
        self._redis: Any = None
        self.write_ops: dict[str, FloorOp] = {}
        self.read_ops: dict[str, FloorOp] = {}
        self.problems: dict[str, str] = {}

    async def open(self) -> None:
        files = self.workdir / "floor-files"
        plain = self.workdir / "floor-plain"
        files.mkdir()
        plain.mkdir()
        durable = _durable_write(files, self.record)
        self._dir_fd = durable.dir_fd  # type: ignore[attr-defined]
        full, conn_full = _sqlite_insert(self.workdir / "floor-full.db", "FULL", self.record)
        normal, conn_normal = _sqlite_insert(
            self.workdir / "floor-normal.db", "NORMAL", self.record
        )
        self._conns = [conn_full, conn_normal]
        self.write_ops = {
            "durable file write": durable,
            "plain file write": _plain_write(plain, self.record),
            "sqlite insert FULL": full,
            "sqlite insert NORMAL": normal,
        }
        try:
            import redis.asyncio as aioredis

            self._redis = aioredis.from_url(self.redis_url)
            await self._redis.ping()
        except Exception as exc:  # no server: the floor is reported as unavailable
            self.problems["redis round trip"] = f"{type(exc).__name__}: {exc}"
            self._redis = None
        else:
            client = self._redis
            self.read_ops["redis round trip"] = lambda i: client.ping()

    async def close(self) -> None:
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None
        for conn in self._conns:
            conn.close()
        self._conns = []
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
