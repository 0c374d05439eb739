"""Microsoft Agent Framework's checkpoint storages, through their documented protocol.

``CheckpointStorage`` has ``save``, ``load``, ``get_latest(workflow_name=)`` and
``list_checkpoints(workflow_name=)``. It has no paging and no cursor, so a page is
what a caller must do: list the workflow, sort by timestamp, slice. The table
marks those rows. A workflow checkpoint carries the state in ``state`` and the
chain in ``previous_checkpoint_id``, as the workflow runner writes them.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from ..payload import make_state
from .base import Adapter, Kind, SaveMode, WriterSpec

_NO_PAGING = "no paging API: list_checkpoints() of the whole workflow, sort by timestamp, slice"
_ORDER = "orders by ISO timestamp (µs ties possible)"


def _newest_first(checkpoints: list[Any]) -> list[Any]:
    return sorted(checkpoints, key=lambda cp: datetime.fromisoformat(cp.timestamp), reverse=True)


class _Maf(Adapter):
    family: ClassVar[str] = "Agent Framework"
    distribution: ClassVar[str] = "agent-framework-core"
    notes: ClassVar[dict[str, str]] = {
        "get_latest": "get_latest(workflow_name=): " + _ORDER,
        "first_page": _NO_PAGING,
        "middle_page": _NO_PAGING + " at the id's position (no cursor)",
        "list_all": "list_checkpoints(): the whole workflow as one list",
    }

    def __init__(self) -> None:
        super().__init__()
        self.storage: Any = None
        self._heads: dict[str, str] = {}

    async def _save(self, stream: str, step: int, mode: str) -> str:
        from agent_framework import WorkflowCheckpoint

        checkpoint = WorkflowCheckpoint(
            workflow_name=stream,
            graph_signature_hash="bench-graph",
            previous_checkpoint_id=self._heads.get(stream),
            state=make_state(step),
            iteration_count=step,
            metadata={"step": step},
        )
        ident = str(await self.storage.save(checkpoint))
        self._heads[stream] = ident
        return ident

    def export_state(self) -> dict[str, Any]:
        return {"heads": dict(self._heads)}

    def import_state(self, state: dict[str, Any]) -> None:
        heads = state.get("heads")
        if heads is not None:
            self._heads = {k: tuple(v) if isinstance(v, list) else v for k, v in heads.items()}

    async def get_latest(self, stream: str) -> Any:
        return await self.storage.get_latest(workflow_name=stream)

    async def load(self, stream: str, ident: str) -> Any:
        return await self.storage.load(ident)

    async def first_page(self, stream: str) -> int:
        everything = await self.storage.list_checkpoints(workflow_name=stream)
        return len(_newest_first(everything)[:20])

    async def prepare_middle(self, stream: str) -> Any:
        return self.ids[len(self.ids) - self.count // 2]

    async def middle_page(self, stream: str, token: Any) -> int:
        ordered = _newest_first(await self.storage.list_checkpoints(workflow_name=stream))
        at = next(i for i, cp in enumerate(ordered) if cp.checkpoint_id == token)
        return len(ordered[at + 1 : at + 21])

    async def list_all(self, stream: str) -> int:
        return len(await self.storage.list_checkpoints(workflow_name=stream))


class MafInMemoryStore(_Maf):
    name = "MAF InMemoryCheckpointStorage"
    kind: ClassVar[Kind] = "memory"
    notes: ClassVar[dict[str, str]] = {
        **_Maf.notes,
        "get_latest": "get_latest: scans every checkpoint of every workflow; " + _ORDER,
    }

    async def open(self, workdir: Path) -> None:
        from agent_framework import InMemoryCheckpointStorage

        self.storage = InMemoryCheckpointStorage()

    async def close(self) -> None:
        self.storage = None

    def default_mode(self) -> SaveMode:
        return SaveMode("memory", "process-memory", "in-process memory (deep copies)")


class MafFileStore(_Maf):
    name = "MAF FileCheckpointStorage"
    kind: ClassVar[Kind] = "embedded"
    notes: ClassVar[dict[str, str]] = {
        **_Maf.notes,
        "get_latest": "get_latest: reads and decodes every file in the directory; " + _ORDER,
        "load": "load: one file",
    }
    cross_process = True

    def __init__(self) -> None:
        super().__init__()
        self.path = ""

    async def open(self, workdir: Path) -> None:
        self.path = str(workdir / "maf-files")
        await self.attach()

    async def attach(self, mode: str | None = None) -> None:
        from agent_framework import FileCheckpointStorage

        self.storage = FileCheckpointStorage(self.path)

    async def detach(self) -> None:
        self.storage = None

    async def close(self) -> None:
        self.storage = None

    def default_mode(self) -> SaveMode:
        return SaveMode(
            "default", "process-crash", "one JSON file per checkpoint, temp + rename, no fsync"
        )

    def writer_spec(self) -> WriterSpec | None:
        return WriterSpec(f"{__name__}:attach_file", {"path": self.path})


def attach_file(path: str) -> Adapter:
    adapter = MafFileStore()
    adapter.path = path
    return adapter


ALL = [MafInMemoryStore, MafFileStore]
