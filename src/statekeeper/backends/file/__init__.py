"""``file://``: a checkpoint store in a local directory, safe across processes and
crashes. The on-disk layout is documented in ``docs/file-backend.md``.

No part holds another's state: :class:`.engine.FileEngine` owns the directory,
the write lock, the state file and the descriptor cache, and every other part is
given, in its constructor, the collaborators it uses (never the engine). The
modules, from the public class down to the operating system:

- :mod:`.store`: :class:`FileCheckpointStore` and its options;
  :class:`~.store.FileParts`, the engine and the parts built over it, and
  :meth:`~.store.FileParts.call`, the one place OS errors become
  ``BackendError``; the saves' writer thread and its group commit. Maps the base
  class's primitives onto the parts, in one worker thread hop each, or none
  (``inline_reads``: a read runs on the event loop's thread first, under the
  budget of :mod:`statekeeper._runtime.inline`).
- :mod:`.batch`: ``save_many`` (atomic: intent, one fsync group, commit), the
  group commit of concurrent saves (one fsync group, one outcome each),
  ``delete_many``, ``prune``, ``delete_stream`` and ``purge_expired``.
- :mod:`.engine`: :class:`~.engine.FileEngine`, the one owner of the files, the
  lock, the state and the descriptor cache: open (the read-only open writes
  nothing) and close; :class:`~.engine.Writes`, the one-record writes (save,
  update, delete) under ``flock``.
- :mod:`.pages`: a listed page of one stream and its probe, with the damaged
  records of unknown stream (orphans) merged in; ``list(None)`` from the bucket
  directories.
- :mod:`.reader`: the strict reads (``get_latest``, ``load``, ``load_many``) and
  ``heal``, lock-free; ``list_streams``, ``info`` and the looks every read
  shares.
- :mod:`.recovery`: the lock holder's transaction, the journal, restart recovery,
  the rebuild and repair, and THE one way records enter the indexes
  (:meth:`~.recovery.Rebuild.index`, and :meth:`~.recovery.Recovery.reindex` of
  ``lo..hi`` from the record files).
- :mod:`.check`: ``verify``'s check of the derived data against the records.
- :mod:`.survey`: a read-only walk of every record file and of what the old
  metadata says about it; the reads answered from it when the indexes cannot be
  trusted.
- :mod:`.fdcache`: the one cache of descriptors kept across calls (the lock
  holder's, and each inline reader thread's).
- :mod:`.files`: the store's directory as this process holds it open: its
  top-level descriptors (and the in-flight mark ``close`` waits for), the state
  file with the lock holder's transaction, the write lock and the ``dirty``
  list, the record files (safe reads of untrusted files, publication by
  rename), THE one walk of the bucket directories, and the spare temp file of
  the next save.
- :mod:`.indexes`: the derived index files, the per-stream slot indexes and the
  id table, and the handle both share.
- :mod:`.layout`: names and the bytes of the small files (the state file too);
  pure, no I/O.
- :mod:`.io`: :class:`FileIO`, every OS call behind one seam, for durability and
  fault injection.
"""

from __future__ import annotations

from .io import FileIO, OsFileIO
from .store import FileCheckpointStore, FileStoreOptions

__all__ = ["FileCheckpointStore", "FileIO", "FileStoreOptions", "OsFileIO"]
