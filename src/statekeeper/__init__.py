"""statekeeper: durable checkpoints behind one honest async contract.

Open a store by URL, then save after each step and resume from the latest::

    import statekeeper as sk

    async with sk.open_store("sqlite:///state.db") as store:
        await store.save("order-42", {"step": 1})
        latest = await store.get_latest("order-42")

See ``docs/`` for the user guide and the backend author guide.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import errors
    from ._core.integrity import repair_records
    from ._core.interface import CheckpointStore, StoreInfo
    from ._core.primitives import StoreIdentity
    from ._core.query import ScanQuery
    from ._core.store import BaseCheckpointStore
    from ._core.validate import skipped_from
    from ._registry import available_backends, open_store, register_backend
    from ._url import StoreURL
    from .config import Capabilities, StoreOptions
    from .encryption.keys import KeyProvider, Keyring
    from .models import (
        Checkpoint,
        CheckpointHeader,
        NewCheckpoint,
        Page,
        Problem,
        RepairReport,
        Retention,
        Skipped,
        SweepReport,
        VerifyReport,
    )
    from .telemetry import Telemetry

#: Where each public name lives. They are imported on first use (module
#: ``__getattr__``), so that ``import statekeeper`` and the command line's
#: ``--help`` do not pay for pydantic and the store machinery they do not touch.
_LAZY: dict[str, str] = {
    "errors": "",
    "repair_records": "._core.integrity",
    "BaseCheckpointStore": "._core.store",
    "CheckpointStore": "._core.interface",
    "StoreInfo": "._core.interface",
    "ScanQuery": "._core.query",
    "StoreIdentity": "._core.primitives",
    "skipped_from": "._core.validate",
    **dict.fromkeys(("available_backends", "open_store", "register_backend"), "._registry"),
    "StoreURL": "._url",
    "Capabilities": ".config",
    "StoreOptions": ".config",
    "Keyring": ".encryption.keys",
    "KeyProvider": ".encryption.keys",
    "Telemetry": ".telemetry",
    **dict.fromkeys(
        (
            "Checkpoint",
            "CheckpointHeader",
            "NewCheckpoint",
            "Page",
            "Problem",
            "RepairReport",
            "Retention",
            "Skipped",
            "SweepReport",
            "VerifyReport",
        ),
        ".models",
    ),
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if where == "":
        value: Any = importlib.import_module(f".{name}", __name__)
    else:
        value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"
"""The version of this statekeeper distribution."""

__all__ = [
    "BaseCheckpointStore",
    "Capabilities",
    "Checkpoint",
    "CheckpointHeader",
    "CheckpointStore",
    "KeyProvider",
    "Keyring",
    "NewCheckpoint",
    "Page",
    "Problem",
    "RepairReport",
    "Retention",
    "ScanQuery",
    "Skipped",
    "StoreIdentity",
    "StoreInfo",
    "StoreOptions",
    "StoreURL",
    "SweepReport",
    "Telemetry",
    "VerifyReport",
    "__version__",
    "available_backends",
    "errors",
    "open_store",
    "register_backend",
    "repair_records",
    "skipped_from",
]
