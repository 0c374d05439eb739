"""``list(None)`` and the listings of the file backend's read side: every stream
in global sequence order from the bucket directories (no index needed), and
``list_streams`` and ``info`` from the stream indexes. Lock-free like the rest
of :mod:`.reads`, and blind to what a reader must not see yet (see
:func:`.format.visible_cap`)."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from ..._protocol import ScanQuery, skipped_from
from ...errors import CheckpointDecodeError
from ...models import Skipped
from ...record import StoredRecord
from . import format as fmt
from .budget import WORKER
from .core import RecordProblem
from .index import IndexDamaged
from .reads import ReadsMixin, wanted
from .view import view_info, view_streams

__all__ = ["ListingMixin"]


class ListingMixin(ReadsMixin):
    """``list(None)``, ``list_streams`` and ``info``."""

    _bucket_list: list[int] | None = None

    def _scan_all(self, q: ScanQuery, cap: int | None) -> list[StoredRecord | Skipped]:
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
        state = self.read_state()
        top = fmt.bucket_of(state.hwm) if state is not None else None
        cached = self._bucket_list
        if cached and top is not None and cached[-1] >= top:
            return cached
        names = self.io.listdir(self.fd("records"))
        buckets = sorted(b for b in map(fmt.parse_bucket_name, names) if b is not None)
        self._bucket_list = buckets
        return buckets

    def _scan_bucket(
        self, bucket: int, q: ScanQuery, out: list[StoredRecord | Skipped], cap: int | None
    ) -> None:
        bname = fmt.bucket_name(bucket)
        base = bucket * fmt.BUCKET_SIZE
        asc = q.order == "asc"

        try:
            bfd = self.open_dir(self.fd("records"), bname, create=False)
        except IndexDamaged as exc:
            if q.bound is None or (base > q.bound if asc else base < q.bound):
                out.append(self._skipped(base, None, f"{fmt.RECORDS_DIR}/{bname}", str(exc)))
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
            for found, kind, name in _bucket_entries(self.io.listdir(bfd), base, q.bound, asc):
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
                        if damaged and not self._unseen(seq, True, cap):
                            out.extend(got)
                    else:
                        self._scan_record(bfd, name, seq, parsed[1], q, out, bucket)
                elif kind == 1:
                    if self._stray_temp(bfd, name, location):
                        out.append(
                            self._skipped(
                                seq,
                                None,
                                location,
                                "a stray temporary file left by an interrupted write",
                            )
                        )
                else:
                    out.append(
                        self._skipped(
                            seq,
                            None,
                            location,
                            "not a statekeeper record file name (planted or foreign file)",
                        )
                    )
        finally:
            self.io.close(bfd)

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
        location = self.record_path(seq, cid)
        if fmt.bucket_of(seq) != bucket:
            out.append(self._skipped(seq, cid, location, "the record is in the wrong bucket"))
            return
        try:
            data = self.read_file(bfd, name)
        except RecordProblem as exc:
            out.append(self._skipped(seq, cid, location, exc.reason))
            return
        if data is None:
            return  # deleted since the directory was listed
        try:
            record = self.decode(data, seq, cid)
        except CheckpointDecodeError as exc:
            out.append(skipped_from(exc, cid, seq))
            return
        if wanted(record, q):
            out.append(record)

    def _stray_temp(self, bfd: int, name: str, location: str) -> bool:
        """A temp file nobody is writing: not the current journal's (its one temp, or
        one of the sequences of a group commit in flight), and still there."""
        state = self.read_state()
        if state is not None and fmt.temp_in_flight(state.journal, location):
            return False
        try:
            self.io.lstat(name, dir_fd=bfd)
        except FileNotFoundError:
            return False
        return True

    # -- listings -----------------------------------------------------------------------

    def list_streams(self, now: datetime, prefix: str = "") -> list[str]:
        """The streams with a live checkpoint that start with ``prefix``. The prefix
        is matched on the stream name in each index's header, never on the file
        name (escaping changes prefixes, and long names are hashed), after a cheap
        pass over the file names that skips only those that cannot match."""
        state = self.read_state()
        cap = fmt.visible_cap(state)
        if self._records_only(state) or (state is not None and self._index_missing(state, WORKER)):
            return [n for n in view_streams(self.survey_upto(state), now) if n.startswith(prefix)]
        now_us = fmt.to_micros(now)
        names: list[str] = []
        try:
            for idx in self.readable_indexes(strict=True, prefix=prefix):
                with idx:
                    if idx.stream.startswith(prefix) and any(
                        s.live and not s.expired(now_us) and (cap is None or s.seq <= cap)
                        for _, s in idx.walk(idx.count - 1, -1)
                    ):
                        names.append(idx.stream)
        except IndexDamaged:
            return [n for n in view_streams(self.survey_upto(state), now) if n.startswith(prefix)]
        return names

    def info(self) -> dict[str, Any]:
        extra = {"path": self.root, "durability": "full" if self.durable else "fast"}
        state = self.read_state()
        if self._records_only(state):
            return {**view_info(self.survey()), **extra, "degraded": self.degraded or "state"}
        assert state is not None
        if self._index_missing(state, WORKER):
            return {**view_info(self.survey()), **extra, "degraded": "a stream index is missing"}
        streams = checkpoints = 0
        try:
            for idx in self.readable_indexes(strict=True):
                with idx:
                    n = sum(1 for _, s in idx.walk(0, 1) if s.live)
                if n:
                    streams += 1
                    checkpoints += n
        except IndexDamaged as exc:
            return {**view_info(self.survey()), **extra, "degraded": str(exc)}
        return {
            "checkpoints": checkpoints,
            "streams": streams,
            "high_water_mark": state.hwm,
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
