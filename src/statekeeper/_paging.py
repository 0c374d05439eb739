"""Keyset paging: how :meth:`BaseCheckpointStore.list` turns cursors into scans.

One function, shared by every backend, so that no backend can page differently.
A cursor is a signed sequence position bound to the query (stream, order, tags,
metadata filter);
``after=`` scans strictly beyond it in the requested order, ``before=`` scans the
other way and reverses, and a one-item probe in the opposite direction decides
whether the page has a neighbour. Every step is a keyset scan, so a page costs
O(limit) whatever its offset, and a cursor survives the deletion, expiry or
filtering of its item because it names a position, not an item.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from ._validate import (
    Scalar,
    check_limit,
    check_metadata_filter,
    check_stream,
    check_tags,
    metadata_matches,
    skipped_from,
)
from .cursor import MAX_POSITION, query_fingerprint
from .errors import CheckpointDecodeError, InvalidQuery
from .models import Checkpoint, Page, Skipped, checkpoint_with_state
from .record import StoredRecord

if TYPE_CHECKING:
    from ._protocol import BaseCheckpointStore

__all__ = ["PageScan", "ScanQuery", "list_page", "probe_bound", "probe_query", "scan", "scan_page"]

Order = Literal["asc", "desc"]
Entry = StoredRecord | Skipped


@dataclass(frozen=True, slots=True)
class ScanQuery:
    """One direction of a keyset scan, as the base class asks a backend for it.

    Return up to ``limit`` live (not expired at ``now``) candidates of ``stream``
    (every stream when ``None``) whose tags include ``tags``, in ``order`` of
    sequence, strictly beyond ``bound`` (``> bound`` for ``asc``, ``< bound`` for
    ``desc``; no bound when ``None``). When ``metadata`` is not empty, only
    records whose top-level metadata matches it
    (:func:`statekeeper._validate.metadata_matches`) count, but only backends that
    declare ``capabilities.metadata_filter`` are ever asked that; for the others
    the base class filters by scanning. A record that cannot be read is returned
    as :class:`Skipped` whatever the filters say.
    """

    stream: str | None
    order: Order
    bound: int | None
    limit: int
    tags: Mapping[str, str]
    now: datetime
    include_state: bool = True
    metadata: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PageScan:
    """What :meth:`~.BaseCheckpointStore._scan_page` returns for one listed page.

    ``entries``: what :meth:`~.BaseCheckpointStore._scan` returns for the page's
    query (records and :class:`Skipped`, never decoded checkpoints: ``list``
    decodes them, so every backend reports an undecodable state the same way).
    ``neighbour``: when the caller asked for the probe, whether a live candidate
    exists one step the other way from the page's edge (:func:`probe_bound`), with
    the same filters; it decides the page's other cursor. ``None`` when not asked.
    """

    entries: builtins.list[Entry]
    neighbour: bool | None = None


#: Records per scan when the base class filters metadata by scanning.
_FILTER_CHUNK = 256

#: The largest scan a backend may run on the event loop's thread as a point read
#: (SQLite, file: with ``inline_reads``): a listed page of up to 100 items, which
#: asks for one row more to tell whether there is a next page. A thread hop costs
#: a page more than its rows do; a larger page takes the hop.
INLINE_PAGE_ROWS = 101


async def scan(store: BaseCheckpointStore[Any], query: ScanQuery) -> builtins.list[Entry]:
    """``store._scan(query)``, filtering metadata by scanning where the backend does
    not declare ``capabilities.metadata_filter``. Costs O(records scanned)."""
    if not query.metadata or store.capabilities.metadata_filter:
        return await store._scan(query)
    found: builtins.list[Entry] = []
    bound = query.bound
    chunk = max(_FILTER_CHUNK, query.limit)
    while len(found) < query.limit:
        # full headers are needed to filter, so ask for records with their state
        batch = await store._scan(
            replace(query, bound=bound, limit=chunk, metadata={}, include_state=True)
        )
        for entry in batch:
            if isinstance(entry, Skipped) or metadata_matches(
                entry.header.metadata, query.metadata
            ):
                found.append(entry)
                if len(found) == query.limit:
                    break
        if len(batch) < chunk:
            break
        bound = batch[-1].sequence
    return found


async def scan_page(store: BaseCheckpointStore[Any], query: ScanQuery, probe: bool) -> PageScan:
    """One listed page's scan and, with ``probe``, its neighbour (:class:`PageScan`):
    ``store._scan_page`` where the backend answers the query's filters itself, else
    two filtering :func:`scan` calls."""
    if not query.metadata or store.capabilities.metadata_filter:
        return await store._scan_page(query, probe)
    entries = await scan(store, query)
    if not probe:
        return PageScan(entries)
    return PageScan(
        entries, bool(await scan(store, probe_query(query, probe_bound(query, entries))))
    )


async def list_page(
    store: BaseCheckpointStore[Any],
    stream: str | None,
    *,
    limit: int,
    order: Order,
    after: str | None,
    before: str | None,
    tags: Mapping[str, str] | None,
    metadata: Mapping[str, Scalar] | None,
    include_state: bool,
) -> Page:
    """One page of ``store.list(...)``; see that method for the contract."""
    if stream is not None:
        check_stream(stream)
    check_limit(limit)
    if order not in ("asc", "desc"):
        raise InvalidQuery(f"order must be 'asc' or 'desc', got {order!r}")
    clean_tags = check_tags(tags)
    clean_meta = check_metadata_filter(metadata)
    if after is not None and before is not None:
        raise InvalidQuery("pass at most one of after= and before=")
    assert store._signer is not None
    signer = store._signer
    fp = query_fingerprint(stream, order, clean_tags, clean_meta)
    now = store.now()
    back: Order = "desc" if order == "asc" else "asc"

    def query(direction: Order, bound: int | None, n: int) -> ScanQuery:
        return ScanQuery(stream, direction, bound, n, clean_tags, now, include_state, clean_meta)

    def pos(entry: Entry) -> int:
        seq = entry.sequence
        assert seq is not None, "_scan must report the sequence of every entry"
        return seq

    if before is None:
        bound = signer.position(after, fp) if after is not None else None
        asked = query(order, bound, limit + 1)
        got = await scan_page(store, asked, probe=bound is not None)
        entries = got.entries[:limit]
        next_pos = pos(entries[-1]) if len(got.entries) > limit else None
        # the probe went one step the other way from the page's first entry (or
        # from the bound's neighbour, for an empty page)
        prev_pos = probe_bound(asked, entries) if got.neighbour else None
    else:
        bound = signer.position(before, fp)
        asked = query(back, bound, limit + 1)
        got = await scan_page(store, asked, probe=True)
        entries = got.entries[:limit]
        edge = probe_bound(asked, entries)
        entries.reverse()
        prev_pos = pos(entries[0]) if len(got.entries) > limit else None
        next_pos = edge if got.neighbour else None

    items: builtins.list[Checkpoint] = []
    skipped: builtins.list[Skipped] = []
    for entry in entries:
        if isinstance(entry, Skipped):
            skipped.append(entry)
        elif not include_state:
            items.append(checkpoint_with_state(entry.header, None))
        else:
            try:
                items.append(store._decode_strict(entry))
            except CheckpointDecodeError as exc:
                skipped.append(skipped_from(exc, entry.id, entry.sequence))
    return Page.model_construct(
        items=items,
        skipped=skipped,
        next_cursor=signer.make(next_pos, fp) if next_pos is not None else None,
        prev_cursor=signer.make(prev_pos, fp) if prev_pos is not None else None,
        has_more=next_pos is not None,
    )


def probe_bound(scanned: ScanQuery, page: Sequence[Entry]) -> int:
    """Where :func:`list_page` probes next, after the scan ``scanned`` (which has a
    bound) returned ``page``: from the page's first entry, or, for an empty page, from
    one step past the bound in the scan's order (kept within a cursor's range).

    The probe is a one-entry scan the other way from there (:func:`probe_query`); it
    decides the page's other cursor. A backend that runs it in the page's own hop
    (:meth:`~.BaseCheckpointStore._scan_page`) takes its bound from here, so the two
    always agree.
    """
    assert scanned.bound is not None, "only a page past a bound is probed"
    if page:
        seq = page[0].sequence
        assert seq is not None, "_scan must report the sequence of every entry"
        return seq
    return _beside(scanned.bound, 1 if scanned.order == "asc" else -1)


def probe_query(scanned: ScanQuery, edge: int) -> ScanQuery:
    """The one-entry probe :func:`list_page` asks for after ``scanned``: the other
    way from ``edge`` (:func:`probe_bound`), the rest of the query the same
    (``dataclasses.replace`` without its per-call field walk)."""
    q = scanned
    back: Order = "desc" if q.order == "asc" else "asc"
    return ScanQuery(q.stream, back, edge, 1, q.tags, q.now, q.include_state, q.metadata)


def _beside(bound: int, step: int) -> int:
    """The position one ``step`` from ``bound``, kept within what a cursor can hold.

    Sequences are at least 1, so every position below 1 marks the same place (before
    everything), as does every position above :data:`~.cursor.MAX_POSITION`; walking
    empty pages past either end stays there instead of leaving the cursor's range.
    """
    return min(max(bound + step, 0), MAX_POSITION)
