"""statekeeper-redis: the statekeeper checkpoint contract on Redis.

Installing this distribution registers the ``redis`` and ``rediss`` URL schemes
with statekeeper (entry-point group ``statekeeper.backends``)::

    import statekeeper as sk

    async with sk.open_store("redis://127.0.0.1:6379/0?key_prefix=myapp") as store:
        await store.save("job-1", {"step": 1})

See :class:`RedisCheckpointStore` for the guarantees and :class:`RedisOptions`
for the options. Built on statekeeper's public extension API only.

The modules, each importing only those listed below it (no cycles)::

    _store     RedisCheckpointStore and RedisOptions: the contract's primitives,
               wired from the parts below (a link, an inserter), and open/close
    _repair    verify() and repair(): run the walk, apply its guarded edits
    _meta      the meta hash: open (create=, read_only=), upgrade, rebuild if lost
    _tracking  the client half of the index tracking: verify's check, repair's reset
    _batch     Inserter (save, save_many: sequences, the turn, retries), load_many,
               delete, delete_many, stream names; the expiry arguments of a record
    _link      RedisLink: the client, the registered scripts, driver errors and the
               damage statuses the scripts share, as statekeeper errors
    _audit     the read-only walk of every key, what verify() reports and the
               edits repair() applies; DamagedStoreError
    _lua       the Lua scripts of the primitives, and the key layout
    _prelude   the Lua helpers every script starts with
    _server    the server's persistence settings, the durability refusal

Every helper takes what it uses (the link, the store id, the clock) explicitly;
none imports the store.
"""

from ._audit import DamagedStoreError
from ._server import ServerPersistence, UnsafeDurabilityError
from ._store import FORMAT_VERSION, RedisCheckpointStore, RedisOptions

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "DamagedStoreError",
    "RedisCheckpointStore",
    "RedisOptions",
    "ServerPersistence",
    "UnsafeDurabilityError",
    "__version__",
]
