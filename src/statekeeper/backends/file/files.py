"""The store's directory as this process holds it open: its top-level files (the
state file, the write lock, the ``dirty`` list) and its record files.

- :class:`Files`: the top-level descriptors by name (opened by
  :meth:`.engine.FileEngine.open`; :meth:`Files.active` marks a call that uses
  them, and :meth:`Files.close` waits for those), the safe read of an untrusted
  record file, the publication of a record file (temp file, fsync, rename, fsync
  of the directory), and :meth:`Files.walk`, the ONE walk of the bucket
  directories every listing, survey and recovery goes through;
- :class:`StateFile`: reads and writes of ``state`` (its bytes are
  :class:`.layout.State`), the generation this process wrote last and the one of
  the last save it completed, and the ``dirty`` list of the indexes written since
  the sync mark; :class:`Txn`, the state as the lock holder sees it;
- :class:`WriteLock`: the write lock, this instance's mutex, then ``flock`` on
  ``lock``, waiting up to ``lock_timeout`` seconds;
- :class:`Spares`: the temp file of the next durable save, made ahead while the
  writer is idle.

Every OS call goes through the :class:`~.io.FileIO`.

**The spare temp file.**
Creating a file costs more than anything else a durable save does but its two
fsyncs: on ext4 here an ``open(O_CREAT|O_EXCL)`` of a new name took 300-400 µs
(a new inode, a directory entry, journalled), as long as the fsync of the data.
So once a save has returned to its caller and nothing is queued, the writer thread
creates the temp file of the *next* sequence, empty, and keeps it open
(:meth:`Spares.make`); the next lone durable save that gets exactly that sequence
writes into it (:meth:`Spares.take`) and goes on as before: fsync, rename over
the record's name, fsync of the directory. Nothing else changes: the spare has the
temp name of its sequence (:func:`.layout.temp_name`), so a save cut short by a
crash leaves it where recovery removes a temp file of that save, and the journal
names it as it names every temp.

A spare not used is empty and holds nothing. :meth:`take` drops one for another
sequence (another process saved in between, or a group commit did) and makes
none; :meth:`drop` removes it at ``close``. A spare that another process removed
meanwhile (``repair``, or a recovery that cleared temp files) is seen by its link
count and not used. Left by a crash, it is an empty temp file: ``verify`` does not
count it as a problem, ``repair`` removes it.

One per engine, used by its writer thread only. A forked child never touches its
parent's spare.
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
from .indexes import NEW, IndexDamaged
from .io import FileIO, read_exact, write_all

__all__ = [
    "DIR",
    "NEW_FILE",
    "RO_FILE",
    "RW_FILE",
    "Files",
    "RecordProblem",
    "Spares",
    "StateFile",
    "Txn",
    "WriteLock",
    "index_names",
    "quietly",
]

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


#: ``(sequence, create) -> a new descriptor of its bucket directory, or None``: never
#: one of the descriptor cache's (which a spare's file must not evict from under a
#: save that holds one).
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
    """The store's directory as this process holds it open, and its record files.

    Owns the top-level descriptors (``root``, ``records``, ``streams``, ``state``,
    ``dirty``, ``lock``; :meth:`adopt` and :meth:`close`), the store id read from
    the meta file, the spare temp file and the last listing of the bucket
    numbers. Bucket descriptors come from ``cache`` (given by the engine once the
    descriptor cache exists: it needs these descriptors to open anything)."""

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
        #: Whether this thread holds the write lock (the lock's own answer).
        self.holding = holding
        self.store_id = ""
        self.fd_table: dict[str, int] = {}
        self.cache: BucketCache
        #: The temp file of the next durable save, made ahead (see the module).
        self.spares = Spares(io, self._open_bucket, durable=durable)
        #: The bucket numbers, ascending, as :meth:`walk` last listed them.
        self._listed: list[int] | None = None
        # In-flight calls, so close() never pulls a descriptor from under a thread.
        self._busy = 0
        self._busy_cond = threading.Condition()
        self._closing = False

    def adopt(self, name: str, fd: int) -> None:
        """Hold ``fd`` as the store's ``name`` (``root`` first: a new open)."""
        if name == "root":
            self.fd_table = {}
        self.fd_table[name] = fd

    def identify(self, store_id: str) -> None:
        """The store id of the meta file: every record and index names it."""
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
        """Once the calls in flight are done, drop the spare and close the top-level
        descriptors."""
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
        """A descriptor of ``seq``'s bucket directory, ``None`` if missing. Release it
        with :meth:`close_bucket` (see :meth:`.fdcache.Descriptors.bucket`)."""
        return self.cache.bucket(seq, create=create)

    def _open_bucket(self, seq: int, create: bool) -> int | None:
        """A new descriptor of ``seq``'s bucket (not cached): the spares' own."""
        name = fmt.bucket_name(fmt.bucket_of(seq))
        return self.open_dir(self.fd("records"), name, create=create)

    def close_bucket(self, fd: int) -> None:
        self.cache.close_bucket(fd)

    def record_path(self, seq: int, cid: str) -> str:
        """The record's path relative to the root."""
        return (
            f"{fmt.RECORDS_DIR}/{fmt.bucket_name(fmt.bucket_of(seq))}/{fmt.record_name(seq, cid)}"
        )

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

    def write_new(self, dir_fd: int, name: str, data: bytes, *, sync: bool) -> None:
        """Create ``name`` exclusively with ``data`` (fsynced if ``sync``); on failure
        nothing is left behind. A ``name`` that :meth:`Spares.take` gave was
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

    def publish(
        self, bucket: int, tmp: str, name: str, data: bytes, previous: bytes | None
    ) -> None:
        """Write ``data`` to ``tmp``, fsync, rename over ``name``, fsync the directory.

        On failure nothing of the new version stays visible: the temp file is removed
        and, if the rename already happened, ``name`` is removed (``previous is
        None``) or its previous bytes are put back.
        """
        self.write_new(bucket, tmp, data, sync=self.durable)
        try:
            self.io.rename(tmp, name, src_dir_fd=bucket, dst_dir_fd=bucket)
        except BaseException:
            self.unlink_quiet(tmp, bucket)
            raise
        if not self.durable:
            return
        try:
            self.io.fsync(bucket)
        except BaseException:
            if previous is None:
                self.unlink_quiet(name, bucket)
            else:
                quietly(lambda: self.put_back(bucket, tmp, name, previous))
            raise

    def put_back(self, bucket: int, tmp: str, name: str, previous: bytes) -> None:
        """Restore a record's previous bytes after a failed replace (best effort: if
        this fails too, the new version stays, complete and valid)."""
        seq = fmt.parse_temp_name(tmp)
        back = fmt.temp_name(seq) if seq is not None else f"{tmp}.undo"
        try:
            self.write_new(bucket, back, previous, sync=self.durable)
            self.io.rename(back, name, src_dir_fd=bucket, dst_dir_fd=bucket)
            if self.durable:
                self.io.fsync(bucket)
        finally:
            self.unlink_quiet(back, bucket)

    # -- the one walk of the bucket directories -----------------------------------------

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
        """``(number, descriptor, names)`` of each bucket directory that may hold
        sequences ``lo..hi`` (``hi=None``: no upper bound), in bucket order (or
        reversed), its descriptor open until the caller asks for the next one.

        A bucket that vanished is passed over; a name in ``records/`` that is no
        bucket directory is reported to ``damaged(name, number, reason)`` (the
        number ``None`` for a name that is no bucket name at all), if given, and
        otherwise passed over. The walk ends before the next bucket once ``until()``
        says so, if given. With ``known_top`` (the high-water mark the caller
        read) the last listing of the bucket numbers is used again while it reaches
        that bucket: buckets are only ever added, each above the last."""
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
        """The names in ``records/`` and their bucket numbers, in name order (which
        is bucket order), from the last listing while it reaches ``known_top``."""
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
        """Forget the last listing of the bucket numbers (a rebuild ran)."""
        self._listed = None


class StateFile:
    """``state`` and ``dirty``, as this process reads and writes them."""

    def __init__(self, files: Files) -> None:
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


@dataclass(frozen=True, slots=True)
class Spare:
    """An empty temp file, open for writing, for the record of sequence ``seq``."""

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
        for (in its bucket), unless there is one. Upkeep: an OS error leaves no
        spare and is not raised (the next save makes its own temp file)."""
        seq = self._next
        if self._mine() is not None or seq is None:
            return
        try:
            bucket = self._open_bucket(seq, True)
        except Exception:  # (a planted link where the bucket should be: the save says so)
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
        """The temp name of the spare of ``seq`` (under the write lock, by the save
        that got ``seq``), or ``None`` if there is none for ``seq`` (a spare of
        another sequence, or one removed meanwhile, is dropped). The save then
        writes that name as its temp file (:meth:`Files.write_new` takes
        the descriptor from :meth:`claim`) and removes it on failure, as its own.
        No spare is used without durability (those saves never wait for a file)."""
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
        """The open descriptor of the spare :meth:`take` gave as ``name``, now the
        caller's to write and close; ``None`` for any other name."""
        taken, self._taken = self._taken, None
        if taken is None or self._pid != os.getpid():
            return None
        if taken.name != name:  # its save failed before writing it: not needed now
            self._discard(taken)
            return None
        return taken.fd

    def drop(self) -> None:
        """Remove the spare, if any (the store closes)."""
        spare, taken = self._mine(), self._taken
        self._spare = self._taken = None
        for left in (spare, taken):
            if left is not None:
                self._discard(left)

    def _discard(self, spare: Spare) -> None:
        with contextlib.suppress(OSError):
            self._io.close(spare.fd)
        with contextlib.suppress(Exception):  # upkeep: verify and repair see the rest
            bucket = self._open_bucket(spare.seq, False)
            if bucket is not None:
                try:
                    self._io.unlink(spare.name, dir_fd=bucket)
                except FileNotFoundError:
                    pass
                finally:
                    self._io.close(bucket)
