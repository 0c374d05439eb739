"""Group commit (SPEC S15): the writes queued together share one commit.

A :class:`GroupCommit` sits on one :class:`~.worker.Worker` (the writer thread).
When the worker meets a grouped job, the group commit takes it and the grouped
jobs queued behind it, up to :attr:`GroupCommit.max_group`, and hands them to its
:class:`GroupRunner`, the part that knows how a group is run and committed:

- :meth:`GroupRunner.alone` runs a lone job exactly as it would run ungrouped
  (SQLite: ``BEGIN IMMEDIATE; ...; COMMIT``, no savepoint; the file store: one
  save and its fsync);
- :meth:`GroupRunner.group` runs several in one commit and returns each job's
  outcome, only once that commit returned (SQLite: one transaction, a savepoint
  per job; the file store: ``insert_group``, one lock hold and one fsync group).
  It may settle a first part and hand back the rest to run as a new group (SQLite
  does when the database dropped the transaction under them);
- :meth:`GroupRunner.abort` cleans up after the machinery itself failed mid-group
  (every job of the group then hears that error; the thread goes on);
- a runner may also have ``idle()``: upkeep run on the thread after a lone job,
  once its caller has its outcome, if nothing was queued then (the file store
  makes the temp file of its next save there; after a group of several, whose
  callers' next calls come together as a group again, it does not run); what it
  raises is dropped, and a job queued meanwhile waits for it to return.

What the group commit guarantees, whatever the runner:

- every caller's future is settled only with what the runner returned, so a
  caller returns only after the commit that holds its write;
- a job whose caller was cancelled before its group started is left out (nothing
  of it runs); one cancelled later may or may not have been written;
- a plain job met while gathering ends the group and runs right after it, so
  jobs run in queue order;
- when the last group had more jobs than are queued now, it waits up to
  :attr:`GroupCommit.gather_wait` for them (their callers are typically queueing
  their next writes just then); jobs that come one at a time never wait.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from queue import Empty, SimpleQueue
from typing import Any, Protocol

from .context import CARRY, note_group
from .worker import GROUPED, Job, deliver, deliver_all

__all__ = ["GATHER_WAIT", "MAX_GROUP", "GroupCommit", "GroupRunner", "Settled"]

#: The most jobs that share one commit.
MAX_GROUP = 64
#: How long (seconds) to wait for more jobs when the last group had more than the
#: jobs queued now (its callers are probably sending their next).
GATHER_WAIT = 0.0002

#: A job and its outcome: its result, or the exception its caller gets.
Settled = tuple[Job, Any, "BaseException | None"]


class GroupRunner(Protocol):
    """How a group of jobs is run and committed (see the module)."""

    def alone(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Run and commit one job; its result, or raise its error."""
        ...

    def group(self, jobs: Sequence[Job]) -> tuple[Sequence[Settled], Sequence[Job]]:
        """Run ``jobs`` (two or more) in one commit. Returns the jobs settled, each
        with its outcome, once the commit returned, and the jobs left to run as a
        new group (usually none). A job whose caller was cancelled before it ran
        may be left out of both."""
        ...

    def abort(self) -> None:
        """Leave nothing half done after :meth:`group` or :meth:`alone` itself
        broke (e.g. roll back an open transaction)."""
        ...


class GroupCommit:
    """The grouped jobs of one worker, run by ``runner`` (see the module)."""

    def __init__(
        self,
        runner: GroupRunner,
        *,
        max_group: int = MAX_GROUP,
        gather_wait: float = GATHER_WAIT,
    ) -> None:
        self.runner = runner
        #: Read at each group, so it may be changed while the worker runs.
        self.max_group = max_group
        self.gather_wait = gather_wait
        self._last = 1  # the size of the last group
        self._idle: Callable[[], object] | None = getattr(runner, "idle", None)

    def take(self, first: Job, queue: SimpleQueue[Job]) -> Job | None:
        """Gather the grouped jobs queued behind ``first`` and run them; the plain
        job that ended the group, if any (it runs next)."""
        group, carry, last = [first], None, self._last
        # The callers of the last group are likely queueing their next writes
        # right now: wait a moment for as many (never when writes come one by one).
        deadline = time.monotonic() + self.gather_wait if last > 1 else 0.0
        while len(group) < self.max_group:
            try:
                if len(group) < last and (wait := deadline - time.monotonic()) > 0:
                    more = queue.get(timeout=wait)
                else:
                    more = queue.get_nowait()
            except Empty:
                break
            if more[4] != GROUPED:
                carry = more  # runs after this group, in queue order
                break
            group.append(more)
        self._last = len(group)
        idle_after = False
        try:
            idle_after = self._run(group, queue)
        except BaseException as exc:  # never leave the thread: every caller would hang
            deliver_all([(job, None, exc) for job in group])  # (settled ones stay)
            with contextlib.suppress(BaseException):
                self.runner.abort()
        idle = self._idle
        if idle is not None and idle_after and carry is None:
            with contextlib.suppress(BaseException):  # upkeep: never the thread's end
                idle()
        return carry

    def _run(self, group: list[Job], queue: SimpleQueue[Job]) -> bool:
        """Run ``group``; whether the runner's ``idle()`` should run after it: a lone
        job with nothing queued, asked before its outcome is delivered, so a caller
        that waits for its outcome before its next call always finds it done first
        (the order of the thread's work does not depend on how fast that caller
        wakes up). Never after a group: its callers' next calls come together."""
        jobs: Sequence[Job] = [job for job in group if not _cancelled(job)]
        if not jobs:
            return False
        if CARRY.on:  # telemetry: each write's span tells the group it rode in
            note_group(jobs)
        if len(jobs) == 1:
            fn, args, loop, fut, _ = jobs[0]
            try:
                result = self.runner.alone(fn, args)
            except BaseException as exc:
                idle_after = queue.empty()
                deliver(loop, fut, None, exc)
            else:
                idle_after = queue.empty()
                deliver(loop, fut, result, None)
            return idle_after
        while jobs:
            settled, jobs = self.runner.group(jobs)
            deliver_all(settled)
        return False


def _cancelled(job: Job) -> bool:
    fut = job[3]
    return fut is not None and fut.cancelled()
