"""File systems for the file backend's I/O seam (``FileCheckpointStore(path, io=...)``):
one that simulates a power cut, and one that injects I/O errors and short writes.

:class:`PowerLossIO` runs on the real directory but keeps a model of what is
*durable*: a file's content only as of its last ``fsync``/``fdatasync``, a
directory's entries only as of the directory's last ``fsync``. :meth:`~PowerLossIO.cut`
kills the "machine" (every later call raises :class:`PowerCut`), and
:meth:`~PowerLossIO.materialize` rewrites the directory as it would be found after
the reboot: unsynced data and directory entries gone, and the last unsynced write
torn in half. Real fsyncs are skipped, since the model decides what survives.

Assumptions, kept deliberately simple: the store's root directory itself is
durable; directories are never renamed; a file that was never fsynced comes back
empty if its directory entry survived.

:class:`FaultyIO` fails the k-th call of chosen system calls with an ``OSError``
(once, or on every call from then on until disarmed), or makes the k-th write
short.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import itertools
import os
import shutil
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

from statekeeper.backends.file.io import OsFileIO


class PowerCut(BaseException):
    """The machine lost power: nothing after this call happens."""


class RebootedIO(OsFileIO):
    """The real file system after a reboot: a new kernel boot id, so the store knows
    that unsynced data may be gone and checks its derived data."""

    def __init__(self, boot: str) -> None:
        self._boot = boot

    def boot_id(self) -> str | None:
        return self._boot


_Entry = tuple[str, int]  # ("dir", 0) or ("file", file identity)


@dataclass
class _Write:
    ident: int
    offset: int | None  # None: at the file position, which we read before writing
    data: bytes


@dataclass
class PowerLossIO(OsFileIO):
    """A crash-simulating :class:`~statekeeper.backends.file.io.FileIO` (module docs)."""

    root: str
    cut_at: int | None = None  # cut the power on entering this mutating call (1-based)
    # mutants: the fsyncs of record files, or of the record directories, do nothing
    # (what deleting either fsync from the backend's write path amounts to)
    drop_file_fsync: bool = False
    drop_dir_fsync: bool = False
    calls: int = 0
    dead: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _ino: dict[int, int] = field(default_factory=dict)  # inode -> file identity
    _fds: dict[int, tuple[str, str, int]] = field(default_factory=dict)  # fd -> kind, path, id
    _durable_dirs: dict[str, dict[str, _Entry]] = field(default_factory=dict)
    _durable_data: dict[int, bytes] = field(default_factory=dict)
    _last_write: _Write | None = None

    # -- the model ---------------------------------------------------------------------

    def _ident(self, st: os.stat_result, *, new: bool = False) -> int:
        if new or st.st_ino not in self._ino:
            self._ino[st.st_ino] = next(self._ids)
        return self._ino[st.st_ino]

    def _snapshot(self, rel: str) -> None:
        """Everything that exists when we start is durable."""
        entries: dict[str, _Entry] = {}
        base = os.path.join(self.root, rel)
        for name in os.listdir(base):
            path = os.path.join(base, name)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                entries[name] = ("dir", 0)
                self._snapshot(os.path.join(rel, name))
            elif stat.S_ISREG(st.st_mode):
                ident = self._ident(st)
                entries[name] = ("file", ident)
                self._durable_data[ident] = Path(path).read_bytes()
        self._durable_dirs[rel] = entries

    def _step(self, *, mutating: bool = True) -> None:
        with self.lock:
            if self.dead:
                raise PowerCut
            if mutating:
                self.calls += 1
                if self.cut_at is not None and self.calls >= self.cut_at:
                    self.dead = True
                    raise PowerCut

    def cut(self) -> None:
        """Cut the power now (if it was not cut already)."""
        with self.lock:
            self.dead = True

    def materialize(self) -> None:
        """Rewrite the directory as the reboot finds it (and drop the dead store's
        descriptors, which a real power cut would have taken with it)."""
        with self.lock:
            for fd in list(self._fds):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
            torn: dict[int, bytes] = {}
            w = self._last_write
            if w is not None and w.offset is not None and len(w.data) > 1:
                base = bytearray(self._durable_data.get(w.ident, b""))
                half = w.data[: len(w.data) // 2]
                if len(base) < w.offset:
                    base.extend(b"\0" * (w.offset - len(base)))
                base[w.offset : w.offset + len(half)] = half
                torn[w.ident] = bytes(base)
            for name in os.listdir(self.root):
                path = os.path.join(self.root, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            self._build("", torn)

    def _build(self, rel: str, torn: dict[int, bytes]) -> None:
        for name, (kind, ident) in self._durable_dirs.get(rel, {}).items():
            path = os.path.join(self.root, rel, name)
            if kind == "dir":
                os.mkdir(path)
                self._build(os.path.join(rel, name), torn)
            else:
                Path(path).write_bytes(torn.get(ident, self._durable_data.get(ident, b"")))

    # -- the FileIO calls -----------------------------------------------------------------

    def open_root(self, path: str, *, create: bool) -> int:
        self._step(mutating=False)
        fd = super().open_root(path, create=create)
        with self.lock:
            if not self._durable_dirs:
                self._snapshot("")
            self._fds[fd] = ("dir", "", 0)
        return fd

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        creating = bool(flags & os.O_CREAT)
        self._step(mutating=creating)
        existed = creating and _exists(name, dir_fd)
        fd = super().open(name, flags, mode, dir_fd=dir_fd)
        st = os.fstat(fd)
        with self.lock:
            parent = self._fds[dir_fd][1]
            if stat.S_ISDIR(st.st_mode):
                self._fds[fd] = ("dir", os.path.join(parent, name), 0)
            else:
                new = creating and not existed
                self._fds[fd] = ("file", os.path.join(parent, name), self._ident(st, new=new))
        return fd

    def close(self, fd: int) -> None:
        with self.lock:
            self._fds.pop(fd, None)
        super().close(fd)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._step(mutating=False)
        return super().pread(fd, size, offset)

    def write(self, fd: int, data: bytes) -> int:
        self._step()
        offset = os.lseek(fd, 0, os.SEEK_CUR)
        n = super().write(fd, data)
        self._last_write = _Write(self._fds[fd][2], offset, bytes(data[:n]))
        return n

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._step()
        n = super().pwrite(fd, data, offset)
        self._last_write = _Write(self._fds[fd][2], offset, bytes(data[:n]))
        return n

    def ftruncate(self, fd: int, length: int) -> None:
        self._step()
        super().ftruncate(fd, length)

    def fsync(self, fd: int) -> None:
        self._step()
        self._sync(fd)

    def fdatasync(self, fd: int) -> None:
        self._step()
        self._sync(fd)

    def _sync(self, fd: int) -> None:
        with self.lock:
            kind, rel, ident = self._fds[fd]
            in_records = rel.split(os.sep)[0] == "records"
            if kind == "dir":
                if self.drop_dir_fsync and in_records:
                    return
                entries: dict[str, _Entry] = {}
                for name in os.listdir(fd):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        entries[name] = ("dir", 0)
                        self._durable_dirs.setdefault(os.path.join(rel, name), {})
                    elif stat.S_ISREG(st.st_mode):
                        entries[name] = ("file", self._ident(st))
                self._durable_dirs[rel] = entries
            else:
                if self.drop_file_fsync and in_records:
                    return
                # the descriptor may be write-only: read the file through /proc
                self._durable_data[ident] = Path(f"/proc/self/fd/{fd}").read_bytes()
                if self._last_write is not None and self._last_write.ident == ident:
                    self._last_write = None

    def fstat(self, fd: int) -> os.stat_result:
        self._step(mutating=False)
        return super().fstat(fd)

    def lstat(self, name: str, *, dir_fd: int) -> os.stat_result:
        self._step(mutating=False)
        return super().lstat(name, dir_fd=dir_fd)

    def rename(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        self._step()
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(self, name: str, *, dir_fd: int) -> None:
        self._step()
        super().unlink(name, dir_fd=dir_fd)

    def mkdir(self, name: str, mode: int = 0o777, *, dir_fd: int) -> None:
        self._step()
        super().mkdir(name, mode, dir_fd=dir_fd)

    def listdir(self, dir_fd: int) -> list[str]:
        self._step(mutating=False)
        return super().listdir(dir_fd)

    def flock(self, fd: int, operation: int) -> None:
        self._step(mutating=False)
        super().flock(fd, operation)


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


# -- I/O errors ---------------------------------------------------------------------------

FAULTABLE = ("write", "pwrite", "fsync", "fdatasync", "rename", "ftruncate", "unlink", "mkdir")


@dataclass
class FaultyIO(OsFileIO):
    """Fail the ``k``-th call (counted from :meth:`arm`) of the calls in ``ops``.

    ``error`` is an errno (EIO, ENOSPC, EDQUOT), or ``None`` for a short write
    (half the bytes). ``persistent`` keeps failing every later matching call until
    :meth:`disarm`. ``fired`` records the calls that failed; ``counts`` counts the
    matching calls since :meth:`arm` (a dry run with ``k=0`` just counts).
    """

    ops: frozenset[str] = frozenset()
    k: int = 0
    error: int | None = errno_mod.EIO
    persistent: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    fired: list[str] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    _seen: int = 0

    def arm(
        self, ops: set[str] | frozenset[str], k: int, error: int | None, *, persistent: bool
    ) -> None:
        with self.lock:
            self.ops, self.k, self.error, self.persistent = frozenset(ops), k, error, persistent
            self.counts, self.fired, self._seen = {}, [], 0

    def disarm(self) -> None:
        with self.lock:
            self.ops = frozenset()

    def _hit(self, op: str) -> bool:
        with self.lock:
            if op not in self.ops:
                return False
            self.counts[op] = self.counts.get(op, 0) + 1
            self._seen += 1
            if self.k and (self._seen == self.k or (self.persistent and self._seen > self.k)):
                self.fired.append(op)
                return True
            return False

    def _fail(self, op: str) -> None:
        if self._hit(op) and self.error is not None:
            raise OSError(self.error, f"injected {errno_mod.errorcode[self.error]} in {op}")

    def write(self, fd: int, data: bytes) -> int:
        if self._hit("write"):
            if self.error is not None:
                raise OSError(self.error, f"injected {errno_mod.errorcode[self.error]} in write")
            return super().write(fd, data[: max(len(data) // 2, 1)])
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if self._hit("pwrite"):
            if self.error is not None:
                raise OSError(self.error, f"injected {errno_mod.errorcode[self.error]} in pwrite")
            return super().pwrite(fd, data[: max(len(data) // 2, 1)], offset)
        return super().pwrite(fd, data, offset)

    # durability is not what these tests look at, so the real fsyncs are skipped
    # (they would make every scenario wait for the disk)

    def fsync(self, fd: int) -> None:
        self._fail("fsync")

    def fdatasync(self, fd: int) -> None:
        self._fail("fdatasync")

    def rename(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        self._fail("rename")
        super().rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def ftruncate(self, fd: int, length: int) -> None:
        self._fail("ftruncate")
        super().ftruncate(fd, length)

    def unlink(self, name: str, *, dir_fd: int) -> None:
        self._fail("unlink")
        super().unlink(name, dir_fd=dir_fd)

    def mkdir(self, name: str, mode: int = 0o777, *, dir_fd: int) -> None:
        self._fail("mkdir")
        super().mkdir(name, mode, dir_fd=dir_fd)
