"""Shared machinery of the file backend's engine: descriptors, the lock, the state
file and safe reads of untrusted files. Everything here is synchronous and runs
in a worker thread; every OS call goes through the :class:`~.io.FileIO`."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from ...errors import CheckpointDecodeError, StoreClosed
from ...record import StoredRecord, read_record
from . import layout as fmt
from .descriptors import Descriptors
from .id_table import IdTable
from .io import FileIO, read_exact, write_all
from .lock import WriteLock
from .spares import Spares
from .stream_index import IndexDamaged, StreamIndex

__all__ = ["EngineCore", "RecordProblem", "Txn"]

RO_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
RW_FILE = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


#: ``"auto"`` (syncfs where usable), ``"syncfs"`` or ``"fsync"``.
BatchSync = Literal["auto", "syncfs", "fsync"]


class RecordProblem(Exception):
    """A record file that must not be read: not a regular file, linked, oversized."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Txn:
    """The state as the lock holder sees it; :meth:`commit` writes the next version."""

    engine: EngineCore
    state: fmt.State

    def commit(self, **changes: Any) -> None:
        new = self.state.next(**changes)
        self.engine.write_state(new)
        self.state = new

    def sync(self) -> None:
        """Make the last committed state durable (only in full durability)."""
        if self.engine.durable:
            self.engine.io.fdatasync(self.engine.fd("state"))


class EngineCore:
    """Descriptors, locking, state and safe reads. See :class:`FileEngine`."""

    def __init__(
        self,
        root: str,
        io: FileIO,
        *,
        durable: bool,
        lock_timeout: float,
        max_record_bytes: int,
        sync_interval: int,
        batch_sync: BatchSync = "auto",
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        self.root = root
        self.create = create and not read_only
        self.read_only = read_only
        #: Why the indexes cannot be trusted on this read-only open (reads then go to
        #: the records, see :mod:`.view`); ``None`` when they can.
        self.degraded: str | None = None
        self.io = io
        self.durable = durable
        self.lock_timeout = lock_timeout
        self.max_record_bytes = max_record_bytes
        self.sync_interval = sync_interval
        #: How a group of files is made durable (``FileStoreOptions.batch_sync``).
        self.batch_sync: BatchSync = batch_sync
        self.store_id = ""
        self.fd_table: dict[str, int] = {}
        #: The write lock: this instance's mutex, then ``flock`` on ``lock``.
        self.lock = WriteLock(io, lambda: self.fd("lock"), lock_timeout, root)
        self._state_cache: tuple[bytes, fmt.State] | None = None
        #: The sync epoch of ``dirty`` and the index files this process noted in it
        #: since (see :meth:`.rebuild.Rebuild.mark_dirty`).
        self.dirty_epoch = -1
        self.dirty_noted: frozenset[str] = frozenset()
        #: The state generation of the last save this process completed (see
        #: :meth:`.rebuild.Rebuild.insert_done`).
        self.done_gen = -1
        # The state generation this process wrote last: a lock holder that finds
        # another one starts a new epoch of the descriptor cache (see .descriptors).
        self.my_gen = -1
        #: Every descriptor kept open across calls, the lock holder's and the inline
        #: readers'.
        self.descriptors = Descriptors(self)
        #: The temp file of the next durable save, made ahead (see :mod:`.spares`).
        self.spares = Spares(io, self._open_bucket, durable=durable)
        #: The bucket numbers, ascending, as a global listing last found them (see
        #: :meth:`.listing.Listing.scan_all`); a rebuild forgets them.
        self.buckets_listed: list[int] | None = None
        # In-flight calls, so close() never pulls a descriptor from under a thread.
        self._busy = 0
        self._busy_cond = threading.Condition()
        self._closing = False

    # -- descriptors ------------------------------------------------------------------

    def fd(self, name: str) -> int:
        try:
            return self.fd_table[name]
        except KeyError:
            raise StoreClosed(f"the file store at {self.root} is closed") from None

    @contextmanager
    def active(self) -> Iterator[None]:
        """Mark a call in flight (``close`` waits for it)."""
        with self._busy_cond:
            if self._closing or not self.fd_table:
                raise StoreClosed(f"the file store at {self.root} is closed")
            self._busy += 1
        try:
            yield
        finally:
            with self._busy_cond:
                self._busy -= 1
                self._busy_cond.notify_all()

    def close_fds(self) -> None:
        with self._busy_cond:
            self._closing = True
            while self._busy:
                self._busy_cond.wait()
            self.spares.drop()
            fds, self.fd_table = self.fd_table, {}
            self._closing = False
        self.descriptors.drop()
        self.descriptors.close_kept()
        for fd in fds.values():
            with contextlib.suppress(OSError):
                self.io.close(fd)

    def forget(self, sfile: str | None = None, *, ids: bool = False) -> None:
        """Drop the cached descriptor of a file this process is about to replace or
        remove (stream index ``sfile``, or the id table)."""
        self.descriptors.forget(sfile, ids=ids)

    def where(self, *parts: str) -> str:
        """A path for messages and ``Skipped.location``."""
        return "/".join((self.root, *parts))

    def open_dir(self, parent: int, name: str, *, create: bool) -> int | None:
        """Open subdirectory ``name`` without following a link; ``None`` if missing."""
        try:
            return self.io.open(name, DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise IndexDamaged(f"{name} is not a directory (a planted link?)") from None
            raise
        try:
            self.io.mkdir(name, 0o777, dir_fd=parent)
        except FileExistsError:
            pass
        else:
            if self.durable:
                self.io.fsync(parent)
        return self.io.open(name, DIR, dir_fd=parent)

    def bucket(self, seq: int, *, create: bool = False) -> int | None:
        """A descriptor of ``seq``'s bucket directory, ``None`` if missing. Release it
        with :meth:`close_bucket` (see :meth:`.descriptors.Descriptors.bucket`)."""
        return self.descriptors.bucket(seq, create=create)

    def _open_bucket(self, seq: int, create: bool) -> int | None:
        """A new descriptor of ``seq``'s bucket (not cached): the spares' own."""
        name = fmt.bucket_name(fmt.bucket_of(seq))
        return self.open_dir(self.fd("records"), name, create=create)

    def close_bucket(self, fd: int) -> None:
        self.descriptors.close_bucket(fd)

    def record_path(self, seq: int, cid: str) -> str:
        """The record's path relative to the root."""
        return (
            f"{fmt.RECORDS_DIR}/{fmt.bucket_name(fmt.bucket_of(seq))}/{fmt.record_name(seq, cid)}"
        )

    # -- safe reads of untrusted files ---------------------------------------------------

    def read_file(self, dir_fd: int, name: str, limit: int | None = None) -> bytes | None:
        """The bytes of a record file, ``None`` if it does not exist.

        Opened with ``O_NOFOLLOW|O_NONBLOCK``, so a symlink is refused and a FIFO
        cannot block; ``fstat`` must then show a regular file with one link and at
        most ``max_record_bytes`` (and at most ``limit``, if given), before anything
        is read. Raises :class:`RecordProblem` otherwise.
        """
        try:
            fd = self.io.open(name, RO_FILE, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise RecordProblem("it is a symbolic link, which is never followed") from None
            if exc.errno in (errno.ENXIO, errno.EISDIR, errno.ENODEV, errno.EACCES, errno.EPERM):
                raise RecordProblem(f"it cannot be opened: {exc.strerror}") from None
            raise
        try:
            st = self.io.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
                raise RecordProblem(f"it is {kind}, not a regular file")
            if st.st_nlink != 1:
                raise RecordProblem(
                    f"it has {st.st_nlink} hard links; a record file has exactly one"
                )
            if st.st_size > self.max_record_bytes:
                raise RecordProblem(
                    f"it is {st.st_size} bytes, over the {self.max_record_bytes}-byte limit"
                )
            if limit is not None and st.st_size > limit:
                raise RecordProblem(f"it is {st.st_size} bytes, over this read's {limit}")
            # One byte more than fstat said: a file that grew is caught by the length check.
            size = st.st_size
            data = self.io.pread(fd, size + 1, 0)
            if len(data) == size:  # read_exact's first read, when it is the whole file
                return data
            return read_exact(self.io, fd, size + 1, 0, expect=size)
        finally:
            self.io.close(fd)

    def decode(self, data: bytes, seq: int, cid: str) -> StoredRecord:
        # the location is worded only for an error (read_record is from_bytes otherwise)
        return read_record(
            data,
            lambda n: self.where(self.record_path(n, cid)),
            store_id=self.store_id,
            id=cid,
            sequence=seq,
        )

    def load_record(
        self, seq: int, cid: str, dirs: dict[int, int] | None = None, limit: int | None = None
    ) -> tuple[StoredRecord, bytes] | None:
        """Read and verify record ``seq``/``cid``: ``None`` if missing, else the record
        and its bytes; :class:`CheckpointDecodeError` naming it if unreadable (or, with
        ``limit``, over ``limit`` bytes).

        ``dirs`` keeps bucket descriptors open across the records of one call (a page
        of one stream is mostly in one or two buckets); the caller closes them with
        :meth:`close_dirs`.
        """
        data = self._record_bytes(seq, cid, dirs, limit)
        if data is None:
            return None
        return self.decode(data, seq, cid), data

    def _record_bytes(
        self, seq: int, cid: str, dirs: dict[int, int] | None, limit: int | None
    ) -> bytes | None:
        """The bytes of record file ``seq``/``cid`` (see :meth:`load_record`)."""
        number = fmt.bucket_of(seq)
        bucket = dirs.get(number) if dirs is not None else None
        owned = bucket is None
        if bucket is None:
            try:
                bucket = self.bucket(seq)
            except IndexDamaged as exc:
                raise self.decode_error(str(exc), seq, cid) from None
            if bucket is None:
                return None
            if dirs is not None and not self.holding():
                dirs[number] = bucket
                owned = False
        try:
            return self.read_file(bucket, fmt.record_name(seq, cid), limit)
        except RecordProblem as exc:
            raise self.decode_error(exc.reason, seq, cid) from None
        finally:
            if owned:
                self.close_bucket(bucket)

    def close_dirs(self, dirs: dict[int, int]) -> None:
        for fd in dirs.values():
            with contextlib.suppress(OSError):
                self.io.close(fd)
        dirs.clear()

    def decode_error(self, reason: str, seq: int, cid: str) -> CheckpointDecodeError:
        return CheckpointDecodeError(
            reason, id=cid, location=self.where(self.record_path(seq, cid)), sequence=seq
        )

    def index_files(self) -> list[str]:
        """The stream index files' names (dot-files and other planted names left out)."""
        return [
            name
            for name in self.io.listdir(self.fd("streams"))
            if not name.startswith(".") and name.endswith(".idx")
        ]

    def readable_indexes(self, *, strict: bool = False, prefix: str = "") -> Iterator[StreamIndex]:
        """Each stream index that opens; a damaged or vanished one is passed over,
        or, if ``strict``, raises :class:`IndexDamaged`. The caller closes each
        (``with idx:``). With ``prefix``, only the files whose name can belong to
        a stream starting with it (the caller still checks ``idx.stream``)."""
        head = fmt.file_name_head(prefix)
        for sfile in self.index_files():
            if not sfile.startswith(head):
                continue
            try:
                idx = self.open_index(sfile)
            except IndexDamaged:
                if strict:
                    raise
                continue
            if idx is not None:
                yield idx

    def open_index(self, sfile: str, *, write: bool = False) -> StreamIndex | None:
        """Open a stream index (``None`` if it does not exist). The lock holder gets a
        cached, writable handle; ``close`` it all the same."""
        return self.descriptors.open_index(sfile, write=write)

    def open_ids(self, *, write: bool = False) -> IdTable:
        """Open the id table; the lock holder gets a cached, writable handle."""
        return self.descriptors.open_ids(write=write)

    # -- state and lock -----------------------------------------------------------------

    def read_state(self) -> fmt.State | None:
        """The current state; ``None`` if it is unreadable (or, on a read-only open,
        missing)."""
        fd = self.fd_table.get("state")
        if fd is None:
            self.fd("root")  # StoreClosed if closed
            return None
        # One byte more than a state file has: a longer file is damage, not state.
        raw = read_exact(self.io, fd, fmt.STATE_SIZE + 1, 0, expect=fmt.STATE_SIZE)
        # Usually the bytes are the ones this process wrote or read last: skip the parse.
        cached = self._state_cache
        if cached is not None and cached[0] == raw:
            return cached[1]
        state = fmt.State.from_bytes(raw)
        self._state_cache = None if state is None else (raw, state)
        return state

    def write_state(self, state: fmt.State) -> None:
        offset, data = state.copy_bytes()
        before, self._state_cache = self._state_cache, None
        done = 0
        while done < len(data):
            n = self.io.pwrite(self.fd("state"), data[done:], offset + done)
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            done += n
        self.my_gen = state.gen
        if before is not None:
            raw = before[0]
            self._state_cache = (raw[:offset] + data + raw[offset + len(data) :], state)

    def locked(self, *, wait: bool = True) -> AbstractContextManager[bool]:
        """Hold the write lock (see :meth:`.lock.WriteLock.held`)."""
        return self.lock.held(wait=wait)

    def holding(self) -> bool:
        """Whether this thread holds the write lock."""
        return self.lock.holding()

    def write_new(self, dir_fd: int, name: str, data: bytes, *, sync: bool) -> None:
        """Create ``name`` exclusively with ``data`` (fsynced if ``sync``); on failure
        nothing is left behind. A ``name`` that :meth:`.spares.Spares.take` gave was
        created empty already: it is written through the spare's descriptor."""
        fd = self.spares.claim(name)
        if fd is None:
            fd = self.io.open(name, NEW_FILE, 0o666, dir_fd=dir_fd)
        try:
            write_all(self.io, fd, data)
            if sync:
                self.io.fsync(fd)
        except BaseException:
            self.io.close(fd)
            self.unlink_quiet(name, dir_fd)
            raise
        try:
            self.io.close(fd)
        except BaseException:
            self.unlink_quiet(name, dir_fd)
            raise

    def unlink_quiet(self, name: str, dir_fd: int) -> None:
        """Remove ``name`` on a cleanup path, never masking the error being handled."""
        with contextlib.suppress(OSError):
            self.io.unlink(name, dir_fd=dir_fd)

    def unlink_missing_ok(self, name: str, dir_fd: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.io.unlink(name, dir_fd=dir_fd)
