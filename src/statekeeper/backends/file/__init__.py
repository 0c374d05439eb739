"""``file://``: a checkpoint store in a local directory, safe across processes and
crashes; the layout is in ``docs/file-backend.md``. :class:`.engine.FileEngine` owns
the files, the lock, the state and the descriptor cache; every other part is given
the collaborators it uses, never the engine.

- :mod:`.store`: the public store, its options, its parts and writer thread;
- :mod:`.batch`: ``save_many``, group commit, the multi-record deletes;
- :mod:`.engine`: open, close and the one-record writes;
- :mod:`.pages`: listed pages;
- :mod:`.reader`: the strict reads, ``heal``, ``list_streams`` and ``info``;
- :mod:`.recovery`: the journal, restart recovery, rebuild and repair;
- :mod:`.check`: ``verify``;
- :mod:`.survey`: a read-only walk of every record file, and reads answered from it;
- :mod:`.fdcache`: the descriptors kept across calls;
- :mod:`.files`: the open directory, the state file, the write lock, record files;
- :mod:`.indexes`: the stream indexes and the id table;
- :mod:`.layout`: names and bytes of the small files, no I/O;
- :mod:`.io`: :class:`FileIO`, every OS call behind one seam.
"""

from __future__ import annotations

from .io import FileIO, OsFileIO
from .store import FileCheckpointStore, FileStoreOptions

__all__ = ["FileCheckpointStore", "FileIO", "FileStoreOptions", "OsFileIO"]
