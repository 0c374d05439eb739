"""What the file backend's two index files (:mod:`.index`, :mod:`.ids`) share: the
safe open of an index file, the handle that closes it unless a cache keeps it, and
:class:`IndexDamaged`, which sends a read to the records."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Self

from ...errors import ConcurrentModificationError
from .io import FileIO

__all__ = [
    "NEW",
    "RO",
    "RW",
    "Handle",
    "IndexDamaged",
    "open_regular",
    "pwrite_all",
    "unlink_quiet",
]

RO = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
RW = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


class IndexDamaged(Exception):
    """An index file is not what the store wrote (planted, corrupt, wrong store)."""


def open_regular(io: FileIO, name: str, flags: int, dir_fd: int) -> tuple[int, os.stat_result]:
    """Open ``name`` without following links or blocking; it must be a regular file
    with one link. Raises :class:`FileNotFoundError`, or :class:`IndexDamaged`.

    A file with *no* link was replaced (an index is rewritten by rename) between the
    open and the ``fstat``: that is a concurrent writer, not damage, so the open is
    retried, and after :data:`_REPLACED_RETRIES` tries it is
    :class:`ConcurrentModificationError`.
    """
    for _ in range(_REPLACED_RETRIES):
        try:
            fd = io.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise
            if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR, errno.ENOTDIR):
                raise IndexDamaged(f"{name} is not a regular file ({exc.strerror})") from None
            raise
        try:
            st = io.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise IndexDamaged(f"{name} is not a regular file")
            if st.st_nlink == 0:
                io.close(fd)
                continue
            if st.st_nlink != 1:
                raise IndexDamaged(f"{name} has {st.st_nlink} hard links")
        except BaseException:
            io.close(fd)
            raise
        return fd, st
    raise ConcurrentModificationError(
        f"{name} was replaced by a concurrent writer {_REPLACED_RETRIES} times in a row; retry"
    )


_REPLACED_RETRIES = 8


class Handle:
    """An open index file: ``close`` (or leaving a ``with`` block) releases it,
    unless the writer's cache holds it (``keep``)."""

    __slots__ = ()
    io: FileIO
    fd: int
    keep: bool

    def close(self) -> None:
        if not self.keep:
            self.io.close(self.fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.keep:  # close(), without the call (a kept handle is on hot paths)
            self.io.close(self.fd)


def pwrite_all(io: FileIO, fd: int, data: bytes, offset: int) -> None:
    done = 0
    while done < len(data):
        n = io.pwrite(fd, data[done:] if done else data, offset + done)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        done += n


def unlink_quiet(io: FileIO, name: str, dir_fd: int) -> None:
    """Remove a temp file on a cleanup path; a failure here must not hide the
    original error (a leftover temp file is cleaned up by the journal later)."""
    with contextlib.suppress(OSError):
        io.unlink(name, dir_fd=dir_fd)
