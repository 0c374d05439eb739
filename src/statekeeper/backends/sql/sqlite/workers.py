"""The threads of an SQLite store: each one a :class:`~statekeeper._runtime.worker.Worker`
that owns one connection, and the writer's group commit (SPEC S15).

All writes of a process go through the one writer thread. Writes queued behind
the one it is committing run together in one transaction, each in its own
savepoint, with one COMMIT (one WAL fsync under ``synchronous=FULL``) for all of
them, and every caller returns only after that COMMIT (see :class:`SqliteWriter`;
the gathering is :class:`~statekeeper._runtime.group.GroupCommit`'s). A lone
write runs as ``BEGIN IMMEDIATE; ...; COMMIT`` with no savepoint.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...._runtime.group import GroupCommit, Settled
from ...._runtime.worker import Job, Worker
from .compiler import Compiler
from .connect import begin_immediate
from .session import SqliteSession

__all__ = ["SqliteWorker", "SqliteWriter", "run_alone"]

T = TypeVar("T")

#: How long an abandoned writer waits for the readers to close first.
JOIN_TIMEOUT = 5.0


class SqliteWorker:
    """A thread that owns one connection (made on the thread, on first use) and runs
    submitted functions on it, in order."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        name: str,
        compiler: Compiler,
        *,
        group: GroupCommit | None = None,
    ) -> None:
        self._connect = connect
        self._compiler = compiler
        self.conn: sqlite3.Connection | None = None
        self.session: SqliteSession | None = None  # over ``conn``, made with it
        self.worker = Worker(name, group=group)

    @property
    def pending(self) -> int:
        """Calls submitted to this thread and not yet returned."""
        return self.worker.pending

    def _session(self) -> SqliteSession:
        session = self.session
        if session is None:
            self.conn = self._connect()
            session = self.session = SqliteSession(self.conn, self._compiler)
        return session

    def _on_conn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return fn(self._session().conn)

    def _on_session(self, fn: Callable[[SqliteSession], T]) -> T:
        return fn(self._session())

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the thread."""
        return await self.worker.run(self._on_conn, fn)

    async def run(self, fn: Callable[[SqliteSession], T]) -> T:
        """Run ``fn(session)`` on the thread (autocommit: each statement a snapshot)."""
        return await self.worker.run(self._on_session, fn)

    async def close(self) -> None:
        """Close the connection on its thread; the thread ends right after."""
        await self.worker.run_last(self._close)

    def _close(self) -> None:
        conn, self.conn, self.session = self.conn, None, None
        if conn is not None:
            conn.close()

    def abandon(self, first: Sequence[threading.Thread] = ()) -> threading.Thread:
        """Close the connection on its thread once the ``first`` threads have ended,
        and end the thread, with nobody awaiting it (its store was collected
        unclosed); the calls queued before still run. Returns the thread."""
        return self.worker.stop(self._abandon, list(first))

    def _abandon(self, first: list[threading.Thread]) -> None:
        # the readers first, so that the writer's connection closes last and
        # checkpoints the WAL into the file
        for thread in first:
            thread.join(JOIN_TIMEOUT)
        with contextlib.suppress(sqlite3.Error):
            self._close()


class SqliteWriter(SqliteWorker):
    """The writer thread: write operations, several per transaction (group commit, S15).

    When write operations are queued while the writer is busy (typically inside
    the fsync of the previous COMMIT), its :class:`GroupCommit` takes up to
    ``max_group`` of them and this runs them in one transaction (:meth:`group`)::

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

    A lone operation runs exactly as before grouping (:meth:`alone`):
    ``BEGIN IMMEDIATE``, the operation, ``COMMIT``, with no savepoint.
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
        #: Gathers the queued writes into groups (its limits may be changed live).
        self.group_commit = GroupCommit(self)
        super().__init__(connect, name, compiler, group=self.group_commit)

    async def run(self, fn: Callable[[SqliteSession], T]) -> T:
        """Run ``fn(session)`` in a write transaction, maybe shared (see the class)."""
        result: T = await self.worker.run_grouped(fn)
        return result

    # -- the GroupRunner of the group commit (on the writer's thread) --------------

    def alone(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        result = run_alone(
            self._session(), fn, args, lambda conn: begin_immediate(conn, self._busy_timeout)
        )
        self.commits += 1
        self.operations += 1
        return result

    def group(self, jobs: Sequence[Job]) -> tuple[list[Settled], Sequence[Job]]:
        """Run ``jobs`` in one transaction; their outcomes once it committed, and the
        jobs left to run in a new transaction (SQLite dropped this one under them)."""
        session = self._session()
        conn = session.conn
        try:
            begin_immediate(conn, self._busy_timeout)
        except BaseException as exc:
            return [(job, None, exc) for job in jobs], []
        ran: list[tuple[Job, Any]] = []  # committed with the transaction, if it commits
        failed: list[Settled] = []
        for i, job in enumerate(jobs):
            fut = job[3]
            if fut is not None and fut.cancelled():
                continue
            try:
                conn.execute("SAVEPOINT statekeeper_op")
                result = job[0](session, *job[1])
                conn.execute("RELEASE statekeeper_op")
            except BaseException as exc:
                if _undo(conn):
                    failed.append((job, None, exc))
                    continue
                # The whole transaction is gone: so are the writes that ran before.
                lost = [(done, None, exc) for done, _ in ran]
                return [*failed, *lost, (job, None, exc)], jobs[i + 1 :]
            ran.append((job, result))
        try:
            _commit(conn)
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            return [*failed, *((job, None, exc) for job, _ in ran)], []
        self.commits += 1
        self.operations += len(ran)
        return [*failed, *((job, result, None) for job, result in ran)], []

    def abort(self) -> None:
        if self.conn is not None and self.conn.in_transaction:
            self.conn.execute("ROLLBACK")


def run_alone(
    session: SqliteSession,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    begin: Callable[[sqlite3.Connection], None],
) -> Any:
    """One write operation in a transaction of its own: ``begin`` (``BEGIN
    IMMEDIATE``, waiting as it says), ``fn(session, *args)``, ``COMMIT``; on any
    error the transaction is rolled back and the error raised, so nothing of ``fn``
    is left behind. The writer's lone write and the inline write
    (:meth:`~.runtime.SqliteRuntime.point_write`) are this one body."""
    conn = session.conn
    begin(conn)
    try:
        result = fn(session, *args)
        _commit(conn)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


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
