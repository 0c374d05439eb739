"""Recovery of a file store: the lock holder's transaction and journal, restart
recovery, the rebuild and repair, and the index maintenance every write shares.

The stream indexes and the id table are *soft*, derived from the records (SPEC
S3a): :meth:`Rebuild.index` is the one way records enter them, and
:meth:`Recovery.reindex` indexes the record files of ``lo..hi`` again through it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from ..._runtime.inline import WORKER, Budget
from ...errors import CheckpointDecodeError
from ...record import StoredRecord
from . import layout as fmt
from .fdcache import Descriptors
from .files import Files, StateFile, Txn, WriteLock
from .indexes import IdTable, IndexDamaged, StreamIndex, write_index
from .survey import orphans_digest, take_survey

__all__ = ["Rebuild", "Recovery", "slot_of"]

_log = logging.getLogger("statekeeper.backends.file")

#: ``(seq, id, record)`` of record files; ``record`` is ``None`` for a damaged one.
Found = Iterable[tuple[int, str, StoredRecord | None]]


@dataclass(eq=False)
class Rebuild:
    """The rebuild from the records and the index maintenance every write shares."""

    files: Files
    fdcache: Descriptors
    statefile: StateFile
    sync_interval: int

    def rebuild_all(self, tx: Txn, *, drop: bool = False) -> dict[str, Any]:
        """Under the write lock, replace every stream index, the id table and the
        state by ones derived from a :func:`.survey.take_survey`: every record file
        keeps its sequence, a damaged one becomes a damaged entry of its stream (or
        an orphan), never a gap. With ``drop``, first remove the damaged records.
        Whole files, each renamed into place (not :meth:`index` into emptied
        ones): a crash leaves each index old or complete."""
        s = take_survey(self.files)
        self.fdcache.drop()  # every index file is about to be replaced
        dropped = [e for e in s.entries if e.record is None] if drop else []
        self.unlink_records([fmt.Slot(e.seq, e.cid) for e in dropped])
        s.entries = [e for e in s.entries if not (drop and e.record is None)]
        self.remove_temps(0, None)
        by_sfile = _by_sfile(
            (e.stream, fmt.Slot(e.seq, e.cid) if e.record is None else slot_of(e.record))
            for e in s.entries
        )
        f, streams_fd = self.files, self.files.fd("streams")
        for sfile, (stream, slots) in by_sfile.items():
            write_index(f.io, streams_fd, sfile, stream, slots, f.store_id, durable=f.durable)
        for sfile in f.io.listdir(streams_fd):
            ours = sfile.endswith(".idx") or (sfile.startswith(".") and sfile.endswith(".tmp"))
            if ours and sfile not in by_sfile:
                f.unlink_missing_ok(sfile, streams_fd)
        if f.durable:
            f.io.fsync(streams_fd)
        used = self._write_ids([(fmt.id_key(e.cid), e.seq) for e in s.entries])
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
            "records": len(s.entries),
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

    # -- index maintenance, under the lock ---------------------------------------------

    def insert_done(self, tx: Txn, journal: fmt.Journal) -> bool:
        """Whether ``journal`` is a save that completed (a save leaves its entry in
        place; the next operation's replaces it): known from memory when this
        process wrote the current state, else from both indexes."""
        if journal.op != "insert" or journal.path is None:
            return False
        if self.statefile.done_gen == tx.state.gen:
            return True
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
        slots: list[tuple[str | None, fmt.Slot]],
        at: tuple[int, bool] | None = None,
    ) -> int:
        """THE way records enter the derived indexes: each ``(stream, slot)`` into
        its stream index (created if missing; a ``None`` stream: one that already
        holds it) and the id table, the index noted in ``dirty``. Idempotent; a
        missing slot below an index's tail is put in its place. ``at``: the
        id-table position a lone save found with :meth:`IdTable.probe`. Returns how
        many empty id-table slots it took."""
        for sfile, (stream, group) in _by_sfile(slots).items():
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
        """Stream index ``sfile`` open for writing, its torn tail cut; if missing,
        ``None``, or (given ``stream``) created, then counted in ``state`` (a crash
        in between leaves one file more than counted, which the next open counts)."""
        idx = self.fdcache.open_index(sfile, write=True)
        if idx is None:
            if stream is None:
                return None
            f = self.files
            write_index(f.io, f.fd("streams"), sfile, stream, [], f.store_id, durable=f.durable)
            if tx.state.streams is not None:
                tx.commit(extra=tx.state.with_extra(streams=tx.state.streams + 1))
            idx = self.fdcache.open_index(sfile, write=True)
            if idx is None:
                raise IndexDamaged(f"streams/{sfile} vanished right after it was created")
        idx.repair_tail()
        return idx

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

    def advance_sync(self, tx: Txn, ids: IdTable, **changes: Any) -> None:
        """Flush every index ``dirty`` lists and the id table, then move the sync
        mark up to the high-water mark (committing ``changes`` with it)."""
        if self.files.durable:
            for sfile in sorted(self.statefile.dirty_names()):
                idx = self.fdcache.open_index(sfile)
                if idx is not None:
                    with idx:
                        idx.sync()
            ids.sync()
        tx.commit(synced=tx.state.hwm, **changes)
        tx.sync()
        self.statefile.clear_dirty()

    def sync_mark_if_due(self, tx: Txn, ids: IdTable) -> bool:
        """After a complete, durable write: move the sync mark if ``sync_interval``
        records came since the last one. A failed flush is logged, not raised (the
        write stands; the mark stays and a later write tries again). Returns
        whether the mark moved."""
        if tx.state.hwm - tx.state.synced < self.sync_interval:
            return False
        try:
            self.advance_sync(tx, ids)
        except OSError as exc:
            _log.warning("file store %s: flushing the indexes failed: %s", self.files.root, exc)
            return False
        return True

    def remove_temps(self, lo: int, hi: int | None) -> None:
        """Remove the temp files of sequences ``lo..hi`` (``hi=None``: no upper
        bound), under the lock: a write cut short left them (sequences are never
        reused, so no write in flight owns them)."""
        for _, bfd, names in self.files.walk(lo, hi):
            removed = False
            for name in names:
                seq = fmt.parse_temp_name(name)
                if seq is not None and lo <= seq and (hi is None or seq <= hi):
                    self.files.unlink_missing_ok(name, bfd)
                    removed = True
            if removed and self.files.durable:
                self.files.io.fsync(bfd)

    def grown(self, tx: Txn, ids: IdTable, more: int, budget: Budget = WORKER) -> IdTable:
        """``ids``, or, if ``more`` entries would fill it past half, the id table
        rebuilt larger (``ids`` closed; inline, that blocks)."""
        if tx.state.ids_used + more <= ids.capacity // 2:
            return ids
        budget.block()
        entries = [(key, seq) for _, key, seq in ids.entries()]
        ids.close()
        tx.commit(ids_used=self._write_ids(entries))
        return self.fdcache.open_ids(write=True)

    def _write_ids(self, entries: list[tuple[int, int]]) -> int:
        """Replace the id table by one holding ``entries``; returns its used slots."""
        self.fdcache.forget(ids=True)
        f = self.files
        return IdTable.build(f.io, f.fd("root"), entries, f.store_id, durable=f.durable)

    def max_on_disk(self) -> int:
        """The highest sequence of any record or temp file (0 for none)."""
        for _, _, names in self.files.walk(descending=True):
            records = (p[0] for p in map(fmt.parse_record_name, names) if p is not None)
            temps = (s for s in map(fmt.parse_temp_name, names) if s is not None)
            top = max([*records, *temps], default=0)
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


@dataclass(eq=False)
class Recovery:
    """The lock holder's transaction, the journal, restart recovery and repair."""

    files: Files
    fdcache: Descriptors
    statefile: StateFile
    lock: WriteLock
    rebuild: Rebuild

    def txn(self, state: fmt.State | None = None, budget: Budget = WORKER) -> Txn:
        """A transaction over the current state (``state``: the one the caller just
        read under the lock). An unreadable state is rebuilt from the records; a
        torn one (its copy may lag a save) gets the high-water mark of the files
        on disk. Both block."""
        if state is None:
            state = self.statefile.read()
        if state is None:
            budget.block()
            tx = Txn(self.statefile, fmt.State(gen=2))
            self.rebuild.rebuild_all(tx)
            return tx
        if state.torn:
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
        try:
            self.finish(tx, budget)
        except IndexDamaged as exc:
            _log.warning("file store %s: rebuilding its indexes: %s", self.files.root, exc)
            self.rebuild.rebuild_all(tx)
        return tx

    def finish(self, tx: Txn, budget: Budget = WORKER) -> None:
        """Finish the operation the journal names, unless it is a save that
        completed (finishing blocks). Raises :class:`IndexDamaged` where only a
        rebuild can."""
        journal = tx.state.journal
        if journal is None or self.rebuild.insert_done(tx, journal):
            return
        budget.block()
        if journal.op in fmt.BATCH_OPS:
            self.resolve_batch(tx)
        else:
            self.recover_journal(tx)

    def recover_journal(self, tx: Txn) -> None:
        """Finish the insert, update or delete a crashed writer was in the middle
        of (a save whose record never got its final name is gone). Idempotent."""
        journal = tx.state.journal
        assert journal is not None
        if journal.tmp:
            self.rebuild.remove_temps(journal.seq, journal.seq)
        hwm = max(tx.state.hwm, journal.seq, journal.hi)
        if journal.op == "insert" and journal.path:
            # A record under its final name is acknowledged, even damaged: it stays.
            self.reindex(tx, journal.seq, journal.seq)
        elif journal.op == "update" and journal.path and journal.stream:
            for _, _, got in self.records(journal.seq, journal.seq):
                if got is not None:
                    expires = fmt.to_micros(got.header.expires_at)
                    self.rebuild.set_hint(journal.stream, journal.seq, expires, sync=False)
        elif journal.op == "delete" and journal.stream:
            for sfile in filter(None, journal.stream.split(fmt.STREAM_SEP)):
                self._finish_delete(sfile, journal.lo, journal.hi)
        tx.commit(journal=None, hwm=hwm)

    def _finish_delete(self, sfile: str, lo: int, hi: int) -> None:
        idx = self.fdcache.open_index(sfile, write=True)
        if idx is None:
            return
        with idx, self.fdcache.open_ids(write=True) as ids:
            dead = []
            for _, slot in idx.walk(idx.locate(lo, right=False), 1):
                if slot.seq > hi:
                    break
                if not slot.live:
                    dead.append(slot)
            ids.drop(dead)
            self.rebuild.unlink_records(dead)
            self.rebuild.trim_dead(idx)

    def resolve_batch(self, tx: Txn) -> None:
        """Finish (``batched``) or take back (``batch``) the batch in the journal,
        under the lock. ``batched`` is rolled forward over the records that are
        there (one missing was deleted since: a torn write of ``state`` can bring
        back an older journal), so none is ever removed here."""
        journal = tx.state.journal
        assert journal is not None and journal.op in fmt.BATCH_OPS
        lo, hi, done = journal.lo, journal.hi, journal.op == fmt.BATCH_COMMITTED
        what = "finishing save_many or save group" if done else "taking back unfinished save_many"
        _log.warning("file store %s: %s %d..%d", self.files.root, what, lo, hi)
        if not done:
            self.roll_back_batch(tx, lo, hi)
            return
        # A group commit cut short may have left temp files (never renamed).
        self.rebuild.remove_temps(lo, hi)
        self.reindex(tx, lo, hi)
        tx.commit(journal=None, hwm=max(tx.state.hwm, hi))

    def reindex(self, tx: Txn, lo: int, hi: int, found: Found | None = None) -> None:
        """Index the record files of ``lo..hi`` again (``found``: their
        :meth:`records`, if the caller read them) through :meth:`Rebuild.index`.
        A damaged one keeps the slot an index holds for it; one that no index
        names raises :class:`IndexDamaged`: the caller rebuilds, which finds its
        stream."""
        slots: list[tuple[str | None, fmt.Slot]] = []
        for seq, cid, record in self.records(lo, hi) if found is None else found:
            if record is not None:
                slots.append((record.stream, slot_of(record)))
            elif self.rebuild.stream_of(seq, cid) is not None:
                slots.append((None, fmt.Slot(seq, cid)))
            else:
                raise IndexDamaged(f"damaged record {seq} ({cid!r}) is in no stream index")
        if not slots:
            return
        ids = self.fdcache.open_ids(write=True)
        try:
            ids = self.rebuild.grown(tx, ids, len(slots))
            took = self.rebuild.index(tx, ids, slots)
        finally:
            ids.close()
        tx.commit(ids_used=tx.state.ids_used + took)

    def records(self, lo: int, hi: int) -> Iterator[tuple[int, str, StoredRecord | None]]:
        """The :data:`Found` of every record file with ``lo <= seq <= hi``, in order."""
        found = sorted(
            p
            for bucket, _, names in self.files.walk(lo, hi)
            for p in map(fmt.parse_record_name, names)
            if p is not None and lo <= p[0] <= hi and fmt.bucket_of(p[0]) == bucket
        )
        for seq, cid in found:
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
        found = list(self.records(lo, hi))
        files = [fmt.Slot(seq, cid) for seq, cid, _ in found]
        sfiles = set(sfiles or ()) | {fmt.stream_file_name(r.stream) for _, _, r in found if r}
        self.rebuild.unlink_records(files)
        for sfile in sorted(sfiles):
            idx = self.fdcache.open_index(sfile, write=True)
            if idx is not None:
                with idx:
                    idx.repair_tail()
                    # The batch held the highest sequences: its slots are the tail.
                    idx.truncate(idx.locate(lo, right=False))
        with self.fdcache.open_ids(write=True) as ids:
            ids.drop(files)
        tx.commit(journal=None, hwm=max(tx.state.hwm, hi))

    def restart(self, tx: Txn, boot: str | None) -> None:
        """After a machine restart (the boot id in ``state`` is not this boot's), a
        power cut may have lost index writes above the sync mark: drop the slots
        and id entries there whose record did not survive, :meth:`reindex` the
        records there, flush, and move the mark up (recording ``boot``)."""
        lo = tx.state.synced
        hwm = max(tx.state.hwm, self.rebuild.max_on_disk())
        # No write is in flight (the lock is held, and the machine restarted): a
        # temp file above the mark is a save or group commit cut short.
        self.rebuild.remove_temps(lo + 1, None)
        found = list(self.records(lo + 1, hwm))
        present = {seq for seq, _, _ in found}
        sfiles = {fmt.stream_file_name(r.stream) for _, _, r in found if r is not None}
        for sfile in sorted(sfiles | self.statefile.dirty_names()):
            self._drop_lost(tx, sfile, lo, present)
        with self.fdcache.open_ids(write=True) as ids:
            for pos, key, seq in list(ids.entries()):
                if lo < seq <= hwm and seq not in present:
                    ids.tombstone(pos, key, seq)
        self.reindex(tx, lo + 1, hwm, found)
        tx.commit(hwm=hwm)
        with self.fdcache.open_ids() as ids:
            self.rebuild.advance_sync(tx, ids, boot=boot)

    def _drop_lost(self, tx: Txn, sfile: str, lo: int, present: set[int]) -> None:
        """Cut ``sfile``'s slots above the sync mark ``lo`` (written without a flush,
        so read leniently: a power cut may have torn them) down to those whose
        record survived; remove the records of the dead ones among them."""
        idx = self.rebuild.writable_index(tx, sfile, None)  # damaged: the caller rebuilds
        if idx is None:
            return
        with idx:
            start, tail = idx.count, []
            while start > 0:
                slot = idx.read_lenient(start - 1)
                if slot is not None and slot.seq <= lo:
                    break
                start -= 1
                if slot is not None:
                    tail.append(slot)
            tail.reverse()
            keep = sorted((s for s in tail if s.seq in present), key=lambda s: s.seq)
            if keep != tail or len(tail) < idx.count - start:
                idx.truncate(start)
                idx.append_many(keep)
            self.rebuild.unlink_records([s for s in keep if not s.live])

    def repair(self, drop_damaged: bool) -> dict[str, Any]:
        """Under the write lock, finish the journal if it can, then
        :meth:`Rebuild.rebuild_all` (with ``drop_damaged``: removing the damaged
        records)."""
        with self.lock.held():
            tx = self.txn()
            with contextlib.suppress(IndexDamaged):
                self.finish(tx)
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


def _by_sfile(
    slots: Iterable[tuple[str | None, fmt.Slot]],
) -> dict[str, tuple[str, list[fmt.Slot]]]:
    """``slots`` by stream index file: ``{sfile: (stream, slots)}``, in their order;
    a ``None`` stream is left out."""
    out: dict[str, tuple[str, list[fmt.Slot]]] = {}
    for stream, slot in slots:
        if stream is not None:
            out.setdefault(fmt.stream_file_name(stream), (stream, []))[1].append(slot)
    return out
