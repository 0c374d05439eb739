"""Old home of ``CheckpointStore``, now :mod:`statekeeper._core.interface`.

A re-export only, with no logic, kept so that existing imports work; the lead moves
the imports across the tree to the new module and then deletes this one.
"""

from ._core.interface import TTL, CheckpointStore, Order, StoreInfo, store_info

__all__ = ["TTL", "CheckpointStore", "Order", "StoreInfo", "store_info"]
