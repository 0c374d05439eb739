"""The derived index files: the per-stream slot indexes (``streams/*.idx``,
:class:`StreamIndex`) and the id table (``ids.idx``, :class:`IdTable`), the
:class:`Handle` both are, their safe open, and :class:`IndexDamaged`, which sends
a read to the records.

Readers never lock: every stream slot carries a CRC, so one being written is
seen as torn and re-read, and a whole file is only ever replaced by rename, so a
reader holding a descriptor keeps a consistent old version.
"""

from __future__ import annotations

import bisect as _bisect
import errno
import os
import stat
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Self, TypeVar

from ...errors import ConcurrentModificationError
from . import layout as fmt
from .io import FileIO, read_exact, unlink_quiet, write_all

__all__ = [
    "NEW",
    "RO",
    "RW",
    "Handle",
    "IdTable",
    "IndexDamaged",
    "StreamIndex",
    "open_regular",
    "replace_file",
    "write_index",
]

#: How the store opens its files: never through a link, never blocking on a FIFO.
RO = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
RW = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
T = TypeVar("T")
_REPLACED_RETRIES = 8


class IndexDamaged(Exception):
    """An index file is not what the store wrote (planted, corrupt, wrong store)."""


def open_regular(io: FileIO, name: str, flags: int, dir_fd: int) -> tuple[int, os.stat_result]:
    """Open ``name`` without following links or blocking; it must be a regular file
    with one link. Raises :class:`FileNotFoundError`, or :class:`IndexDamaged`. A
    file with *no* link was replaced by a concurrent writer between the open and the
    ``fstat``: the open is retried, up to :class:`ConcurrentModificationError`."""
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


class Handle:
    """An open index file: ``close`` (or leaving a ``with`` block) releases it,
    unless a descriptor cache holds it (``keep``). ``identity`` (device, inode) and
    ``epoch`` (the writer's validation epoch it was last checked in) are the
    cache's, see :mod:`.fdcache`."""

    __slots__ = ("epoch", "fd", "identity", "io", "keep")

    def __init__(self, io: FileIO, fd: int, st: os.stat_result) -> None:
        self.io = io
        self.fd = fd
        self.identity = (st.st_dev, st.st_ino)
        self.keep = False
        self.epoch: int | None = None

    @staticmethod
    def checked(io: FileIO, fd: int, check: Callable[[], T]) -> T:
        """``check()`` of a file just opened, closing ``fd`` if it raises."""
        try:
            return check()
        except BaseException:
            io.close(fd)
            raise

    def close(self) -> None:
        if not self.keep:
            self.io.close(self.fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.keep:  # close(), without the call (a kept handle is on hot paths)
            self.io.close(self.fd)

    def sync(self) -> None:
        self.io.fdatasync(self.fd)


_MAX_CHUNK = 64
_HEADERS_KEPT = 4096
_TORN_RETRIES = 3
#: Slots read at once by :meth:`StreamIndex.locate` (4 KiB).
_SEARCH_BLOCK = 16
#: The sequence field of each slot in a run of slots.
_SEQ_FIELD = struct.Struct(f"<Q{fmt.SLOT_SIZE - 8}x")


class StreamIndex(Handle):
    """An open stream index: a 4 KiB header naming the stream, then sorted slots."""

    __slots__ = ("_last", "count", "name", "size", "stream")

    def __init__(self, io: FileIO, fd: int, name: str, stream: str, st: os.stat_result) -> None:
        super().__init__(io, fd, st)
        self.name = name
        self.stream = stream
        # (size, sequence of the last slot) as this handle last wrote them.
        self._last: tuple[int, int] | None = None
        self.refresh(st.st_size)

    def refresh(self, size: int) -> None:
        """Take the current file size (from a fresh ``stat`` of the same inode)."""
        self.size = size
        self.count = max(0, (size - fmt.IDX_HEADER_SIZE) // fmt.SLOT_SIZE)

    def last_seq(self) -> int:
        """The sequence of the last slot (0 if none); no read if this handle wrote it
        and nobody appended since."""
        if self._last is not None and self._last[0] == self.size:
            return self._last[1]
        return self._seqs(self.count - 1, 1)[0] if self.count else 0

    @classmethod
    def open(
        cls,
        io: FileIO,
        streams_fd: int,
        name: str,
        store_id: str,
        *,
        write: bool = False,
        headers: dict[tuple[int, int, str], str] | None = None,
    ) -> StreamIndex | None:
        """Open an index; ``None`` if it does not exist. ``headers`` caches verified
        headers by inode (an index is replaced, never rewritten in place)."""
        try:
            fd, st = open_regular(io, name, RW if write else RO, streams_fd)
        except FileNotFoundError:
            return None
        key = (st.st_dev, st.st_ino, name)
        stream = headers.get(key) if headers is not None else None
        if stream is None:
            stream = cls.checked(io, fd, lambda: _stream_named(io, fd, name, store_id))
            if headers is not None:
                if len(headers) >= _HEADERS_KEPT:
                    headers.clear()
                headers[key] = stream
        return cls(io, fd, name, stream, st)

    # -- reading ----------------------------------------------------------------------

    def _offset(self, i: int) -> int:
        return fmt.IDX_HEADER_SIZE + i * fmt.SLOT_SIZE

    def read(self, start: int, n: int) -> list[fmt.Slot]:
        """Slots ``start .. start+n-1`` (clipped to the index). A torn slot is re-read
        (a writer may be mid-write); one that stays invalid is damage."""
        start = max(start, 0)
        n = min(n, self.count - start)
        if n <= 0:
            return []
        slots: list[fmt.Slot] = []
        for _ in range(_TORN_RETRIES):
            data = read_exact(self.io, self.fd, n * fmt.SLOT_SIZE, self._offset(start))
            # A writer may have trimmed the tail since fstat: fewer whole slots is fine.
            whole = len(data) // fmt.SLOT_SIZE
            view = memoryview(data)
            slots = []
            for k in range(whole):
                slot = fmt.Slot.from_bytes(view[k * fmt.SLOT_SIZE : (k + 1) * fmt.SLOT_SIZE])
                if slot is None:
                    break
                slots.append(slot)
            if len(slots) == whole:
                return slots
        raise IndexDamaged(f"streams/{self.name}: slot {start + len(slots)} is corrupt")

    def read_lenient(self, i: int) -> fmt.Slot | None:
        """Slot ``i``, or ``None`` if it is torn or corrupt (for recovery)."""
        return fmt.Slot.from_bytes(read_exact(self.io, self.fd, fmt.SLOT_SIZE, self._offset(i)))

    def slot(self, i: int) -> fmt.Slot:
        return self.read(i, 1)[0]

    def locate(self, seq: int, *, right: bool) -> int:
        """The first position whose sequence is ``> seq`` (``right``) or ``>= seq``.

        Each step reads a block of :data:`_SEARCH_BLOCK` slots (one ``pread``): the
        tail block, the head block, then where the sequence would sit if spread
        evenly (interpolation), halving whenever a guess did not halve the range;
        about 3 or 4 reads for an evenly spread stream, at most about twice
        ``log2(count)`` for an uneven one. Sequences are read unchecked (:meth:`_seqs`)."""
        lo, hi = 0, self.count
        below: tuple[int, int] | None = None  # (position, sequence) known below lo
        above: tuple[int, int] | None = None  # ... and at hi
        halve = False
        while lo < hi:
            n = hi - lo
            if n <= _SEARCH_BLOCK:
                start = lo
            else:
                if above is None:
                    guess = hi - 1
                elif below is None:
                    guess = lo
                elif halve or above[1] <= below[1]:
                    guess = lo + n // 2
                else:
                    span = above[0] - below[0]
                    guess = below[0] + (seq - below[1]) * span // (above[1] - below[1])
                start = min(max(guess - _SEARCH_BLOCK // 2, lo), hi - _SEARCH_BLOCK)
            k = min(_SEARCH_BLOCK, n)
            seqs = self._seqs(start, k)
            i = _bisect.bisect_right(seqs, seq) if right else _bisect.bisect_left(seqs, seq)
            if 0 < i < k:
                return start + i
            guessed = below is not None and above is not None and not halve
            if i == 0:
                if start == lo:
                    return lo
                hi, above = start, (start, seqs[0])
            else:
                if start + k == hi:
                    return hi
                lo, below = start + k, (start + k - 1, seqs[-1])
            halve = guessed and hi - lo > n // 2
        return lo

    def _seqs(self, start: int, n: int) -> list[int]:
        """The sequences of slots ``start .. start+n-1`` (within the index), unchecked:
        safe for searching, as a slot's sequence never changes within the size a
        reader saw."""
        raw = read_exact(self.io, self.fd, n * fmt.SLOT_SIZE, self._offset(start))
        if len(raw) != n * fmt.SLOT_SIZE:
            raise IndexDamaged(
                f"streams/{self.name}: slot {start + len(raw) // fmt.SLOT_SIZE} is cut short"
            )
        return [seq for (seq,) in _SEQ_FIELD.iter_unpack(raw)]

    def find(self, seq: int) -> int | None:
        i = self.locate(seq, right=False)
        return i if i < self.count and self.slot(i).seq == seq else None

    def walk(self, start: int, step: int, *, first: int = 1) -> Iterator[tuple[int, fmt.Slot]]:
        """``(position, slot)`` from ``start`` forward (``step=1``) or backward, read in
        chunks that start at ``first`` slots and grow."""
        i = start
        n = max(1, first)
        while 0 <= i < self.count:
            if step > 0:
                chunk = self.read(i, n)
                if not chunk:
                    return
                for k, slot in enumerate(chunk):
                    yield i + k, slot
                i += len(chunk)
            else:
                lo = max(0, i - n + 1)
                chunk = self.read(lo, i - lo + 1)
                for k in range(len(chunk) - 1, -1, -1):
                    yield lo + k, chunk[k]
                i = lo - 1
            n = min(n * 4, _MAX_CHUNK)

    # -- writing (under the store lock) ----------------------------------------------

    def repair_tail(self) -> None:
        """Cut a torn trailing slot (a power cut during an append); under the lock,
        right after the open whose ``fstat`` gave ``size``."""
        whole = self._offset(self.count)
        if self.size != whole:
            self.io.ftruncate(self.fd, whole)
            self.size = whole

    def append_many(self, slots: list[fmt.Slot]) -> None:
        """Append ``slots`` (sorted, above the last) in one write."""
        if not slots:
            return
        data = b"".join(slot.to_bytes() for slot in slots)
        write_all(self.io, self.fd, data, self._offset(self.count))
        self.count += len(slots)
        self.size = self._offset(self.count)
        self._last = (self.size, slots[-1].seq)

    def write(self, i: int, slot: fmt.Slot) -> None:
        write_all(self.io, self.fd, slot.to_bytes(), self._offset(i))

    def truncate(self, count: int) -> None:
        self.io.ftruncate(self.fd, self._offset(count))
        self.count = count
        self.size = self._offset(count)


def _stream_named(io: FileIO, fd: int, name: str, store_id: str) -> str:
    """The stream a stream index's header names; it must live in ``name``."""
    stream = _header(
        io, fd, f"streams/{name}", fmt.IDX_HEADER_SIZE, fmt.parse_index_header, store_id
    )
    if fmt.stream_file_name(stream) != name:
        raise IndexDamaged(f"streams/{name} names stream {stream!r}, which lives elsewhere")
    return stream


def _header(
    io: FileIO, fd: int, where: str, size: int, parse: Callable[[bytes, str], T], store_id: str
) -> T:
    try:
        return parse(read_exact(io, fd, size, 0), store_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IndexDamaged(f"{where}: {exc}") from None


def write_index(
    io: FileIO,
    streams_fd: int,
    name: str,
    stream: str,
    slots: list[fmt.Slot],
    store_id: str,
    *,
    durable: bool,
) -> None:
    """Write a whole stream index (compaction, or an empty one) and rename it over
    ``name``: see :func:`replace_file`."""
    body = fmt.index_header(stream, store_id) + b"".join(s.to_bytes() for s in slots)
    replace_file(io, streams_fd, name, body, durable=durable)


def replace_file(io: FileIO, dir_fd: int, name: str, body: bytes, *, durable: bool) -> None:
    """Write ``body`` to a temp file and rename it over ``name``, both fsynced if
    ``durable``: a reader sees the old file or the new one, never a missing or
    half-written one. On failure the temp file is removed."""
    tmp = f".{name}.tmp"
    unlink_quiet(io, tmp, dir_fd)
    fd = io.open(tmp, NEW, 0o666, dir_fd=dir_fd)
    try:
        write_all(io, fd, body, 0)
        if durable:
            io.fsync(fd)
    except BaseException:
        io.close(fd)
        unlink_quiet(io, tmp, dir_fd)
        raise
    io.close(fd)
    try:
        io.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        unlink_quiet(io, tmp, dir_fd)
        raise
    if durable:
        io.fsync(dir_fd)


# -- the id table ----------------------------------------------------------------------


_IDS_CHUNK = 16


class IdTable(Handle):
    """``ids.idx``: an open-addressing hash table, id hash -> sequence.

    Each 16-byte slot is ``(key, seq)``; ``(0, 0)`` is empty and a set top bit of
    ``seq`` is a tombstone. A 64-bit key can collide, so a hit is only a candidate:
    the caller confirms it against the record's own id.
    """

    __slots__ = ("capacity",)

    def __init__(self, io: FileIO, fd: int, capacity: int, st: os.stat_result) -> None:
        super().__init__(io, fd, st)
        self.capacity = capacity

    @classmethod
    def open(cls, io: FileIO, root_fd: int, store_id: str, *, write: bool = False) -> IdTable:
        try:
            fd, st = open_regular(io, fmt.IDS_NAME, RW if write else RO, root_fd)
        except FileNotFoundError:
            raise IndexDamaged(f"{fmt.IDS_NAME} is missing") from None
        capacity = cls.checked(io, fd, lambda: _capacity(io, fd, st, store_id))
        return cls(io, fd, capacity, st)

    def _probe(self, key: int) -> Iterator[tuple[int, int, int]]:
        """``(position, key, seq)`` along ``key``'s probe sequence, up to an empty slot."""
        mask = self.capacity - 1
        pos = key & mask
        seen = 0
        while seen < self.capacity:
            n = min(_IDS_CHUNK, self.capacity - pos)
            for k, (skey, sseq) in enumerate(self._read(pos, n)):
                if skey == 0 and sseq == 0:
                    return
                yield pos + k, skey, sseq
            seen += n
            pos = (pos + n) & mask

    def probe(self, key: int) -> tuple[list[tuple[int, int]], int, bool]:
        """One walk of ``key``'s probe sequence: the ``(position, seq)`` of its live
        entries, where a new entry for it would go (the first tombstone, else the
        empty slot that ends the walk), and whether that slot is empty."""
        live: list[tuple[int, int]] = []
        free: int | None = None
        probed = 0
        for pos, skey, sseq in self._probe(key):
            if skey == key and not sseq & fmt.TOMBSTONE:
                live.append((pos, sseq))
            elif free is None and sseq & fmt.TOMBSTONE:
                free = pos
            probed += 1
        if free is not None:
            return live, free, False
        if probed >= self.capacity:
            raise IndexDamaged(f"{fmt.IDS_NAME} is full")
        return live, (key + probed) & (self.capacity - 1), True

    def _read(self, pos: int, n: int) -> Iterator[tuple[int, int]]:
        offset = fmt.IDS_HEADER_SIZE + pos * fmt.IDS_SLOT.size
        return fmt.IDS_SLOT.iter_unpack(read_exact(self.io, self.fd, n * fmt.IDS_SLOT.size, offset))

    def put(self, pos: int, key: int, seq: int) -> None:
        """Write ``key -> seq`` at ``pos`` (from :meth:`probe`, under the lock)."""
        offset = fmt.IDS_HEADER_SIZE + pos * fmt.IDS_SLOT.size
        write_all(self.io, self.fd, fmt.IDS_SLOT.pack(key, seq), offset)

    def lookup(self, key: int) -> list[tuple[int, int]]:
        return [(p, s) for p, k, s in self._probe(key) if k == key and not s & fmt.TOMBSTONE]

    def lookup_checked(self, key: int) -> tuple[list[int], list[int], list[tuple[int, int]]]:
        """The sequences of ``key``'s live and deleted entries, and the ``(key, seq)``
        of the other live entries on its probe, for a strict read. Slots carry no
        checksum, so an entry passed that is not in the run of non-empty slots from
        its home (a damaged key, garbage in an empty slot) raises
        :class:`IndexDamaged`; the caller checks the others against their records
        before it answers "no such id"."""
        mask = self.capacity - 1
        home = key & mask
        live: list[int] = []
        dead: list[int] = []
        others: list[tuple[int, int]] = []
        for pos, k, seq in self._probe(key):
            if k == key:
                (dead if seq & fmt.TOMBSTONE else live).append(seq & ~fmt.TOMBSTONE)
            elif not self._placed(k & mask, home, pos):
                raise IndexDamaged(f"{fmt.IDS_NAME}: slot {pos} is not where its key belongs")
            elif not seq & fmt.TOMBSTONE:
                others.append((k, seq))
        return live, dead, others

    def _placed(self, start: int, home: int, pos: int) -> bool:
        """Whether an entry whose home is ``start`` may be at ``pos`` on the probe
        from ``home``: ``start`` is in ``home..pos``, or ``start..home`` is full."""
        mask = self.capacity - 1
        if (pos - start) & mask <= (pos - home) & mask:
            return True
        gap = (home - start) & mask  # slots start .. home-1, read backwards in chunks
        i = home
        while gap > 0:
            n = min(gap, _IDS_CHUNK, i if i else self.capacity)
            lo = (i - n) & mask
            if any(k == 0 and s == 0 for k, s in self._read(lo, n)):
                return False
            gap -= n
            i = lo
        return True

    def find(self, key: int, seq: int) -> int | None:
        return next((p for p, s in self.lookup(key) if s == seq), None)

    def insert(self, key: int, seq: int) -> bool:
        """Store ``key -> seq`` unless it is there, where :meth:`probe` says. Returns
        whether it took an empty slot (the caller counts those to know when to grow)."""
        live, free, empty = self.probe(key)
        if any(s == seq for _, s in live):
            return False
        self.put(free, key, seq)
        return empty

    def tombstone(self, pos: int, key: int, seq: int) -> None:
        self.put(pos, key, seq | fmt.TOMBSTONE)

    def drop(self, slots: Iterable[fmt.Slot]) -> None:
        for slot in slots:
            key = fmt.id_key(slot.cid)
            at = self.find(key, slot.seq)
            if at is not None:
                self.tombstone(at, key, slot.seq)

    def entries(self) -> Iterator[tuple[int, int, int]]:
        step = 4096
        for pos in range(0, self.capacity, step):
            for k, (skey, sseq) in enumerate(self._read(pos, min(step, self.capacity - pos))):
                if skey and not sseq & fmt.TOMBSTONE:
                    yield pos + k, skey, sseq

    @staticmethod
    def build(
        io: FileIO,
        root_fd: int,
        entries: list[tuple[int, int]],
        store_id: str,
        *,
        durable: bool,
    ) -> int:
        """Write a fresh table holding ``entries`` at load <= 1/4 and swap it in
        atomically; return its number of used slots."""
        capacity = fmt.IDS_MIN_CAPACITY
        while capacity < 4 * len(entries):
            capacity *= 2
        size = fmt.IDS_SLOT.size
        table = bytearray(capacity * size)
        mask = capacity - 1
        for key, seq in entries:
            pos = key & mask
            while table[pos * size : pos * size + size] != bytes(size):
                pos = (pos + 1) & mask
            fmt.IDS_SLOT.pack_into(table, pos * size, key, seq)
        body = fmt.ids_header(capacity, store_id) + bytes(table)
        replace_file(io, root_fd, fmt.IDS_NAME, body, durable=durable)
        return len(entries)


def _capacity(io: FileIO, fd: int, st: os.stat_result, store_id: str) -> int:
    """The capacity the id table's header names; the file must hold its slots."""
    capacity = _header(io, fd, fmt.IDS_NAME, fmt.IDS_HEADER_SIZE, fmt.parse_ids_header, store_id)
    if st.st_size < fmt.IDS_HEADER_SIZE + capacity * fmt.IDS_SLOT.size:
        raise IndexDamaged(f"{fmt.IDS_NAME} is truncated")
    return capacity
