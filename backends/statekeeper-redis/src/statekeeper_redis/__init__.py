"""statekeeper-redis: the statekeeper checkpoint contract on Redis.

Installing this distribution registers the ``redis`` and ``rediss`` URL schemes
with statekeeper (entry-point group ``statekeeper.backends``)::

    import statekeeper as sk

    async with sk.open_store("redis://127.0.0.1:6379/0?key_prefix=myapp") as store:
        await store.save("job-1", {"step": 1})

See :class:`RedisCheckpointStore` for the guarantees and :class:`RedisOptions`
for the options. Built on statekeeper's public extension API only.
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
