"""The file backend's real I/O with a hook before each mutating call, for the tests
that inject OS errors into it (``test_file_io_errors.py``, ``test_file_group_commit.py``).
"""

from __future__ import annotations

import os
from typing import ClassVar

from statekeeper.backends.file.io import OsFileIO


class FaultHookIO(OsFileIO):
    """:class:`OsFileIO` that calls :meth:`_fault` with the call's name before each
    mutating call named in :attr:`FAULTED` (``open`` only when it creates), and then
    makes the call; a subclass counts, and raises where it means to fail."""

    FAULTED: ClassVar[frozenset[str]]

    def _fault(self, op: str) -> None:
        raise NotImplementedError

    def _before(self, op: str) -> None:
        if op in self.FAULTED:
            self._fault(op)

    def write(self, fd: int, data: bytes) -> int:
        self._before("write")
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._before("pwrite")
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._before("fsync")
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._before("fdatasync")
        super().fdatasync(fd)

    def syncfs(self, fd: int) -> None:
        self._before("syncfs")
        super().syncfs(fd)

    def rename(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        self._before("rename")
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def ftruncate(self, fd: int, length: int) -> None:
        self._before("ftruncate")
        super().ftruncate(fd, length)

    def unlink(self, name: str, *, dir_fd: int) -> None:
        self._before("unlink")
        super().unlink(name, dir_fd=dir_fd)

    def mkdir(self, name: str, mode: int = 0o777, *, dir_fd: int) -> None:
        self._before("mkdir")
        super().mkdir(name, mode, dir_fd=dir_fd)

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        if flags & os.O_CREAT:
            self._before("open")
        return super().open(name, flags, mode, dir_fd=dir_fd)
