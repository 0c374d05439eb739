"""Listed pages: of one stream from its index, a page and the probe that decides
its other cursor, tolerant (a damaged record is a skipped entry), with the
damaged records of unknown stream merged in where their sequences fall; of every
stream (``list(None)``, :meth:`Pages.scan_all`) from the bucket directories,
through the one walk of :meth:`.files.Files.walk`. A store whose indexes
cannot be trusted answers from a survey of the records. One function per page, run inline
first under a budget (see :mod:`statekeeper._runtime.inline`).

**Orphans.** Damaged records of unknown stream (*orphans*, see :mod:`.survey`) in the pages
of a stream listing read from the indexes.

No stream index holds an orphan, yet it may be any stream's checkpoint, so
``get_latest`` of a stream whose winner is older raises naming it (the newest one,
which ``state`` marks). ``list(stream)`` agrees: every page of every stream
reports each orphan whose sequence lies in the page's range in ``skipped``, with a
reason that says its stream is unknown (:func:`.survey.orphan_error`, the body
``get_latest``'s error comes from). A page read from the records
(:func:`.survey.view_scan`) has them from its survey; a page read from a stream
index has them merged in here, by sequence, so keyset paging and cursors work as
for any other skipped entry: each orphan is on exactly one page of a walk, and a
page still holds at most ``limit`` entries.

Which records are orphans only a survey of the records tells (O(store)), so a
reader takes one survey per rebuild: the rebuild stores a digest of its orphans
in ``state`` (:func:`.survey.orphans_digest`), and a reader keeps the orphans it found
for as long as ``state`` shows the same marker and digest. Each orphan is read
again whenever a page's range holds it, so one deleted since (by id) is left out
and one restored shows as the checkpoint it is.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator, Sequence

from ..._core.query import ScanQuery
from ..._core.validate import skipped_from
from ..._runtime.inline import WORKER, Budget
from ...errors import CheckpointDecodeError, ConcurrentModificationError
from ...models import Skipped
from ...record import StoredRecord
from . import layout as fmt
from .files import Files, RecordProblem
from .indexes import IndexDamaged, StreamIndex
from .reader import INLINE_EXTRA_RECORDS, INLINE_EXTRA_SLOTS, Listing, Reader, wanted
from .survey import Survey, orphan_error, view_scan

__all__ = ["Entry", "OrphanKey", "PageEntries", "Pages", "ProbeOf", "merge_orphans", "orphans_key"]

#: What a reader's kept orphans are good for: ``state``'s marker and digest.
OrphanKey = tuple[tuple[int, str], str | None]

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

    def __init__(self, files: Files, listing: Listing, reader: Reader) -> None:
        self.files = files
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
        of unknown stream in its range (see the module).

        Inline, a page of one stream from its index, whose records are there,
        readable and of that stream; it blocks for a global listing, an orphan, a
        damaged or missing index, a record missing, damaged, too large or of
        another stream (which the worker reports as skipped, or sees deleted), and
        more than :data:`~.reader.INLINE_EXTRA_SLOTS` slots or
        :data:`~.reader.INLINE_EXTRA_RECORDS` records passed over. So an inline
        page never holds a :class:`~statekeeper.models.Skipped` entry."""
        if query.stream is None:
            budget.block()
            state = self.reader.heal(budget)
            cap = fmt.visible_cap(state)
            page = list[Entry](self.scan_all(query, cap))
            if probe_of is None:
                return page, None
            return page, list[Entry](self.scan_all(probe_of(page), cap))
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
                self.files.close_dirs(dirs)

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
                            self.files.record_path(slot.seq, slot.cid),
                            "the stream index lists it but its record file is missing",
                        )
                    )
                elif got[0].stream != q.stream:
                    budget.block()
                    out.append(
                        self.listing.skipped(
                            slot.seq,
                            slot.cid,
                            self.files.record_path(slot.seq, slot.cid),
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
        of unknown stream in its range (see the module): those ``get_latest``
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
                got = self.files.load_record(seq, cid)
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

    # -- list(None): every stream, from the bucket directories ----------------------------

    def scan_all(self, q: ScanQuery, cap: int | None) -> list[StoredRecord | Skipped]:
        """Every stream in global sequence order: walk the bucket directories, which
        are named (and sorted) by sequence, and read only the records in the page."""
        asc = q.order == "asc"
        lo, hi = (q.bound or 0, None) if asc else (0, q.bound)
        out: list[StoredRecord | Skipped] = []

        def damaged(name: str, number: int | None, reason: str) -> None:
            if number is None or len(out) >= q.limit:
                return  # (a name that is no bucket's: verify reports it)
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
        out: list[StoredRecord | Skipped],
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
            parsed = fmt.parse_record_name(name) if kind == 0 else None
            if parsed is not None:
                if cap is not None and seq > cap:
                    got: list[StoredRecord | Skipped] = []
                    self._scan_record(bfd, name, seq, parsed[1], q, got, bucket)
                    damaged = bool(got) and isinstance(got[0], Skipped)
                    if damaged and not self.listing.unseen(seq, True, cap):
                        out.extend(got)
                else:
                    self._scan_record(bfd, name, seq, parsed[1], q, out, bucket)
            elif kind == 1:
                if self._stray_temp(bfd, name, location):
                    reason = "a stray temporary file left by an interrupted write"
                    out.append(self.listing.skipped(seq, None, location, reason))
            else:
                reason = "not a statekeeper record file name (planted or foreign file)"
                out.append(self.listing.skipped(seq, None, location, reason))

    def _scan_record(
        self,
        bfd: int,
        name: str,
        seq: int,
        cid: str,
        q: ScanQuery,
        out: list[StoredRecord | Skipped],
        bucket: int,
    ) -> None:
        location = self.files.record_path(seq, cid)
        if fmt.bucket_of(seq) != bucket:
            out.append(
                self.listing.skipped(seq, cid, location, "the record is in the wrong bucket")
            )
            return
        try:
            data = self.files.read_file(bfd, name)
        except RecordProblem as exc:
            out.append(self.listing.skipped(seq, cid, location, exc.reason))
            return
        if data is None:
            return  # deleted since the directory was listed
        try:
            record = self.files.decode(data, seq, cid)
        except CheckpointDecodeError as exc:
            out.append(skipped_from(exc, cid, seq))
            return
        if wanted(record, q):
            out.append(record)

    def _stray_temp(self, bfd: int, name: str, location: str) -> bool:
        """A temp file nobody is writing: not the current journal's (its one temp, or
        one of the sequences of a group commit in flight), still there, and not
        empty (an empty one holds nothing to leave out: a writer's spare, see
        :class:`.files.Spares`, or a write cut before its first byte)."""
        state = self.listing.statefile.read()
        if state is not None and fmt.temp_in_flight(state.journal, location):
            return False
        try:
            return self.files.io.lstat(name, dir_fd=bfd).st_size > 0
        except FileNotFoundError:
            return False


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


def orphans_key(state: fmt.State | None) -> OrphanKey | None:
    """``None`` when ``state`` marks no orphan (a page needs no merge), else the key
    under which a reader keeps the orphans it surveyed."""
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
    """``page`` (a scan of ``q`` from a stream index, in ``q``'s order) with every
    orphan of ``orphans`` (ascending) in the page's range put in its place:
    beyond ``q.bound``, and up to the page's last entry when the page is full (a
    page that is not full reached the end of the stream, so its range does too).
    ``look`` reads an orphan again: its :class:`Skipped` entry, the record if it is
    readable again (and of this stream, and listed by ``q``), or ``None`` (gone).
    The result is cut to ``q.limit``: what falls off is the next page's."""
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
    """``(sequence, kind, name)`` of a bucket's files beyond ``bound``, in order;
    kind 0 is a record file name, 1 a temp file, 2 anything else (its sequence is
    ``None`` when its name carries none: the caller places it where it appears).

    A bucket holds up to 1000 names and a page needs about 20, so the names are
    sorted (record names sort by sequence: 20 digits, then ``.``) and cut at the
    bound by bisection; only what the page consumes is looked at in Python.
    """
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
