"""The store's directory as this process holds it open: :class:`Files` (the top-level
descriptors, safe reads of untrusted record files, publication by rename, the one walk
of the bucket directories), :class:`StateFile` and :class:`Txn` (``state`` and
``dirty``), :class:`WriteLock`, and :class:`Spares`.

**The spare temp file.** Creating a file costs as much as an fsync, so once a save has
returned and nothing is queued, the writer thread creates the empty temp file of the
next sequence and keeps it open; the next lone durable save of exactly that sequence
writes into it. It has its sequence's temp name, so a crash leaves an empty temp file
that recovery removes as any save's, ``verify`` does not count and ``repair`` removes.
One per engine, used by its writer thread only; a forked child never touches its
parent's, and one removed by another process meanwhile (seen by its link count) is
not used.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import CheckpointDecodeError, StoreClosed, StoreTimeout
from ...record import StoredRecord, read_record
from . import layout as fmt
from .indexes import NEW, RO, IndexDamaged
from .io import FileIO, read_exact, unlink_quiet, write_all

DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


#: ``(sequence, create) -> a new bucket descriptor or None``, never a cached one.
OpenBucket = Callable[[int, bool], "int | None"]


class RecordProblem(Exception):
    """A record file that must not be read: not a regular file, linked, oversized."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BucketCache(Protocol):
    """The bucket descriptors :class:`Files` borrows (the :mod:`.fdcache`'s)."""

    def bucket(self, seq: int, *, create: bool = False) -> int | None: ...
    def close_bucket(self, fd: int) -> None: ...


def quietly(action: Callable[[], object]) -> None:
    """Run a best-effort cleanup step; a failure is left to the journal."""
    with contextlib.suppress(Exception):
        action()


class Files:
    """The top-level descriptors by name, the store id, the spare and the last listing
    of the bucket numbers; bucket descriptors are borrowed from ``cache`` (set by the
    engine once the descriptor cache exists)."""

    def __init__(
        self,
        root: str,
        io: FileIO,
        *,
        durable: bool,
        max_record_bytes: int,
        holding: Callable[[], bool],
    ) -> None:
        self.root = root
        self.io = io
        self.durable = durable
        self.max_record_bytes = max_record_bytes
        #: Whether this thread holds the write lock.
        self.holding = holding
        self.store_id = ""
        self.fd_table: dict[str, int] = {}
        self.cache: BucketCache
        self.spares = Spares(io, self._open_bucket, durable=durable)
        #: The bucket numbers, ascending, as :meth:`walk` last listed them.
        self._listed: list[int] | None = None
        # In-flight calls, so close() never pulls a descriptor from under a thread.
        self._busy = 0
        self._busy_cond = threading.Condition()
        self._closing = False

    def adopt(self, name: str, fd: int) -> None:
        """Hold ``fd`` as ``name`` (``root`` first: a new open)."""
        if name == "root":
            self.fd_table = {}
        self.fd_table[name] = fd

    def identify(self, store_id: str) -> None:
        self.store_id = store_id

    @contextmanager
    def active(self) -> Iterator[None]:
        """Mark a call in flight (:meth:`close` waits for it)."""
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

    def close(self) -> None:
        """Once the calls in flight are done, drop the spare and close the descriptors."""
        with self._busy_cond:
            self._closing = True
            while self._busy:
                self._busy_cond.wait()
            self.spares.drop()
            fds, self.fd_table = self.fd_table, {}
            self._closing = False
        for fd in fds.values():
            with contextlib.suppress(OSError):
                self.io.close(fd)

    def fd(self, name: str) -> int:
        try:
            return self.fd_table[name]
        except KeyError:
            raise StoreClosed(f"the file store at {self.root} is closed") from None

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
        """``seq``'s bucket directory (``None``: missing), for :meth:`close_bucket`."""
        return self.cache.bucket(seq, create=create)

    def _open_bucket(self, seq: int, create: bool) -> int | None:
        name = fmt.bucket_name(fmt.bucket_of(seq))
        return self.open_dir(self.fd("records"), name, create=create)

    def close_bucket(self, fd: int) -> None:
        self.cache.close_bucket(fd)

    def stray_temp(self, bfd: int, name: str, location: str, journal: fmt.Journal | None) -> bool:
        """Whether temp file ``name`` is one nobody is writing: not ``journal``'s, still
        there (not just renamed or removed by its write), not empty (an empty one holds
        nothing: a spare, or a write cut before its first byte)."""
        if fmt.temp_in_flight(journal, location):
            return False
        try:
            return self.io.lstat(name, dir_fd=bfd).st_size > 0
        except FileNotFoundError:
            return False

    def record_path(self, seq: int, cid: str) -> str:
        return (
            f"{fmt.RECORDS_DIR}/{fmt.bucket_name(fmt.bucket_of(seq))}/{fmt.record_name(seq, cid)}"
        )

    def read_file(self, dir_fd: int, name: str, limit: int | None = None) -> bytes | None:
        """The bytes of a record file, ``None`` if it does not exist. Opened with
        ``O_NOFOLLOW|O_NONBLOCK``; before a byte is read, ``fstat`` must show a regular
        file with one link, at most ``max_record_bytes`` (and ``limit``), or
        :class:`RecordProblem` is raised."""
        try:
            fd = self.io.open(name, RO, dir_fd=dir_fd)
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
            return read_exact(self.io, fd, st.st_size + 1, 0, expect=st.st_size)
        finally:
            self.io.close(fd)

    def decode(self, data: bytes, seq: int, cid: str) -> StoredRecord:
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
        """Record ``seq``/``cid`` verified, and its bytes (``None``: missing);
        :class:`CheckpointDecodeError` naming it if unreadable or over ``limit``.
        ``dirs`` keeps bucket descriptors across one call's records (the caller's, for
        :meth:`close_dirs`)."""
        data = self.record_bytes(seq, cid, dirs, limit)
        if data is None:
            return None
        return self.decode(data, seq, cid), data

    def record_bytes(
        self, seq: int, cid: str, dirs: dict[int, int] | None = None, limit: int | None = None
    ) -> bytes | None:
        """:meth:`load_record`'s bytes, unverified."""
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

    def write_new(self, dir_fd: int, name: str, data: bytes, *, sync: bool) -> None:
        """Create ``name`` exclusively with ``data`` (fsynced if ``sync``); on failure
        nothing is left behind. A name :meth:`Spares.take` gave is the spare's."""
        fd = self.spares.claim(name)
        if fd is None:
            fd = self.io.open(name, NEW, 0o666, dir_fd=dir_fd)
        try:
            try:
                write_all(self.io, fd, data)
                if sync:
                    self.io.fsync(fd)
            finally:
                self.io.close(fd)
        except BaseException:
            unlink_quiet(self.io, name, dir_fd)
            raise

    def unlink_missing_ok(self, name: str, dir_fd: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.io.unlink(name, dir_fd=dir_fd)

    def publish(
        self, bucket: int, tmp: str, name: str, data: bytes, previous: bytes | None
    ) -> None:
        """Write ``data`` to ``tmp``, fsync, rename over ``name``, fsync the directory.
        On failure nothing of it stays visible: ``tmp`` is removed, and after the
        rename ``name`` is removed (``previous is None``) or ``previous`` put back."""
        self.write_new(bucket, tmp, data, sync=self.durable)
        try:
            self.io.rename(tmp, name, src_dir_fd=bucket, dst_dir_fd=bucket)
        except BaseException:
            unlink_quiet(self.io, tmp, bucket)
            raise
        if not self.durable:
            return
        try:
            self.io.fsync(bucket)
        except BaseException:
            if previous is None:
                unlink_quiet(self.io, name, bucket)
            else:
                quietly(lambda: self.put_back(bucket, tmp, name, previous))
            raise

    def put_back(self, bucket: int, tmp: str, name: str, previous: bytes) -> None:
        """Restore a record's previous bytes (if this fails too, the new version stays,
        complete and valid)."""
        seq = fmt.parse_temp_name(tmp)
        back = fmt.temp_name(seq) if seq is not None else f"{tmp}.undo"
        try:
            self.write_new(bucket, back, previous, sync=self.durable)
            self.io.rename(back, name, src_dir_fd=bucket, dst_dir_fd=bucket)
            if self.durable:
                self.io.fsync(bucket)
        finally:
            unlink_quiet(self.io, back, bucket)

    def walk(
        self,
        lo: int = 0,
        hi: int | None = None,
        *,
        descending: bool = False,
        known_top: int | None = None,
        damaged: Callable[[str, int | None, str], None] | None = None,
        until: Callable[[], bool] | None = None,
    ) -> Iterator[tuple[int, int, list[str]]]:
        """``(number, descriptor, names)`` of each bucket that may hold ``lo..hi``, in
        order (or reversed), the descriptor open until the next. A vanished bucket is
        passed over; a name that is no bucket directory goes to ``damaged(name, number
        or None, reason)``. It stops before a bucket once ``until()``. The last listing
        is used again while it reaches ``known_top`` (buckets are only added, above)."""
        records = self.fd_table.get("records")
        if records is None:
            return
        first, last = fmt.bucket_of(lo), None if hi is None else fmt.bucket_of(hi)
        for name, number in self._listing(records, known_top, descending):
            if until is not None and until():
                return
            if number is None:
                if damaged is not None:
                    damaged(name, None, "not a bucket directory")
                continue
            if number < first or (last is not None and number > last):
                continue
            try:
                bfd = self.open_dir(records, name, create=False)
            except IndexDamaged as exc:
                if damaged is not None:
                    damaged(name, number, str(exc))
                continue
            if bfd is None:
                continue
            try:
                yield number, bfd, self.io.listdir(bfd)
            finally:
                self.io.close(bfd)

    def _listing(
        self, records: int, known_top: int | None, descending: bool
    ) -> list[tuple[str, int | None]]:
        cached = self._listed
        if cached and known_top is not None and cached[-1] >= fmt.bucket_of(known_top):
            listing: list[tuple[str, int | None]] = [(fmt.bucket_name(n), n) for n in cached]
        else:
            listing = [(name, fmt.parse_bucket_name(name)) for name in self.io.listdir(records)]
            listing.sort()
            self._listed = [n for _, n in listing if n is not None]
        if descending:
            listing.reverse()
        return listing

    def forget_buckets(self) -> None:
        self._listed = None


class StateFile:
    """``state`` and ``dirty``, as this process reads and writes them. ``my_gen``: the
    generation it wrote last; ``done_gen``: that of its last completed save."""

    def __init__(self, files: Files) -> None:
        self.files = files
        self._cache: tuple[bytes, fmt.State] | None = None
        self.my_gen = -1
        self.done_gen = -1
        self._dirty_epoch = -1
        self._dirty_noted: frozenset[str] = frozenset()

    def read(self) -> fmt.State | None:
        """The current state; ``None`` if unreadable (or missing, on a read-only open)."""
        fd = self.files.fd_table.get("state")
        if fd is None:
            self.files.fd("root")  # StoreClosed if closed
            return None
        raw = read_exact(self.files.io, fd, fmt.STATE_SIZE + 1, 0, expect=fmt.STATE_SIZE)
        cached = self._cache
        if cached is not None and cached[0] == raw:
            return cached[1]
        state = fmt.State.from_bytes(raw)
        self._cache = None if state is None else (raw, state)
        return state

    def write(self, state: fmt.State) -> None:
        offset, data = state.copy_bytes()
        before, self._cache = self._cache, None
        write_all(self.files.io, self.files.fd("state"), data, offset)
        self.my_gen = state.gen
        if before is not None:
            raw = before[0]
            self._cache = (raw[:offset] + data + raw[offset + len(data) :], state)

    def saved(self, gen: int) -> None:
        self.done_gen = gen

    def mark_dirty(self, synced: int, sfile: str) -> None:
        """Note in ``dirty``, once per sync epoch, that ``sfile`` has unflushed appends."""
        if self._dirty_epoch != synced:
            self._dirty_epoch = synced
            self._dirty_noted = frozenset()
        if sfile not in self._dirty_noted:
            self.files.io.write(self.files.fd("dirty"), sfile.encode("ascii") + b"\n")
            self._dirty_noted = self._dirty_noted | {sfile}

    def dirty_names(self) -> set[str]:
        """The index file names in ``dirty``, one a line; a power cut can tear the last
        append, so NULs separate too and anything not an index file name is left out."""
        io, fd = self.files.io, self.files.fd("dirty")
        text = read_exact(io, fd, io.fstat(fd).st_size, 0).decode("ascii", "replace")
        return {
            name
            for name in text.replace("\x00", "\n").split()
            if name.endswith(".idx") and "/" not in name and not name.startswith(".")
        }

    def clear_dirty(self) -> None:
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
    """The write lock: this instance's mutex, then ``flock`` on ``lock`` (``lock_fd()``),
    waiting up to ``timeout`` seconds, else :class:`StoreTimeout`."""

    def __init__(self, io: FileIO, lock_fd: Callable[[], int], timeout: float, root: str) -> None:
        self.io = io
        self._lock_fd = lock_fd
        self.timeout = timeout
        self.root = root
        self._mutex = threading.Lock()
        self._owner: int | None = None

    @contextmanager
    def held(self, *, wait: bool = True) -> Iterator[bool]:
        """Hold the write lock; with ``wait=False`` yield ``False`` at once if taken."""
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
        return self._owner == threading.get_ident()

    def _timeout_message(self) -> str:
        return (
            f"timed out after {self.timeout:g}s waiting for the write lock of the file "
            f"store at {self.root}; another process is writing (raise lock_timeout to wait longer)"
        )


@dataclass(frozen=True, slots=True)
class Spare:
    seq: int
    name: str
    fd: int


class Spares:
    """At most one spare temp file (see the module)."""

    def __init__(self, io: FileIO, open_bucket: OpenBucket, *, durable: bool) -> None:
        self._io = io
        self._open_bucket = open_bucket
        self._durable = durable
        self._spare: Spare | None = None
        self._taken: Spare | None = None  # given by take(), not yet claimed
        self._next: int | None = None  # the sequence after the last one taken
        self._pid = os.getpid()

    def _mine(self) -> Spare | None:
        if self._pid != os.getpid():  # forked: the parent's, neither used nor removed
            self._spare, self._taken, self._pid = None, None, os.getpid()
        return self._spare

    def make(self) -> None:
        """Create the spare of the sequence after the last one :meth:`take` was asked
        for, unless there is one; an error leaves none and is not raised."""
        seq = self._next
        if self._mine() is not None or seq is None:
            return
        try:
            bucket = self._open_bucket(seq, True)
        except Exception:  # a planted link: the save reports it
            return
        if bucket is None:
            return
        name = fmt.temp_name(seq)
        try:
            fd = self._io.open(name, NEW, 0o666, dir_fd=bucket)
        except OSError:
            return
        finally:
            self._io.close(bucket)
        self._spare = Spare(seq, name, fd)

    def take(self, seq: int) -> str | None:
        """The spare's temp name for the save that got ``seq`` (under the write lock),
        or ``None`` (a spare of another sequence, or removed meanwhile, is dropped).
        The save writes it as its own temp file. None without durability."""
        spare = self._mine()
        self._next = seq + 1 if self._durable else None
        if spare is None:
            return None
        self._spare = None
        if spare.seq == seq:
            try:
                alive = self._io.fstat(spare.fd).st_nlink == 1
            except OSError:
                alive = False
            if alive:
                self._taken = spare
                return spare.name
        self._discard(spare)
        return None

    def claim(self, name: str) -> int | None:
        """The descriptor of the spare :meth:`take` gave as ``name``, now the caller's;
        ``None`` for any other name."""
        taken, self._taken = self._taken, None
        if taken is None or self._pid != os.getpid():
            return None
        if taken.name != name:  # its save failed before writing it
            self._discard(taken)
            return None
        return taken.fd

    def drop(self) -> None:
        spare, taken = self._mine(), self._taken
        self._spare = self._taken = None
        for left in (spare, taken):
            if left is not None:
                self._discard(left)

    def _discard(self, spare: Spare) -> None:
        with contextlib.suppress(OSError):
            self._io.close(spare.fd)
        with contextlib.suppress(Exception):  # verify and repair see what is left
            bucket = self._open_bucket(spare.seq, False)
            if bucket is not None:
                try:
                    self._io.unlink(spare.name, dir_fd=bucket)
                finally:
                    self._io.close(bucket)
