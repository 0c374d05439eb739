"""SQLite execution: one worker thread per connection, one thread hop per operation,
group commit on the writer, and bounded reads (and, under ``durability="fast"``,
single-record writes) on the event loop's thread.

Why not SQLAlchemy's ``sqlite+aiosqlite`` engine: aiosqlite already runs each
connection on its own thread, but the async adapter awaits that thread once per
cursor call (create, execute, fetch, close, commit), so a ``get_latest`` costs
five hops and about 0.5-0.9 ms on a 2-core box, most of it in thread handoffs.
Here a whole operation (the transaction, every statement, decoding the rows) runs
as one function on the connection's own thread, and the event loop waits for it
once. The statements are the same SQLAlchemy Core objects the other dialects
execute, compiled once for SQLite and run through the stdlib ``sqlite3`` driver
(which is also what aiosqlite wraps).

Writes go through the one writer thread, several per transaction (SPEC S15, see
:class:`~.workers.SqliteWriter`), except a write of one record at
``synchronous=NORMAL`` that finds the writer idle and the lock free
(:meth:`SqliteRuntime.point_write`).

Connections never cross threads (``check_same_thread`` stays on) and never cross
``fork``: a child process that uses a store opened by its parent gets fresh
threads and connections and leaves the parent's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from ...._runtime.inline import HOP, Budget, Turns, try_inline
from ...._runtime.worker import pick
from .compiler import Compiler
from .connect import BUSY_CODES, Connector, OpenMode, error_code, prepare_file, with_busy_timeout
from .session import SqliteSession
from .workers import SqliteWorker, SqliteWriter, run_alone

__all__ = ["SqliteRuntime"]

T = TypeVar("T")

#: Connections abandoned by ``fork``: kept referenced so that the child never
#: finalises (closes) a connection that belongs to its parent's threads.
_FORK_ORPHANS: list[object] = []
#: SQLITE_INTERRUPT: a read on the event loop's thread ran over its budget.
_INTERRUPT = 9
#: The budget of one read on the event loop's thread (point_read), in SQLite
#: virtual-machine operations, counted in steps of _INLINE_STEP: a listed page of
#: 101 rows takes about 1,500, a lookup a few dozen, and 6,000 expired rows (not yet
#: purged) to walk past about 42,000 (4 ms here). A read that would take more is
#: interrupted and runs on a reader thread instead: no read keeps the loop for
#: more than about 2 ms of SQLite's work.
_INLINE_OPS = 20_000
_INLINE_STEP = 1_000
#: Inline writes between two WAL checkpoints run on the writer thread. The inline
#: writer's connection never checkpoints by itself (a checkpoint syncs and copies
#: pages: milliseconds the event loop should not be kept for); a write of one
#: checkpoint adds 3 to 6 WAL pages, so this is about SQLite's own 1,000 pages.
_CHECKPOINT_EVERY = 200


def _begin_now(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE`` without waiting: the inline writer's busy timeout is 0, so
    a write lock held elsewhere is an immediate SQLITE_BUSY (the write then hops)."""
    conn.execute("BEGIN IMMEDIATE")


def _passive_checkpoint(conn: sqlite3.Connection) -> None:
    """Copy what the WAL holds into the database file as far as readers allow (on
    the writer's thread). Upkeep only: if it cannot finish now, the next one will,
    and the writer's own commits and ``close`` checkpoint too."""
    with contextlib.suppress(sqlite3.Error):
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


class _LoopConnection:
    """A connection of the thread that first asks for one (the event loop's), made
    on first use by ``make`` unless ``enabled`` is false; any other thread gets
    ``None``. One thread only, but closed by :meth:`take` wherever that runs."""

    __slots__ = ("_enabled", "_make", "held")

    def __init__(self, enabled: bool, make: Callable[[], sqlite3.Connection]) -> None:
        self._enabled = enabled
        self._make = make
        #: ``(owning thread's id, session)`` once made.
        self.held: tuple[int, SqliteSession] | None = None

    def session(self, compiler: Compiler) -> SqliteSession | None:
        """This thread's session, or ``None`` (another thread's, or not enabled)."""
        if self.held is None:
            if not self._enabled:
                return None
            self.held = (threading.get_ident(), SqliteSession(self._make(), compiler))
        owner, session = self.held
        return session if owner == threading.get_ident() else None

    def take(self) -> sqlite3.Connection | None:
        """The connection, no longer this runtime's (for the caller to close)."""
        held, self.held = self.held, None
        return None if held is None else held[1].conn


def _would_block(exc: Exception) -> bool:
    """A point read's error that means: run it on a reader thread instead."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = error_code(exc)
    return code in BUSY_CODES or code == _INTERRUPT


class SqliteRuntime:
    """The connections of one SQLite store: one writer thread, up to ``readers`` reader threads.

    All writes of this process go through the single writer connection, so they
    queue here instead of spinning in SQLite's busy handler, and the ones that
    queue up while a COMMIT is being synced share the next transaction (group
    commit, :class:`~.workers.SqliteWriter`); writers in other processes are waited
    for up to ``busy_timeout``. Reads use the reader
    connections (started on demand) and, in WAL mode, never wait for writers.

    Every connection opens the file through a ``file:`` URI with ``mode``: ``rwc``
    may create it, ``rw`` never creates it, and ``ro`` opens it read-only (and
    ``query_only``); a ``ro`` runtime never starts its writer thread.
    """

    def __init__(
        self,
        path: str,
        *,
        compiler: Compiler,
        synchronous: str,
        busy_timeout: float,
        readers: int,
        echo: bool,
        mode: OpenMode = "rwc",
        inline_reads: bool = True,
        inline_writes: bool = True,
    ) -> None:
        self.path = path
        self.mode: OpenMode = mode
        self.compiler = compiler
        self._connector = Connector(
            path, mode=mode, synchronous=synchronous, busy_timeout=busy_timeout, echo=echo
        )
        #: A new connection with this store's settings (see :meth:`.Connector.connect`).
        self.connect = self._connector.connect
        self._busy_timeout = busy_timeout
        self._max_readers = readers
        self._pid = os.getpid()
        self._writer: SqliteWriter | None = None
        self._readers: list[SqliteWorker] = []
        self._budget = Budget(_INLINE_OPS, _INLINE_STEP)  # of the running point read
        # the point-read connection (see point_read)
        self._inline = _LoopConnection(inline_reads, self._connect_point_reader)
        self._write_budget = Budget(_INLINE_OPS, _INLINE_STEP)
        #: The loop's turns between inline calls (see :class:`Turns`).
        self._turns = Turns()
        # the inline writer's (see point_write): a COMMIT syncs nothing below FULL, so
        # it may run on the event loop's thread
        self._inline_writer = _LoopConnection(
            inline_writes and mode != "ro" and synchronous.upper() != "FULL",
            self._connect_inline_writer,
        )
        self._inline_commits = 0  # since the last checkpoint handed to the writer

    def _connect_writer(self) -> sqlite3.Connection:
        if self.mode == "ro":
            raise AssertionError("a read-only SQLite runtime has no writer")
        # The writer waits for the write lock in begin_immediate, not in SQLite's
        # busy handler (see there); other statements of its own have no lock to wait for.
        return self.connect(wait=False)

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            # Forked: the parent's threads do not exist here, and its connections
            # must be neither used nor closed by this process.
            _FORK_ORPHANS.extend([w for w in (self._writer, *self._readers) if w is not None])
            for loop_conn in (self._inline, self._inline_writer):
                if loop_conn.held is not None:
                    _FORK_ORPHANS.append(loop_conn.held)
                loop_conn.held = None
            self._writer, self._readers, self._pid = None, [], os.getpid()

    def _writer_worker(self) -> SqliteWriter:
        self._check_fork()
        if self._writer is None:
            self._writer = SqliteWriter(
                self._connect_writer,
                "statekeeper-sqlite-writer",
                compiler=self.compiler,
                busy_timeout=self._busy_timeout,
            )
        return self._writer

    def _reader_worker(self) -> SqliteWorker:
        self._check_fork()
        return pick(self._readers, self._max_readers, self._new_reader)

    def _new_reader(self, n: int) -> SqliteWorker:
        return SqliteWorker(self.connect, f"statekeeper-sqlite-reader-{n}", self.compiler)

    async def write(self, fn: Callable[[SqliteSession], T]) -> T:
        """Run ``fn`` in a ``BEGIN IMMEDIATE`` transaction on the writer thread.

        The transaction may be shared with other queued writes (group commit, see
        :class:`~.workers.SqliteWriter`): ``fn`` then runs inside its own savepoint, so it commits
        or fails as if alone, and this returns only after the shared COMMIT, that
        is once ``fn``'s writes are as durable as ``synchronous`` makes them.
        """
        return await self._writer_worker().run(fn)

    async def point_write(self, fn: Callable[[SqliteSession], T]) -> T:
        """As :meth:`write`, for ``fn`` that writes one record (a save, an update or a
        delete of one checkpoint, with its index rows): right here on the calling
        thread when that cannot wait for anything, else as :meth:`write` does.

        Only under ``synchronous=NORMAL`` (``durability="fast"``), where COMMIT
        syncs nothing: it appends to the WAL, about 30 µs, while the round trip to
        the writer thread costs two thread wake-ups and more than the whole write.
        Under ``FULL`` a COMMIT waits for an fsync, which the event loop must not, so
        every write goes to the writer thread. The inline write runs on a connection
        of its own (made on first use) with ``busy_timeout = 0`` and the same body
        as the writer's lone write (:func:`~.workers.run_alone`), under the read
        budget while ``fn`` runs. It hops to the writer thread, ``fn`` run again
        there, when:

        - the writer thread has calls queued or running (they go first, and group;
          so does the checkpoint below, so no inline write runs beside it);
        - ``BEGIN IMMEDIATE`` finds the write lock taken (another process, or this
          store's writer thread, is writing): SQLite says busy at once and nothing
          has been written;
        - ``fn`` runs over the budget (SQLite interrupts it) or meets a lock: the
          transaction is rolled back first.

        Any other error is the write's own (a taken id, a failed ``if_match``) and is
        raised as the writer would raise it. Commit order is still sequence order:
        the counter row is bumped inside the transaction, by whichever connection
        holds the write lock. The inline connection never checkpoints the WAL
        itself: after every :data:`_CHECKPOINT_EVERY` inline commits, the next
        point write first waits (the loop free) for a passive checkpoint on the
        writer thread, as SQLite's own auto-checkpoint makes the commit that takes
        the WAL past 1,000 pages wait for one.
        """
        session = self._inline_writer_session()
        if session is not None and self._inline_commits >= _CHECKPOINT_EVERY:
            # Before this write, not beside it: SQLite starts the WAL over only when
            # a write begins after a checkpoint that copied every frame, so one
            # running while the loop keeps appending would let the WAL grow forever.
            self._inline_commits = 0
            await self._writer_worker().call(_passive_checkpoint)
        if session is not None and self._turns.due():
            await asyncio.sleep(0)  # before the writer is found idle, not after
        if session is not None and (self._writer is None or self._writer.pending == 0):
            got = try_inline(partial(self._run_inline_write, fn=fn), session, _would_block)
            if got is not HOP:
                self._inline_commits += 1
                return got
        return await self.write(fn)

    def _run_inline_write(self, session: SqliteSession, fn: Callable[[SqliteSession], T]) -> T:
        budget, conn = self._write_budget, session.conn

        def budgeted(s: SqliteSession) -> T:
            budget.start()
            conn.set_progress_handler(budget.spend, _INLINE_STEP)
            try:
                return fn(s)
            finally:  # never during COMMIT: an interrupted COMMIT may have committed
                conn.set_progress_handler(None, 0)

        result: T = run_alone(session, budgeted, (), _begin_now)
        return result

    def _inline_writer_session(self) -> SqliteSession | None:
        """The inline writer's session on this thread, or ``None`` to use the writer."""
        self._check_fork()
        return self._inline_writer.session(self.compiler)

    def _connect_inline_writer(self) -> sqlite3.Connection:
        conn = self.connect(wait=False, check_same_thread=False)
        conn.execute("PRAGMA wal_autocheckpoint = 0")  # the writer thread does them
        return conn

    async def locked_write(
        self,
        lock: Callable[[SqliteSession], None],
        fn: Callable[[SqliteSession], T],
        unlock: Callable[[SqliteSession], None],
    ) -> T:
        """``fn`` in a write transaction: BEGIN IMMEDIATE is the lock SQLite needs."""
        return await self.write(fn)

    async def read(self, fn: Callable[[SqliteSession], T]) -> T:
        """Run ``fn`` on an idle reader thread (autocommit: each statement is a snapshot)."""
        return await self._reader_worker().run(fn)

    async def point_read(self, fn: Callable[[SqliteSession], T]) -> T:
        """Run ``fn``, a bounded indexed read (``get_latest``, ``load``, a
        ``load_many`` of at most ``INLINE_PAGE_ROWS`` ids, or a listed page of at
        most ``INLINE_PAGE_ROWS`` rows and its one-row probe), right here on the
        calling thread when SQLite can answer without waiting, else as :meth:`read`
        does.

        A round trip to a reader thread costs more than such a read (two thread
        wake-ups, 25-50 µs here, against about 20 µs for a lookup and its decode; a
        listed page paid about 3.5 µs an item for the hop, a quarter of its time), so
        these reads run on the event loop's thread, on a connection of their own (made
        on first use) with ``busy_timeout = 0``: SQLite never makes them wait for a
        lock. When it would have to (a WAL-index rebuild after another process
        crashed, or a checkpoint that resets the WAL), it says busy at once and the
        whole of ``fn`` runs again on a reader thread, which waits as every read does
        (``fn`` only reads, so running it again is safe). So does a read that runs
        over :data:`_INLINE_OPS` SQLite operations (a page past thousands of expired
        rows not yet purged): SQLite interrupts it, so no read keeps the loop for
        more than about 2 ms of SQLite's work. What such a read can block the loop on is
        reading the pages of one index range, which the OS usually has cached. Like
        every read, each statement is in autocommit: one snapshot of what
        was committed when it started. ``inline_reads=False`` (an option of the
        SQLite store) sends every read to the reader threads.
        """
        session = self._inline_session()
        if session is not None:
            if self._turns.due():
                await asyncio.sleep(0)
            got = try_inline(fn, session, _would_block, self._budget)
            if got is not HOP:
                return got
            # SQLite would have to wait, or the read is longer than the loop
            # should be kept: a reader thread does it, without the loop
        return await self.read(fn)

    def _inline_session(self) -> SqliteSession | None:
        """The point-read session of this thread, or ``None`` to use the readers."""
        self._check_fork()
        return self._inline.session(self.compiler)

    def _connect_point_reader(self) -> sqlite3.Connection:
        conn = self.connect(wait=False, check_same_thread=False)
        conn.set_progress_handler(self._budget.spend, _INLINE_STEP)
        return conn

    async def snapshot(self, fn: Callable[[SqliteSession], T]) -> T:
        """Run ``fn`` in one read transaction on a reader thread: one WAL snapshot."""
        compiler = self.compiler

        def body(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN")
            try:
                return fn(SqliteSession(conn, compiler))
            finally:
                conn.execute("ROLLBACK")

        return await self._reader_worker().call(body)

    async def start(self) -> None:
        """Check that the file can be opened; create nothing unless ``mode`` is ``rwc``."""
        # Reads the header: a file that is not a database fails here (SQLITE_NOTADB).
        await self._reader_worker().call(lambda conn: conn.execute("PRAGMA schema_version"))

    async def prepare(self) -> None:
        """Make the file ready for writing: incremental auto-vacuum (new files) and WAL."""
        ms = round(self._busy_timeout * 1000)
        await self._writer_worker().call(lambda conn: with_busy_timeout(conn, ms, prepare_file))

    async def reclaim(self, full: bool = False) -> int | None:
        """``PRAGMA incremental_vacuum`` (``full``: ``VACUUM``, which rewrites the
        whole file); the bytes given back: the drop in ``page_count`` times
        ``page_size``."""

        def vacuum(conn: sqlite3.Connection) -> int:
            before = _database_bytes(conn)
            # incremental_vacuum frees pages only in files created with
            # auto_vacuum=INCREMENTAL (new stores are); elsewhere freed pages are
            # reused by later saves, and only VACUUM gives them back.
            # executescript steps the pragma to the end; execute() frees one page.
            conn.executescript("VACUUM" if full else "PRAGMA incremental_vacuum")
            return max(before - _database_bytes(conn), 0)

        ms = round(self._busy_timeout * 1000)
        return await self._writer_worker().call(lambda conn: with_busy_timeout(conn, ms, vacuum))

    def abandon(self) -> None:
        """What :meth:`close` does, for a store collected unclosed (its finalizer,
        which may run on any thread, awaits nothing and must not block): the
        point-read connection closes here, each reader thread closes its connection
        after the calls queued before, and the writer's closes last, after the
        readers' threads ended, so that the WAL is checkpointed into the file as
        :meth:`close` leaves it. The threads then end. In a forked child, nothing of
        the parent's is touched. A closed runtime has nothing left to abandon."""
        writer, readers, inline = self._detach()
        if inline is not None:
            with contextlib.suppress(sqlite3.Error):
                inline.close()
        threads = [reader.abandon() for reader in readers]
        if writer is not None:
            writer.abandon(threads)

    def _detach(self) -> tuple[SqliteWriter | None, list[SqliteWorker], sqlite3.Connection | None]:
        """Take the writer, the readers and the point-read connection out of this
        runtime, for :meth:`close` or :meth:`abandon` to close. In a forked child
        there are none to take: the parent's are orphaned (see :meth:`_check_fork`)."""
        self._check_fork()
        writer, readers = self._writer, self._readers
        inline_writer = self._inline_writer.take()
        if inline_writer is not None:
            # before the readers and the writer: whichever closes last checkpoints
            with contextlib.suppress(sqlite3.Error):
                inline_writer.close()
        self._writer, self._readers = None, []
        return writer, readers, self._inline.take()

    async def close(self) -> None:
        """Close every connection, the writer's last.

        The last connection to close checkpoints the WAL into the database file and
        removes it, so that after ``close()`` the file alone holds every save (what
        a user copying ``store.db`` expects). SQLite only does that when the closing
        connection can tell it is the last one; two connections closing at the same
        moment each see the other and both skip it (closing them all at once left
        the saves in the ``-wal`` file in 35 of 200 closes). So the readers and the
        point-read connection close first, and the writer alone after them.
        """
        writer, readers, inline = self._detach()  # a forked child: nothing to close
        if inline is not None:
            inline.close()
        await asyncio.gather(*(w.close() for w in readers))
        if writer is not None:
            await writer.close()


def _database_bytes(conn: sqlite3.Connection) -> int:
    """The database's size as SQLite counts it: ``page_count`` times ``page_size``."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    return int(pages) * int(conn.execute("PRAGMA page_size").fetchone()[0])
