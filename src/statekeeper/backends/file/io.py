"""Every operating-system call of the file backend, behind :class:`FileIO`: the seam
for durability and fault tests (``FileCheckpointStore(path, io=...)``; default
:class:`OsFileIO`). A test's ``io`` may fail the k-th ``fsync`` with ``EIO``, or keep
an in-memory file system that loses whatever was not fsynced (a power cut).

One method per system call, so a fault can be injected at every step of every write:
names are single components relative to ``dir_fd`` (:meth:`FileIO.open_root` aside);
every method raises :class:`OSError` with ``errno`` set and nothing else; descriptors
are ``int``; :meth:`FileIO.fsync` takes files and directories. Implementations must
be thread-safe (worker threads call them). Optional, outside :class:`FileIO`:
``syncfs(fd)``, which ``save_many`` uses to make a batch durable at once (see
:func:`syncfs_usable`); without it, one ``fsync`` per file. An implementation that
models durability must model it (a subclass of :class:`OsFileIO` inherits the real one).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import platform
import re
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["FileIO", "OsFileIO", "read_exact", "syncfs_usable", "unlink_quiet", "write_all"]


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs``, on Linux 5.8 or later only: older kernels return 0 even
    when writing back failed, which would acknowledge data that is not on disk."""
    if platform.system() != "Linux":
        return None
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    if m is None or (int(m[1]), int(m[2])) < (5, 8):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        func: Any = libc.syncfs
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int]
    func.restype = ctypes.c_int
    return func  # type: ignore[no-any-return]


_SYNCFS = _load_syncfs()


def syncfs_usable(io: object) -> bool:
    """Whether ``io`` offers ``syncfs`` and this system can trust it."""
    return _SYNCFS is not None and callable(getattr(io, "syncfs", None))


@runtime_checkable
class FileIO(Protocol):
    """The system calls of the file backend, under the module's rules. Flags and modes
    are the :mod:`os` constants; each method is the POSIX call it names, with its contract.
    """

    def open_root(self, path: str, *, create: bool) -> int:
        """Open the store's root directory (``path`` is absolute) for ``dir_fd`` use,
        first creating it and its missing parents if ``create``."""

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        """``openat(dir_fd, name, flags, mode)``."""

    def close(self, fd: int) -> None:
        """``close(fd)``."""

    def ftruncate(self, fd: int, length: int) -> None:
        """``ftruncate(fd, length)``."""

    def fstat(self, fd: int) -> os.stat_result:
        """``fstat(fd)``."""

    def unlink(self, name: str, *, dir_fd: int) -> None:
        """``unlinkat(dir_fd, name)``."""

    def mkdir(self, name: str, mode: int = 0o777, *, dir_fd: int) -> None:
        """``mkdirat(dir_fd, name, mode)``."""

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        """``pread``: up to ``size`` bytes at ``offset`` (short only at end of file)."""

    def write(self, fd: int, data: bytes) -> int:
        """``write``: returns how many bytes were written (may be short)."""

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        """``pwrite``: returns how many bytes were written (may be short)."""

    def fsync(self, fd: int) -> None:
        """``fsync`` of a file or a directory."""

    def fdatasync(self, fd: int) -> None:
        """``fdatasync``: the data and the size, not the timestamps."""

    def lstat(self, name: str, *, dir_fd: int) -> os.stat_result:
        """``fstatat(dir_fd, name, AT_SYMLINK_NOFOLLOW)``."""

    def rename(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        """``renameat``: atomically replaces ``dst`` if it exists (``os.replace``)."""

    def rmdir(self, name: str, *, dir_fd: int) -> None:
        """``unlinkat(AT_REMOVEDIR)``: removes an empty directory (``OSError`` if not)."""

    def listdir(self, dir_fd: int) -> list[str]:
        """The names in an open directory (without ``.`` and ``..``), in any order;
        safe while other threads list the same descriptor."""

    def flock(self, fd: int, operation: int) -> None:
        """``flock(fd, operation)`` (``fcntl.LOCK_EX | fcntl.LOCK_NB`` ...); raises
        ``BlockingIOError`` when a non-blocking request would wait."""

    def boot_id(self) -> str | None:
        """The running kernel boot's id (``None``: the platform has none); a change means
        a restart, so the indexes are checked against the records."""


class OsFileIO:
    """The real :class:`FileIO` over :mod:`os`. ``flock``, never ``lockf``: a POSIX
    record lock is released when any descriptor of the file closes in the process."""

    def open_root(self, path: str, *, create: bool) -> int:
        if create:
            os.makedirs(path, exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        return os.open(name, flags | os.O_CLOEXEC, mode, dir_fd=dir_fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def syncfs(self, fd: int) -> None:
        """``syncfs(fd)``: write back everything dirty on the file system holding
        ``fd`` (every process's data, not only this store's) and wait for it."""
        if _SYNCFS is None:
            raise OSError(errno.ENOSYS, "syncfs is not available on this system")
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def fdatasync(self, fd: int) -> None:
        # macOS has no fdatasync; its fsync is no stronger anyway (F_FULLFSYNC aside).
        sync = getattr(os, "fdatasync", os.fsync)
        sync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def lstat(self, name: str, *, dir_fd: int) -> os.stat_result:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)

    def rename(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        os.replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(self, name: str, *, dir_fd: int) -> None:
        os.unlink(name, dir_fd=dir_fd)

    def mkdir(self, name: str, mode: int = 0o777, *, dir_fd: int) -> None:
        os.mkdir(name, mode, dir_fd=dir_fd)

    def rmdir(self, name: str, *, dir_fd: int) -> None:
        os.rmdir(name, dir_fd=dir_fd)

    def listdir(self, dir_fd: int) -> list[str]:
        # os.listdir(fd) reads through a dup, which shares fd's read position with
        # every thread listing fd at once (names twice, or none): read a private one.
        own = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            return os.listdir(own)
        finally:
            os.close(own)

    def flock(self, fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)

    def boot_id(self) -> str | None:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
                return f.read().strip() or None
        except OSError:
            return None


def write_all(io: FileIO, fd: int, data: bytes, offset: int | None = None) -> None:
    """Write all of ``data``, retrying short writes: at the current position, or with
    ``pwrite`` at ``offset``."""
    done = 0
    while done < len(data):
        chunk = data[done:] if done else data
        n = io.write(fd, chunk) if offset is None else io.pwrite(fd, chunk, offset + done)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        done += n


def unlink_quiet(io: FileIO, name: str, dir_fd: int) -> None:
    """Remove ``name`` on a cleanup path, never masking the error being handled."""
    with contextlib.suppress(OSError):
        io.unlink(name, dir_fd=dir_fd)


def read_exact(
    io: FileIO, fd: int, size: int, offset: int = 0, *, expect: int | None = None
) -> bytes:
    """Read up to ``size`` bytes at ``offset``; shorter only at end of file.

    ``expect``: the length the caller expects (``fstat``'s size, or a fixed file
    size) when it asks for one byte more to catch a longer file; a first read
    that gives exactly that many bytes ended at the end of the file (a file that
    grew meanwhile gives more), so no second read is made to find out."""
    first = io.pread(fd, size, offset)
    if len(first) == size or not first or len(first) == expect:
        return first
    chunks = [first]
    got = len(first)
    while got < size:
        chunk = io.pread(fd, size - got, offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
