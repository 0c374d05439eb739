"""Listed pages: of one stream from its index (tolerant: a damaged record is a skipped
entry), with its probe; of every stream from the bucket directories; from a survey of
the records when the indexes cannot be trusted.

**Orphans** (damaged records of unknown stream, see :mod:`.survey`) may be any
stream's, so every page of every stream reports each one in its range in
``skipped``, merged in by sequence: each is on exactly one page of a walk, and a page
holds at most ``limit`` entries. A reader surveys them once per rebuild (kept while
``state`` shows the same marker and digest) and reads each again when a page's range
holds it, so one deleted since is left out and one restored shows as a checkpoint.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator, Sequence

from ..._core.query import Entry, ScanQuery
from ..._core.validate import skipped_from
from ..._runtime.inline import WORKER, Budget
from ...errors import CheckpointDecodeError
from ...models import Skipped
from ...record import StoredRecord
from . import layout as fmt
from .files import Files, RecordProblem
from .indexes import IndexDamaged, StreamIndex
from .reader import INLINE_EXTRA_RECORDS, INLINE_EXTRA_SLOTS, Listing, Reader, wanted
from .survey import orphan_error, view_scan

#: What a reader's kept orphans are good for: ``state``'s marker and digest.
OrphanKey = tuple[tuple[int, str], str | None]

#: The most slots a page scan reads at first in one ``pread`` (up to 64 KiB).
_PAGE_SLOTS = 256

#: The probe a page scan runs after the page (:func:`statekeeper._core.query.probe_query`).
ProbeOf = Callable[[list[Entry]], ScanQuery]
#: A page and, when asked, its probe's entries.
PageEntries = tuple[list[Entry], list[Entry] | None]


class Pages:
    """A listed page and its probe."""

    def __init__(self, files: Files, listing: Listing, reader: Reader) -> None:
        self.files = files
        self.listing = listing
        self.reader = reader
        self._orphans_kept: tuple[OrphanKey, list[tuple[int, str]]] | None = None

    def scan_page(
        self, query: ScanQuery, probe_of: ProbeOf | None, budget: Budget = WORKER
    ) -> PageEntries:
        """The entries of ``query`` and, with ``probe_of``, of the probe
        ``probe_of(page)`` that decides the other cursor: both under one ``state``
        (the probe sees what the page saw), through one open index, or one survey.
        Inline, only a page of one stream from its index that skips nothing and
        passes over at most :data:`~.reader.INLINE_EXTRA_SLOTS` slots and
        :data:`~.reader.INLINE_EXTRA_RECORDS` records; anything else blocks."""
        if query.stream is None:
            budget.block()
            cap = fmt.visible_cap(self.reader.heal(budget))
            return _paired(lambda q: self.scan_all(q, cap), query, probe_of)
        return self.reader.strict(
            budget,
            lambda state: self._indexed_page(query, probe_of, state, budget),
            lambda s: _paired(lambda q: view_scan(s, q), query, probe_of),
        )

    def _indexed_page(
        self, query: ScanQuery, probe_of: ProbeOf | None, state: fmt.State, budget: Budget
    ) -> PageEntries:
        """From the stream index (:class:`IndexDamaged` if it is damaged)."""
        assert query.stream is not None
        cap = fmt.visible_cap(state)
        idx = self.reader.index_for(fmt.stream_file_name(query.stream), budget)
        if idx is None:
            if self.listing.index_missing(state, budget):
                raise IndexDamaged("a stream index is missing")
            return _paired(lambda q: self._with_orphans([], q, state, cap, budget), query, probe_of)
        dirs: dict[int, int] = {}

        def scan(q: ScanQuery) -> list[Entry]:
            found = self._scan_slots(idx, q, dirs, cap, budget)
            return self._with_orphans(found, q, state, cap, budget)

        try:
            with idx:
                return _paired(scan, query, probe_of)
        finally:
            self.files.close_dirs(dirs)

    def _scan_slots(
        self,
        idx: StreamIndex,
        q: ScanQuery,
        dirs: dict[int, int],
        cap: int | None,
        budget: Budget,
    ) -> list[Entry]:
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
                if got is not None and got[0].stream == q.stream:
                    if wanted(got[0], q):
                        out.append(got[0])
                    else:
                        records_left -= 1
                        if records_left < 0:
                            budget.block()
                else:
                    budget.block()
                    if got is None and self.reader.slot_changed(idx, pos, slot):
                        continue  # deleted since
                    reason = (
                        "the stream index lists it but its record file is missing"
                        if got is None
                        else f"the record belongs to stream {got[0].stream!r}"
                    )
                    out.append(self._skipped_record(slot.seq, slot.cid, reason))
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
        """``page`` with the orphans in its range; nothing read while ``state`` marks none."""
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
                got = self.files.load_record(seq, cid)
            except CheckpointDecodeError as exc:
                return skipped_from(orphan_error(exc, stream, listed=True), cid, seq)
            if got is None or got[0].stream != stream or not wanted(got[0], q):
                return None  # deleted since, or readable again and another stream's
            return got[0]

        return merge_orphans(page, q, self._orphans(key), look)

    def _orphans(self, key: OrphanKey) -> list[tuple[int, str]]:
        """The orphans' ``(sequence, id)``, ascending, surveyed once per ``key``."""
        kept = self._orphans_kept
        if kept is not None and kept[0] == key:
            return kept[1]
        found = sorted((e.seq, e.cid) for e in self.listing.survey().orphans)
        self._orphans_kept = (key, found)
        return found

    def scan_all(self, q: ScanQuery, cap: int | None) -> list[Entry]:
        """Every stream in sequence order, from the bucket directories."""
        asc = q.order == "asc"
        lo, hi = (q.bound or 0, None) if asc else (0, q.bound)
        out: list[Entry] = []

        def damaged(name: str, number: int | None, reason: str) -> None:
            if number is None or len(out) >= q.limit:
                return  # (verify reports a name that is no bucket's)
            base = number * fmt.BUCKET_SIZE
            if q.bound is None or (base > q.bound if asc else base < q.bound):
                out.append(self.listing.skipped(base, None, f"{fmt.RECORDS_DIR}/{name}", reason))

        state = self.listing.statefile.read()
        known_top = state.hwm if state is not None else None
        for bucket, bfd, names in self.files.walk(
            lo,
            hi,
            descending=not asc,
            known_top=known_top,
            damaged=damaged,
            until=lambda: len(out) >= q.limit,
        ):
            self._scan_bucket(bucket, bfd, names, q, out, cap)
        return out

    def _scan_bucket(
        self,
        bucket: int,
        bfd: int,
        names: list[str],
        q: ScanQuery,
        out: list[Entry],
        cap: int | None,
    ) -> None:
        bname = fmt.bucket_name(bucket)
        base = bucket * fmt.BUCKET_SIZE
        asc = q.order == "asc"
        # Where a name carries no sequence, report it next to its neighbour (or at
        # the edge of the range) so positions never go backwards within a page.
        last = (
            (q.bound + 1 if q.bound is not None else base)
            if asc
            else (q.bound - 1 if q.bound is not None else base + fmt.BUCKET_SIZE - 1)
        )
        for found, kind, name in _bucket_entries(names, base, q.bound, asc):
            if len(out) >= q.limit:
                return
            seq = last if found is None else found
            last = seq
            location = f"{fmt.RECORDS_DIR}/{bname}/{name}"
            if kind == 0:  # a record file name, parsed: <20 digits>.<id>.ckpt
                entry = self._scan_record(bfd, name, seq, name[21:-5], q, bucket)
                if entry is not None and not self.listing.unseen(
                    seq, isinstance(entry, Skipped), cap
                ):
                    out.append(entry)
            elif kind == 1:
                state = self.listing.statefile.read()
                journal = state.journal if state is not None else None
                if self.files.stray_temp(bfd, name, location, journal):
                    reason = "a stray temporary file left by an interrupted write"
                    out.append(self.listing.skipped(seq, None, location, reason))
            else:
                reason = "not a statekeeper record file name (planted or foreign file)"
                out.append(self.listing.skipped(seq, None, location, reason))

    def _scan_record(
        self, bfd: int, name: str, seq: int, cid: str, q: ScanQuery, bucket: int
    ) -> Entry | None:
        """Record file ``name``'s entry for ``q`` (``None``: gone, or not listed)."""
        if fmt.bucket_of(seq) != bucket:
            return self._skipped_record(seq, cid, "the record is in the wrong bucket")
        try:
            data = self.files.read_file(bfd, name)
        except RecordProblem as exc:
            return self._skipped_record(seq, cid, exc.reason)
        if data is None:
            return None  # deleted since the directory was listed
        try:
            record = self.files.decode(data, seq, cid)
        except CheckpointDecodeError as exc:
            return skipped_from(exc, cid, seq)
        return record if wanted(record, q) else None

    def _skipped_record(self, seq: int, cid: str, reason: str) -> Skipped:
        return self.listing.skipped(seq, cid, self.files.record_path(seq, cid), reason)


def _paired(
    scan: Callable[[ScanQuery], list[Entry]], query: ScanQuery, probe_of: ProbeOf | None
) -> PageEntries:
    """``scan`` of ``query`` and, with ``probe_of``, of the probe after that page."""
    page = scan(query)
    return page, None if probe_of is None else scan(probe_of(page))


def _check_edge(idx: StreamIndex, pos: int, bound: int | None, *, beyond: bool) -> None:
    """A search that put a page past the end of the index read sequences unchecked:
    the slot at the edge must be at or below the bound (``beyond``: above), else
    :class:`IndexDamaged` (an index overwritten in place, not an empty page)."""
    seq = idx.slot(pos).seq
    if bound is not None and (seq < bound if beyond else seq > bound):
        raise IndexDamaged(f"streams/{idx.name}: slot {pos} is out of order")


def orphans_key(state: fmt.State | None) -> OrphanKey | None:
    """The key a reader keeps its surveyed orphans under (``None``: no orphan)."""
    if state is None or state.orphan is None:
        return None
    digest = state.extra.get("orphans")
    return state.orphan, digest if isinstance(digest, str) else None


def merge_orphans(
    page: list[Entry],
    q: ScanQuery,
    orphans: Sequence[tuple[int, str]],
    look: Callable[[int, str], StoredRecord | Skipped | None],
) -> list[Entry]:
    """``page`` (in ``q``'s order) with each of ``orphans`` (ascending) in its range
    put in place: beyond ``q.bound``, up to the last entry of a full page. ``look``
    reads one again (its skipped entry, its record, or ``None``: gone). Cut to
    ``q.limit``: what falls off is the next page's."""
    asc = q.order == "asc"
    lo, hi = 0, fmt.MAX_SEQUENCE + 1  # exclusive
    if q.bound is not None:
        lo, hi = (q.bound, hi) if asc else (lo, q.bound)
    if len(page) >= q.limit:
        edge = _seq(page[-1])
        lo, hi = (lo, edge) if asc else (edge, hi)
    listed = {_seq(e) for e in page}
    found: list[Entry] = []
    for seq, cid in orphans:
        if lo < seq < hi and seq not in listed and (entry := look(seq, cid)) is not None:
            found.append(entry)
    if not found:
        return page
    merged = sorted([*page, *found], key=_seq, reverse=not asc)
    return merged[: q.limit]


def _seq(entry: Entry) -> int:
    seq = entry.sequence
    assert seq is not None, "every entry of a stream's scan has its sequence"
    return seq


def _bucket_entries(
    names: list[str], base: int, bound: int | None, asc: bool
) -> Iterator[tuple[int | None, int, str]]:
    """``(sequence, kind, name)`` of a bucket's files beyond ``bound``, in order: kind
    0 a record, 1 a temp file, 2 anything else (sequence ``None``: its name has none).
    Sorted and cut by bisection, so only what the page consumes is parsed."""
    names.sort()
    lo, hi = bisect.bisect_left(names, "0"), bisect.bisect_left(names, ":")
    digits = names[lo:hi]
    others: list[tuple[str, int, str]] = []
    for name in names[:lo] + names[hi:]:
        tseq = fmt.parse_temp_name(name)
        others.append((f"{tseq if tseq is not None else base:020d}", 1 if tseq else 2, name))
    key = None if bound is None else f"{bound:020d}"
    if asc:
        start = 0 if key is None else bisect.bisect_right(digits, key + "/")
        records: Iterator[str] = iter(digits[start:])
        others = sorted(e for e in others if key is None or e[0] > key)
    else:
        end = len(digits) if key is None else bisect.bisect_left(digits, key)
        records = reversed(digits[:end])
        others = sorted((e for e in others if key is None or e[0] < key), reverse=True)
    keyed = ((name[:20], 0, name) for name in records)
    for k, kind, name in heapq.merge(keyed, others, reverse=not asc):
        if kind == 0 and not (k.isdigit() and fmt.parse_record_name(name)):
            yield (int(k) if k.isdigit() else None), 2, name
        else:
            yield int(k), kind, name
