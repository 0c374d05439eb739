"""Opening an SQLite file: the URL's path, the connection settings, WAL, and the
writer's wait for the write lock (``BEGIN IMMEDIATE``)."""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import time
from collections.abc import Callable
from typing import Literal, TypeVar
from urllib.parse import quote

from ...._url import StoreURL
from ....errors import BackendError, InvalidURL, StoreNotFound

__all__ = [
    "BUSY_CODES",
    "Connector",
    "OpenMode",
    "begin_immediate",
    "error_code",
    "prepare_file",
    "sqlite_path",
    "with_busy_timeout",
]

T = TypeVar("T")
#: SQLite's URI open modes: read-write-create (``create=True``), read-write
#: (``create=False``: a missing file is an error, never created), read-only.
OpenMode = Literal["rwc", "rw", "ro"]
logger = logging.getLogger("statekeeper.sql")

#: SQLITE_BUSY and SQLITE_LOCKED: SQLite would have to wait for another connection.
BUSY_CODES = (5, 6)


def error_code(exc: BaseException) -> int:
    """SQLite's primary result code of a ``sqlite3`` error (0 if it has none)."""
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF


class Connector:
    """New connections to one SQLite file with one store's settings."""

    def __init__(
        self, path: str, *, mode: OpenMode, synchronous: str, busy_timeout: float, echo: bool
    ) -> None:
        self.path = path
        self.mode: OpenMode = mode
        self._uri = f"file:{quote(path)}?mode={mode}"
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._echo = echo

    def connect(self, *, wait: bool = True, check_same_thread: bool = True) -> sqlite3.Connection:
        """A new connection with this store's settings (called on a worker thread);
        ``wait=False``: SQLite's busy timeout is 0, so a lock it would wait for is an
        immediate SQLITE_BUSY."""
        if self.mode != "rwc" and not os.path.isfile(self.path):
            raise StoreNotFound(
                f"there is no SQLite store at {self.path!r} (no such file); nothing was "
                "created, because create=False or read_only=True"
            )
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):  # sqlite3 would only say "unable to open"
            raise BackendError(
                f"cannot create the SQLite store {self.path!r}: the directory "
                f"{directory!r} does not exist"
            )
        conn = sqlite3.connect(
            self._uri,
            uri=True,
            timeout=self._busy_timeout,
            isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
            cached_statements=256,
            check_same_thread=check_same_thread,
        )
        try:
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            if self.mode == "ro":
                # mode=ro already refuses writes; query_only also refuses the
                # statements that would write only a -wal or journal file.
                conn.execute("PRAGMA query_only = 1")
            if self._echo:
                conn.set_trace_callback(lambda sql: logger.info("%s: %s", self.path, sql))
            if not wait:  # last: the statements above still wait as every connection does
                conn.execute("PRAGMA busy_timeout = 0")
        except BaseException:
            conn.close()
            raise
        return conn


def begin_immediate(conn: sqlite3.Connection, timeout: float) -> None:
    """``BEGIN IMMEDIATE``, waiting up to ``timeout`` seconds for other processes' writers.

    IMMEDIATE takes the write lock up front; a deferred transaction that reads and
    then writes would instead fail at once with "database is locked" when another
    writer got there first, whatever the busy timeout.

    SQLite's own busy handler sleeps 1, 2, 5, ... up to 100 ms between attempts, so
    a waiting writer keeps missing the short gaps between another process's
    transactions: four processes saving at once managed one save per ~40 ms. Here
    the wait is short (0.1 ms doubling to 2 ms) and jittered, so waiters take the
    lock within a couple of milliseconds of its release.
    """
    delay, deadline = 0.0001, 0.0
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if error_code(exc) not in BUSY_CODES:
                raise
            now = time.monotonic()
            if not deadline:
                deadline = now + timeout
            elif now >= deadline:
                raise
        time.sleep(min(delay * (0.5 + random.random()), max(deadline - now, 0.0)))
        delay = min(delay * 2, 0.002)


def with_busy_timeout(
    conn: sqlite3.Connection, ms: int, fn: Callable[[sqlite3.Connection], T]
) -> T:
    """Run ``fn`` with SQLite's busy handler waiting up to ``ms`` (writer connection)."""
    conn.execute(f"PRAGMA busy_timeout = {int(ms)}")
    try:
        return fn(conn)
    finally:
        conn.execute("PRAGMA busy_timeout = 0")


def prepare_file(conn: sqlite3.Connection) -> None:
    if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
        # Must precede the first table; lets purge_expired give space back.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise BackendError(f"SQLite refused WAL mode (journal_mode is {mode!r})")


def sqlite_path(url: StoreURL) -> str:
    """The absolute database path of an SQLite store URL."""
    if url.has_authority:
        if url.host or url.username or url.port:
            raise InvalidURL(
                f"{url}: an SQLite URL has no host; use sqlite:///relative.db or "
                "sqlite:////absolute/path.db"
            )
        path = url.path[1:] if url.path.startswith("/") else url.path
    else:
        path = url.path
    if not path or path == ":memory:" or path.startswith("file:"):
        raise InvalidURL(
            f"{url}: give a database file, e.g. sqlite:///state.db; "
            "for an in-memory store use memory://"
        )
    return os.path.abspath(path)
