"""The one interface every store is driven through, ours and the peers alike.

An adapter maps each workload onto the store's own recommended API: statekeeper's
``save``/``get_latest``/``load``/``list``, LangGraph's ``put``/``get_tuple``/``list``,
MAF's ``save``/``get_latest``/``load``/``list_checkpoints``. Where a peer has no
equivalent (no cursor, no paging) the adapter does what a user of that peer would
have to do, and says so in :attr:`Adapter.notes` so the table can show it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

# What a save has survived once it returned (the durability class it is compared in).
Durability = Literal["power-loss", "process-crash", "server-memory", "process-memory"]
# Reads are compared within a kind: in-process memory, embedded storage (files, SQLite)
# or a database server.
Kind = Literal["memory", "embedded", "server"]

MAIN_STREAM = "bench-main"
NOISE_STREAMS = tuple(f"bench-noise-{i:02d}" for i in range(10))
WRITERS_STREAM = "bench-writers"


class StoreUnavailable(Exception):
    """The store cannot run here (backend not importable, server unreachable): skip it."""


@dataclass(frozen=True)
class SaveMode:
    """One way of saving, measured as its own row (e.g. ``full`` and ``fast``)."""

    label: str
    durability: Durability
    detail: str


@dataclass
class WriterSpec:
    """What a child process needs to open its own handle on the same store."""

    factory: str  # "module:function" taking (**params) and returning an Adapter
    params: dict[str, Any] = field(default_factory=dict)


class Adapter(ABC):
    """A store under test. One instance per store; it lives for the whole run.

    ``count`` tracks how many checkpoints the main stream holds, ``ids`` the ids
    of the main stream in save order (so workloads can pick ids to load and the
    middle of the history), ``noise`` the checkpoints in the other streams and
    ``steps`` the next step number (so every saved state differs).
    """

    #: Row name in the tables.
    name: ClassVar[str]
    #: "statekeeper" or the peer's project name.
    family: ClassVar[str]
    kind: ClassVar[Kind]
    #: Distribution whose version the report records.
    distribution: ClassVar[str]
    #: Contract differences per workload ("first_page", "middle_page", ...).
    notes: ClassVar[dict[str, str]] = {}
    #: Whether several processes may write one store (the 4-writer workload).
    cross_process: ClassVar[bool] = False
    #: Processes for the untimed bulk load (more than one only where saves commute:
    #: no client-side chain state, no store-wide write lock).
    bulk_processes: ClassVar[int] = 1

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.count = 0
        self.noise = 0
        self.steps = 0

    # -- lifecycle ----------------------------------------------------------------------

    @abstractmethod
    async def open(self, workdir: Path) -> None:
        """Create an empty store under ``workdir`` (or a random prefix on a server).

        Raise :class:`StoreUnavailable` if it cannot run here.
        """

    @abstractmethod
    async def close(self) -> None:
        """Close handles and remove everything the store created."""

    def save_modes(self) -> list[SaveMode]:
        """The save variants measured for this store (first one is the default)."""
        return [self.default_mode()]

    @abstractmethod
    def default_mode(self) -> SaveMode: ...

    def describe(self) -> str:
        """Extra facts for the stores table (server settings, pragmas)."""
        return ""

    # -- population (untimed) -------------------------------------------------------------

    async def populate(self, plan: Iterator[tuple[str, int]]) -> None:
        """Save every ``(stream, step)`` of ``plan`` in order.

        The default calls :meth:`save` in the default mode; adapters override it
        where a faster path gives the same data (a no-fsync mode for the bulk load),
        since only the measured calls must pay for durability.
        """
        for stream, step in plan:
            await self.save(stream, step, self.default_mode().label)

    def populate_label(self) -> str | None:
        """The save mode the bulk load uses (``None``: the default mode)."""
        return None

    def export_state(self) -> dict[str, Any]:
        """Client-side state a bulk load in another process must continue from
        (e.g. each stream's head for a parent-chained checkpoint)."""
        return {}

    def import_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`export_state` gave (after a bulk load elsewhere)."""
        return None

    async def after_populate(self) -> None:
        """Untimed: what a store in steady state would have done by now (e.g. ANALYZE)."""
        return None

    # -- the workloads ------------------------------------------------------------------

    async def save(self, stream: str, step: int, mode: str) -> None:
        """Save the state of ``step`` at the end of ``stream``; track main-stream ids."""
        self.track(stream, await self._save(stream, step, mode))

    def track(self, stream: str, ident: str) -> None:
        """Count a saved checkpoint (for adapters that save by another path)."""
        if stream == MAIN_STREAM:
            self.ids.append(ident)
            self.count += 1
        elif stream in NOISE_STREAMS:
            self.noise += 1

    @abstractmethod
    async def _save(self, stream: str, step: int, mode: str) -> str:
        """Save and return the new checkpoint's id."""

    @abstractmethod
    async def get_latest(self, stream: str) -> Any: ...

    @abstractmethod
    async def load(self, stream: str, ident: str) -> Any: ...

    @abstractmethod
    async def first_page(self, stream: str) -> int:
        """The newest 20 checkpoints of ``stream``; return how many came back."""

    @abstractmethod
    async def prepare_middle(self, stream: str) -> Any:
        """Untimed: whatever :meth:`middle_page` needs to start at the middle."""

    @abstractmethod
    async def middle_page(self, stream: str, token: Any) -> int:
        """20 checkpoints from the middle of the history, newest first; return how many."""

    @abstractmethod
    async def list_all(self, stream: str) -> int:
        """Every checkpoint of ``stream``, consumed one by one and not kept."""

    def writer_spec(self) -> WriterSpec | None:
        """How a child process opens this store, or ``None`` if it can't be shared."""
        return None

    async def attach(self, mode: str | None = None) -> None:
        """In a child process: open a handle on the existing store (see ``writer_spec``),
        saving in ``mode`` (default: the default mode)."""
        raise NotImplementedError

    async def detach(self) -> None:
        """In a child process: close the handle without removing anything."""
        raise NotImplementedError

    async def count_stream(self, stream: str) -> int:
        """How many checkpoints ``stream`` holds (verifies the writer workload)."""
        return await self.list_all(stream)


A = TypeVar("A", bound=Adapter)


async def open_adapter(
    cls: type[A], workdir: Path, say: Callable[[str], None]
) -> tuple[A | None, str | None]:
    """A new ``cls`` opened in a directory of its own under ``workdir``; or, where it
    cannot run here, ``None`` and why (``"Type: message"``), said as ``skip NAME``."""
    adapter = cls()
    place = workdir / cls.__name__
    place.mkdir()
    try:
        await adapter.open(place)
    except (StoreUnavailable, ImportError) as exc:
        say(f"skip {cls.name}: {exc}")
        return None, f"{type(exc).__name__}: {exc}"
    return adapter, None
