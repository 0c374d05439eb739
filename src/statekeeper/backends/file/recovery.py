"""Recovery of a file store: the lock holder's transaction, the journal, restart
recovery, the rebuild and repair, and the index maintenance every write shares.

The save path fsyncs only the record file and its directory; the stream indexes
and the id table are *soft*, derived from the records (SPEC S3a). This module
keeps them honest:

- :meth:`Rebuild.index` is THE way records enter the derived indexes: a save, a
  batch, a group commit, and :meth:`Recovery.reindex`, which indexes the record
  files of ``lo..hi`` again (the roll forward of a save or batch a crash cut
  short);
- the one-entry journal in ``state``: every multi-step write names itself there
  first, and the next lock holder finishes it (:meth:`Recovery.recover_pending`);
- the *sync mark*: every ``sync_interval`` saves the indexes written since the
  last mark (listed in ``dirty``) are flushed and the mark moves up;
- restart recovery (:meth:`Recovery.restart`): when the boot id differs from the
  one recorded, a power cut may have lost index writes, so every record above
  the sync mark is indexed again and index entries whose record did not survive
  are dropped;
- :meth:`Rebuild.rebuild_all` (``repair``, and an open that finds damage), which
  rebuilds the indexes, the id table and the state from a
  :func:`.survey.take_survey` of the records: every record file under its final
  name keeps its sequence, a damaged one becomes a damaged entry of its stream
  (or an orphan), never a gap; only ``repair(drop_damaged=True)`` removes them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ..._runtime.inline import WORKER, Budget
from ...errors import CheckpointDecodeError
from ...record import StoredRecord
from . import layout as fmt
from .fdcache import Descriptors
from .files import Files, RecordProblem, StateFile, Txn, WriteLock
from .indexes import IdTable, IndexDamaged, StreamIndex, write_index
from .survey import Entry, orphans_digest, take_survey

__all__ = ["Rebuild", "Recovery", "slot_of"]

_log = logging.getLogger("statekeeper.backends.file")


class Rebuild:
    """The rebuild from the records and the index maintenance every write shares
    (the one :meth:`index`, the sync mark, trims): a part, given the store's
    directory, the descriptor cache and the state file."""

    def __init__(
        self, files: Files, fdcache: Descriptors, statefile: StateFile, *, sync_interval: int
    ) -> None:
        self.files = files
        self.fdcache = fdcache
        self.statefile = statefile
        self.sync_interval = sync_interval

    def rebuild_all(self, tx: Txn, *, drop: bool = False) -> dict[str, Any]:
        """Rebuild every stream index, the id table and the state from the records,
        under the write lock. With ``drop``, first remove the damaged records."""
        s = take_survey(self.files)
        self.fdcache.drop()  # every index file is about to be replaced
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
        streams_fd = self.files.fd("streams")
        for sfile, (stream, slots) in by_sfile.items():
            write_index(
                self.files.io,
                streams_fd,
                sfile,
                stream,
                slots,
                self.files.store_id,
                durable=self.files.durable,
            )
        for sfile in self.files.io.listdir(streams_fd):
            ours = sfile.endswith(".idx") or (sfile.startswith(".") and sfile.endswith(".tmp"))
            if ours and sfile not in by_sfile:
                self.files.unlink_missing_ok(sfile, streams_fd)
        if self.files.durable:
            self.files.io.fsync(streams_fd)
        entries = [(fmt.id_key(e.cid), e.seq) for e in s.entries]
        used = IdTable.build(
            self.files.io,
            self.files.fd("root"),
            entries,
            self.files.store_id,
            durable=self.files.durable,
        )
        self.fdcache.drop()
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
        self.statefile.clear_dirty()
        self.files.forget_buckets()
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
        bfd = self.files.open_dir(self.files.fd("records"), fmt.bucket_name(bucket), create=False)
        if bfd is None:
            return
        try:
            for name in names:
                self.files.unlink_missing_ok(name, bfd)
            if self.files.durable:
                self.files.io.fsync(bfd)
        finally:
            self.files.io.close(bfd)

    # -- index maintenance, under the lock ---------------------------------------------

    def insert_done(self, tx: Txn, journal: fmt.Journal) -> bool:
        """Whether ``journal`` is a save that completed. A save leaves its journal
        entry in place (clearing it would cost a second write of ``state``); the
        next operation's entry replaces it. Checked from memory when this process
        wrote it and nobody wrote since, else by looking at both indexes."""
        if journal.op != "insert" or journal.path is None:
            return False
        if self.statefile.done_gen == tx.state.gen:
            return True  # this process wrote the current state, for this very save
        parsed = fmt.parse_record_name(journal.path.rsplit("/", 1)[-1])
        if parsed is None:
            return False
        seq, cid = parsed
        try:
            idx = self.fdcache.open_index(journal.stream)
            if idx is None:
                return False
            with idx:
                if idx.last_seq() != seq:
                    return False
            with self.fdcache.open_ids() as ids:
                return ids.find(fmt.id_key(cid), seq) is not None
        except IndexDamaged:
            return False

    def index(
        self,
        tx: Txn,
        ids: IdTable,
        slots: list[tuple[str, fmt.Slot]],
        at: tuple[int, bool] | None = None,
    ) -> int:
        """THE way records enter the derived indexes: each ``(stream, slot)`` into
        its stream index (created if missing) and the id table, the index noted in
        ``dirty``. Idempotent: recovery runs it again over the same records. A slot
        below an index's tail that it lacks is put in its place (a state copy that
        lagged). ``at``: the id-table position a lone save found for its new id
        with :meth:`IdTable.probe`. Returns how many empty id-table slots it took."""
        by_sfile: dict[str, tuple[str, list[fmt.Slot]]] = {}
        for stream, slot in slots:
            by_sfile.setdefault(fmt.stream_file_name(stream), (stream, []))[1].append(slot)
        for sfile, (stream, group) in by_sfile.items():
            idx = self.writable_index(tx, sfile, stream)
            assert idx is not None
            with idx:
                last = idx.last_seq()
                idx.append_many([slot for slot in group if slot.seq > last])
                for slot in group:
                    if slot.seq < last and idx.find(slot.seq) is None:
                        start = idx.locate(slot.seq, right=True)
                        tail = idx.read(start, idx.count - start)
                        idx.truncate(start)
                        idx.append_many([slot, *tail])
            self.statefile.mark_dirty(tx.state.synced, sfile)
        if at is not None:
            ((_, slot),) = slots
            ids.put(at[0], fmt.id_key(slot.cid), slot.seq)
            return int(at[1])
        return sum(ids.insert(fmt.id_key(slot.cid), slot.seq) for _, slot in slots)

    def writable_index(self, tx: Txn, sfile: str, stream: str | None) -> StreamIndex | None:
        """Stream index ``sfile`` open for writing, its torn tail repaired; created
        (and counted) if missing and ``stream`` is given, else ``None``."""
        idx = self.fdcache.open_index(sfile, write=True)
        if idx is None:
            if stream is None:
                return None
            self.create_index(tx, sfile, stream)
            idx = self.fdcache.open_index(sfile, write=True)
            if idx is None:
                raise IndexDamaged(f"streams/{sfile} vanished right after it was created")
        idx.repair_tail()
        return idx

    def create_index(self, tx: Txn, sfile: str, stream: str) -> None:
        """Create an empty stream index, then count it in ``state`` (so fewer index
        files than counted means one went missing; a crash in between leaves one
        more file than counted, which the next open counts)."""
        write_index(
            self.files.io,
            self.files.fd("streams"),
            sfile,
            stream,
            [],
            self.files.store_id,
            durable=self.files.durable,
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
        idx = self.fdcache.open_index(sfile, write=True)
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
            bucket = self.files.bucket(group[0].seq)
            if bucket is None:
                continue
            try:
                for slot in group:
                    self.files.unlink_missing_ok(fmt.record_name(slot.seq, slot.cid), bucket)
                if self.files.durable:
                    self.files.io.fsync(bucket)
            finally:
                self.files.close_bucket(bucket)

    def trim_dead(self, idx: StreamIndex) -> None:
        """Cut dead slots off the end, so ``get_latest`` never walks over them."""
        keep = idx.count
        for pos, slot in idx.walk(idx.count - 1, -1):
            if slot.live:
                break
            keep = pos
        if keep < idx.count:
            idx.truncate(keep)

    def _advance_sync(self, tx: Txn, ids: IdTable) -> None:
        """Flush every index written since the last sync mark, then move the mark, so
        recovery after a restart only re-reads the records above it."""
        if self.files.durable:
            for sfile in sorted(self.statefile.dirty_names()):
                idx = self.fdcache.open_index(sfile)
                if idx is not None:
                    with idx:
                        idx.sync()
            ids.sync()
        tx.commit(synced=tx.state.hwm)
        tx.sync()
        self.statefile.clear_dirty()

    def sync_mark_if_due(self, tx: Txn, ids: IdTable) -> bool:
        """After a complete, durable write: move the sync mark if ``sync_interval``
        records came since the last one. A failed flush is logged, not raised (the
        write it follows stands); the mark stays put and a later write tries again.
        Returns whether the mark moved."""
        if tx.state.hwm - tx.state.synced < self.sync_interval:
            return False
        try:
            self._advance_sync(tx, ids)
        except OSError as exc:
            _log.warning("file store %s: flushing the indexes failed: %s", self.files.root, exc)
            return False
        return True

    def remove_temps(self, lo: int, hi: int | None) -> None:
        """Remove the temp files of sequences ``lo..hi`` (``hi=None``: no upper
        bound), under the lock: a write cut short left them (sequences are never
        reused, so no write in flight owns them)."""
        for _, bfd, names in self.files.walk(lo, hi):
            for name in names:
                seq = fmt.parse_temp_name(name)
                if seq is not None and lo <= seq and (hi is None or seq <= hi):
                    self.files.unlink_missing_ok(name, bfd)

    def rebuild_ids(self, tx: Txn) -> IdTable:
        """Build the id table afresh, larger, and return it open for writing."""
        with self.fdcache.open_ids() as old:
            entries = [(key, seq) for _, key, seq in old.entries()]
        self.fdcache.forget(ids=True)
        used = IdTable.build(
            self.files.io,
            self.files.fd("root"),
            entries,
            self.files.store_id,
            durable=self.files.durable,
        )
        tx.commit(ids_used=used)
        return self.fdcache.open_ids(write=True)

    # -- helpers ------------------------------------------------------------------------

    def max_on_disk(self) -> int:
        """The highest sequence of any record or temp file (0 for none)."""
        for _, _, names in self.files.walk(descending=True):
            top = max((s for s in map(_seq_of, names) if s is not None), default=0)
            if top:
                return top
        return 0

    def stream_of(self, seq: int, cid: str) -> str | None:
        """The index holding ``seq`` when its record is too damaged to say (rare: it
        looks through every stream index)."""
        for idx in self.fdcache.readable_indexes():
            with idx:
                pos = idx.find(seq)
                if pos is not None and idx.slot(pos).cid == cid:
                    return idx.name
        return None


class Recovery:
    """The lock holder's transaction, the journal, restart recovery and repair
    (see the module): a part, given the store's directory, the descriptor cache,
    the state file, the write lock and the :class:`Rebuild`."""

    def __init__(
        self,
        files: Files,
        fdcache: Descriptors,
        statefile: StateFile,
        lock: WriteLock,
        rebuild: Rebuild,
    ) -> None:
        self.files = files
        self.fdcache = fdcache
        self.statefile = statefile
        self.lock = lock
        self.rebuild = rebuild

    # -- the lock holder's view ------------------------------------------------------------

    def txn(self, state: fmt.State | None = None, budget: Budget = WORKER) -> Txn:
        """A transaction over the current state (read now, unless the caller just
        read it under the lock and passes it). An unreadable or torn state blocks
        (a rebuild, a write)."""
        if state is None:
            state = self.statefile.read()
        if state is None:
            # Both copies are unreadable (wiped, or a power cut mid-write in fast mode;
            # a new store starts this way too): rebuild everything from the records,
            # the high-water mark included.
            budget.block()
            tx = Txn(self.statefile, fmt.State(gen=2))
            self.rebuild.rebuild_all(tx)
            return tx
        if state.torn:
            # The newer copy is torn, so this one may lag a save: never hand out a
            # sequence that a record on disk already has.
            budget.block()
            state = state.next(hwm=max(state.hwm, self.rebuild.max_on_disk()))
            self.statefile.write(state)
        if state.gen != self.statefile.my_gen:
            self.fdcache.new_epoch()  # another process wrote since: re-validate
        return Txn(self.statefile, state)

    @contextmanager
    def writing(self, budget: Budget = WORKER) -> Iterator[Txn]:
        """The write lock plus the current state, with any crashed journal finished.
        Inline, a lock held elsewhere blocks, and so does a journal to finish."""
        with self.lock.held(wait=not budget.inline) as got:
            if not got:
                budget.block()
            yield self.recover_pending(budget)

    def recover_pending(self, budget: Budget = WORKER) -> Txn:
        """Finish a crashed writer's journal (under the lock); metadata too damaged
        for that is rebuilt from the records."""
        tx = self.txn(budget=budget)
        journal = tx.state.journal
        if journal is not None and not self.rebuild.insert_done(tx, journal):
            budget.block()
            try:
                if journal.op in fmt.BATCH_OPS:
                    self.resolve_batch(tx)
                else:
                    self.recover_journal(tx)
            except IndexDamaged as exc:
                _log.warning("file store %s: rebuilding its indexes: %s", self.files.root, exc)
                self.rebuild.rebuild_all(tx)
        return tx

    def recover_journal(self, tx: Txn) -> None:
        """Finish (or, for a record that never got its bytes, undo) the operation a
        crashed writer was in the middle of. Every step is idempotent."""
        journal = tx.state.journal
        assert journal is not None
        if journal.tmp:
            self._unlink_rel(journal.tmp)
        hwm = max(tx.state.hwm, journal.seq, journal.hi)
        if journal.op == "insert" and journal.path:
            # A record under its final name is acknowledged, even damaged (a power
            # cut in fast mode): it stays, as a damaged entry; a rebuild places it.
            self.reindex(tx, journal.seq, journal.seq)
        elif journal.op == "update" and journal.path:
            got = self._load_rel(journal.path)
            if got is not None and journal.stream:
                self.rebuild.set_hint(
                    journal.stream, journal.seq, fmt.to_micros(got.header.expires_at), sync=False
                )
        elif journal.op == "delete" and journal.stream:
            self._finish_delete(journal)
        tx.commit(journal=None, hwm=hwm)

    def _finish_delete(self, journal: fmt.Journal) -> None:
        for sfile in journal.stream.split(fmt.STREAM_SEP):
            if sfile:
                self._finish_delete_in(sfile, journal)

    def _finish_delete_in(self, sfile: str, journal: fmt.Journal) -> None:
        idx = self.fdcache.open_index(sfile, write=True)
        if idx is None:
            return
        with idx, self.fdcache.open_ids(write=True) as ids:
            dead = []
            for _, slot in idx.walk(idx.locate(journal.lo, right=False), 1):
                if slot.seq > journal.hi:
                    break
                if not slot.live:
                    dead.append(slot)
            for slot in dead:
                key = fmt.id_key(slot.cid)
                at = ids.find(key, slot.seq)
                if at is not None:
                    ids.tombstone(at, key, slot.seq)
            self.rebuild.unlink_records(dead)
            self.rebuild.trim_dead(idx)

    def _load_rel(self, path: str) -> StoredRecord | None:
        """The valid record at a root-relative path, or ``None`` (if missing, or if
        damaged)."""
        parsed = fmt.parse_record_name(path.rsplit("/", 1)[-1])
        if parsed is None:
            return None
        try:
            got = self.files.load_record(*parsed)
        except CheckpointDecodeError:
            return None
        return None if got is None else got[0]

    def _unlink_rel(self, path: str) -> None:
        parts = path.split("/")
        if len(parts) != 3 or parts[0] != fmt.RECORDS_DIR:
            return
        bucket = fmt.parse_bucket_name(parts[1])
        if bucket is None:
            return
        bfd = self.files.open_dir(self.files.fd("records"), parts[1], create=False)
        if bfd is not None:
            try:
                self.files.unlink_missing_ok(parts[2], bfd)
            finally:
                self.files.io.close(bfd)

    # -- save_many and group commits cut short -------------------------------------------

    def resolve_batch(self, tx: Txn) -> None:
        """Finish (``batched``) or take back (``batch``) the batch in the journal;
        under the lock.

        ``batched`` is always rolled forward, over the records that are there: in
        full durability all of them are, and one missing was deleted since (a
        torn write of ``state`` can bring back an older journal), so none is ever
        removed here. A damaged one raises :class:`IndexDamaged`: the caller
        rebuilds, which keeps it as a damaged entry."""
        journal = tx.state.journal
        assert journal is not None and journal.op in fmt.BATCH_OPS
        lo, hi = journal.lo, journal.hi
        if journal.op == fmt.BATCH_COMMITTED:
            # A group commit cut short may have left temp files (never renamed).
            self.rebuild.remove_temps(lo, hi)
            _log.warning(
                "file store %s: finishing save_many or save group %d..%d", self.files.root, lo, hi
            )
            self.reindex(tx, lo, hi)
            tx.commit(journal=None, hwm=max(tx.state.hwm, hi))
            return
        _log.warning(
            "file store %s: taking back unfinished save_many %d..%d", self.files.root, lo, hi
        )
        self.roll_back_batch(tx, lo, hi)

    def reindex(self, tx: Txn, lo: int, hi: int) -> None:
        """Index the record files of sequences ``lo..hi`` again (through
        :meth:`Rebuild.index`, idempotent): the roll forward of a save or a batch a
        crash cut short. A damaged one raises :class:`IndexDamaged`: the caller
        rebuilds, which keeps it as a damaged entry."""
        slots: list[tuple[str, fmt.Slot]] = []
        for seq, cid, record in self.records(lo, hi):
            if record is None:
                raise IndexDamaged(f"record {seq} ({cid!r}) of {lo}..{hi} is damaged")
            slots.append((record.stream, slot_of(record)))
        if not slots:
            return
        ids = self.fdcache.open_ids(write=True)
        try:
            if tx.state.ids_used + len(slots) > ids.capacity // 2:
                ids.close()
                ids = self.rebuild.rebuild_ids(tx)
            took = self.rebuild.index(tx, ids, slots)
        finally:
            ids.close()
        tx.commit(ids_used=tx.state.ids_used + took)

    def files_of(self, lo: int, hi: int) -> list[tuple[int, str]]:
        """``(seq, id)`` of every record file with ``lo <= seq <= hi``, in order."""
        found: list[tuple[int, str]] = []
        for bucket, _, names in self.files.walk(lo, hi):
            for name in names:
                parsed = fmt.parse_record_name(name)
                if (
                    parsed is not None
                    and lo <= parsed[0] <= hi
                    and fmt.bucket_of(parsed[0]) == bucket
                ):
                    found.append(parsed)
        return sorted(found)

    def records(self, lo: int, hi: int) -> Iterator[tuple[int, str, StoredRecord | None]]:
        """``(seq, id, record)`` of every record file with ``lo <= seq <= hi``, in
        sequence order; ``record`` is ``None`` for a damaged one."""
        for seq, cid in self.files_of(lo, hi):
            try:
                got = self.files.load_record(seq, cid)
            except CheckpointDecodeError:
                yield seq, cid, None
                continue
            if got is not None:
                yield seq, cid, got[0]

    def roll_back_batch(self, tx: Txn, lo: int, hi: int, sfiles: set[str] | None = None) -> None:
        """Remove every trace of batch ``lo..hi``: its record files first (flushed,
        so none comes back), then its index slots and id entries, then the
        journal. Its sequences stay used."""
        self.rebuild.remove_temps(lo, hi)
        files = self.files_of(lo, hi)
        sfiles = set(sfiles or ())
        for seq, cid in files:
            with contextlib.suppress(CheckpointDecodeError, RecordProblem, IndexDamaged):
                got = self.files.load_record(seq, cid)
                if got is not None:
                    sfiles.add(fmt.stream_file_name(got[0].stream))
        self.rebuild.unlink_records([fmt.Slot(seq, cid) for seq, cid in files])
        for sfile in sorted(sfiles):
            idx = self.fdcache.open_index(sfile, write=True)
            if idx is not None:
                with idx:
                    idx.repair_tail()
                    # The batch held the highest sequences: its slots are the tail.
                    idx.truncate(idx.locate(lo, right=False))
        with self.fdcache.open_ids(write=True) as ids:
            for seq, cid in files:
                key = fmt.id_key(cid)
                at = ids.find(key, seq)
                if at is not None:
                    ids.tombstone(at, key, seq)
        tx.commit(journal=None, hwm=max(tx.state.hwm, hi))

    # -- after a machine restart ---------------------------------------------------------

    def restart(self, tx: Txn, boot: str | None) -> None:
        """After a machine restart (the boot id in ``state`` is not this boot's),
        index again every record above the sync mark (a power cut may have lost
        unflushed index writes) and drop index entries whose record did not
        survive. A damaged record there that no index names raises
        :class:`IndexDamaged`, so the caller rebuilds (which finds its stream)."""
        lo = tx.state.synced
        hwm = max(tx.state.hwm, self.rebuild.max_on_disk())
        # No write is in flight (the lock is held, and the machine restarted): a
        # temp file above the mark is a save or group commit cut short.
        self.rebuild.remove_temps(lo + 1, None)
        found: dict[str, list[StoredRecord]] = {}
        present: set[int] = set()
        damaged: list[tuple[int, str]] = []
        for seq, cid, record in self.records(lo + 1, hwm):
            present.add(seq)
            if record is None:
                damaged.append((seq, cid))
            else:
                found.setdefault(fmt.stream_file_name(record.stream), []).append(record)
        for sfile in set(found) | self.statefile.dirty_names():
            recs = found.get(sfile, [])
            self._merge_tail(tx, sfile, recs[0].stream if recs else None, lo, recs, present)
        for seq, cid in damaged:
            if self.rebuild.stream_of(seq, cid) is None:
                raise IndexDamaged(f"damaged record {seq} is in no stream index")
        used = tx.state.ids_used
        with self.fdcache.open_ids(write=True) as ids:
            for pos, key, seq in list(ids.entries()):
                if lo < seq <= hwm and seq not in present:
                    ids.tombstone(pos, key, seq)
            for recs in found.values():
                for record in recs:
                    used += ids.insert(fmt.id_key(record.id), record.sequence)
            for seq, cid in damaged:
                used += ids.insert(fmt.id_key(cid), seq)
            if self.files.durable:
                ids.sync()
        tx.commit(hwm=hwm, synced=hwm, boot=boot, ids_used=used)
        tx.sync()
        self.statefile.clear_dirty()

    def _merge_tail(
        self,
        tx: Txn,
        sfile: str,
        stream: str | None,
        lo: int,
        records: list[StoredRecord],
        present: set[int],
    ) -> None:
        """Index ``sfile``'s slots above the sync mark ``lo`` again: the records
        there, less the slots whose record did not survive."""
        idx = self.rebuild.writable_index(tx, sfile, stream)  # damaged: the caller rebuilds
        if idx is None:
            return
        with idx:
            # Walk back to the last slot at or below the sync mark: everything after
            # it was written without an fsync and may be torn (a power cut), so it is
            # read leniently and rebuilt from the records.
            start, tail = idx.count, []
            while start > 0:
                slot = idx.read_lenient(start - 1)
                if slot is not None and slot.seq <= lo:
                    break
                start -= 1
                if slot is not None:
                    tail.append(slot)
            tail.reverse()
            garbage = len(tail) < idx.count - start
            keep = [s for s in tail if s.seq in present]
            doomed = [s for s in keep if not s.live]
            have = {s.seq for s in keep}
            keep += [slot_of(r) for r in records if r.sequence not in have]
            keep.sort(key=lambda s: s.seq)
            if keep != tail or garbage:
                idx.truncate(start)
                idx.append_many(keep)
            self.rebuild.unlink_records(doomed)
            if self.files.durable:
                idx.sync()

    def repair(self, drop_damaged: bool) -> dict[str, Any]:
        """Rebuild the indexes, the id table and the state from the record files,
        keeping damaged records as damaged entries (or, with ``drop_damaged``,
        removing their files). Takes the write lock for the whole pass."""
        with self.lock.held():
            tx = self.txn()
            journal = tx.state.journal
            if journal is not None and not self.rebuild.insert_done(tx, journal):
                with contextlib.suppress(IndexDamaged):
                    if journal.op in fmt.BATCH_OPS:
                        self.resolve_batch(tx)
                    else:
                        self.recover_journal(tx)
            return self.rebuild.rebuild_all(tx, drop=drop_damaged)

    def delete_orphan_done(self, tx: Txn, seqs: list[int]) -> None:
        """After deleting records by id: if one was the newest damaged record of
        unknown stream, find the next one (a rebuild; rare)."""
        orphan = tx.state.orphan
        if orphan is not None and orphan[0] in seqs:
            self.rebuild.rebuild_all(tx)


def slot_of(record: StoredRecord) -> fmt.Slot:
    """The index slot of ``record``."""
    return fmt.Slot(record.sequence, record.id, fmt.to_micros(record.header.expires_at))


def _seq_of(name: str) -> int | None:
    parsed = fmt.parse_record_name(name)
    if parsed is not None:
        return parsed[0]
    return fmt.parse_temp_name(name)
