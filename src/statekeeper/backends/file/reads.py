"""The read side of the file backend's engine: lock-free, strict where it must be.

Readers take no lock. Writers only ever replace whole files by rename and write
index slots that carry a CRC, so a reader sees every file either before or after a
change. Where a reader's two looks disagree (a slot said live, its record is gone)
it looks again; if the disagreement persists across a few tries it is damage,
reported as such, never papered over with an older checkpoint.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from ..._protocol import ScanQuery, skipped_from
from ...errors import CheckpointDecodeError, CheckpointNotFound, ConcurrentModificationError
from ...models import Skipped
from ...record import StoredRecord
from . import format as fmt
from .core import EngineCore, RecordProblem, Txn
from .index import IdTable, IndexDamaged, StreamIndex
from .survey import Survey, take_survey
from .view import orphan_error, view_get, view_info, view_latest, view_scan, view_streams

__all__ = ["ReadsMixin"]

#: How many times a read that a concurrent writer disturbed is retried.
READ_RETRIES = 8


class _Retry(Exception):
    """A concurrent writer changed what this read was looking at."""


class ReadsMixin(EngineCore):
    """Strict ``latest``/``get``, tolerant ``scan``, and the listings."""

    _bucket_list: list[int] | None = None
    #: ``(mtime, size)`` of ``streams/`` when it last held every index ``state`` counts.
    _streams_seen: tuple[int, int] | None = None

    def recover_pending(self) -> Txn:
        """Finish a crashed writer's journal (the engine implements it)."""
        raise NotImplementedError

    def heal(self) -> fmt.State | None:
        """If a writer died mid-operation and nobody holds the lock now, finish its
        work before reading, so no reader sees a half-done delete or update for long.
        Returns the state (``None``: unreadable, so the reads go to the records).

        Save entries are left to the next writer: every completed save leaves one
        (see ``_insert_done``), and a save that died before its index entries is one
        nobody was told about, which strict reads do not show anyway. A read-only
        store heals nothing. A torn read of ``state`` is usually a writer's write
        in flight, so it is read again (a few times) before it is believed."""
        state = self.read_state()
        for _ in range(3):
            if state is None or not state.torn:
                break
            state = self.read_state()
        if self.read_only or state is None or state.journal is None or state.journal.op == "insert":
            return state
        with self.locked(wait=False) as got:
            if got:
                self.recover_pending()
                return self.read_state()
        return state

    def _index_missing(self, state: fmt.State) -> bool:
        """Whether a stream index file went missing: fewer index files than ``state``
        counts. Costs one ``fstat`` unless ``streams/`` changed since it last held
        them all (then one listing)."""
        want = state.streams
        if not want:
            return False
        st = self.io.fstat(self.fd("streams"))
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self._streams_seen:
            return False
        missing = len(self.index_files()) < want
        if not missing:
            self._streams_seen = seen
        return missing

    def _records_only(self, state: fmt.State | None) -> bool:
        """Whether this read must go to the records (the indexes cannot be trusted)."""
        return state is None or self.degraded is not None

    def survey(self) -> Survey:
        """The whole store, from its records (O(store); see :mod:`.view`)."""
        return take_survey(self)

    def survey_upto(self, state: fmt.State | None) -> Survey:
        """:meth:`survey` without the records a reader that read ``state`` must
        not see (see :func:`.format.visible_cap`)."""
        cap = fmt.visible_cap(state, from_records=True)
        s = self.survey()
        if cap is not None:
            s.entries = [e for e in s.entries if not self._unseen(e.seq, e.record is None, cap)]
        return s

    def _unseen(self, seq: int, damaged: bool, cap: int | None) -> bool:
        """Whether a reader whose cap is ``cap`` leaves record ``seq`` out. A valid
        record above the cap was saved after the read began; a damaged one is
        left out only while a batch in flight holds its sequence (it is being
        written), since damage above the high-water mark must still be reported."""
        if cap is None or seq <= cap:
            return False
        if not damaged:
            return True
        state = self.read_state()
        journal = state.journal if state is not None else None
        return journal is not None and journal.op in fmt.BATCH_OPS and journal.lo <= seq

    # -- strict reads -------------------------------------------------------------------

    def latest(self, stream: str, now: datetime) -> StoredRecord | None:
        """The live record of ``stream`` with the highest sequence, read from the
        tail of the stream index: no other record is decoded, whatever the size of
        the stream or the store. Without a usable index, from the records."""
        state = self.heal()
        cap = fmt.visible_cap(state)
        if self._records_only(state):
            return view_latest(self.survey_upto(state), stream, now)
        assert state is not None
        try:
            got = self._latest_indexed(stream, now, cap)
        except IndexDamaged:
            return view_latest(self.survey_upto(state), stream, now)
        if got is None and self._index_missing(state):
            return view_latest(self.survey_upto(state), stream, now)
        orphan = state.orphan
        if orphan is not None and orphan[0] > (got.sequence if got is not None else 0):
            return self._past_orphan(orphan, stream, now, got)
        return got

    def _past_orphan(
        self, orphan: tuple[int, str], stream: str, now: datetime, got: StoredRecord | None
    ) -> StoredRecord | None:
        """A damaged record of unknown stream is newer than ``stream``'s winner: it
        may be that stream's newest, so raise naming it (unless it is gone, or
        readable again and of another stream)."""
        try:
            found = self.load_record(*orphan)
        except CheckpointDecodeError as exc:
            raise orphan_error(exc, stream) from None
        if found is not None and found[0].stream == stream and not found[0].is_expired(now):
            return found[0]
        return got

    def _latest_indexed(self, stream: str, now: datetime, cap: int | None) -> StoredRecord | None:
        sfile = fmt.stream_file_name(stream)
        now_us = fmt.to_micros(now)
        for _ in range(READ_RETRIES):
            idx = self._index_for_read(sfile)
            if idx is None:
                return None
            try:
                with idx:
                    return self._latest_in(idx, stream, now, now_us, cap)
            except _Retry:
                continue
        raise ConcurrentModificationError(
            f"get_latest({stream!r}) was disturbed by concurrent writers {READ_RETRIES} times "
            f"in a row in the file store at {self.root}; retry"
        )

    def _latest_in(
        self, idx: StreamIndex, stream: str, now: datetime, now_us: int, cap: int | None
    ) -> StoredRecord | None:
        dirs: dict[int, int] = {}
        try:
            return self._latest_walk(idx, stream, now, now_us, dirs, cap)
        finally:
            self.close_dirs(dirs)

    def _latest_walk(
        self,
        idx: StreamIndex,
        stream: str,
        now: datetime,
        now_us: int,
        dirs: dict[int, int],
        cap: int | None,
    ) -> StoredRecord | None:
        for pos, slot in idx.walk(idx.count - 1, -1):
            if not slot.live or slot.expired(now_us) or (cap is not None and slot.seq > cap):
                continue
            got = self.load_record(slot.seq, slot.cid, dirs)
            if got is None:
                if self._slot_changed(idx, pos, slot):
                    raise _Retry
                raise self.decode_error(
                    "the stream index lists it but its record file is missing "
                    "(removed outside statekeeper?)",
                    slot.seq,
                    slot.cid,
                )
            record = got[0]
            if record.stream != stream:
                raise self.decode_error(
                    f"the record belongs to stream {record.stream!r}", slot.seq, slot.cid
                )
            if not record.is_expired(now):
                return record
        return None

    def get(self, cid: str, now: datetime) -> StoredRecord | None:
        """The live record ``cid`` via the id table; ``None`` if missing or expired.
        Without a usable id table, from the records."""
        state = self.heal()
        cap = fmt.visible_cap(state)
        if self._records_only(state):
            return view_get(self.survey_upto(state), cid, now)
        try:
            return self._get_indexed(cid, now, cap)
        except IndexDamaged:
            return view_get(self.survey_upto(state), cid, now)

    def _get_indexed(
        self, cid: str, now: datetime, cap: int | None, table: IdTable | None = None
    ) -> StoredRecord | None:
        """Through the id table (``table``, if the caller has it open). Raises
        :class:`IndexDamaged` (so the caller asks the records) when the table says
        something the record files contradict. A record above ``cap`` is not
        shown (see :func:`.format.visible_cap`); an entry above it is still
        checked against the record files, since a damaged entry can say any
        sequence."""
        key = fmt.id_key(cid)
        for attempt in range(READ_RETRIES):
            if table is not None and attempt == 0:
                candidates, deleted, others = table.lookup_checked(key)
            else:
                with self._ids_for_read() as ids:
                    candidates, deleted, others = ids.lookup_checked(key)
            missing: list[int] = []
            hidden = False
            for seq in candidates:
                if cap is not None and seq > cap:
                    if self._record_exists(seq, cid):
                        hidden = True  # saved after this read began, or a batch in flight
                    else:
                        missing.append(seq)
                    continue
                got = self.load_record(seq, cid)
                if got is None:
                    missing.append(seq)
                    continue
                record = got[0]
                return None if record.is_expired(now) else record
            if not missing:
                if not hidden:
                    self._confirm_absent(cid, deleted, others)
                return None
            with self._ids_for_read() as ids:
                again, _, _ = ids.lookup_checked(key)
            if again != candidates:
                continue
            for seq in missing:
                if not self._sequence_exists(seq):
                    # The table names a sequence no file has: ask the records (a
                    # damaged entry); if they have no such id either, the record
                    # was removed outside statekeeper, and that is not "not found".
                    found = view_get(self.survey_upto(self.read_state()), cid, now)
                    if found is not None:
                        return found
                    raise self.decode_error(
                        "the id table lists it but its record file is missing "
                        "(removed outside statekeeper?)",
                        seq,
                        cid,
                    )
            return None  # the entries were other ids with the same 64-bit hash
        raise ConcurrentModificationError(
            f"load({cid!r}) was disturbed by concurrent writers {READ_RETRIES} times in a row "
            f"in the file store at {self.root}; retry"
        )

    def _confirm_absent(self, cid: str, deleted: list[int], others: list[tuple[int, int]]) -> None:
        """Before answering "no such id": the entries on its probe must agree with
        the record files (id-table slots have no checksum). Raises
        :class:`IndexDamaged` if one does not. Costs a directory listing per other
        entry, and only on this path."""
        if any(self._record_exists(seq, cid) for seq in deleted):
            raise IndexDamaged(f"{fmt.IDS_NAME} marks {cid!r} deleted; its record exists")
        for key, seq in others:
            names = self._names_with_seq(seq)
            if names and not any(fmt.id_key(other) == key for other in names):
                raise IndexDamaged(f"{fmt.IDS_NAME}: the entry for sequence {seq} is damaged")

    def _names_with_seq(self, seq: int) -> list[str]:
        """The ids of the record files with sequence ``seq``."""
        bucket = self.bucket(seq)
        if bucket is None:
            return []
        try:
            parsed = map(fmt.parse_record_name, self.io.listdir(bucket))
            return [p[1] for p in parsed if p is not None and p[0] == seq]
        finally:
            self.close_bucket(bucket)

    def _record_exists(self, seq: int, cid: str) -> bool:
        bucket = self.bucket(seq)
        if bucket is None:
            return False
        try:
            self.io.lstat(fmt.record_name(seq, cid), dir_fd=bucket)
        except FileNotFoundError:
            return False
        finally:
            self.close_bucket(bucket)
        return True

    def read_raw(self, cid: str) -> bytes:
        """The stored bytes of ``cid``, unverified (the conformance kit's backdoor)."""
        with self._ids_for_read() as ids:
            candidates = [seq for _, seq in ids.lookup(fmt.id_key(cid))]
        for seq in candidates:
            bucket = self.bucket(seq)
            if bucket is None:
                continue
            try:
                data = self.read_file(bucket, fmt.record_name(seq, cid))
            except RecordProblem as exc:
                raise self.decode_error(exc.reason, seq, cid) from None
            finally:
                self.close_bucket(bucket)
            if data is not None:
                return data
        raise CheckpointNotFound(cid)

    # -- tolerant scans -----------------------------------------------------------------

    def scan(self, query: ScanQuery) -> list[StoredRecord | Skipped]:
        state = self.heal()
        cap = fmt.visible_cap(state)
        if query.stream is None:
            # from the bucket directories: no index needed
            return self._scan_all(query, cap)
        if self._records_only(state):
            return view_scan(self.survey_upto(state), query)
        assert state is not None
        try:
            idx = self._index_for_read(fmt.stream_file_name(query.stream))
            if idx is None:
                if self._index_missing(state):
                    return view_scan(self.survey_upto(state), query)
                return []
            with idx:
                return self._scan_index(idx, query, cap)
        except IndexDamaged:
            return view_scan(self.survey_upto(state), query)

    def _scan_index(
        self, idx: StreamIndex, q: ScanQuery, cap: int | None
    ) -> list[StoredRecord | Skipped]:
        dirs: dict[int, int] = {}
        try:
            return self._scan_slots(idx, q, dirs, cap)
        finally:
            self.close_dirs(dirs)

    def _scan_slots(
        self, idx: StreamIndex, q: ScanQuery, dirs: dict[int, int], cap: int | None
    ) -> list[StoredRecord | Skipped]:
        if q.order == "asc":
            start, step = (0 if q.bound is None else idx.bisect(q.bound, right=True)), 1
        else:
            top = idx.count if q.bound is None else idx.bisect(q.bound, right=False)
            start, step = top - 1, -1
        now_us = fmt.to_micros(q.now)
        out: list[StoredRecord | Skipped] = []
        for pos, slot in idx.walk(start, step, first=min(q.limit + 1, 64)):
            if not slot.live or slot.expired(now_us) or (cap is not None and slot.seq > cap):
                continue
            try:
                got = self.load_record(slot.seq, slot.cid, dirs)
            except CheckpointDecodeError as exc:
                out.append(skipped_from(exc, slot.cid, slot.seq))
            else:
                if got is None:
                    if self._slot_changed(idx, pos, slot):
                        continue  # deleted since we read the slot
                    out.append(
                        self._skipped(
                            slot.seq,
                            slot.cid,
                            self.record_path(slot.seq, slot.cid),
                            "the stream index lists it but its record file is missing",
                        )
                    )
                elif got[0].stream != q.stream:
                    out.append(
                        self._skipped(
                            slot.seq,
                            slot.cid,
                            self.record_path(slot.seq, slot.cid),
                            f"the record belongs to stream {got[0].stream!r}",
                        )
                    )
                elif not _wanted(got[0], q):
                    continue
                else:
                    out.append(got[0])
            if len(out) >= q.limit:
                break
        return out

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
        if _wanted(record, q):
            out.append(record)

    def _stray_temp(self, bfd: int, name: str, location: str) -> bool:
        """A temp file nobody is writing: not the current journal's, and still there."""
        state = self.read_state()
        if state is not None and state.journal is not None and state.journal.tmp == location:
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
        if self._records_only(state) or (state is not None and self._index_missing(state)):
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
        if self._index_missing(state):
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

    # -- helpers ------------------------------------------------------------------------

    def _index_for_read(self, sfile: str) -> StreamIndex | None:
        """Raises :class:`IndexDamaged`, which sends the read to the records."""
        return self.open_index(sfile)

    def _ids_for_read(self) -> Any:
        return self.open_ids()

    def _slot_changed(self, idx: StreamIndex, pos: int, slot: fmt.Slot) -> bool:
        """Whether the index (looked up afresh by name) no longer says ``slot`` at ``pos``."""
        fresh = self.open_index(idx.name)
        if fresh is None:
            return True
        with fresh:
            if fresh.identity != idx.identity or pos >= fresh.count:
                return True
            return fresh.slot(pos) != slot

    def _sequence_exists(self, seq: int) -> bool:
        """Whether any record file has sequence ``seq`` (under any id)."""
        bucket = self.bucket(seq)
        if bucket is None:
            return False
        try:
            prefix = f"{seq:020d}."
            return any(name.startswith(prefix) for name in self.io.listdir(bucket))
        finally:
            self.close_bucket(bucket)

    def _skipped(self, seq: int, cid: str | None, location: str, reason: str) -> Skipped:
        return Skipped.model_construct(
            id=cid,
            sequence=seq,
            location=self.where(location),
            reason=reason,
            error=CheckpointDecodeError.__name__,
        )


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


def _wanted(record: StoredRecord, q: ScanQuery) -> bool:
    if record.is_expired(q.now):
        return False
    tags = record.header.tags
    return all(tags.get(k) == v for k, v in q.tags.items())
