"""The temp file of the next durable save, made ahead while the writer is idle.

Creating a file costs more than anything else a durable save does but its two
fsyncs: on ext4 here an ``open(O_CREAT|O_EXCL)`` of a new name took 300-400 µs
(a new inode, a directory entry, journalled), as long as the fsync of the data.
So once a save has returned to its caller and nothing is queued, the writer thread
creates the temp file of the *next* sequence, empty, and keeps it open
(:meth:`Spares.make`); the next lone durable save that gets exactly that sequence
writes into it (:meth:`Spares.take`) and goes on as before: fsync, rename over
the record's name, fsync of the directory. Nothing else changes: the spare has the
temp name of its sequence (:func:`.format.temp_name`), so a save cut short by a
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
import os
from collections.abc import Callable
from dataclasses import dataclass

from . import layout as fmt
from .io import FileIO
from .stream_index import NEW

#: ``(sequence, create) -> a new descriptor of its bucket directory, or None``: never
#: one of the descriptor cache's (which a spare's file must not evict from under a
#: save that holds one).
OpenBucket = Callable[[int, bool], "int | None"]

__all__ = ["Spare", "Spares"]


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
        writes that name as its temp file (:meth:`.core.EngineCore.write_new` takes
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
