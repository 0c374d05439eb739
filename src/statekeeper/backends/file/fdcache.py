"""The descriptors a file store keeps open across calls: ONE cache, two users.

- The lock holder (a writer) keeps stream indexes, the id table and bucket
  directories open between writes, each re-validated by one ``lstat`` per use, or
  by none while it was validated in the current *epoch* (a lock holder that finds
  another process's generation in ``state`` starts a new epoch): a save costs one
  open (its temp file) instead of four. Files this process replaces itself are
  dropped (:meth:`Descriptors.forget`).
- Each thread that reads inline (the event loop's) keeps its own indexes, id
  table and buckets (:class:`_Kept`), each used only after one ``lstat`` shows the
  same file under its name: a file replaced by rename is opened afresh, exactly as
  a fresh open would find it.

Any other reader opens afresh (and closes) each file it reads; verified stream
index headers are shared by every thread (``headers``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Protocol

from . import layout as fmt
from .indexes import IdTable, IndexDamaged, StreamIndex
from .io import FileIO, read_exact

__all__ = ["Descriptors"]

#: The stream indexes and bucket directories the lock holder keeps open.
_INDEXES_KEPT = 128
_BUCKETS_KEPT = 4


class Files(Protocol):
    """What :class:`Descriptors` needs of the store's directory (:class:`.files.Files`)."""

    io: FileIO
    store_id: str

    def fd(self, name: str) -> int: ...
    def holding(self) -> bool: ...
    def open_dir(self, parent: int, name: str, *, create: bool) -> int | None: ...


def _same_file(st: os.stat_result, identity: tuple[int, int]) -> bool:
    return (st.st_dev, st.st_ino) == identity and stat.S_ISREG(st.st_mode) and st.st_nlink == 1


#: Stream indexes and bucket directories a thread's inline reads keep open.
_KEPT_INDEXES = 32
_KEPT_BUCKETS = 4


class _Kept:
    """The descriptors one thread's inline reads keep between calls, so that a
    read costs one ``lstat`` per file instead of an open, an ``fstat`` and a close.
    Each is used only after that ``lstat`` shows the same file (device and inode,
    a regular file with one link, or a directory) under its name: a file replaced
    by rename is opened afresh, exactly as a fresh open would find it."""

    __slots__ = ("buckets", "ids", "indexes")

    def __init__(self) -> None:
        self.indexes: OrderedDict[str, StreamIndex] = OrderedDict()
        #: The id table and the bytes of its header when it was verified.
        self.ids: tuple[IdTable, bytes] | None = None
        self.buckets: OrderedDict[int, tuple[int, tuple[int, int]]] = OrderedDict()

    def fds(self) -> list[int]:
        fds = [idx.fd for idx in self.indexes.values()]
        fds += [fd for fd, _ in self.buckets.values()]
        if self.ids is not None:
            fds.append(self.ids[0].fd)
        self.indexes.clear()
        self.buckets.clear()
        self.ids = None
        return fds


class Descriptors:
    """The descriptors kept open across calls (see the module docstring)."""

    def __init__(self, files: Files) -> None:
        self.files = files
        self.io = files.io
        #: The writer caches' validation epoch (see the module docstring).
        self.epoch = 0
        self._indexes: OrderedDict[str, StreamIndex] = OrderedDict()
        self._ids: IdTable | None = None
        self._buckets: dict[int, tuple[int, tuple[int, int], int]] = {}
        #: Verified stream-index headers by (device, inode, name): readers skip the
        #: 4 KiB read and parse. Shared by threads; a plain dict is safe for that.
        self.headers: dict[tuple[int, int, str], str] = {}
        #: The inline readers' descriptors, by thread.
        self._kept: dict[int, _Kept] = {}

    # -- the lock holder's, and fresh opens ---------------------------------------------

    def new_epoch(self) -> None:
        """Another process wrote since this one: re-validate every kept handle."""
        self.epoch += 1

    def bucket(self, seq: int, *, create: bool = False) -> int | None:
        """A descriptor of ``seq``'s bucket directory, ``None`` if missing. Release it
        with :meth:`close_bucket`."""
        number = fmt.bucket_of(seq)
        name = fmt.bucket_name(number)
        records = self.files.fd("records")
        if not self.files.holding():
            return self.files.open_dir(records, name, create=create)
        cached = self._buckets.get(number)
        if cached is not None and cached[2] == self.epoch:
            return cached[0]
        if cached is not None:
            try:
                st = self.io.lstat(name, dir_fd=records)
            except FileNotFoundError:
                st = None
            if st is not None and (st.st_dev, st.st_ino) == cached[1]:
                self._buckets[number] = (cached[0], cached[1], self.epoch)
                return cached[0]
            del self._buckets[number]
            self.io.close(cached[0])
        fd = self.files.open_dir(records, name, create=create)
        if fd is None:
            return None
        st = self.io.fstat(fd)
        while len(self._buckets) >= _BUCKETS_KEPT:
            _, (old, _, _) = self._buckets.popitem()
            self.io.close(old)
        self._buckets[number] = (fd, (st.st_dev, st.st_ino), self.epoch)
        return fd

    def close_bucket(self, fd: int) -> None:
        if not any(fd == held[0] for held in self._buckets.values()):
            self.io.close(fd)

    def open_index(self, sfile: str, *, write: bool = False) -> StreamIndex | None:
        """Open a stream index (``None`` if it does not exist). The lock holder gets a
        cached, writable handle; ``close`` it all the same."""
        streams = self.files.fd("streams")
        if not self.files.holding():
            return StreamIndex.open(
                self.io, streams, sfile, self.files.store_id, write=write, headers=self.headers
            )
        hit = self._indexes.get(sfile)
        if hit is not None and hit.epoch == self.epoch:
            return hit
        try:
            st = self.io.lstat(sfile, dir_fd=streams)
        except FileNotFoundError:
            st = None
        cached = self._indexes.pop(sfile, None)
        if cached is not None:
            if st is not None and _same_file(st, cached.identity):
                cached.refresh(st.st_size)
                cached.epoch = self.epoch
                self._indexes[sfile] = cached
                return cached
            self.io.close(cached.fd)
        if st is None:
            return None
        idx = StreamIndex.open(self.io, streams, sfile, self.files.store_id, write=True)
        if idx is not None:
            idx.keep = True
            idx.epoch = self.epoch
            self._indexes[sfile] = idx
            while len(self._indexes) > _INDEXES_KEPT:
                _, old = self._indexes.popitem(last=False)
                self.io.close(old.fd)
        return idx

    def open_ids(self, *, write: bool = False) -> IdTable:
        """Open the id table; the lock holder gets a cached, writable handle."""
        root = self.files.fd("root")
        if not self.files.holding():
            return IdTable.open(self.io, root, self.files.store_id, write=write)
        if self._ids is not None and self._ids.epoch == self.epoch:
            return self._ids
        cached, self._ids = self._ids, None
        if cached is not None:
            try:
                st = self.io.lstat(fmt.IDS_NAME, dir_fd=root)
            except FileNotFoundError:
                st = None
            if st is not None and _same_file(st, cached.identity):
                cached.epoch = self.epoch
                self._ids = cached
                return cached
            self.io.close(cached.fd)
        ids = IdTable.open(self.io, root, self.files.store_id, write=True)
        ids.keep = True
        ids.epoch = self.epoch
        self._ids = ids
        return ids

    def forget(self, sfile: str | None = None, *, ids: bool = False) -> None:
        """Drop the cached descriptor of a file this process is about to replace or
        remove (stream index ``sfile``, or the id table)."""
        if sfile is not None:
            idx = self._indexes.pop(sfile, None)
            if idx is not None:
                self.io.close(idx.fd)
        if ids and self._ids is not None:
            old, self._ids = self._ids, None
            self.io.close(old.fd)

    def drop(self) -> None:
        """Close every descriptor the lock holder keeps (its files are about to be
        replaced, or the store closes)."""
        held = [idx.fd for idx in self._indexes.values()]
        held += [entry[0] for entry in self._buckets.values()]
        if self._ids is not None:
            held.append(self._ids.fd)
        self._indexes.clear()
        self._buckets.clear()
        self._ids = None
        for fd in held:
            with contextlib.suppress(OSError):
                self.io.close(fd)

    def index_files(self) -> list[str]:
        """The stream index files' names (dot-files and other planted names left out)."""
        return [
            name
            for name in self.io.listdir(self.files.fd("streams"))
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

    # -- the inline readers' -----------------------------------------------------------

    def mine(self) -> _Kept:
        """This thread's kept descriptors (see :class:`_Kept`)."""
        me = threading.get_ident()
        kept = self._kept.get(me)
        if kept is None:
            kept = self._kept[me] = _Kept()
        return kept

    def close_kept(self) -> None:
        """Close the descriptors the inline readers keep (no call is in flight once
        the store's own are closed, so none of these is in use)."""
        table, self._kept = self._kept, {}
        for kept in table.values():
            for fd in kept.fds():
                with contextlib.suppress(OSError):
                    self.io.close(fd)

    def _lstat(self, name: str, dir_fd: int) -> os.stat_result | None:
        try:
            return self.io.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return None

    def kept_index(self, sfile: str) -> StreamIndex | None:
        """:meth:`open_index` through this thread's kept descriptors: ``None`` if
        there is no such index; raises :class:`IndexDamaged` as the open does."""
        kept = self.mine()
        streams = self.files.fd("streams")
        st = self._lstat(sfile, streams)
        idx = kept.indexes.get(sfile)
        if idx is not None:
            if st is not None and _same_file(st, idx.identity):
                idx.refresh(st.st_size)
                kept.indexes.move_to_end(sfile)
                return idx
            del kept.indexes[sfile]
            self.io.close(idx.fd)
        if st is None:
            return None
        idx = self.open_index(sfile)
        if idx is None:
            return None
        idx.keep = True
        kept.indexes[sfile] = idx
        while len(kept.indexes) > _KEPT_INDEXES:
            _, old = kept.indexes.popitem(last=False)
            self.io.close(old.fd)
        return idx

    def kept_ids(self) -> IdTable:
        """The id table through this thread's kept descriptor: its header is read
        again at every use and must be the bytes verified when it was opened (so
        damage to it is seen as by a fresh open), and its size must still hold its
        slots. Raises :class:`IndexDamaged` as :meth:`IdTable.open` does."""
        kept = self.mine()
        root = self.files.fd("root")
        st = self._lstat(fmt.IDS_NAME, root)
        if kept.ids is not None:
            ids, header = kept.ids
            if (
                st is not None
                and _same_file(st, ids.identity)
                and st.st_size >= fmt.IDS_HEADER_SIZE + ids.capacity * fmt.IDS_SLOT.size
                and read_exact(self.io, ids.fd, fmt.IDS_HEADER_SIZE, 0) == header
            ):
                return ids
            kept.ids = None
            self.io.close(ids.fd)
        ids = IdTable.open(self.io, root, self.files.store_id)
        try:
            header = read_exact(self.io, ids.fd, fmt.IDS_HEADER_SIZE, 0)
        except BaseException:
            ids.close()
            raise
        ids.keep = True
        kept.ids = (ids, header)
        return ids

    def kept_bucket(self, seq: int) -> int | None:
        """``seq``'s bucket directory through this thread's kept descriptors (not to
        be closed by the caller); ``None`` if missing."""
        kept = self.mine()
        number = fmt.bucket_of(seq)
        records = self.files.fd("records")
        name = fmt.bucket_name(number)
        st = self._lstat(name, records)
        held = kept.buckets.get(number)
        if held is not None:
            if st is not None and stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == held[1]:
                return held[0]
            del kept.buckets[number]
            self.io.close(held[0])
        if st is None:
            return None
        fd = self.files.open_dir(records, name, create=False)
        if fd is None:
            return None
        try:
            got = self.io.fstat(fd)
        except BaseException:
            self.io.close(fd)
            raise
        kept.buckets[number] = (fd, (got.st_dev, got.st_ino))
        while len(kept.buckets) > _KEPT_BUCKETS:
            _, (old, _) = kept.buckets.popitem(last=False)
            self.io.close(old)
        return fd
