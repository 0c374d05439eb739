"""``memory://``: the in-memory backend, and the official fake for application tests.

Data lives in a :class:`MemoryStorage` owned by the store instance, never in a
module global, so two stores never see each other's data. Pass the same
``storage=`` to a second store to simulate a restart of the same process.

It is faithful rather than lenient: states go through the same codec and the same
record envelope as the persistent backends, so a test that passes here does not
fail in production because of state production cannot store.

Costs: ``get_latest`` is O(1) amortised, a page is O(log n + page), ``save`` is
O(1) amortised, ``delete`` is O(n) in the worst case (a list removal). A save
without metadata leaves its envelope bytes to be built on first use (a read, a raw
read), from the very values the save saw, so that cost moves from the save to the
first read. A record's envelope is parsed and verified on its first read and kept
beside its bytes (so a checkpoint that was read takes about twice its size); states
are decoded on every read, through the store's codec.

The modules: ``store.py``, :class:`MemoryCheckpointStore`, the primitives over a
storage; ``storage.py``, :class:`MemoryStorage`, the maps by id, sequence and
stream, with one entry per checkpoint, and the check that they agree.

**For backend authors reading this as an example:** it imports what a plugin may
(the exports of ``statekeeper``, ``statekeeper.errors`` and ``statekeeper.record``)
with two exceptions, private constructors that skip validation of values already
checked: ``statekeeper.models.trusted_header`` (instead of
``CheckpointHeader.model_construct``, about 9x its cost) and
``statekeeper.record.trusted_stored_record`` (instead of ``StoredRecord(...)``,
about 1.5x). With the public forms this store's ``save`` took 1.8x, ``get_latest``
1.7x and a page of 20 2.0x as long (medians of 7 interleaved rounds of 2000 calls on
one stream). They are exempt from the compatibility promise of the public API, so a
plugin should not use them; the from-scratch backend of the backend author guide
needs neither.
"""

from .storage import Entry, MemoryStorage
from .store import MemoryCheckpointStore

#: The entry's name before the module became a package; tests/reliability/mutants.py
#: imports it from here. A re-export only, to go when that import moves to
#: ``statekeeper.backends.memory.storage.Entry``.
_Entry = Entry

__all__ = ["MemoryCheckpointStore", "MemoryStorage"]
