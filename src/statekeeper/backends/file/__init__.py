"""``file://``: a checkpoint store in a local directory, safe across processes and
crashes. The on-disk layout is documented in ``docs/file-backend.md``.

The engine (:class:`.batch.FileEngine`) is its core (the files, the state, the
write lock and the one descriptor cache) and parts with their own state, each
given the parts it uses in its constructor: the write side (rebuild, recovery,
writes, batches, opening), under the lock, and the read side (listing, reader,
pages), which takes no lock. The modules, from the public class down to the
operating system:

- :mod:`.store`: :class:`FileCheckpointStore` and its options; maps the base
  class's primitives onto the engine, in one worker thread hop each, or none
  (``inline_reads``: a read runs on the event loop's thread first, under the
  budget of :mod:`statekeeper._runtime.inline`); sends saves to the writer of
  :mod:`.saves`.
- :mod:`.saves`: the saves' writer thread and its group commit (the shared
  :class:`~statekeeper._runtime.group.GroupCommit`, run by :class:`~.saves.FileSaves`),
  and :func:`~.saves.engine_call`, where OS errors become ``BackendError``.
- :mod:`.batch`: :class:`~.batch.FileEngine`, the wiring of the parts.
- :mod:`.batches`: ``save_many`` (atomic: intent, one fsync group, commit), the
  group commit of concurrent saves (one fsync group, one outcome each) and
  ``delete_many``.
- :mod:`.engine`: :class:`~.engine.Writes`, the one-record writes (save, update,
  delete, prune, purge) under ``flock``.
- :mod:`.opening`: open and create; the read-only open, which writes nothing.
- :mod:`.recovery`: :class:`~.recovery.Recovery`, the journal, the lock holder's
  transaction, the roll forward or back of a batch or group a crash interrupted,
  and ``repair``.
- :mod:`.restart`: after a machine restart, the records above the sync mark
  indexed again.
- :mod:`.rebuild`: :class:`~.rebuild.Rebuild`, rebuilding the indexes, the id
  table and the state from the record files, which are the truth; the cheap
  checks made when a store opens; the index maintenance every write shares (the
  sync mark, ``dirty``).
- :mod:`.survey`: a read-only walk of every record file and of what the old
  metadata says about it (the streams of damaged records, orphans).
- :mod:`.check`: ``verify``'s check of the derived data against the records.
- :mod:`.reads`: the strict reads (``get_latest``, ``load``, ``load_many``) and
  ``heal``; lock-free; what a reader may see is capped by the state it read first
  (a batch in flight is hidden).
- :mod:`.pages`: a listed page of one stream and its probe, with the damaged
  records of unknown stream merged in (:mod:`.orphans`).
- :mod:`.listing`: ``list(None)`` from the bucket directories, ``list_streams``
  (with a prefix, matched on the names in the index headers), ``info``, and the
  looks every read shares (can the indexes be trusted, the survey, the cap).
- :mod:`.view`: reads answered from the records when the indexes cannot be trusted.
- :mod:`.orphans`: damaged records of unknown stream in the pages of a stream
  listing read from its index (each page whose range holds one reports it).
- :mod:`.core`: the files (descriptors by name), the state file, safe reads of
  untrusted files; the engine's shared state.
- :mod:`.lock`: the write lock (the instance's mutex, then ``flock``).
- :mod:`.descriptors`: the one cache of descriptors kept across calls (the lock
  holder's, and each inline reader thread's).
- :mod:`.stream_index`: the per-stream slot indexes and what both index files
  share; :mod:`.id_table`: the id table.
- :mod:`.layout`: names and the bytes of the small files (the state file too);
  pure, no I/O.
- :mod:`.spares`: the temp file of the next durable save, made ahead while the
  writer is idle.
- :mod:`.io`: :class:`FileIO`, every OS call behind one seam, for durability and
  fault injection.
"""

from __future__ import annotations

from .io import FileIO, OsFileIO
from .store import FileCheckpointStore, FileStoreOptions

__all__ = ["FileCheckpointStore", "FileIO", "FileStoreOptions", "OsFileIO"]
