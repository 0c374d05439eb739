"""Old home of ``BaseCheckpointStore``, now :mod:`statekeeper._core.store`.

A re-export only, with no logic, kept so that existing imports work; the lead moves
the imports across the tree to the new module and then deletes this one.
"""

from ._core.interface import TTL, CheckpointStore, Order, StoreInfo
from ._core.primitives import StoreIdentity
from ._core.query import ScanQuery
from ._core.store import BaseCheckpointStore, OptionsT
from ._core.validate import skipped_from

__all__ = [
    "TTL",
    "BaseCheckpointStore",
    "CheckpointStore",
    "OptionsT",
    "Order",
    "ScanQuery",
    "StoreIdentity",
    "StoreInfo",
    "skipped_from",
]
