"""What applications type against: the ``CheckpointStore`` Protocol, the ``Order``
and ``TTL`` argument types, and ``StoreInfo``.

Code that only uses a store types against :class:`CheckpointStore`; every backend,
built-in or third-party, satisfies it by subclassing
:class:`~statekeeper.BaseCheckpointStore` (in ``_protocol.py``), which states the
contract in full.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, Protocol, Self, overload, runtime_checkable

from ..config import Capabilities
from ..models import (
    Checkpoint,
    CheckpointHeader,
    NewCheckpoint,
    Page,
    RepairReport,
    Retention,
    SweepReport,
    VerifyReport,
)

__all__ = ["TTL", "CheckpointStore", "Order", "StoreInfo", "store_info"]

Order = Literal["asc", "desc"]
TTL = int | float | timedelta


@runtime_checkable
class CheckpointStore(Protocol):
    """What applications type against: every store, built-in or a plugin's, has these
    methods, because every backend subclasses :class:`BaseCheckpointStore`.

    Each method's contract (strict or tolerant, what it raises, concurrency) is that
    of the same method of :class:`BaseCheckpointStore`, which enforces it for every
    backend; the API reference shows it under each method here too.
    """

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
    async def save(
        self,
        stream: str,
        state: Any,
        *,
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        parent_id: str | None = None,
        ttl: TTL | None = None,
        id: str | None = None,
    ) -> Checkpoint: ...
    async def get_latest(self, stream: str) -> Checkpoint | None: ...
    @overload
    async def load(self, id: str, *, include_state: Literal[True] = True) -> Checkpoint: ...
    @overload
    async def load(self, id: str, *, include_state: bool) -> CheckpointHeader: ...
    # the signature behind the overloads: without it the reference has no entry for load
    async def load(self, id: str, *, include_state: bool = True) -> CheckpointHeader: ...
    @overload
    async def load_many(
        self, ids: Iterable[str], *, include_state: Literal[True] = True
    ) -> dict[str, Checkpoint]: ...
    @overload
    async def load_many(
        self, ids: Iterable[str], *, include_state: bool
    ) -> dict[str, CheckpointHeader]: ...
    async def load_many(
        self, ids: Iterable[str], *, include_state: bool = True
    ) -> dict[str, Checkpoint] | dict[str, CheckpointHeader]: ...
    async def cursor_at(
        self,
        id: str,
        *,
        order: Order = "desc",
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str: ...
    async def save_many(self, items: Sequence[NewCheckpoint]) -> builtins.list[Checkpoint]: ...
    async def delete_many(self, ids: Iterable[str]) -> int: ...
    async def list(
        self,
        stream: str | None = None,
        *,
        limit: int = 20,
        order: Order = "desc",
        after: str | None = None,
        before: str | None = None,
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        include_state: bool = True,
    ) -> Page: ...
    async def update(
        self,
        id: str,
        state: Any,
        *,
        if_match: str | None = None,
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        parent_id: str | None = None,
    ) -> Checkpoint: ...
    async def delete(self, id: str, *, if_match: str | None = None) -> bool: ...
    async def delete_stream(self, stream: str) -> int: ...
    async def list_streams(self, *, prefix: str | None = None) -> builtins.list[str]: ...
    async def prune(self, stream: str, *, keep_last: int) -> int: ...
    async def purge_expired(self) -> int: ...
    async def info(self) -> StoreInfo: ...
    async def verify(self, *, progress: Callable[[int], None] | None = None) -> VerifyReport: ...
    async def repair(self, *, drop_damaged: bool = False) -> RepairReport: ...
    async def sweep(
        self,
        *,
        dry_run: bool = False,
        policy: Retention | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> SweepReport: ...
    async def compact(self) -> int | None: ...


@dataclass(frozen=True)
class StoreInfo:
    """What ``info()`` reports about a store (for tools such as ``statekeeper info``)."""

    backend: str
    url: str
    store_id: str
    format_version: int | None
    capabilities: Capabilities
    checkpoints: int | None = None
    streams: int | None = None
    high_water_mark: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def store_info(
    backend: str, url: str, identity: Any, capabilities: Capabilities, extra: dict[str, Any]
) -> StoreInfo:
    """``info()``: ``identity`` (the store's ``StoreIdentity``) gives the store id and
    format version; ``extra`` is what ``_info`` returned, counts taken out of it."""
    return StoreInfo(
        backend=backend,
        url=url,
        store_id=identity.store_id,
        format_version=identity.format_version,
        capabilities=capabilities,
        checkpoints=extra.pop("checkpoints", None),
        streams=extra.pop("streams", None),
        high_water_mark=extra.pop("high_water_mark", None),
        extra=extra,
    )
