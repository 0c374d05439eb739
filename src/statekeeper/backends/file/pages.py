"""Listed pages of one stream from its index: a page and the probe that decides its
other cursor, tolerant (a damaged record is a skipped entry), with the damaged
records of unknown stream merged in where their sequences fall (see
:mod:`.orphans`). A global listing comes from :meth:`.listing.Listing.scan_all`,
and a store whose indexes cannot be trusted answers from a survey of the records.
One function per page, run inline first under a budget (see :mod:`statekeeper._runtime.inline`).
"""

from __future__ import annotations

from collections.abc import Callable

from ..._core.query import ScanQuery
from ..._core.validate import skipped_from
from ..._runtime.inline import WORKER, Budget
from ...errors import CheckpointDecodeError, ConcurrentModificationError
from ...models import Skipped
from ...record import StoredRecord
from . import layout as fmt
from .core import EngineCore
from .listing import Listing, wanted
from .orphans import OrphanKey, merge_orphans, orphans_key
from .reads import INLINE_EXTRA_RECORDS, INLINE_EXTRA_SLOTS, Reader
from .stream_index import IndexDamaged, StreamIndex
from .survey import Survey
from .view import orphan_error, view_scan

__all__ = ["Entry", "PageEntries", "Pages", "ProbeOf"]

#: The most slots a page scan reads at once at first: a page of up to this many
#: candidates (``list`` asks one more than its limit) reads the slots it needs in one
#: ``pread`` of up to 64 KiB, when nothing is filtered out.
_PAGE_SLOTS = 256

#: What a scan gives: records and skipped entries.
Entry = StoredRecord | Skipped
#: The probe a page scan runs after the page (see :func:`statekeeper._core.query.probe_query`).
ProbeOf = Callable[[list[Entry]], ScanQuery]
#: A page and, when asked, its probe's entries.
PageEntries = tuple[list[Entry], list[Entry] | None]


class Pages:
    """:meth:`scan_page`: a listed page and its probe."""

    def __init__(self, core: EngineCore, listing: Listing, reader: Reader) -> None:
        self.core = core
        self.listing = listing
        self.reader = reader
        #: The damaged records of unknown stream, surveyed once while ``state``
        #: shows the same marker (see :meth:`_orphans`).
        self._orphans_kept: tuple[OrphanKey, list[tuple[int, str]]] | None = None

    def scan_page(
        self, query: ScanQuery, probe_of: ProbeOf | None, budget: Budget = WORKER
    ) -> PageEntries:
        """The entries of ``query`` and, with ``probe_of``, those of the probe
        ``probe_of(page)`` that decides the page's other cursor: both read one
        ``state`` (one cap: the probe sees what the page saw), through one open
        stream index and the same bucket descriptors, or from one survey of the
        records. A scan of one stream also reports, as skipped, each damaged record
        of unknown stream in its range (see :mod:`.orphans`).

        Inline, a page of one stream from its index, whose records are there,
        readable and of that stream; it blocks for a global listing, an orphan, a
        damaged or missing index, a record missing, damaged, too large or of
        another stream (which the worker reports as skipped, or sees deleted), and
        more than :data:`~.reads.INLINE_EXTRA_SLOTS` slots or
        :data:`~.reads.INLINE_EXTRA_RECORDS` records passed over. So an inline
        page never holds a :class:`~statekeeper.models.Skipped` entry."""
        if query.stream is None:
            budget.block()
            state = self.reader.heal(budget)
            cap = fmt.visible_cap(state)
            page = list[Entry](self.listing.scan_all(query, cap))
            if probe_of is None:
                return page, None
            return page, list[Entry](self.listing.scan_all(probe_of(page), cap))
        try:
            state = self.reader.heal(budget)
            if self.listing.records_only(state):
                budget.block()
                return _view_page(self.listing.survey_upto(state), query, probe_of)
            assert state is not None
            try:
                return self._indexed_page(query, probe_of, state, budget)
            except IndexDamaged:
                budget.block()
                return _view_page(self.listing.survey_upto(state), query, probe_of)
        except ConcurrentModificationError:
            budget.block()
            raise

    def _indexed_page(
        self, query: ScanQuery, probe_of: ProbeOf | None, state: fmt.State, budget: Budget
    ) -> PageEntries:
        """:meth:`scan_page` from the stream index (``IndexDamaged`` if it is damaged)."""
        assert query.stream is not None
        cap = fmt.visible_cap(state)
        idx = self.reader.index_for(fmt.stream_file_name(query.stream), budget)
        if idx is None:
            if self.listing.index_missing(state, budget):
                return _view_page(self.listing.survey_upto(state), query, probe_of)
            page = self._with_orphans([], query, state, cap, budget)
            if probe_of is None:
                return page, None
            probe = probe_of(page)
            return page, self._with_orphans([], probe, state, cap, budget)
        dirs: dict[int, int] = {}
        try:
            with idx:
                page = self._scan_slots(idx, query, dirs, cap, budget)
                page = self._with_orphans(page, query, state, cap, budget)
                if probe_of is None:
                    return page, None
                probe = probe_of(page)
                found = self._scan_slots(idx, probe, dirs, cap, budget)
                return page, self._with_orphans(found, probe, state, cap, budget)
        finally:
            if dirs:
                self.core.close_dirs(dirs)

    def _scan_slots(
        self,
        idx: StreamIndex,
        q: ScanQuery,
        dirs: dict[int, int],
        cap: int | None,
        budget: Budget,
    ) -> list[Entry]:
        """The entries of ``q`` from ``idx``'s slots. Inline, what the worker would
        report as skipped or look at again blocks, and so does passing over more
        slots or records than the budget allows."""
        if q.order == "asc":
            start, step = (0 if q.bound is None else idx.locate(q.bound, right=True)), 1
            if start >= idx.count > 0:
                _check_edge(idx, idx.count - 1, q.bound, beyond=False)
        else:
            top = idx.count if q.bound is None else idx.locate(q.bound, right=False)
            start, step = top - 1, -1
            if top == 0 < idx.count:
                _check_edge(idx, 0, q.bound, beyond=True)
        now_us = fmt.to_micros(q.now)
        out: list[Entry] = []
        slots_left, records_left = INLINE_EXTRA_SLOTS, INLINE_EXTRA_RECORDS
        for pos, slot in idx.walk(start, step, first=min(q.limit, _PAGE_SLOTS)):
            if not slot.live or slot.expired(now_us) or (cap is not None and slot.seq > cap):
                slots_left -= 1
                if slots_left < 0:
                    budget.block()
                continue
            try:
                got = self.reader.load(slot.seq, slot.cid, dirs, budget)
            except CheckpointDecodeError as exc:
                out.append(skipped_from(exc, slot.cid, slot.seq))
            else:
                if got is None:
                    budget.block()
                    if self.reader.slot_changed(idx, pos, slot):
                        continue  # deleted since we read the slot
                    out.append(
                        self.listing.skipped(
                            slot.seq,
                            slot.cid,
                            self.core.record_path(slot.seq, slot.cid),
                            "the stream index lists it but its record file is missing",
                        )
                    )
                elif got[0].stream != q.stream:
                    budget.block()
                    out.append(
                        self.listing.skipped(
                            slot.seq,
                            slot.cid,
                            self.core.record_path(slot.seq, slot.cid),
                            f"the record belongs to stream {got[0].stream!r}",
                        )
                    )
                elif not wanted(got[0], q):
                    records_left -= 1
                    if records_left < 0:
                        budget.block()
                    continue
                else:
                    out.append(got[0])
            if len(out) >= q.limit:
                break
        return out

    def _with_orphans(
        self,
        page: list[Entry],
        q: ScanQuery,
        state: fmt.State | None,
        cap: int | None,
        budget: Budget,
    ) -> list[Entry]:
        """``page``, a scan of ``q`` from its stream index, with the damaged records
        of unknown stream in its range (see :mod:`.orphans`): those ``get_latest``
        raises for. Nothing to do, and nothing read, while ``state`` marks none."""
        key = orphans_key(state)
        if key is None:
            return page
        budget.block()
        assert q.stream is not None
        stream = q.stream

        def look(seq: int, cid: str) -> StoredRecord | Skipped | None:
            if self.listing.unseen(seq, True, cap):
                return None
            try:
                got = self.core.load_record(seq, cid)
            except CheckpointDecodeError as exc:
                return skipped_from(orphan_error(exc, stream, listed=True), cid, seq)
            if got is None or got[0].stream != stream or not wanted(got[0], q):
                return None  # deleted since, or readable again (and another stream's)
            return got[0]

        return merge_orphans(page, q, self._orphans(key), look)

    def _orphans(self, key: OrphanKey) -> list[tuple[int, str]]:
        """The ``(sequence, id)`` of the damaged records of unknown stream, ascending:
        from a survey of the records, kept while ``state`` says ``key``."""
        kept = self._orphans_kept
        if kept is not None and kept[0] == key:
            return kept[1]
        found = sorted((e.seq, e.cid) for e in self.listing.survey().orphans)
        self._orphans_kept = (key, found)
        return found


def _view_page(s: Survey, query: ScanQuery, probe_of: ProbeOf | None) -> PageEntries:
    """A page (and its probe) from one survey of the records."""
    page = list[Entry](view_scan(s, query))
    if probe_of is None:
        return page, None
    return page, list[Entry](view_scan(s, probe_of(page)))


def _check_edge(idx: StreamIndex, pos: int, bound: int | None, *, beyond: bool) -> None:
    """A search that put a page past the end of the index (so the walk reads no
    slot) decided on sequences read unchecked: check the slot at the edge it passed,
    whose sequence must be at or below the bound (``beyond``: at or above it).
    Raises :class:`IndexDamaged` (the scan then asks the records) if it is corrupt
    or says otherwise: an index overwritten in place, not an empty page."""
    seq = idx.slot(pos).seq
    if bound is not None and (seq < bound if beyond else seq > bound):
        raise IndexDamaged(f"streams/{idx.name}: slot {pos} is out of order")
