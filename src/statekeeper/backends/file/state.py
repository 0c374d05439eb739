"""The state file as this process reads and writes it, the write lock that
guards it, and the ``dirty`` list of the indexes written since the sync mark.

- :class:`StateFile`: reads and writes of ``state`` (its bytes are
  :class:`.layout.State`), the generation this process wrote last and the one of
  the last save it completed, and the ``dirty`` list;
- :class:`Txn`: the state as the lock holder sees it; :meth:`Txn.commit` writes
  the next version;
- :class:`WriteLock`: the write lock, this instance's mutex, then ``flock`` on
  ``lock``, waiting up to ``lock_timeout`` seconds.
"""

from __future__ import annotations

import errno
import fcntl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import StoreTimeout
from . import layout as fmt
from .io import FileIO, read_exact

__all__ = ["StateFile", "Txn", "WriteLock", "index_names"]


class Dir(Protocol):
    """What :class:`StateFile` needs of the store's directory (:class:`.records.Files`)."""

    io: FileIO
    durable: bool
    fd_table: dict[str, int]

    def fd(self, name: str) -> int: ...


class StateFile:
    """``state`` and ``dirty``, as this process reads and writes them."""

    def __init__(self, files: Dir) -> None:
        self.files = files
        self._cache: tuple[bytes, fmt.State] | None = None
        #: The state generation this process wrote last: a lock holder that finds
        #: another one starts a new epoch of the descriptor cache (see .fdcache).
        self.my_gen = -1
        #: The state generation of the last save this process completed (see
        #: :meth:`.recovery.Rebuild.insert_done`).
        self.done_gen = -1
        #: The sync epoch of ``dirty`` and the index files this process noted in it
        #: since (see :meth:`mark_dirty`).
        self._dirty_epoch = -1
        self._dirty_noted: frozenset[str] = frozenset()

    def read(self) -> fmt.State | None:
        """The current state; ``None`` if it is unreadable (or, on a read-only open,
        missing)."""
        fd = self.files.fd_table.get("state")
        if fd is None:
            self.files.fd("root")  # StoreClosed if closed
            return None
        # One byte more than a state file has: a longer file is damage, not state.
        raw = read_exact(self.files.io, fd, fmt.STATE_SIZE + 1, 0, expect=fmt.STATE_SIZE)
        # Usually the bytes are the ones this process wrote or read last: skip the parse.
        cached = self._cache
        if cached is not None and cached[0] == raw:
            return cached[1]
        state = fmt.State.from_bytes(raw)
        self._cache = None if state is None else (raw, state)
        return state

    def write(self, state: fmt.State) -> None:
        offset, data = state.copy_bytes()
        before, self._cache = self._cache, None
        done = 0
        while done < len(data):
            n = self.files.io.pwrite(self.files.fd("state"), data[done:], offset + done)
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            done += n
        self.my_gen = state.gen
        if before is not None:
            raw = before[0]
            self._cache = (raw[:offset] + data + raw[offset + len(data) :], state)

    def saved(self, gen: int) -> None:
        """A save of this process completed at state generation ``gen``."""
        self.done_gen = gen

    def mark_dirty(self, synced: int, sfile: str) -> None:
        """Note (once per sync epoch ``synced`` and process) that ``sfile`` has
        unflushed appends."""
        if self._dirty_epoch != synced:
            self._dirty_epoch = synced
            self._dirty_noted = frozenset()
        if sfile not in self._dirty_noted:
            self.files.io.write(self.files.fd("dirty"), sfile.encode("ascii") + b"\n")
            self._dirty_noted = self._dirty_noted | {sfile}

    def dirty_names(self) -> set[str]:
        """The index files ``dirty`` lists (see :func:`index_names`)."""
        io, fd = self.files.io, self.files.fd("dirty")
        size = io.fstat(fd).st_size
        return index_names(read_exact(io, fd, size, 0).decode("ascii", "replace"))

    def clear_dirty(self) -> None:
        """Empty ``dirty``: every index it listed is flushed, or rebuilt."""
        self.files.io.ftruncate(self.files.fd("dirty"), 0)
        self._dirty_noted = frozenset()


@dataclass
class Txn:
    """The state as the lock holder sees it; :meth:`commit` writes the next version."""

    file: StateFile
    state: fmt.State

    def commit(self, **changes: Any) -> None:
        new = self.state.next(**changes)
        self.file.write(new)
        self.state = new

    def sync(self) -> None:
        """Make the last committed state durable (only in full durability)."""
        files = self.file.files
        if files.durable:
            files.io.fdatasync(files.fd("state"))


class WriteLock:
    """The write lock (see the module docstring); ``lock_fd`` gives the descriptor
    of ``lock`` (the store's, opened by the opening)."""

    def __init__(self, io: FileIO, lock_fd: Callable[[], int], timeout: float, root: str) -> None:
        self.io = io
        self._lock_fd = lock_fd
        self.timeout = timeout
        self.root = root
        self._mutex = threading.Lock()
        #: The thread holding the lock, if any.
        self._owner: int | None = None

    @contextmanager
    def held(self, *, wait: bool = True) -> Iterator[bool]:
        """Hold the write lock: this instance's mutex, then ``flock(LOCK_EX)`` on
        ``lock``. With ``wait=False`` yields ``False`` at once if either is taken."""
        timeout = self.timeout
        deadline = time.monotonic() + timeout
        if not self._mutex.acquire(timeout=timeout if wait else 0):
            if not wait:
                yield False
                return
            raise StoreTimeout(self._timeout_message())
        try:
            lock_fd = self._lock_fd()
            delay = 0.0002
            while True:
                try:
                    self.io.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if not wait:
                        yield False
                        return
                    if left <= 0:
                        raise StoreTimeout(self._timeout_message()) from None
                    time.sleep(min(delay, left))
                    delay = min(delay * 2, 0.005)
            self._owner = threading.get_ident()
            try:
                yield True
            finally:
                self._owner = None
                self.io.flock(lock_fd, fcntl.LOCK_UN)
        finally:
            self._mutex.release()

    def holding(self) -> bool:
        """Whether this thread holds the write lock."""
        return self._owner == threading.get_ident()

    def _timeout_message(self) -> str:
        return (
            f"timed out after {self.timeout:g}s waiting for the write lock of the file "
            f"store at {self.root}; another process is writing (raise lock_timeout to wait longer)"
        )


def index_names(text: str) -> set[str]:
    """The index file names listed in ``dirty``, one a line. A power cut can tear
    its last append (zeros where the bytes were lost): NULs separate names too,
    and anything that is not a plain index file name is left out."""
    return {
        name
        for name in text.replace("\x00", "\n").split()
        if name.endswith(".idx") and "/" not in name and not name.startswith(".")
    }
