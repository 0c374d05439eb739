"""``ids.idx``, the file backend's id table: id hash -> sequence, derived from the
records like the stream indexes (:mod:`.stream_index`), written without an fsync on the
save path and rebuilt by recovery when a crash may have lost writes."""

from __future__ import annotations

import os
from collections.abc import Iterator

from . import layout as fmt
from .io import FileIO, read_exact
from .stream_index import NEW, RO, RW, Handle, IndexDamaged, open_regular, pwrite_all, unlink_quiet

__all__ = ["IdTable"]

_CHUNK = 16


class IdTable(Handle):
    """``ids.idx``: an open-addressing hash table, id hash -> sequence.

    Each 16-byte slot is ``(key, seq)``; ``(0, 0)`` is empty and a set top bit of
    ``seq`` is a tombstone. A 64-bit key can collide, so a hit is only a candidate:
    the caller confirms it against the record's own id.
    """

    __slots__ = ("capacity", "epoch", "fd", "identity", "io", "keep")

    def __init__(self, io: FileIO, fd: int, capacity: int, st: os.stat_result) -> None:
        self.io = io
        self.fd = fd
        self.capacity = capacity
        self.identity = (st.st_dev, st.st_ino)
        #: Held in the writer's cache: ``close`` leaves the descriptor open.
        self.keep = False
        #: The writer cache's validation epoch this handle was last checked in.
        self.epoch = -1

    @classmethod
    def open(cls, io: FileIO, root_fd: int, store_id: str, *, write: bool = False) -> IdTable:
        try:
            fd, st = open_regular(io, fmt.IDS_NAME, RW if write else RO, root_fd)
        except FileNotFoundError:
            raise IndexDamaged(f"{fmt.IDS_NAME} is missing") from None
        try:
            try:
                capacity = fmt.parse_ids_header(
                    read_exact(io, fd, fmt.IDS_HEADER_SIZE, 0), store_id
                )
            except (ValueError, UnicodeDecodeError) as exc:
                raise IndexDamaged(f"{fmt.IDS_NAME}: {exc}") from None
            if st.st_size < fmt.IDS_HEADER_SIZE + capacity * fmt.IDS_SLOT.size:
                raise IndexDamaged(f"{fmt.IDS_NAME} is truncated")
        except BaseException:
            io.close(fd)
            raise
        return cls(io, fd, capacity, st)

    def _probe(self, key: int) -> Iterator[tuple[int, int, int]]:
        """``(position, key, seq)`` along ``key``'s probe sequence, up to an empty slot."""
        mask = self.capacity - 1
        pos = key & mask
        seen = 0
        size = fmt.IDS_SLOT.size
        while seen < self.capacity:
            n = min(_CHUNK, self.capacity - pos)
            data = read_exact(self.io, self.fd, n * size, fmt.IDS_HEADER_SIZE + pos * size)
            for k, (skey, sseq) in enumerate(fmt.IDS_SLOT.iter_unpack(data)):
                if skey == 0 and sseq == 0:
                    return
                yield pos + k, skey, sseq
            seen += n
            pos = (pos + n) & mask

    def probe(self, key: int) -> tuple[list[tuple[int, int]], int, bool]:
        """One walk of ``key``'s probe sequence: the ``(position, seq)`` of its live
        entries, where a new entry for it would go (the first tombstone, else the
        empty slot that ends the walk), and whether that slot is empty."""
        mask = self.capacity - 1
        live: list[tuple[int, int]] = []
        free: int | None = None
        after = key & mask
        probed = 0
        for pos, skey, sseq in self._probe(key):
            if skey == key and not sseq & fmt.TOMBSTONE:
                live.append((pos, sseq))
            elif free is None and sseq & fmt.TOMBSTONE:
                free = pos
            after = (pos + 1) & mask
            probed += 1
        if free is not None:
            return live, free, False
        if probed >= self.capacity:
            raise IndexDamaged(f"{fmt.IDS_NAME} is full")
        return live, after, True

    def put(self, pos: int, key: int, seq: int) -> None:
        """Write ``key -> seq`` at ``pos`` (from :meth:`probe`, under the lock)."""
        pwrite_all(
            self.io,
            self.fd,
            fmt.IDS_SLOT.pack(key, seq),
            fmt.IDS_HEADER_SIZE + pos * fmt.IDS_SLOT.size,
        )

    def lookup(self, key: int) -> list[tuple[int, int]]:
        """``(position, seq)`` of the live entries with ``key``."""
        return [(p, s) for p, k, s in self._probe(key) if k == key and not s & fmt.TOMBSTONE]

    def lookup_checked(self, key: int) -> tuple[list[int], list[int], list[tuple[int, int]]]:
        """The sequences of ``key``'s live and deleted entries, and the ``(key, seq)``
        of the other live entries on its probe, for a strict read.

        Slots carry no checksum, so the probe checks what linear probing
        guarantees: every entry lies in the run of non-empty slots that starts at
        its home position. An entry passed on the way that breaks this (a damaged
        key, or garbage in an empty slot) raises :class:`IndexDamaged`, so a
        damaged slot of ``key`` is not read as "no such id". (A damaged key that
        keeps its home slot passes; the caller checks the others against their
        record files before it answers "no such id".)"""
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
        """Whether an entry whose home is ``start``, found at ``pos`` on the probe
        from ``home`` (so ``home..pos`` are all non-empty), may be there: ``start``
        is in ``home..pos`` or the slots from ``start`` up to ``home`` are non-empty."""
        mask = self.capacity - 1
        if (pos - start) & mask <= (pos - home) & mask:
            return True
        size = fmt.IDS_SLOT.size
        gap = (home - start) & mask  # slots start .. home-1, read backwards in chunks
        i = home
        while gap > 0:
            n = min(gap, _CHUNK, i if i else self.capacity)
            lo = (i - n) & mask
            data = read_exact(self.io, self.fd, n * size, fmt.IDS_HEADER_SIZE + lo * size)
            if any(k == 0 and s == 0 for k, s in fmt.IDS_SLOT.iter_unpack(data)):
                return False
            gap -= n
            i = lo
        return True

    def find(self, key: int, seq: int) -> int | None:
        for p, k, s in self._probe(key):
            if k == key and s == seq:
                return p
        return None

    def insert(self, key: int, seq: int) -> bool:
        """Store ``key -> seq`` unless it is there: in the first tombstoned slot of the
        probe sequence, or the empty slot that ends it. Returns whether it took an
        empty slot (the caller counts those to know when to grow)."""
        mask = self.capacity - 1
        free: int | None = None
        after = key & mask  # the slot after the last one probed: empty, unless full
        probed = 0
        for pos, skey, sseq in self._probe(key):
            if skey == key and sseq == seq:
                return False
            if free is None and sseq & fmt.TOMBSTONE:
                free = pos
            after = (pos + 1) & mask
            probed += 1
        empty = free is None
        if free is None:
            if probed >= self.capacity:
                raise IndexDamaged(f"{fmt.IDS_NAME} is full")
            free = after
        pwrite_all(
            self.io,
            self.fd,
            fmt.IDS_SLOT.pack(key, seq),
            fmt.IDS_HEADER_SIZE + free * fmt.IDS_SLOT.size,
        )
        return empty

    def tombstone(self, pos: int, key: int, seq: int) -> None:
        size = fmt.IDS_SLOT.size
        pwrite_all(
            self.io,
            self.fd,
            fmt.IDS_SLOT.pack(key, seq | fmt.TOMBSTONE),
            fmt.IDS_HEADER_SIZE + pos * size,
        )

    def entries(self) -> Iterator[tuple[int, int, int]]:
        """Every live ``(position, key, seq)``, in slot order."""
        size = fmt.IDS_SLOT.size
        step = 4096
        for pos in range(0, self.capacity, step):
            n = min(step, self.capacity - pos)
            data = read_exact(self.io, self.fd, n * size, fmt.IDS_HEADER_SIZE + pos * size)
            for k, (skey, sseq) in enumerate(fmt.IDS_SLOT.iter_unpack(data)):
                if skey and not sseq & fmt.TOMBSTONE:
                    yield pos + k, skey, sseq

    def sync(self) -> None:
        self.io.fdatasync(self.fd)

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
        tmp = f".{fmt.IDS_NAME}.tmp"
        unlink_quiet(io, tmp, root_fd)
        fd = io.open(tmp, NEW, 0o666, dir_fd=root_fd)
        try:
            pwrite_all(io, fd, fmt.ids_header(capacity, store_id) + bytes(table), 0)
            if durable:
                io.fsync(fd)
        except BaseException:
            io.close(fd)
            unlink_quiet(io, tmp, root_fd)
            raise
        io.close(fd)
        try:
            io.rename(tmp, fmt.IDS_NAME, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        except BaseException:
            unlink_quiet(io, tmp, root_fd)
            raise
        if durable:
            io.fsync(root_fd)
        return len(entries)
