"""What a scan is asked and what it answers: :class:`ScanQuery`, :class:`PageScan`,
and where a listed page's probe goes (:func:`probe_bound`, :func:`probe_query`).

Plain data and arithmetic, shared by the paging code that asks and the backends
that answer, so both sides of a page's probe take its bound from one place.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ..cursor import MAX_POSITION
from ..models import Skipped
from ..record import StoredRecord
from .interface import Order
from .validate import Scalar

__all__ = ["INLINE_PAGE_ROWS", "Entry", "PageScan", "ScanQuery", "probe_bound", "probe_query"]

Entry = StoredRecord | Skipped

#: The largest scan a backend may run on the event loop's thread as a point read
#: (SQLite, file: with ``inline_reads``): a listed page of up to 100 items, which
#: asks for one row more to tell whether there is a next page. A thread hop costs
#: a page more than its rows do; a larger page takes the hop.
INLINE_PAGE_ROWS = 101


@dataclass(frozen=True, slots=True)
class ScanQuery:
    """One direction of a keyset scan, as the base class asks a backend for it.

    Return up to ``limit`` live (not expired at ``now``) candidates of ``stream``
    (every stream when ``None``) whose tags include ``tags``, in ``order`` of
    sequence, strictly beyond ``bound`` (``> bound`` for ``asc``, ``< bound`` for
    ``desc``; no bound when ``None``). When ``metadata`` is not empty, only
    records whose top-level metadata matches it
    (:func:`statekeeper._core.validate.metadata_matches`) count, but only backends that
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


def probe_bound(scanned: ScanQuery, page: Sequence[Entry]) -> int:
    """Where :func:`~statekeeper._core.paging.list_page` probes next, after the scan
    ``scanned`` (which has a bound) returned ``page``: from the page's first entry,
    or, for an empty page, from one step past the bound in the scan's order (kept
    within a cursor's range).

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
    """The one-entry probe :func:`~statekeeper._core.paging.list_page` asks for after
    ``scanned``: the other way from ``edge`` (:func:`probe_bound`), the rest of the
    query the same (``dataclasses.replace`` without its per-call field walk)."""
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
