"""The descriptors a file store keeps open across calls (stream indexes, the id
table, bucket directories): the lock holder's, and each inline reader thread's.

A kept descriptor is used only after one ``lstat`` shows the same file under its
name (device and inode; a regular file with one link, or a directory), so a file
replaced by rename is opened afresh. The lock holder skips that ``lstat`` for a
descriptor checked in the current *epoch* (a new one starts when another process
wrote); files it replaces itself it drops (:meth:`Descriptors.forget`). Any other
reader opens (and closes) each file afresh; verified stream index headers are
shared by every thread (``headers``).
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
from .indexes import Handle, IdTable, IndexDamaged, StreamIndex
from .io import FileIO, read_exact

__all__ = ["Descriptors"]

#: The stream indexes the lock holder keeps open, and each inline reader thread.
_INDEXES_KEPT = 128
_KEPT_INDEXES = 32
#: The bucket directories each keeps open.
_BUCKETS_KEPT = 4


class Files(Protocol):
    """What :class:`Descriptors` needs of the store's directory (:class:`.files.Files`)."""

    io: FileIO
    store_id: str

    def fd(self, name: str) -> int: ...
    def holding(self) -> bool: ...
    def open_dir(self, parent: int, name: str, *, create: bool) -> int | None: ...


def _same(st: os.stat_result | None, identity: tuple[int, int], *, regular: bool = True) -> bool:
    if st is None or (st.st_dev, st.st_ino) != identity:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 if regular else stat.S_ISDIR(st.st_mode)


class _Kept:
    """The descriptors one user keeps (the lock holder, or one reader thread)."""

    __slots__ = ("buckets", "ids", "indexes", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.indexes: OrderedDict[str, StreamIndex] = OrderedDict()
        #: The id table and the bytes of its header when it was verified.
        self.ids: tuple[IdTable, bytes] | None = None
        #: Bucket number -> (descriptor, identity, epoch checked in).
        self.buckets: OrderedDict[int, tuple[int, tuple[int, int], int | None]] = OrderedDict()

    def fds(self) -> list[int]:
        """Every descriptor, forgotten (the caller closes them)."""
        fds = [idx.fd for idx in self.indexes.values()]
        fds += [fd for fd, _, _ in self.buckets.values()]
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
        #: The writer's validation epoch (see the module docstring).
        self.epoch = 0
        self._writer = _Kept(_INDEXES_KEPT)
        #: Verified stream-index headers by (device, inode, name): readers skip the
        #: 4 KiB read and parse. Shared by threads; a plain dict is safe for that.
        self.headers: dict[tuple[int, int, str], str] = {}
        #: The inline readers' descriptors, by thread.
        self._kept: dict[int, _Kept] = {}

    def new_epoch(self) -> None:
        """Another process wrote since this one: re-validate every kept handle."""
        self.epoch += 1

    # -- the lock holder's (kept) or fresh opens ----------------------------------------

    def bucket(self, seq: int, *, create: bool = False) -> int | None:
        """A descriptor of ``seq``'s bucket directory, ``None`` if missing. Release it
        with :meth:`close_bucket`."""
        if not self.files.holding():
            name = fmt.bucket_name(fmt.bucket_of(seq))
            return self.files.open_dir(self.files.fd("records"), name, create=create)
        return self._bucket(self._writer, seq, self.epoch, create=create)

    def close_bucket(self, fd: int) -> None:
        if not any(fd == held[0] for held in self._writer.buckets.values()):
            self.io.close(fd)

    def open_index(self, sfile: str, *, write: bool = False) -> StreamIndex | None:
        """Open a stream index (``None`` if it does not exist); the lock holder's is
        kept and writable (``close`` it all the same)."""
        if not self.files.holding():
            streams = self.files.fd("streams")
            store_id = self.files.store_id
            return StreamIndex.open(
                self.io, streams, sfile, store_id, write=write, headers=self.headers
            )
        return self._index(self._writer, sfile, self.epoch)

    def open_ids(self, *, write: bool = False) -> IdTable:
        """Open the id table; the lock holder gets a kept, writable handle."""
        if not self.files.holding():
            return IdTable.open(self.io, self.files.fd("root"), self.files.store_id, write=write)
        return self._ids(self._writer, self.epoch)

    def forget(self, sfile: str | None = None, *, ids: bool = False) -> None:
        """Drop the lock holder's descriptor of stream index ``sfile`` or of the id
        table (this process is about to replace or remove it)."""
        held = self._writer
        if sfile is not None and (idx := held.indexes.pop(sfile, None)) is not None:
            self.io.close(idx.fd)
        if ids and held.ids is not None:
            old, held.ids = held.ids[0], None
            self.io.close(old.fd)

    def drop(self) -> None:
        """Close every descriptor the lock holder keeps."""
        self._close(self._writer.fds())

    def index_files(self) -> list[str]:
        """The stream index files' names (dot-files and other planted names left out)."""
        return [
            name
            for name in self.io.listdir(self.files.fd("streams"))
            if not name.startswith(".") and name.endswith(".idx")
        ]

    def readable_indexes(self, *, strict: bool = False, prefix: str = "") -> Iterator[StreamIndex]:
        """Each stream index that opens (the caller closes it); a damaged or vanished
        one is passed over, or, if ``strict``, raises :class:`IndexDamaged`. With
        ``prefix``, only files that can hold a stream starting with it."""
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

    # -- the inline readers' ------------------------------------------------------------

    def mine(self) -> _Kept:
        me = threading.get_ident()
        kept = self._kept.get(me)
        if kept is None:
            kept = self._kept[me] = _Kept(_KEPT_INDEXES)
        return kept

    def close_kept(self) -> None:
        """Close the descriptors the inline readers keep (once no call is in flight)."""
        table, self._kept = self._kept, {}
        for kept in table.values():
            self._close(kept.fds())

    def kept_index(self, sfile: str) -> StreamIndex | None:
        """:meth:`open_index` through this thread's kept descriptors."""
        return self._index(self.mine(), sfile, None)

    def kept_ids(self) -> IdTable:
        """:meth:`open_ids` through this thread's kept descriptor, whose header is
        read again at every use and must be the bytes verified at its open (so
        damage in place is seen as by a fresh open), and whose size must still
        hold its slots."""
        return self._ids(self.mine(), None)

    def kept_bucket(self, seq: int) -> int | None:
        """``seq``'s bucket directory through this thread's kept descriptors (not to
        be closed); ``None`` if missing."""
        return self._bucket(self.mine(), seq, None, create=False)

    # -- one body for both ----------------------------------------------------------------

    def _lstat(self, name: str, dir_fd: int) -> os.stat_result | None:
        try:
            return self.io.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return None

    def _close(self, fds: list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                self.io.close(fd)

    def _index(self, kept: _Kept, sfile: str, epoch: int | None) -> StreamIndex | None:
        idx = kept.indexes.get(sfile)
        if idx is not None and epoch is not None and idx.epoch == epoch:
            return idx
        streams = self.files.fd("streams")
        if idx is not None:
            st = self._lstat(sfile, streams)
            if st is not None and _same(st, idx.identity):
                idx.refresh(st.st_size)
                idx.epoch = epoch
                kept.indexes.move_to_end(sfile)
                return idx
            del kept.indexes[sfile]
            self.io.close(idx.fd)
        write = epoch is not None
        headers = None if write else self.headers
        store_id = self.files.store_id
        idx = StreamIndex.open(self.io, streams, sfile, store_id, write=write, headers=headers)
        if idx is not None:
            idx.keep = True
            idx.epoch = epoch
            kept.indexes[sfile] = idx
            while len(kept.indexes) > kept.limit:
                _, old = kept.indexes.popitem(last=False)
                self.io.close(old.fd)
        return idx

    def _ids(self, kept: _Kept, epoch: int | None) -> IdTable:
        root = self.files.fd("root")
        if kept.ids is not None:
            ids, header = kept.ids
            if epoch is not None and ids.epoch == epoch:
                return ids
            st = self._lstat(fmt.IDS_NAME, root)
            if _same(st, ids.identity) and (
                epoch is not None
                or (
                    st is not None
                    and st.st_size >= fmt.IDS_HEADER_SIZE + ids.capacity * fmt.IDS_SLOT.size
                    and read_exact(self.io, ids.fd, fmt.IDS_HEADER_SIZE, 0) == header
                )
            ):
                ids.epoch = epoch
                return ids
            kept.ids = None
            self.io.close(ids.fd)
        ids = IdTable.open(self.io, root, self.files.store_id, write=epoch is not None)
        header = b""
        if epoch is None:
            header = ids.checked(
                self.io, ids.fd, lambda: read_exact(self.io, ids.fd, fmt.IDS_HEADER_SIZE, 0)
            )
        ids.keep = True
        ids.epoch = epoch
        kept.ids = (ids, header)
        return ids

    def _bucket(self, kept: _Kept, seq: int, epoch: int | None, *, create: bool) -> int | None:
        number = fmt.bucket_of(seq)
        records = self.files.fd("records")
        name = fmt.bucket_name(number)
        held = kept.buckets.get(number)
        if held is not None:
            if epoch is not None and held[2] == epoch:
                return held[0]
            if _same(self._lstat(name, records), held[1], regular=False):
                kept.buckets[number] = (held[0], held[1], epoch)
                kept.buckets.move_to_end(number)
                return held[0]
            del kept.buckets[number]
            self.io.close(held[0])
        fd = self.files.open_dir(records, name, create=create)
        if fd is None:
            return None
        st = Handle.checked(self.io, fd, lambda: self.io.fstat(fd))
        kept.buckets[number] = (fd, (st.st_dev, st.st_ino), epoch)
        while len(kept.buckets) > _BUCKETS_KEPT:
            _, (old, _, _) = kept.buckets.popitem(last=False)
            self.io.close(old)
        return fd
