"""``file://``: a checkpoint store in a local directory, safe across processes and
crashes. The on-disk layout is documented in ``docs/file-backend.md``.

The modules, from the public class down to the operating system:

- :mod:`.store`: :class:`FileCheckpointStore` and its options; maps the base
  class's primitives onto the engine, in one worker thread hop each; queues the
  saves made while one is in flight, for a group commit.
- :mod:`.batch`: ``save_many`` (atomic: intent, one fsync group, commit), the
  group commit of concurrent saves (one fsync group, one outcome each),
  ``delete_many`` and ``load_many``, each one hop; the roll forward or back of
  a batch or group a crash interrupted.
- :mod:`.engine`: the one-record writes (save, update, delete) under ``flock``.
- :mod:`.opening`: open and create; the read-only open, which writes nothing.
- :mod:`.recovery`: the journal, the sync mark, restart recovery and ``repair``.
- :mod:`.rebuild`: rebuilding the indexes, the id table and the state from the
  record files, which are the truth; the cheap checks made when a store opens.
- :mod:`.survey`: a read-only walk of every record file and of what the old
  metadata says about it (the streams of damaged records, orphans).
- :mod:`.view`: reads answered from the records when the indexes cannot be trusted.
- :mod:`.orphans`: damaged records of unknown stream in the pages of a stream
  listing read from its index (each page whose range holds one reports it).
- :mod:`.check`: ``verify``'s check of the derived data against the records.
- :mod:`.reads`: the lock-free read side (latest, load, scan of a stream); what a
  reader may see is capped by the state it read first (a batch in flight is
  hidden).
- :mod:`.listing`: ``list(None)`` from the bucket directories, ``list_streams``
  (with a prefix, matched on the names in the index headers) and ``info``.
- :mod:`.core`: descriptors, the lock, the state file, safe reads of untrusted files.
- :mod:`.index`: the per-stream slot indexes and the id table (derived data).
- :mod:`.format`: names and the bytes of the small files; pure, no I/O.
- :mod:`.statefile`: the bytes of the state file and its journal, and what a
  reader may see of a batch in flight; pure, re-exported by :mod:`.format`.
- :mod:`.io`: :class:`FileIO`, every OS call behind one seam, for durability and
  fault injection.
"""

from __future__ import annotations

from .io import FileIO, OsFileIO
from .store import FileCheckpointStore, FileStoreOptions

__all__ = ["FileCheckpointStore", "FileIO", "FileStoreOptions", "OsFileIO"]
