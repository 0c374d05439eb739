"""SQLite execution: one worker thread per connection, one thread hop per operation,
and group commit on the writer.

Why not SQLAlchemy's ``sqlite+aiosqlite`` engine: aiosqlite already runs each
connection on its own thread, but the async adapter awaits that thread once per
cursor call (create, execute, fetch, close, commit), so a ``get_latest`` costs
five hops and about 0.5-0.9 ms on a 2-core box, most of it in thread handoffs.
Here a whole operation (the transaction, every statement, decoding the rows) runs
as one function on the connection's own thread, and the event loop waits for it
once. The statements are the same SQLAlchemy Core objects the other dialects
execute, compiled once for SQLite and run through the stdlib ``sqlite3`` driver
(which is also what aiosqlite wraps).

All writes of a process go through the one writer thread. Writes queued behind
the one it is committing run together in one transaction, each in its own
savepoint, with one COMMIT (one WAL fsync under ``synchronous=FULL``) for all of
them, and every caller returns only after that COMMIT (SPEC S15; see
:class:`_Writer`). A lone write runs as ``BEGIN IMMEDIATE; ...; COMMIT`` with no
savepoint.

Connections never cross threads (``check_same_thread`` stays on) and never cross
``fork``: a child process that uses a store opened by its parent gets fresh
threads and connections and leaves the parent's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from queue import Empty, SimpleQueue
from typing import Any, Literal, TypeVar, cast
from urllib.parse import quote

from sqlalchemy.sql import Executable

from ..._url import StoreURL
from ...errors import BackendError, InvalidURL, StoreNotFound
from .compiler import _POSTCOMPILE, Compiler, _expand
from .dialects import Family

__all__ = ["OpenMode", "SqliteRuntime", "SqliteSession", "sqlite_path"]

T = TypeVar("T")
#: SQLite's URI open modes: read-write-create (``create=True``), read-write
#: (``create=False``: a missing file is an error, never created), read-only.
OpenMode = Literal["rwc", "rw", "ro"]
logger = logging.getLogger("statekeeper.sql")

#: Connections abandoned by ``fork``: kept referenced so that the child never
#: finalises (closes) a connection that belongs to its parent's threads.
_FORK_ORPHANS: list[object] = []
#: SQLITE_BUSY and SQLITE_LOCKED: SQLite would have to wait for another connection.
_BUSY_CODES = (5, 6)
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


class SqliteSession:
    """:class:`~.dialects.Session` over one ``sqlite3`` connection."""

    family: Family = "sqlite"
    mariadb = False

    def __init__(self, conn: sqlite3.Connection, compiler: Compiler) -> None:
        self.conn = conn
        self._compile = compiler

    def _bind(
        self, stmt: Executable, params: Mapping[str, Any] | None
    ) -> tuple[str, tuple[Any, ...]]:
        sql, binds = self._compile(stmt)
        if not params:
            return sql, tuple([default for _, default in binds])
        get = params.get
        args = tuple([get(n, d) for n, d in binds])  # a list is built faster than a generator
        if _POSTCOMPILE in sql:
            return _expand(sql, binds, args)
        return sql, args

    def rows(
        self, stmt: Executable, params: Mapping[str, Any] | None = None
    ) -> Sequence[Sequence[Any]]:
        sql, args = self._bind(stmt, params)
        # fetchall() also runs a RETURNING statement to completion, which COMMIT needs.
        return self.conn.execute(sql, args).fetchall()

    def first(
        self, stmt: Executable, params: Mapping[str, Any] | None = None
    ) -> Sequence[Any] | None:
        rows = self.rows(stmt, params)
        return rows[0] if rows else None

    def run(self, stmt: Executable, params: Mapping[str, Any] | None = None) -> int:
        sql, args = self._bind(stmt, params)
        return self.conn.execute(sql, args).rowcount

    def run_many(self, stmt: Executable, params: Sequence[Mapping[str, Any]]) -> None:
        sql, binds = self._compile(stmt)
        if len(binds) == 1:
            (name, _), *_ = binds
            self.conn.executemany(sql, [(p[name],) for p in params])
            return
        # one C-level lookup per row (a save_many inserts up to 1000 rows per table)
        pick = itemgetter(*(n for n, _ in binds))
        self.conn.executemany(sql, [pick(p) for p in params])

    def lastrowid(self, stmt: Executable, params: Mapping[str, Any] | None = None) -> int:
        sql, args = self._bind(stmt, params)
        return self.conn.execute(sql, args).lastrowid or 0

    def ddl(self, element: Any) -> None:
        self.conn.execute(str(element.compile(dialect=self._compile.dialect)))


class _Worker:
    """A thread that owns one connection and runs submitted functions on it, in order."""

    def __init__(
        self, connect: Callable[[], sqlite3.Connection], name: str, compiler: Compiler
    ) -> None:
        self._connect = connect
        self._compiler = compiler
        self._queue: SimpleQueue[_Job] = SimpleQueue()
        self.conn: sqlite3.Connection | None = None
        self.session: SqliteSession | None = None  # over ``conn``, made with it
        self.pending = 0
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while self._run(self._queue.get()):
            pass

    def _run(self, job: _Job) -> bool:
        """Run one job alone; False once the worker has closed its connection."""
        fn, loop, fut, on_session = job
        if isinstance(fn, _Abandon):
            fn.finish(self)
            return False
        if fn is _close:
            if self.conn is not None:
                self.conn.close()
            _deliver(loop, fut, None, None)
            return False
        if fut.cancelled():
            return True  # the caller gave up before we started: do nothing at all
        try:
            result = fn(self._session() if on_session else self._conn())
        except BaseException as exc:  # delivered to the awaiting task
            _deliver(loop, fut, None, exc)
        else:
            _deliver(loop, fut, result, None)
        return True

    def _conn(self) -> sqlite3.Connection:
        if self.conn is None:
            self.conn = self._connect()
            self.session = SqliteSession(self.conn, self._compiler)
        return self.conn

    def _session(self) -> SqliteSession:
        if self.session is None:
            self._conn()
        assert self.session is not None
        return self.session

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the thread."""
        return await self._submit(fn, False)

    async def run(self, fn: Callable[[SqliteSession], T]) -> T:
        """Run ``fn(session)`` on the thread (the writer: in a write transaction)."""
        return await self._submit(fn, True)

    async def _submit(self, fn: Callable[[Any], T], on_session: bool) -> T:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self.pending += 1
        try:
            self._queue.put((fn, loop, fut, on_session))
            return await fut
        finally:
            self.pending -= 1

    async def close(self) -> None:
        """Close the connection on its thread; the thread ends right after."""
        await self.call(_close)
        self.conn = None

    def abandon(self, first: Sequence[threading.Thread] = ()) -> threading.Thread:
        """Close the connection on its thread once the ``first`` threads have ended,
        and end the thread, with nobody awaiting it (its store was collected
        unclosed); the calls queued before still run. Returns the thread."""
        # no caller waits: the job has no loop and no future
        self._queue.put(cast(_Job, (_Abandon(first), None, None, False)))
        return self._thread


#: A queued job: the function, the caller's loop and future, and whether it is a
#: function of the worker's :class:`SqliteSession` (on the writer: a write
#: operation, run in a transaction it may share with other writes) or a plain
#: function of the connection.
_Job = tuple[Callable[[Any], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]", bool]

#: The most write operations that share one transaction (one COMMIT, one fsync).
MAX_GROUP = 64
#: How long (seconds) the writer waits for more writes when the last group had
#: more than the writes queued now (its callers are probably sending their next).
GATHER_WAIT = 0.0002


class _Writer(_Worker):
    """The writer thread: runs write operations, several per transaction (group commit, S15).

    When write operations are queued while the writer is busy (typically inside
    the fsync of the previous COMMIT), it takes up to :data:`MAX_GROUP` of them
    and runs them in one transaction::

        BEGIN IMMEDIATE
        SAVEPOINT op; <operation 1>; RELEASE op
        SAVEPOINT op; <operation 2>; RELEASE op    (or ROLLBACK TO op, if it raised)
        ...
        COMMIT

    - Each operation runs as it would alone: it sees the writes of the operations
      before it, bumps the counter row itself, so sequences follow the order the
      operations ran in, and commit order is sequence order.
    - An operation that raises is rolled back to its savepoint (its counter bump
      too: no gap) and only its caller gets the error; the others go on.
    - Every caller's future is settled only after the COMMIT returned, that is
      after SQLite synced the WAL under ``synchronous=FULL``: nothing is
      acknowledged before it is durable. If BEGIN or COMMIT fails, every
      operation of the group fails with that error and nothing is acknowledged.
    - If SQLite rolls the whole transaction back by itself (an I/O error, a full
      disk), the operations that ran before fail with that error too, since their
      writes are gone, and the operations after run in a new transaction.
    - A caller cancelled before its operation started is skipped; one cancelled
      after may or may not have saved, as with a lone write.

    A lone operation runs exactly as before grouping: ``BEGIN IMMEDIATE``,
    the operation, ``COMMIT``, with no savepoint. When the last group had more
    operations than are queued now, the writer waits up to :data:`GATHER_WAIT`
    for them (their callers are typically queueing their next writes just then);
    writes that come one at a time never wait.
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        name: str,
        *,
        compiler: Compiler,
        busy_timeout: float,
    ) -> None:
        self._busy_timeout = busy_timeout
        #: Write transactions committed, and write operations they carried (a test
        #: and benchmark hook: ``operations / commits`` is the mean group size).
        self.commits = 0
        self.operations = 0
        super().__init__(connect, name, compiler)

    def _main(self) -> None:
        queue, carry, last = self._queue, None, 1
        while True:
            job = carry if carry is not None else queue.get()
            carry = None
            if not job[3]:
                if not self._run(job):
                    return
                continue
            group = [job]
            # The callers of the last group are likely queueing their next writes
            # right now: wait a moment for as many (never when writes come one by one).
            deadline = time.monotonic() + GATHER_WAIT if last > 1 else 0.0
            while len(group) < MAX_GROUP:
                try:
                    if len(group) < last and (wait := deadline - time.monotonic()) > 0:
                        more = queue.get(timeout=wait)
                    else:
                        more = queue.get_nowait()
                except Empty:
                    break
                if not more[3]:
                    carry = more  # runs after this group, in queue order
                    break
                group.append(more)
            last = len(group)
            try:
                self._run_group(group)
            except BaseException as exc:  # never leave the thread: every caller would hang
                _deliver_all([(job, None, exc) for job in group])  # (settled ones stay)
                with contextlib.suppress(BaseException):
                    if self.conn is not None and self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")

    def _run_group(self, group: list[_Job]) -> None:
        jobs = [job for job in group if not job[2].cancelled()]
        if not jobs:
            return
        try:
            session = self._session()
        except BaseException as exc:
            _deliver_all([(job, None, exc) for job in jobs])
            return
        if len(jobs) == 1:
            fn, loop, fut, _ = jobs[0]
            try:
                result = self._alone(session, fn)
            except BaseException as exc:
                _deliver(loop, fut, None, exc)
            else:
                _deliver(loop, fut, result, None)
            return
        while jobs:
            jobs = self._transaction(session, jobs)

    def _alone(self, session: SqliteSession, fn: Callable[[SqliteSession], T]) -> T:
        conn = session.conn
        _begin_immediate(conn, self._busy_timeout)
        try:
            result = fn(session)
            _commit(conn)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self.commits += 1
        self.operations += 1
        return result

    def _transaction(self, session: SqliteSession, jobs: list[_Job]) -> list[_Job]:
        """Run ``jobs`` in one transaction and settle their futures; return the jobs
        left to run in a new transaction (SQLite dropped this one under them)."""
        conn = session.conn
        try:
            _begin_immediate(conn, self._busy_timeout)
        except BaseException as exc:
            _deliver_all([(job, None, exc) for job in jobs])
            return []
        ran: list[tuple[_Job, Any]] = []  # committed with the transaction, if it commits
        failed: list[tuple[_Job, Any, BaseException | None]] = []
        for i, job in enumerate(jobs):
            if job[2].cancelled():
                continue
            try:
                conn.execute("SAVEPOINT statekeeper_op")
                result = job[0](session)
                conn.execute("RELEASE statekeeper_op")
            except BaseException as exc:
                if _undo(conn):
                    failed.append((job, None, exc))
                    continue
                # The whole transaction is gone: so are the writes that ran before.
                lost = [(done, None, exc) for done, _ in ran]
                _deliver_all([*failed, *lost, (job, None, exc)])
                return jobs[i + 1 :]
            ran.append((job, result))
        try:
            _commit(conn)
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            _deliver_all([*failed, *((job, None, exc) for job, _ in ran)])
            return []
        self.commits += 1
        self.operations += len(ran)
        _deliver_all([*failed, *((job, result, None) for job, result in ran)])
        return []


def _undo(conn: sqlite3.Connection) -> bool:
    """Roll back to the operation's savepoint; False if the transaction is gone."""
    if not conn.in_transaction:
        return False
    try:
        conn.execute("ROLLBACK TO statekeeper_op")
        conn.execute("RELEASE statekeeper_op")
    except sqlite3.Error:
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        return False
    return True


def _commit(conn: sqlite3.Connection) -> None:
    """COMMIT the writer's transaction (one place, so that tests can make it fail)."""
    conn.execute("COMMIT")


def _close(conn: sqlite3.Connection) -> None:
    """The marker of a worker's last call (handled by the worker itself)."""


class _Abandon:
    """The last job of a worker whose store was collected unclosed (see
    :meth:`SqliteRuntime.abandon`): wait for the ``first`` threads (the readers, so
    that the writer's connection closes last and checkpoints the WAL into the
    file), then close the connection. Nobody awaits it."""

    #: How long the writer waits for the readers to close first.
    JOIN_TIMEOUT = 5.0

    def __init__(self, first: Sequence[threading.Thread]) -> None:
        self.first = list(first)

    def finish(self, worker: _Worker) -> None:
        for thread in self.first:
            thread.join(self.JOIN_TIMEOUT)
        if worker.conn is not None:
            with contextlib.suppress(sqlite3.Error):
                worker.conn.close()
            worker.conn = worker.session = None


def _deliver(
    loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future[Any],
    result: Any,
    exc: BaseException | None,
) -> None:
    # RuntimeError: the loop was closed while we worked, so nobody is waiting.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_settle, fut, result, exc)


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    """On the future's loop: its result or exception, unless the caller gave up."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def _deliver_all(outcomes: Sequence[tuple[_Job, Any, BaseException | None]]) -> None:
    """Settle a group's futures: one wake-up of each event loop, not one per future."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, Any, BaseException | None]]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0][1], []).append(outcome)

    for loop, settled in by_loop.items():

        def settle(settled: list[tuple[_Job, Any, BaseException | None]] = settled) -> None:
            for (_, _, fut, _), result, exc in settled:
                _settle(fut, result, exc)

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle)


class SqliteRuntime:
    """The connections of one SQLite store: one writer thread, up to ``readers`` reader threads.

    All writes of this process go through the single writer connection, so they
    queue here instead of spinning in SQLite's busy handler, and the ones that
    queue up while a COMMIT is being synced share the next transaction (group
    commit, :class:`_Writer`); writers in other processes are waited for up to
    ``busy_timeout``. Reads use the reader
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
    ) -> None:
        self.path = path
        self.mode: OpenMode = mode
        self._uri = f"file:{quote(path)}?mode={mode}"
        self.compiler = compiler
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._max_readers = readers
        self._echo = echo
        self._pid = os.getpid()
        self._writer: _Writer | None = None
        self._readers: list[_Worker] = []
        self._inline_reads = inline_reads
        # the point-read connection of the thread that first made one (the event
        # loop's), with that thread's id; see point_read
        self._inline: tuple[int, SqliteSession] | None = None
        self._inline_ops = 0  # operations of the running point read (see _INLINE_OPS)

    def _connect_writer(self) -> sqlite3.Connection:
        if self.mode == "ro":
            raise AssertionError("a read-only SQLite runtime has no writer")
        # The writer waits for the write lock in _begin_immediate, not in SQLite's
        # busy handler (see there); other statements of its own have no lock to wait for.
        return self.connect(wait=False)

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

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            # Forked: the parent's threads do not exist here, and its connections
            # must be neither used nor closed by this process.
            _FORK_ORPHANS.extend([w for w in (self._writer, *self._readers) if w is not None])
            if self._inline is not None:
                _FORK_ORPHANS.append(self._inline)
            self._writer, self._readers, self._pid = None, [], os.getpid()
            self._inline = None

    def _writer_worker(self) -> _Writer:
        self._check_fork()
        if self._writer is None:
            self._writer = _Writer(
                self._connect_writer,
                "statekeeper-sqlite-writer",
                compiler=self.compiler,
                busy_timeout=self._busy_timeout,
            )
        return self._writer

    def _reader_worker(self) -> _Worker:
        self._check_fork()
        for worker in self._readers:
            if not worker.pending:
                return worker
        if len(self._readers) < self._max_readers:
            name = f"statekeeper-sqlite-reader-{len(self._readers)}"
            worker = _Worker(self.connect, name, self.compiler)
            self._readers.append(worker)
            return worker
        return min(self._readers, key=lambda w: w.pending)

    async def write(self, fn: Callable[[SqliteSession], T]) -> T:
        """Run ``fn`` in a ``BEGIN IMMEDIATE`` transaction on the writer thread.

        The transaction may be shared with other queued writes (group commit, see
        :class:`_Writer`): ``fn`` then runs inside its own savepoint, so it commits
        or fails as if alone, and this returns only after the shared COMMIT, that
        is once ``fn``'s writes are as durable as ``synchronous`` makes them.
        """
        return await self._writer_worker().run(fn)

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
            self._inline_ops = 0
            try:
                return fn(session)
            except sqlite3.OperationalError as exc:
                code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
                if code not in _BUSY_CODES and code != _INTERRUPT:
                    raise
                # SQLite would have to wait, or the read is longer than the loop
                # should be kept: a reader thread does it, without the loop
        return await self.read(fn)

    def _inline_progress(self) -> int:
        """SQLite's progress handler on the point-read connection: non-zero (stop)
        once the read has run :data:`_INLINE_OPS` operations."""
        self._inline_ops += _INLINE_STEP
        return int(self._inline_ops > _INLINE_OPS)

    def _inline_session(self) -> SqliteSession | None:
        """The point-read session of this thread, or ``None`` to use the readers."""
        self._check_fork()
        if self._inline is None:
            if not self._inline_reads:
                return None
            # one thread only (checked below), but closed by close() wherever it runs
            conn = self.connect(wait=False, check_same_thread=False)
            conn.set_progress_handler(self._inline_progress, _INLINE_STEP)
            self._inline = (threading.get_ident(), SqliteSession(conn, self.compiler))
        owner, session = self._inline
        return session if owner == threading.get_ident() else None

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
        await self._writer_worker().call(lambda conn: _with_busy_timeout(conn, ms, _prepare_file))

    async def reclaim(self) -> None:
        def vacuum(conn: sqlite3.Connection) -> None:
            # Frees pages only in files created with auto_vacuum=INCREMENTAL (new
            # stores are); elsewhere freed pages are reused by later saves.
            # executescript steps the pragma to the end; execute() frees one page.
            conn.executescript("PRAGMA incremental_vacuum")

        ms = round(self._busy_timeout * 1000)
        await self._writer_worker().call(lambda conn: _with_busy_timeout(conn, ms, vacuum))

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

    def _detach(self) -> tuple[_Writer | None, list[_Worker], sqlite3.Connection | None]:
        """Take the writer, the readers and the point-read connection out of this
        runtime, for :meth:`close` or :meth:`abandon` to close. In a forked child
        there are none to take: the parent's are orphaned (see :meth:`_check_fork`)."""
        self._check_fork()
        writer, readers = self._writer, self._readers
        inline, self._inline = self._inline, None
        self._writer, self._readers = None, []
        return writer, readers, None if inline is None else inline[1].conn

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


def _begin_immediate(conn: sqlite3.Connection, timeout: float) -> None:
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
            if (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF not in _BUSY_CODES:
                raise
            now = time.monotonic()
            if not deadline:
                deadline = now + timeout
            elif now >= deadline:
                raise
        time.sleep(min(delay * (0.5 + random.random()), max(deadline - now, 0.0)))
        delay = min(delay * 2, 0.002)


def _with_busy_timeout(
    conn: sqlite3.Connection, ms: int, fn: Callable[[sqlite3.Connection], T]
) -> T:
    """Run ``fn`` with SQLite's busy handler waiting up to ``ms`` (writer connection)."""
    conn.execute(f"PRAGMA busy_timeout = {int(ms)}")
    try:
        return fn(conn)
    finally:
        conn.execute("PRAGMA busy_timeout = 0")


def _prepare_file(conn: sqlite3.Connection) -> None:
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
