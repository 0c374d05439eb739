"""Keyset paging: how :meth:`BaseCheckpointStore.list` turns cursors into scans.

One function, shared by every backend, so that no backend can page differently.
A cursor is a signed sequence position bound to the query (stream, order, tags,
metadata filter);
``after=`` scans strictly beyond it in the requested order, ``before=`` scans the
other way and reverses, and a one-item probe in the opposite direction decides
whether the page has a neighbour. Every step is a keyset scan, so a page costs
O(limit) whatever its offset, and a cursor survives the deletion, expiry or
filtering of its item because it names a position, not an item.

The functions here take what they use: the backend's primitives (``_scan`` and
``_scan_page``), whether it filters metadata itself, the cursor signer, the clock
and the strict decoder; never the store.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime

from ..cursor import CursorSigner, query_fingerprint
from ..errors import CheckpointDecodeError, InvalidQuery
from ..models import Checkpoint, Page, Skipped
from ..record import StoredRecord, header_values
from .interface import Order
from .primitives import StorePrimitives
from .query import (
    INLINE_PAGE_ROWS,
    Entry,
    PageScan,
    ScanQuery,
    probe_bound,
    probe_query,
)
from .validate import (
    Scalar,
    check_limit,
    check_metadata_filter,
    check_stream,
    check_tags,
    metadata_matches,
    skipped_from,
)

__all__ = [
    "INLINE_PAGE_ROWS",
    "PageScan",
    "ScanQuery",
    "list_page",
    "probe_bound",
    "probe_query",
    "scan",
    "scan_page",
]

#: Decodes a record's state strictly (``BaseCheckpointStore._decode_strict``).
Decode = Callable[[StoredRecord], Checkpoint]

#: Records per scan when the base class filters metadata by scanning.
_FILTER_CHUNK = 256


async def scan(
    primitives: StorePrimitives, query: ScanQuery, metadata_filter: bool
) -> builtins.list[Entry]:
    """``primitives._scan(query)``, filtering metadata by scanning where the backend
    does not filter it itself (``metadata_filter``, its
    ``capabilities.metadata_filter``). Costs O(records scanned)."""
    if not query.metadata or metadata_filter:
        return await primitives._scan(query)
    found: builtins.list[Entry] = []
    bound = query.bound
    chunk = max(_FILTER_CHUNK, query.limit)
    while len(found) < query.limit:
        # full headers are needed to filter, so ask for records with their state
        batch = await primitives._scan(
            replace(query, bound=bound, limit=chunk, metadata={}, include_state=True)
        )
        for entry in batch:
            if isinstance(entry, Skipped) or metadata_matches(
                header_values(entry)["metadata"], query.metadata
            ):
                found.append(entry)
                if len(found) == query.limit:
                    break
        if len(batch) < chunk:
            break
        bound = batch[-1].sequence
    return found


async def scan_page(
    primitives: StorePrimitives, query: ScanQuery, probe: bool, metadata_filter: bool
) -> PageScan:
    """One listed page's scan and, with ``probe``, its neighbour (:class:`PageScan`):
    ``primitives._scan_page`` where the backend answers the query's filters itself,
    else two filtering :func:`scan` calls."""
    if not query.metadata or metadata_filter:
        return await primitives._scan_page(query, probe)
    entries = await scan(primitives, query, metadata_filter)
    if not probe:
        return PageScan(entries)
    edge = probe_bound(query, entries)
    return PageScan(
        entries, bool(await scan(primitives, probe_query(query, edge), metadata_filter))
    )


async def list_page(
    primitives: StorePrimitives,
    signer: CursorSigner,
    clock: Callable[[], datetime],
    decode: Decode,
    metadata_filter: bool,
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
    """One page of ``store.list(...)``; see that method for the contract.

    ``primitives`` answers the scans, ``signer`` makes and checks the cursors,
    ``clock`` is read once for the page's ``now``, ``decode`` decodes each listed
    state, and ``metadata_filter`` says whether ``primitives`` filters metadata.
    """
    if stream is not None:
        check_stream(stream)
    check_limit(limit)
    if order not in ("asc", "desc"):
        raise InvalidQuery(f"order must be 'asc' or 'desc', got {order!r}")
    clean_tags = check_tags(tags)
    clean_meta = check_metadata_filter(metadata)
    if after is not None and before is not None:
        raise InvalidQuery("pass at most one of after= and before=")
    fp = query_fingerprint(stream, order, clean_tags, clean_meta)
    now = clock()
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
        got = await scan_page(primitives, asked, bound is not None, metadata_filter)
        entries = got.entries[:limit]
        next_pos = pos(entries[-1]) if len(got.entries) > limit else None
        # the probe went one step the other way from the page's first entry (or
        # from the bound's neighbour, for an empty page)
        prev_pos = probe_bound(asked, entries) if got.neighbour else None
    else:
        bound = signer.position(before, fp)
        asked = query(back, bound, limit + 1)
        got = await scan_page(primitives, asked, True, metadata_filter)
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
            # a header, with no state at all: never mistaken for a stored None
            items.append(entry.header)  # type: ignore[arg-type]
        else:
            try:
                items.append(decode(entry))
            except CheckpointDecodeError as exc:
                skipped.append(skipped_from(exc, entry.id, entry.sequence))
    return Page.model_construct(
        items=items,
        skipped=skipped,
        next_cursor=signer.make(next_pos, fp) if next_pos is not None else None,
        prev_cursor=signer.make(prev_pos, fp) if prev_pos is not None else None,
        has_more=next_pos is not None,
    )
