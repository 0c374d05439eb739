"""``verify()`` and ``repair()``: the parts every backend shares.

Records are the truth (SPEC S3a). A backend's indexes, id tables and counters are
derived from them, so a check walks the records through every public read path
and compares what each path says, and a repair rebuilds the derived data and then
deals with the records that stay damaged. What only a backend can check (its own
files, rows or keys) it adds through ``_verify`` and ``_repair``.

These walk a store through its public reads, so they take a store, typed by what
they call: :class:`RecordWalker` (``list``, ``_delete`` and the clock) for
``repair_records``, :class:`Verifiable` (every read path, ``_info`` and
``_verify``) for ``verify_store``.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, ClassVar, Protocol

from ..errors import CheckpointDecodeError, CheckpointNotFound
from ..models import Checkpoint, Page, Problem, RepairReport, Skipped, VerifyReport
from .interface import CheckpointStore, Order

__all__ = ["RecordWalker", "Verifiable", "damaged_problem", "repair_records", "verify_store"]


class RecordWalker(Protocol):
    """What :func:`repair_records` uses of a store: the tolerant listing, the
    ``_delete`` primitive and the store's clock."""

    async def list(
        self,
        stream: str | None = None,
        *,
        limit: int = 20,
        order: Order = "desc",
        after: str | None = None,
        before: str | None = None,
        tags: Any = None,
        metadata: Any = None,
        include_state: bool = True,
    ) -> Page: ...
    async def _delete(self, id: str, *, if_match: str | None, now: datetime) -> bool: ...
    def now(self) -> datetime: ...


class Verifiable(CheckpointStore, Protocol):
    """What :func:`verify_store` uses of a store: every public read, where it lives
    (for messages) and the backend's own counts and check (``_info``, ``_verify``)."""

    backend_name: ClassVar[str]

    def describe(self) -> str: ...
    async def _info(self) -> dict[str, Any]: ...
    async def _verify(self) -> builtins.list[Problem] | None: ...


#: Records per page while walking a store.
PAGE = 500

Progress = Callable[[int], None]


#: The problem kinds of records that an encrypted store refuses (S16), by the error
#: a read raises for them; any other unreadable record is ``"damaged-record"``.
_REFUSALS = {"RecordNotEncrypted": "plaintext", "RecordUndecryptable": "undecryptable"}


def damaged_problem(entry: Skipped, stream: str | None = None) -> Problem:
    """A :class:`Problem` for a record that a tolerant listing skipped."""
    return Problem(
        kind=_REFUSALS.get(entry.error, "damaged-record"),
        location=entry.location,
        reason=entry.reason,
        id=entry.id,
        sequence=entry.sequence,
        stream=stream,
    )


class _Problems:
    """Problems in the order found, each record or location reported once."""

    def __init__(self) -> None:
        self.items: builtins.list[Problem] = []
        self._seen: set[tuple[str, str]] = set()

    def add(self, problem: Problem) -> None:
        key = (problem.kind, problem.id or problem.location)
        if key not in self._seen:
            self._seen.add(key)
            self.items.append(problem)


async def _still_listed(store: Verifiable, after: str | None, item: Checkpoint) -> bool:
    """Whether ``item`` is still in the page that listed it (so it was not deleted
    by a concurrent writer while the check ran)."""
    page = await store.list(None, limit=PAGE, order="asc", after=after, include_state=False)
    return any(c.id == item.id and c.sequence == item.sequence for c in page.items)


async def verify_store(store: Verifiable, progress: Progress | None = None) -> VerifyReport:
    """Walk every record of ``store`` and compare what each read path says.

    1. A tolerant listing of the whole store in global order: every ``skipped``
       entry is a damaged record.
    2. A strict ``load`` by id of every listed checkpoint's header (its state was
       decoded by the listing): one that lists but does not load, or loads as
       another position, points at a damaged id table.
    3. A strict ``get_latest`` of every stream, against the newest sequence the
       listing saw in it: ``None`` or an older checkpoint is damaged metadata, a
       decode error a damaged record.
    4. The high-water mark against the highest sequence seen.
    5. The backend's own check of its metadata (``_verify``).
    """
    found = _Problems()
    newest: dict[str, int] = {}
    records = 0
    top = 0
    cursor: str | None = None
    while True:
        page = await store.list(None, limit=PAGE, order="asc", after=cursor)
        for entry in page.skipped:
            found.add(damaged_problem(entry))
            top = max(top, entry.sequence or 0)
        for item in page.items:
            newest[item.stream] = max(newest.get(item.stream, 0), item.sequence)
            top = max(top, item.sequence)
            # The listing decoded the state already; by id, only the header is
            # read, and it must be the same record (same position).
            try:
                header = await store.load(item.id, include_state=False)
                said = f"finds sequence {header.sequence}"
                wrong = header.sequence != item.sequence
            except CheckpointNotFound:
                said, wrong = "says it does not exist", True
            except CheckpointDecodeError as exc:  # an envelope the listing could read
                found.add(_decode_problem(exc, item.stream))
                continue
            if wrong and await _still_listed(store, cursor, item):
                found.add(
                    Problem(
                        kind="index",
                        location=store.describe(),
                        reason=f"checkpoint {item.id!r} lists at sequence {item.sequence} "
                        f"in stream {item.stream!r} but load() by id {said}",
                        id=item.id,
                        sequence=item.sequence,
                        stream=item.stream,
                    )
                )
        records += len(page.items) + len(page.skipped)
        if progress is not None:
            progress(len(page.items) + len(page.skipped))
        cursor = page.next_cursor
        if cursor is None:
            break
    streams = set(await store.list_streams())
    for name in sorted(streams | set(newest)):
        await _check_latest(store, name, newest.get(name), found)
    info = await store._info()
    hwm = info.get("high_water_mark")
    if isinstance(hwm, int) and hwm < top:
        found.add(
            Problem(
                kind="state",
                location=store.describe(),
                reason=f"the high-water mark {hwm} is below sequence {top}, which exists; "
                "repair() rebuilds it from the records",
            )
        )
    extra = await store._verify()
    if extra is None:
        found.add(
            Problem(
                kind="unchecked",
                location=store.describe(),
                reason=f"the {store.backend_name} backend cannot check its indexes and tables "
                "against the records, so this store was not fully verified",
            )
        )
    else:
        for problem in extra:
            found.add(problem)
    return VerifyReport(
        records=records,
        streams=len(streams | set(newest)),
        high_water_mark=hwm if isinstance(hwm, int) else None,
        complete=extra is not None,
        problems=found.items,
    )


async def _check_latest(
    store: Verifiable, stream: str, listed: int | None, found: _Problems
) -> None:
    try:
        latest = await store.get_latest(stream)
    except CheckpointDecodeError as exc:
        found.add(_decode_problem(exc, stream))
        return
    if listed is None:
        return  # only damaged records were listed; get_latest raising is checked above
    if latest is None or latest.sequence < listed:
        if await _settled(store, stream):
            return  # a writer deleted or pruned the newest meanwhile: not a problem
        said = "None" if latest is None else f"sequence {latest.sequence}"
        found.add(
            Problem(
                kind="index",
                location=store.describe(),
                reason=f"get_latest({stream!r}) answered {said}, but the listing has "
                f"sequence {listed}; repair() rebuilds the stream's index",
                stream=stream,
            )
        )


async def _settled(store: Verifiable, stream: str) -> bool:
    """Whether ``get_latest(stream)`` agrees, now, with the newest position that the
    tolerant listing gives for it (so a disagreement seen during the walk was a
    concurrent delete, not damage)."""
    page = await store.list(stream, limit=1, order="desc", include_state=False)
    positions = [c.sequence for c in page.items]
    positions += [s.sequence for s in page.skipped if s.sequence is not None]
    newest = max(positions, default=None)
    try:
        latest = await store.get_latest(stream)
    except CheckpointDecodeError:
        return False
    if newest is None:
        return latest is None
    return latest is not None and latest.sequence >= newest


def _decode_problem(exc: CheckpointDecodeError, stream: str | None) -> Problem:
    return Problem(
        kind=_REFUSALS.get(type(exc).__name__, "damaged-record"),
        location=exc.location or "",
        reason=exc.reason,
        id=exc.id,
        sequence=exc.sequence,
        stream=stream,
    )


async def _drop(
    store: RecordWalker,
    entry: Skipped,
    drop: Callable[[Skipped], Awaitable[bool]] | None,
) -> bool:
    if drop is not None:
        return await drop(entry)
    if entry.id is None:
        return False
    await store._delete(entry.id, if_match=None, now=store.now())
    return True


async def repair_records(
    store: RecordWalker,
    drop_damaged: bool,
    *,
    rebuilt: dict[str, int],
    actions: builtins.list[str],
    drop: Callable[[Skipped], Awaitable[bool]] | None = None,
) -> RepairReport:
    """For a backend's ``_repair``: walk the records after it rebuilt its metadata,
    count them, and list (or, with ``drop_damaged``, delete by id) the damaged ones.

    Public as ``statekeeper.repair_records`` for backend authors. ``rebuilt`` and
    ``actions`` are what the backend did before calling it; they are returned in
    the :class:`RepairReport` with the records' outcome appended.

    A damaged record whose id cannot be read cannot be deleted through the public
    primitives; it is reported in ``damaged`` and the backend's own ``_repair``
    must remove it by location if it can. A backend that can delete one record by
    where it is (``drop``: ``True`` if it removed it; ``False`` keeps it in
    ``damaged``) passes that instead: deleting by id would also take a readable
    record that shares the id (possible only in a damaged store).
    """
    damaged: builtins.list[Problem] = []
    dropped: builtins.list[Problem] = []
    records = 0
    cursor: str | None = None
    while True:
        page = await store.list(None, limit=PAGE, order="asc", after=cursor, include_state=True)
        records += len(page.items) + len(page.skipped)
        for entry in page.skipped:
            problem = damaged_problem(entry)
            if drop_damaged and await _drop(store, entry, drop):
                dropped.append(problem)
            else:
                damaged.append(problem)
        cursor = page.next_cursor
        if cursor is None:
            break
    if dropped:
        actions.append(f"dropped {len(dropped)} damaged checkpoint(s), as drop_damaged asked")
    if damaged:
        actions.append(
            f"kept {len(damaged)} damaged checkpoint(s): strict reads still raise for them; "
            "repair(drop_damaged=True) removes them"
        )
    return RepairReport(
        records=records - len(dropped),
        rebuilt=rebuilt,
        actions=actions,
        damaged=damaged,
        dropped=dropped,
    )
