"""The write lock of a file store: this instance's mutex (threads), then
``flock(LOCK_EX)`` on ``<dir>/lock`` (processes), waiting up to ``lock_timeout``.
Readers never take it; the thread holding it is the only user of the writer's
cached descriptors (see :mod:`.descriptors`)."""

from __future__ import annotations

import fcntl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...errors import StoreTimeout
from .io import FileIO

__all__ = ["WriteLock"]


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
