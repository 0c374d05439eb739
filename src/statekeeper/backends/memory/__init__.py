"""``memory://``: the in-memory backend, and the official fake for application tests.

Data lives in a :class:`MemoryStorage` owned by the store instance, never in a
module global, so two stores never see each other's data. Pass the same
``storage=`` to a second store to simulate a restart of the same process.

It is faithful rather than lenient: states go through the same codec and the same
record envelope as the persistent backends, so a test that passes here does not
fail in production because of state production cannot store.

Costs: ``get_latest`` is O(1) amortised, a page is O(log n + page), ``save`` is
O(1) amortised, ``delete`` is O(n) in the worst case (a list removal). A save
leaves its envelope bytes to be built on first use (a read, a raw read), from the
very values the save saw (its own copies of the tags and metadata), so that cost
moves from the save to the first read; the state is encoded by the save, so a
state production could not store is refused there (SPEC S5). A record's envelope
is parsed and verified on its first read and kept beside its bytes (so a
checkpoint that was read takes about twice its size); states are decoded on every
read, through the store's codec.

The modules: ``store.py``, :class:`MemoryCheckpointStore`, the primitives over a
storage; ``storage.py``, :class:`MemoryStorage`, the maps by id, sequence and
stream, with one entry per checkpoint, and the check that they agree.

**For backend authors reading this as an example:** it imports what a plugin may
(the exports of ``statekeeper``, ``statekeeper.errors`` and ``statekeeper.record``)
with four exceptions, private helpers that skip work on values already checked:
``statekeeper.models.trusted_header`` and ``statekeeper.models.trusted_checkpoint``
(a header, or the checkpoint a save returns, without validating its values again,
instead of ``model_construct``, about half its cost),
``statekeeper.record.verified_record`` (a record from checked header values that
builds its header model only if asked, instead of ``StoredRecord(header=...)``:
a read then builds one model, the checkpoint it returns) and
``statekeeper.record.header_values`` (a record's header fields without building its
header model). Without them a read builds two pydantic models per checkpoint
instead of one (each about 2 us, measured for issue 23). They are
exempt from the compatibility promise of the public API, so a plugin should not use
them; the from-scratch backend of the backend author guide needs none.
"""

from .storage import MemoryStorage
from .store import MemoryCheckpointStore

__all__ = ["MemoryCheckpointStore", "MemoryStorage"]
