"""statekeeper: durable checkpoints behind one honest async contract.

Open a store by URL, then save after each step and resume from the latest::

    import statekeeper as sk

    async with sk.open_store("sqlite:///state.db") as store:
        await store.save("order-42", {"step": 1})
        latest = await store.get_latest("order-42")

See ``docs/`` for the user guide and the backend author guide.
"""

from . import errors
from ._integrity import repair_records
from ._protocol import (
    BaseCheckpointStore,
    CheckpointStore,
    ScanQuery,
    StoreIdentity,
    StoreInfo,
    skipped_from,
)
from ._registry import available_backends, open_store, register_backend
from ._url import StoreURL
from .config import Capabilities, StoreOptions
from .models import (
    Checkpoint,
    CheckpointHeader,
    NewCheckpoint,
    Page,
    Problem,
    RepairReport,
    Skipped,
    VerifyReport,
)

__version__ = "0.1.0"
"""The version of this statekeeper distribution."""

__all__ = [
    "BaseCheckpointStore",
    "Capabilities",
    "Checkpoint",
    "CheckpointHeader",
    "CheckpointStore",
    "NewCheckpoint",
    "Page",
    "Problem",
    "RepairReport",
    "ScanQuery",
    "Skipped",
    "StoreIdentity",
    "StoreInfo",
    "StoreOptions",
    "StoreURL",
    "VerifyReport",
    "__version__",
    "available_backends",
    "errors",
    "open_store",
    "register_backend",
    "repair_records",
    "skipped_from",
]
