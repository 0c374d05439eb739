"""The listings of the file backend's read side, and what every read shares.

- :meth:`Listing.scan_all`: ``list(None)``, every stream in global sequence order
  from the bucket directories (no index needed);
- :meth:`Listing.list_streams` and :meth:`Listing.info`, from the stream indexes;
- what the strict reads (:mod:`.reads`) and the page scans (:mod:`.pages`) share:
  whether the indexes can be trusted (:meth:`Listing.records_only`,
  :meth:`Listing.index_missing`), the survey a read that cannot trust them answers
  from, and what a reader must not see yet (:meth:`Listing.unseen`, see
  :func:`.format.visible_cap`).

Lock-free like the rest of the read side.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal

from ..._core.query import ScanQuery
from ..._core.validate import skipped_from
from ..._runtime.inline import WORKER, Budget
from ...errors import CheckpointDecodeError
from ...models import Skipped
from ...record import StoredRecord, header_values
from . import layout as fmt
from .core import EngineCore, RecordProblem
from .stream_index import IndexDamaged
from .survey import Survey, take_survey
from .view import view_info, view_streams

__all__ = ["Listing", "wanted"]


class Listing:
    """``list(None)``, ``list_streams``, ``info``, and the read side's shared looks."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        #: ``(mtime, size)`` of ``streams/`` when it last held every index ``state``
        #: counts (see :meth:`index_missing`).
        self._streams_seen: tuple[int, int] | None = None

    def records_only(self, state: fmt.State | None) -> bool:
        """Whether this read must go to the records (the indexes cannot be trusted)."""
        return state is None or self.core.degraded is not None

    def unseen(self, seq: int, damaged: bool, cap: int | None) -> bool:
        """Whether a reader whose cap is ``cap`` leaves record ``seq`` out. A valid
        record above the cap was saved after the read began; a damaged one is
        left out only while a batch in flight holds its sequence (it is being
        written), since damage above the high-water mark must still be reported."""
        if cap is None or seq <= cap:
            return False
        if not damaged:
            return True
        state = self.core.read_state()
        journal = state.journal if state is not None else None
        return journal is not None and journal.op in fmt.BATCH_OPS and journal.lo <= seq

    def survey_upto(self, state: fmt.State | None) -> Survey:
        """:meth:`survey` without the records a reader that read ``state`` must
        not see (see :func:`.format.visible_cap`)."""
        cap = fmt.visible_cap(state, from_records=True)
        s = self.survey()
        if cap is not None:
            s.entries = [e for e in s.entries if not self.unseen(e.seq, e.record is None, cap)]
        return s

    def survey(self) -> Survey:
        """The whole store, from its records (O(store); see :mod:`.view`)."""
        return take_survey(self.core)

    def index_missing(self, state: fmt.State, budget: Budget) -> bool:
        """Whether a stream index file went missing: fewer index files than ``state``
        counts. Costs one ``fstat`` unless ``streams/`` changed since it last held
        them all (then one listing, which blocks)."""
        seen = self.streams_unchanged(state)
        if seen is True:
            return False
        budget.block()
        missing = len(self.core.index_files()) < (state.streams or 0)
        if not missing:
            self._streams_seen = seen
        return missing

    def streams_unchanged(self, state: fmt.State) -> Literal[True] | tuple[int, int]:
        """``True`` if no stream index can be missing, known from ``state`` and one
        ``fstat`` of ``streams/`` (it did not change since it last held every index
        ``state`` counts); else what that ``fstat`` saw, for :meth:`index_missing`,
        which lists the directory."""
        if not state.streams:
            return True
        st = self.core.io.fstat(self.core.fd("streams"))
        seen = (st.st_mtime_ns, st.st_size)
        return True if seen == self._streams_seen else seen

    def skipped(self, seq: int, cid: str | None, location: str, reason: str) -> Skipped:
        return Skipped.model_construct(
            id=cid,
            sequence=seq,
            location=self.core.where(location),
            reason=reason,
            error=CheckpointDecodeError.__name__,
        )

    def scan_all(self, q: ScanQuery, cap: int | None) -> list[StoredRecord | Skipped]:
        """Every stream in global sequence order: walk the bucket directories, which
        are named (and sorted) by sequence, and read only the records in the page."""
        buckets = self._buckets()
        asc = q.order == "asc"
        if q.bound is not None:
            edge = fmt.bucket_of(q.bound)
            buckets = [b for b in buckets if (b >= edge if asc else b <= edge)]
        if not asc:
            buckets.reverse()
        out: list[StoredRecord | Skipped] = []
        for bucket in buckets:
            self._scan_bucket(bucket, q, out, cap)
            if len(out) >= q.limit:
                break
        return out

    def _buckets(self) -> list[int]:
        """The bucket numbers, ascending. Buckets are only ever added, each one above
        the last as the high-water mark grows, so a listing stays good until the
        high-water mark reaches a bucket it does not have."""
        state = self.core.read_state()
        top = fmt.bucket_of(state.hwm) if state is not None else None
        cached = self.core.buckets_listed
        if cached and top is not None and cached[-1] >= top:
            return cached
        names = self.core.io.listdir(self.core.fd("records"))
        buckets = sorted(b for b in map(fmt.parse_bucket_name, names) if b is not None)
        self.core.buckets_listed = buckets
        return buckets

    def _scan_bucket(
        self, bucket: int, q: ScanQuery, out: list[StoredRecord | Skipped], cap: int | None
    ) -> None:
        bname = fmt.bucket_name(bucket)
        base = bucket * fmt.BUCKET_SIZE
        asc = q.order == "asc"

        try:
            bfd = self.core.open_dir(self.core.fd("records"), bname, create=False)
        except IndexDamaged as exc:
            if q.bound is None or (base > q.bound if asc else base < q.bound):
                out.append(self.skipped(base, None, f"{fmt.RECORDS_DIR}/{bname}", str(exc)))
            return
        if bfd is None:
            return
        try:
            # Where a name carries no sequence, report it next to its neighbour (or at
            # the edge of the range) so positions never go backwards within a page.
            last = (
                (q.bound + 1 if q.bound is not None else base)
                if asc
                else (q.bound - 1 if q.bound is not None else base + fmt.BUCKET_SIZE - 1)
            )
            for found, kind, name in _bucket_entries(self.core.io.listdir(bfd), base, q.bound, asc):
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
                        if damaged and not self.unseen(seq, True, cap):
                            out.extend(got)
                    else:
                        self._scan_record(bfd, name, seq, parsed[1], q, out, bucket)
                elif kind == 1:
                    if self._stray_temp(bfd, name, location):
                        out.append(
                            self.skipped(
                                seq,
                                None,
                                location,
                                "a stray temporary file left by an interrupted write",
                            )
                        )
                else:
                    out.append(
                        self.skipped(
                            seq,
                            None,
                            location,
                            "not a statekeeper record file name (planted or foreign file)",
                        )
                    )
        finally:
            self.core.io.close(bfd)

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
        location = self.core.record_path(seq, cid)
        if fmt.bucket_of(seq) != bucket:
            out.append(self.skipped(seq, cid, location, "the record is in the wrong bucket"))
            return
        try:
            data = self.core.read_file(bfd, name)
        except RecordProblem as exc:
            out.append(self.skipped(seq, cid, location, exc.reason))
            return
        if data is None:
            return  # deleted since the directory was listed
        try:
            record = self.core.decode(data, seq, cid)
        except CheckpointDecodeError as exc:
            out.append(skipped_from(exc, cid, seq))
            return
        if wanted(record, q):
            out.append(record)

    def _stray_temp(self, bfd: int, name: str, location: str) -> bool:
        """A temp file nobody is writing: not the current journal's (its one temp, or
        one of the sequences of a group commit in flight), still there, and not
        empty (an empty one holds nothing to leave out: a writer's spare, see
        :mod:`.spares`, or a write cut before its first byte)."""
        state = self.core.read_state()
        if state is not None and fmt.temp_in_flight(state.journal, location):
            return False
        try:
            return self.core.io.lstat(name, dir_fd=bfd).st_size > 0
        except FileNotFoundError:
            return False

    # -- listings -----------------------------------------------------------------------

    def list_streams(self, now: datetime, prefix: str = "") -> list[str]:
        """The streams with a live checkpoint that start with ``prefix``. The prefix
        is matched on the stream name in each index's header, never on the file
        name (escaping changes prefixes, and long names are hashed), after a cheap
        pass over the file names that skips only those that cannot match."""
        state = self.core.read_state()
        cap = fmt.visible_cap(state)
        if self.records_only(state) or (state is not None and self.index_missing(state, WORKER)):
            return [n for n in view_streams(self.survey_upto(state), now) if n.startswith(prefix)]
        now_us = fmt.to_micros(now)
        names: list[str] = []
        try:
            for idx in self.core.readable_indexes(strict=True, prefix=prefix):
                with idx:
                    if idx.stream.startswith(prefix) and any(
                        s.live and not s.expired(now_us) and (cap is None or s.seq <= cap)
                        for _, s in idx.walk(idx.count - 1, -1)
                    ):
                        names.append(idx.stream)
        except IndexDamaged:
            return [n for n in view_streams(self.survey_upto(state), now) if n.startswith(prefix)]
        return names

    def info(self, now: datetime) -> dict[str, Any]:
        """Counts of the checkpoints live at ``now`` and their streams; the expired
        ones not yet purged apart (``expired``, when there are any)."""
        extra = {"path": self.core.root, "durability": "full" if self.core.durable else "fast"}
        state = self.core.read_state()
        if self.records_only(state):
            degraded = self.core.degraded or "state"
            return {**view_info(self.survey(), now), **extra, "degraded": degraded}
        assert state is not None
        if self.index_missing(state, WORKER):
            degraded = "a stream index is missing"
            return {**view_info(self.survey(), now), **extra, "degraded": degraded}
        now_us = fmt.to_micros(now)
        streams = checkpoints = expired = 0
        try:
            for idx in self.core.readable_indexes(strict=True):
                with idx:
                    slots = [s for _, s in idx.walk(0, 1) if s.live]
                gone = sum(1 for s in slots if s.expired(now_us))
                expired += gone
                if len(slots) > gone:
                    streams += 1
                    checkpoints += len(slots) - gone
        except IndexDamaged as exc:
            return {**view_info(self.survey(), now), **extra, "degraded": str(exc)}
        return {
            "checkpoints": checkpoints,
            "streams": streams,
            "high_water_mark": state.hwm,
            **({"expired": expired} if expired else {}),
            **extra,
        }


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


def wanted(record: StoredRecord, q: ScanQuery) -> bool:
    """Whether a scan of ``q`` lists ``record``: not expired at ``q.now``, and with
    every tag ``q`` asks for (an unfiltered page's rows skip the tag loop). Reads the
    verified header values, so a page builds no header model for a row it passes over
    or returns (list builds the one model a returned checkpoint needs)."""
    values = header_values(record)
    expires = values["expires_at"]
    if expires is not None and expires <= q.now:
        return False
    if not q.tags:
        return True
    tags = values["tags"]
    return all(tags.get(k) == v for k, v in q.tags.items())
