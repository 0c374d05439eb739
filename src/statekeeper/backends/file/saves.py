"""The file store's saves on the shared group commit (SPEC S15), and the one place
an engine call's OS errors become :class:`~statekeeper.errors.BackendError`.

- :func:`engine_call`: run one engine function under the engine's activity mark,
  turning ``OSError`` and :class:`~.index.IndexDamaged` into ``BackendError``
  naming the operation and the store (every worker hop of the store and every
  inline call goes through it);
- :class:`FileSaves`: the :class:`~statekeeper._runtime.group.GroupRunner` of file
  saves: a lone save is ``engine.insert`` (one save, its fsyncs); a group is
  ``engine.insert_group`` (one lock hold, ONE fsync group, one outcome each); there
  is nothing to abort (``insert_group`` leaves no group half done);
- :class:`SaveWriter`: the store's writer thread, a
  :class:`~statekeeper._runtime.worker.Worker` with a
  :class:`~statekeeper._runtime.group.GroupCommit` of :class:`FileSaves`, started on
  the first save, started again in a forked child (the parent's thread is not
  there) and after :meth:`SaveWriter.close`.

Nothing here holds the store itself: the writer's thread outlives nothing it
should not, and the store can be collected unclosed (its finalizer then closes it).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from ..._runtime.group import GroupCommit, Settled
from ..._runtime.worker import Job, Worker
from ...errors import BackendError, StatekeeperError
from ...models import CheckpointHeader
from ...record import NewRecord
from .batch import FileEngine
from .stream_index import IndexDamaged

__all__ = ["MAX_GROUP", "FileSaves", "SaveWriter", "engine_call"]

T = TypeVar("T")

#: The most saves committed in one group.
MAX_GROUP = 256


def engine_call(engine: FileEngine, path: str, what: str, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` while the engine is active; OS errors become
    :class:`BackendError` with ``.orig``."""
    try:
        with engine.active():
            return func(*args)
    except StatekeeperError:
        raise
    except IndexDamaged as exc:
        raise BackendError(
            f"{what} failed in the file store at {path}: {exc}; "
            "FileCheckpointStore.repair() rebuilds the indexes from the records",
            orig=exc,
        ) from exc
    except OSError as exc:
        raise BackendError(
            f"{what} failed in the file store at {path}: {exc.strerror or exc} ({errno_name(exc)})",
            orig=exc,
        ) from exc


def errno_name(exc: OSError) -> str:
    """``EIO``, ``ENOSPC``...: the symbolic name of the error's errno."""
    return errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")


class FileSaves:
    """How a group of file saves is run and committed (a ``GroupRunner``). A job is
    ``(engine.insert, (record,), ...)``."""

    def __init__(self, engine: FileEngine, path: str) -> None:
        self._engine = engine
        self._path = path

    def alone(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """One save, as ungrouped: its header, or its error."""
        return engine_call(self._engine, self._path, "save", fn, *args)

    def group(self, jobs: Sequence[Job]) -> tuple[Sequence[Settled], Sequence[Job]]:
        """The saves in one ``insert_group``: one lock hold, one fsync group. Each
        save gets its own outcome; an error of the group itself (raised) fails
        every save of it."""
        records: list[NewRecord] = [job[1][0] for job in jobs]
        engine = self._engine
        outcomes = engine_call(engine, self._path, "save", engine.insert_group, records)
        return [
            (job, outcome, None) if isinstance(outcome, CheckpointHeader) else (job, None, outcome)
            for job, outcome in zip(jobs, outcomes, strict=True)
        ], []

    def abort(self) -> None:
        """Nothing: ``insert_group`` rolls back whatever of a failed group it did."""

    def idle(self) -> None:
        """After a lone save whose caller has its outcome, with nothing queued: the
        temp file of the next durable save, made ahead (:mod:`.spares`). Upkeep:
        a closed store or an OS error makes none."""
        with contextlib.suppress(StatekeeperError, OSError), self._engine.active():
            self._engine.spares.make()  # (anything else it raises, the worker drops)


class SaveWriter:
    """The store's writer thread for saves (see the module)."""

    def __init__(self, name: str, runner: FileSaves) -> None:
        self._name = name
        self.group_commit = GroupCommit(runner, max_group=MAX_GROUP, gather_wait=0.0)
        self._worker: Worker | None = None
        self._pid = os.getpid()

    @property
    def pending(self) -> int:
        """Saves submitted by this process and not yet returned to their callers."""
        worker = self._worker
        return 0 if worker is None or self._pid != os.getpid() else worker.pending

    def save(self, insert: Callable[..., Any], record: NewRecord) -> Coroutine[Any, Any, Any]:
        """``insert(record)`` on the writer, alone or in a group with the saves
        queued with it; returns once the group's fsyncs returned."""
        worker = self._worker
        if worker is None or self._pid != os.getpid():  # forked: the thread is not here
            worker = self._worker = Worker(self._name, group=self.group_commit)
            self._pid = os.getpid()
        return worker.run_grouped(insert, record)

    def close(self) -> None:
        """Let the thread end once it has run the saves queued before this (any
        thread may call this; it never blocks). The next save starts a new one."""
        worker, self._worker = self._worker, None
        if worker is not None and self._pid == os.getpid():
            worker.stop()
