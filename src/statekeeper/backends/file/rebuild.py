"""Rebuilding a file store's derived data from its records; the checks that decide,
when a store is opened, whether that is needed; the index maintenance every write
shares (the sync mark and ``dirty``, new index entries, trims).

Records are the truth (SPEC S3a): the stream indexes, the id table and the state
are rebuilt from a :func:`.survey.take_survey` of the record files, and every
record file under its final name keeps its sequence: a damaged one becomes a
damaged entry of its stream (or an orphan), never a gap. Only ``drop=True``
(``repair(drop_damaged=True)``) removes damaged records. The open-time checks are
cheap (no record is read); damage they cannot see (a corrupt slot in the middle
of an index) is met by the reads, which answer from the records (:mod:`.view`),
and reported by ``verify``.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from typing import Any

from ...errors import CheckpointDecodeError
from . import layout as fmt
from .core import EngineCore, Txn
from .id_table import IdTable
from .io import read_exact
from .orphans import orphans_digest
from .stream_index import IndexDamaged, StreamIndex, write_index
from .survey import Entry, take_survey

__all__ = ["Rebuild", "index_names"]

_log = logging.getLogger("statekeeper.backends.file")


class Rebuild:
    """The rebuild from the records, the open-time checks and the index maintenance
    every write shares: a part, given the engine's core."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def rebuild_all(self, tx: Txn, *, drop: bool = False) -> dict[str, Any]:
        """Rebuild every stream index, the id table and the state from the records,
        under the write lock. With ``drop``, first remove the damaged records."""
        s = take_survey(self.core)
        self.core.descriptors.drop()  # every index file is about to be replaced
        dropped: list[Entry] = []
        if drop:
            dropped = [e for e in s.entries if e.record is None]
            self._unlink_entries(dropped)
            s.entries = [e for e in s.entries if e.record is not None]
        for bucket, name in s.temps + s.empty_temps:
            self._unlink_in_bucket(bucket, [name])
        by_sfile: dict[str, tuple[str, list[fmt.Slot]]] = {}
        for e in s.entries:
            if e.stream is None:
                continue
            expires = fmt.to_micros(e.record.header.expires_at) if e.record is not None else 0
            by_sfile.setdefault(fmt.stream_file_name(e.stream), (e.stream, []))[1].append(
                fmt.Slot(e.seq, e.cid, expires)
            )
        streams_fd = self.core.fd("streams")
        for sfile, (stream, slots) in by_sfile.items():
            write_index(
                self.core.io,
                streams_fd,
                sfile,
                stream,
                slots,
                self.core.store_id,
                durable=self.core.durable,
            )
        for sfile in self.core.io.listdir(streams_fd):
            ours = sfile.endswith(".idx") or (sfile.startswith(".") and sfile.endswith(".tmp"))
            if ours and sfile not in by_sfile:
                self.core.unlink_missing_ok(sfile, streams_fd)
        if self.core.durable:
            self.core.io.fsync(streams_fd)
        entries = [(fmt.id_key(e.cid), e.seq) for e in s.entries]
        used = IdTable.build(
            self.core.io,
            self.core.fd("root"),
            entries,
            self.core.store_id,
            durable=self.core.durable,
        )
        self.core.descriptors.drop()
        orphans = s.orphans
        newest = max(orphans, key=lambda e: e.seq) if orphans else None
        hwm = max(s.top, tx.state.hwm)
        extra = tx.state.with_extra(
            streams=len(by_sfile),
            orphan=None if newest is None else [newest.seq, newest.cid],
            orphans=orphans_digest((e.seq, e.cid) for e in orphans) if orphans else None,
        )
        tx.commit(hwm=hwm, synced=hwm, ids_used=used, journal=None, extra=extra)
        tx.sync()
        self.core.io.ftruncate(self.core.fd("dirty"), 0)
        self.core.dirty_noted = frozenset()
        self.core.buckets_listed = None
        return {
            "records": len(entries),
            "streams": len(by_sfile),
            "damaged": sum(1 for e in s.entries if e.record is None),
            "orphans": len(orphans),
            "dropped": [(e.seq, e.cid, e.error) for e in dropped],
            "temps": len(s.temps),
            "state": s.state_problem,
            "ids": s.ids_damaged,
            "indexes": sorted(i.sfile for i in s.indexes.values() if i.damaged),
            "high_water_mark": hwm,
        }

    def _unlink_entries(self, entries: list[Entry]) -> None:
        by_bucket: dict[int, list[str]] = {}
        for e in entries:
            by_bucket.setdefault(fmt.bucket_of(e.seq), []).append(fmt.record_name(e.seq, e.cid))
        for bucket, names in by_bucket.items():
            self._unlink_in_bucket(bucket, names)

    def _unlink_in_bucket(self, bucket: int, names: list[str]) -> None:
        bfd = self.core.open_dir(self.core.fd("records"), fmt.bucket_name(bucket), create=False)
        if bfd is None:
            return
        try:
            for name in names:
                self.core.unlink_missing_ok(name, bfd)
            if self.core.durable:
                self.core.io.fsync(bfd)
        finally:
            self.core.io.close(bfd)

    # -- open-time checks ---------------------------------------------------------------

    def damage_at_open(self, tx: Txn) -> list[str]:
        """What is wrong with the derived data, from cheap checks (under the lock).
        Also records the stream count in a store that has none yet."""
        reasons: list[str] = []
        try:
            self.core.open_ids().close()
        except IndexDamaged as exc:
            reasons.append(str(exc))
        files = len(self.core.index_files())
        want = tx.state.streams
        if want is not None and files < want:
            reasons.append(f"{want - files} stream index file(s) are missing")
        elif want is None or files > want:
            tx.commit(extra=tx.state.with_extra(streams=files))
        top = self.max_on_disk()
        if top > tx.state.hwm:
            reasons.append(f"record {top} is above the high-water mark {tx.state.hwm}")
        return reasons

    def damage_read_only(self) -> str | None:
        """Why this read-only open cannot trust the indexes (``None``: it can). The
        same checks as a writable open makes, plus the work a writable open would
        do first: a save the journal has not finished, and records above the sync
        mark after a machine restart that are not indexed."""
        if "streams" not in self.core.fd_table:
            return "the streams directory is missing"
        state = self.core.read_state()
        if state is None:
            return "the state file is missing or unreadable"
        if state.torn:
            return "a copy of the state file is damaged"
        try:
            self.core.open_ids().close()
        except IndexDamaged as exc:
            return str(exc)
        if state.streams is not None and len(self.core.index_files()) < state.streams:
            return "a stream index file is missing"
        if self.max_on_disk() > state.hwm:
            return "a record is above the high-water mark"
        journal = state.journal
        if (
            journal is not None
            and journal.op == "insert"
            and not self.insert_done(Txn(self.core, state), journal)
        ):
            return "the last save is not indexed yet (a writer crashed)"
        if journal is not None and journal.op == fmt.BATCH_COMMITTED:
            # Its records are complete and durable; its index entries may not be.
            return "the last save_many is not indexed yet (a writer crashed)"
        boot = self.core.io.boot_id()
        if boot is None or boot != state.boot:
            try:
                if not self._indexed_above(state.synced, state.hwm):
                    return "records above the sync mark are not indexed (a machine restart)"
            except IndexDamaged as exc:
                return str(exc)
        return None

    def _indexed_above(self, lo: int, hi: int) -> bool:
        """Whether every record file with ``lo < seq <= hi`` is in its stream index
        and the id table (at most ``sync_interval`` records are read)."""
        records = self.core.fd("records")
        buckets = [
            b
            for b in map(fmt.parse_bucket_name, self.core.io.listdir(records))
            if b is not None and fmt.bucket_of(lo + 1) <= b <= fmt.bucket_of(hi)
        ]
        for bucket in buckets:
            bfd = self.core.open_dir(records, fmt.bucket_name(bucket), create=False)
            if bfd is None:
                continue
            try:
                names = [p for n in self.core.io.listdir(bfd) if (p := fmt.parse_record_name(n))]
            finally:
                self.core.io.close(bfd)
            for seq, cid in names:
                if lo < seq <= hi and not self._is_indexed(seq, cid):
                    return False
        return True

    def _is_indexed(self, seq: int, cid: str) -> bool:
        with self.core.open_ids() as ids:
            if ids.find(fmt.id_key(cid), seq) is None:
                return False
        try:
            got = self.core.load_record(seq, cid)
        except CheckpointDecodeError:
            return False
        if got is None:
            return True  # deleted since the listing
        idx = self.core.open_index(fmt.stream_file_name(got[0].stream))
        if idx is None:
            return False
        with idx:
            return idx.find(seq) is not None

    # -- index maintenance, under the lock ---------------------------------------------

    def insert_done(self, tx: Txn, journal: fmt.Journal) -> bool:
        """Whether ``journal`` is a save that completed. A save leaves its journal
        entry in place (clearing it would cost a second write of ``state``); the
        next operation's entry replaces it. Checked from memory when this process
        wrote it and nobody wrote since, else by looking at both indexes."""
        if journal.op != "insert" or journal.path is None:
            return False
        if self.core.done_gen == tx.state.gen:
            return True  # this process wrote the current state, for this very save
        parsed = fmt.parse_record_name(journal.path.rsplit("/", 1)[-1])
        if parsed is None:
            return False
        seq, cid = parsed
        try:
            idx = self.core.open_index(journal.stream)
            if idx is None:
                return False
            with idx:
                if idx.last_seq() != seq:
                    return False
            with self.core.open_ids() as ids:
                return ids.find(fmt.id_key(cid), seq) is not None
        except IndexDamaged:
            return False

    def index_new(
        self,
        tx: Txn,
        ids: IdTable,
        sfile: str,
        stream: str,
        slot: fmt.Slot,
        key: int,
        at: tuple[int, bool] | None = None,
    ) -> int:
        """Add ``slot`` to its stream index and the id table; idempotent (recovery
        runs it again). ``at`` is the id-table position a save found with
        :meth:`IdTable.probe` for its new id. Returns 1 if an empty slot was used."""
        idx = self.core.open_index(sfile, write=True)
        if idx is None:
            self.create_index(tx, sfile, stream)
            idx = self.core.open_index(sfile, write=True)
            if idx is None:
                raise IndexDamaged(f"streams/{sfile} vanished right after it was created")
        with idx:
            idx.repair_tail()
            last = idx.last_seq()
            if last < slot.seq:
                idx.append(slot)
            elif last != slot.seq and idx.find(slot.seq) is None:
                # Recovery of an older save than the index's tail (a state copy that
                # lagged): put the slot in its place.
                start = idx.bisect(slot.seq, right=True)
                tail = idx.read(start, idx.count - start)
                idx.truncate(start)
                for one in (slot, *tail):
                    idx.append(one)
        if at is None:
            took = int(ids.insert(key, slot.seq))
        else:
            ids.put(at[0], key, slot.seq)
            took = int(at[1])
        self.mark_dirty(tx, sfile)
        return took

    def create_index(self, tx: Txn, sfile: str, stream: str) -> None:
        """Create an empty stream index, then count it in ``state`` (so fewer index
        files than counted means one went missing; a crash in between leaves one
        more file than counted, which the next open counts)."""
        StreamIndex.create(
            self.core.io,
            self.core.fd("streams"),
            sfile,
            stream,
            self.core.store_id,
            durable=self.core.durable,
        )
        count = tx.state.streams
        if count is not None:
            tx.commit(extra=tx.state.with_extra(streams=count + 1))

    def uncount_index(self, tx: Txn) -> None:
        """Count one index fewer, before removing it (a crash in between makes the
        next open rebuild, never miss a missing index)."""
        count = tx.state.streams
        if count:
            tx.commit(extra=tx.state.with_extra(streams=count - 1))

    def set_hint(self, sfile: str, seq: int, expires: int, *, sync: bool) -> None:
        idx = self.core.open_index(sfile, write=True)
        if idx is None:
            return
        with idx:
            pos = idx.find(seq)
            if pos is None:
                return
            slot = idx.slot(pos)
            if slot.expires != expires:
                idx.write(pos, replace(slot, expires=expires))
                if sync:
                    idx.sync()

    def unlink_records(self, slots: list[fmt.Slot]) -> None:
        by_bucket: dict[int, list[fmt.Slot]] = {}
        for slot in slots:
            by_bucket.setdefault(fmt.bucket_of(slot.seq), []).append(slot)
        for group in by_bucket.values():
            bucket = self.core.bucket(group[0].seq)
            if bucket is None:
                continue
            try:
                for slot in group:
                    self.core.unlink_missing_ok(fmt.record_name(slot.seq, slot.cid), bucket)
                if self.core.durable:
                    self.core.io.fsync(bucket)
            finally:
                self.core.close_bucket(bucket)

    def trim_dead(self, idx: StreamIndex) -> None:
        """Cut dead slots off the end, so ``get_latest`` never walks over them."""
        keep = idx.count
        for pos, slot in idx.walk(idx.count - 1, -1):
            if slot.live:
                break
            keep = pos
        if keep < idx.count:
            idx.truncate(keep)

    def mark_dirty(self, tx: Txn, sfile: str) -> None:
        """Note (once per sync epoch and process) that ``sfile`` has unflushed appends."""
        if self.core.dirty_epoch != tx.state.synced:
            self.core.dirty_epoch = tx.state.synced
            self.core.dirty_noted = frozenset()
        if sfile not in self.core.dirty_noted:
            self.core.io.write(self.core.fd("dirty"), sfile.encode("ascii") + b"\n")
            self.core.dirty_noted = self.core.dirty_noted | {sfile}

    def _advance_sync(self, tx: Txn, ids: IdTable) -> None:
        """Flush every index written since the last sync mark, then move the mark, so
        recovery after a restart only re-reads the records above it."""
        dirty_fd = self.core.fd("dirty")
        if self.core.durable:
            size = self.core.io.fstat(dirty_fd).st_size
            names = index_names(
                read_exact(self.core.io, dirty_fd, size, 0).decode("ascii", "replace")
            )
            for sfile in sorted(names):
                idx = self.core.open_index(sfile)
                if idx is not None:
                    with idx:
                        idx.sync()
            ids.sync()
        tx.commit(synced=tx.state.hwm)
        tx.sync()
        self.core.io.ftruncate(dirty_fd, 0)

    def sync_mark_if_due(self, tx: Txn, ids: IdTable) -> bool:
        """After a complete, durable write: move the sync mark if ``sync_interval``
        records came since the last one. A failed flush is logged, not raised (the
        write it follows stands); the mark stays put and a later write tries again.
        Returns whether the mark moved."""
        if tx.state.hwm - tx.state.synced < self.core.sync_interval:
            return False
        try:
            self._advance_sync(tx, ids)
        except OSError as exc:
            _log.warning("file store %s: flushing the indexes failed: %s", self.core.root, exc)
            return False
        return True

    def remove_temps(self, lo: int, hi: int | None) -> None:
        """Remove the temp files of sequences ``lo..hi`` (``hi=None``: no upper
        bound), under the lock: a write cut short left them (sequences are never
        reused, so no write in flight owns them)."""
        records = self.core.fd("records")
        first = fmt.bucket_of(lo)
        for number in sorted(
            b for b in map(fmt.parse_bucket_name, self.core.io.listdir(records)) if b is not None
        ):
            if number < first or (hi is not None and number > fmt.bucket_of(hi)):
                continue
            bfd = self.core.open_dir(records, fmt.bucket_name(number), create=False)
            if bfd is None:
                continue
            try:
                for name in self.core.io.listdir(bfd):
                    seq = fmt.parse_temp_name(name)
                    if seq is not None and lo <= seq and (hi is None or seq <= hi):
                        self.core.unlink_missing_ok(name, bfd)
            finally:
                self.core.io.close(bfd)

    def rebuild_ids(self, tx: Txn) -> IdTable:
        """Build the id table afresh, larger, and return it open for writing."""
        with self.core.open_ids() as old:
            entries = [(key, seq) for _, key, seq in old.entries()]
        self.core.forget(ids=True)
        used = IdTable.build(
            self.core.io,
            self.core.fd("root"),
            entries,
            self.core.store_id,
            durable=self.core.durable,
        )
        tx.commit(ids_used=used)
        return self.core.open_ids(write=True)

    @staticmethod
    def quietly(action: Any) -> None:
        """Run a best-effort cleanup step; a failure is left to the journal."""
        with contextlib.suppress(Exception):
            action()

    # -- helpers ------------------------------------------------------------------------

    def max_on_disk(self) -> int:
        """The highest sequence of any record or temp file (0 for none)."""
        records = self.core.fd_table.get("records")
        if records is None:
            return 0
        buckets = sorted(
            (b for b in map(fmt.parse_bucket_name, self.core.io.listdir(records)) if b is not None),
            reverse=True,
        )
        for bucket in buckets:
            try:
                bfd = self.core.open_dir(records, fmt.bucket_name(bucket), create=False)
            except IndexDamaged:
                continue
            if bfd is None:
                continue
            try:
                seqs = [_seq_of(name) for name in self.core.io.listdir(bfd)]
            finally:
                self.core.io.close(bfd)
            top = max((s for s in seqs if s is not None), default=0)
            if top:
                return top
        return 0

    def stream_of(self, seq: int, cid: str) -> str | None:
        """The index holding ``seq`` when its record is too damaged to say (rare: it
        looks through every stream index)."""
        for idx in self.core.readable_indexes():
            with idx:
                pos = idx.find(seq)
                if pos is not None and idx.slot(pos).cid == cid:
                    return idx.name
        return None


def _seq_of(name: str) -> int | None:
    parsed = fmt.parse_record_name(name)
    if parsed is not None:
        return parsed[0]
    return fmt.parse_temp_name(name)


def index_names(text: str) -> set[str]:
    """The index file names listed in ``dirty``, one a line. A power cut can tear
    its last append (zeros where the bytes were lost): NULs separate names too,
    and anything that is not a plain index file name is left out."""
    return {
        name
        for name in text.replace("\x00", "\n").split()
        if name.endswith(".idx") and "/" not in name and not name.startswith(".")
    }
