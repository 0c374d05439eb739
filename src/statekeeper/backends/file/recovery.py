"""Recovery and index maintenance of the file backend's engine.

The save path fsyncs only the record file and its directory; the stream indexes
and the id table are *soft*. This module holds what keeps them honest:

- the one-entry journal in ``state``: every multi-step write names itself there
  first, and the next lock holder finishes it (a record that made it to its final
  name is indexed, a temp file is removed, a half-done delete is completed);
- the *sync mark*: every ``sync_interval`` saves the indexes written since the
  last mark (listed in ``dirty``) are flushed and the mark moves up;
- restart recovery: when the boot id differs from the one recorded, a power cut
  may have lost index writes, so every record above the sync mark is indexed
  again and index entries whose record did not survive are dropped;
- :meth:`RecoveryMixin.repair` and the rebuild on open, which rebuild both
  indexes, the id table and the state from the records (see :mod:`.survey`),
  keeping every damaged record as a damaged entry.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ...errors import CheckpointDecodeError
from ...record import StoredRecord
from . import format as fmt
from .budget import WORKER, Budget
from .core import RecordProblem, Txn
from .index import IdTable, IndexDamaged, StreamIndex
from .io import read_exact
from .rebuild import RebuildMixin

__all__ = ["RecoveryMixin"]

_log = logging.getLogger("statekeeper.backends.file")


class RecoveryMixin(RebuildMixin):
    """Journal, sync mark, restart recovery and repair. See the module docstring."""

    _dirty_epoch = -1
    _dirty: frozenset[str] = frozenset()
    #: The state generation of the last save this process completed (see _insert_done).
    _done_gen = -1

    # -- the lock holder's view ------------------------------------------------------------

    def _txn(self, state: fmt.State | None = None, budget: Budget = WORKER) -> Txn:
        """A transaction over the current state (read now, unless the caller just
        read it under the lock and passes it). An unreadable or torn state blocks
        (a rebuild, a write)."""
        if state is None:
            state = self.read_state()
        if state is None:
            # Both copies are unreadable (wiped, or a power cut mid-write in fast mode;
            # a new store starts this way too): rebuild everything from the records,
            # the high-water mark included.
            budget.block()
            tx = Txn(self, fmt.State(gen=2))
            self._rebuild_all(tx)
            return tx
        if state.torn:
            # The newer copy is torn, so this one may lag a save: never hand out a
            # sequence that a record on disk already has.
            budget.block()
            state = state.next(hwm=max(state.hwm, self._max_on_disk()))
            self.write_state(state)
        if state.gen != self._my_gen:
            self.descriptors.epoch += 1  # another process wrote since: re-validate cached handles
        return Txn(self, state)

    @contextmanager
    def writing(self, budget: Budget = WORKER) -> Iterator[Txn]:
        """The write lock plus the current state, with any crashed journal finished.
        Inline, a lock held elsewhere blocks, and so does a journal to finish."""
        with self.locked(wait=not budget.inline) as got:
            if not got:
                budget.block()
            yield self.recover_pending(budget)

    def recover_pending(self, budget: Budget = WORKER) -> Txn:
        """Finish a crashed writer's journal (under the lock); metadata too damaged
        for that is rebuilt from the records."""
        tx = self._txn(budget=budget)
        journal = tx.state.journal
        if journal is not None and not self._insert_done(tx, journal):
            budget.block()
            try:
                if journal.op in fmt.BATCH_OPS:
                    self._resolve_batch(tx)
                else:
                    self._recover_journal(tx)
            except IndexDamaged as exc:
                _log.warning("file store %s: rebuilding its indexes: %s", self.root, exc)
                self._rebuild_all(tx)
        return tx

    def _resolve_batch(self, tx: Txn) -> None:
        """Finish or take back a crashed ``save_many`` (the batch mixin has it)."""
        raise NotImplementedError

    def _insert_done(self, tx: Txn, journal: fmt.Journal) -> bool:
        """Whether ``journal`` is a save that completed. A save leaves its journal
        entry in place (clearing it would cost a second write of ``state``); the
        next operation's entry replaces it. Checked from memory when this process
        wrote it and nobody wrote since, else by looking at both indexes."""
        if journal.op != "insert" or journal.path is None:
            return False
        if self._done_gen == tx.state.gen:
            return True  # this process wrote the current state, for this very save
        parsed = fmt.parse_record_name(journal.path.rsplit("/", 1)[-1])
        if parsed is None:
            return False
        seq, cid = parsed
        try:
            idx = self.open_index(journal.stream)
            if idx is None:
                return False
            with idx:
                if idx.last_seq() != seq:
                    return False
            with self.open_ids() as ids:
                return ids.find(fmt.id_key(cid), seq) is not None
        except IndexDamaged:
            return False

    def _index_new(
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
        idx = self.open_index(sfile, write=True)
        if idx is None:
            self._create_index(tx, sfile, stream)
            idx = self.open_index(sfile, write=True)
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
        self._mark_dirty(tx, sfile)
        return took

    def _create_index(self, tx: Txn, sfile: str, stream: str) -> None:
        """Create an empty stream index, then count it in ``state`` (so fewer index
        files than counted means one went missing; a crash in between leaves one
        more file than counted, which the next open counts)."""
        StreamIndex.create(
            self.io, self.fd("streams"), sfile, stream, self.store_id, durable=self.durable
        )
        count = tx.state.streams
        if count is not None:
            tx.commit(extra=tx.state.with_extra(streams=count + 1))

    def _uncount_index(self, tx: Txn) -> None:
        """Count one index fewer, before removing it (a crash in between makes the
        next open rebuild, never miss a missing index)."""
        count = tx.state.streams
        if count:
            tx.commit(extra=tx.state.with_extra(streams=count - 1))

    def _set_hint(self, sfile: str, seq: int, expires: int, *, sync: bool) -> None:
        idx = self.open_index(sfile, write=True)
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

    def _unlink_records(self, slots: list[fmt.Slot]) -> None:
        by_bucket: dict[int, list[fmt.Slot]] = {}
        for slot in slots:
            by_bucket.setdefault(fmt.bucket_of(slot.seq), []).append(slot)
        for group in by_bucket.values():
            bucket = self.bucket(group[0].seq)
            if bucket is None:
                continue
            try:
                for slot in group:
                    self.unlink_missing_ok(fmt.record_name(slot.seq, slot.cid), bucket)
                if self.durable:
                    self.io.fsync(bucket)
            finally:
                self.close_bucket(bucket)

    def _trim(self, idx: StreamIndex) -> None:
        """Cut dead slots off the end, so ``get_latest`` never walks over them."""
        keep = idx.count
        for pos, slot in idx.walk(idx.count - 1, -1):
            if slot.live:
                break
            keep = pos
        if keep < idx.count:
            idx.truncate(keep)

    def _mark_dirty(self, tx: Txn, sfile: str) -> None:
        """Note (once per sync epoch and process) that ``sfile`` has unflushed appends."""
        if self._dirty_epoch != tx.state.synced:
            self._dirty_epoch = tx.state.synced
            self._dirty = frozenset()
        if sfile not in self._dirty:
            self.io.write(self.fd("dirty"), sfile.encode("ascii") + b"\n")
            self._dirty = self._dirty | {sfile}

    def _advance_sync(self, tx: Txn, ids: IdTable) -> None:
        """Flush every index written since the last sync mark, then move the mark, so
        recovery after a restart only re-reads the records above it."""
        dirty_fd = self.fd("dirty")
        if self.durable:
            size = self.io.fstat(dirty_fd).st_size
            names = _index_names(read_exact(self.io, dirty_fd, size, 0).decode("ascii", "replace"))
            for sfile in sorted(names):
                idx = self.open_index(sfile)
                if idx is not None:
                    with idx:
                        idx.sync()
            ids.sync()
        tx.commit(synced=tx.state.hwm)
        tx.sync()
        self.io.ftruncate(dirty_fd, 0)

    def _sync_mark_if_due(self, tx: Txn, ids: IdTable) -> bool:
        """After a complete, durable write: move the sync mark if ``sync_interval``
        records came since the last one. A failed flush is logged, not raised (the
        write it follows stands); the mark stays put and a later write tries again.
        Returns whether the mark moved."""
        if tx.state.hwm - tx.state.synced < self.sync_interval:
            return False
        try:
            self._advance_sync(tx, ids)
        except OSError as exc:
            _log.warning("file store %s: flushing the indexes failed: %s", self.root, exc)
            return False
        return True

    def _recover_journal(self, tx: Txn) -> None:
        """Finish (or, for a record that never got its bytes, undo) the operation a
        crashed writer was in the middle of. Every step is idempotent."""
        journal = tx.state.journal
        assert journal is not None
        if journal.tmp:
            self._unlink_rel(journal.tmp)
        hwm = max(tx.state.hwm, journal.seq, journal.hi)
        if journal.op == "insert" and journal.path:
            self._roll_insert_forward(tx, journal)
        elif journal.op == "update" and journal.path:
            got = self._load_rel(journal.path)
            if got is not None and journal.stream:
                self._set_hint(
                    journal.stream, journal.seq, fmt.to_micros(got.header.expires_at), sync=False
                )
        elif journal.op == "delete" and journal.stream:
            self._finish_delete(journal)
        tx.commit(journal=None, hwm=hwm)

    def _roll_insert_forward(self, tx: Txn, journal: fmt.Journal) -> None:
        assert journal.path is not None
        try:
            record = self._load_rel(journal.path, strict=True)
        except CheckpointDecodeError as exc:
            # A record under its final name is acknowledged, even damaged (a power
            # cut in fast mode): it stays, as a damaged entry; a rebuild places it.
            raise IndexDamaged(f"the record of the last save is damaged: {exc}") from None
        if record is None:
            return
        with self.open_ids(write=True) as ids:
            slot = fmt.Slot(record.sequence, record.id, fmt.to_micros(record.header.expires_at))
            took = self._index_new(
                tx, ids, journal.stream, record.stream, slot, fmt.id_key(record.id)
            )
        tx.commit(ids_used=tx.state.ids_used + took)

    def _finish_delete(self, journal: fmt.Journal) -> None:
        for sfile in journal.stream.split(fmt.STREAM_SEP):
            if sfile:
                self._finish_delete_in(sfile, journal)

    def _finish_delete_in(self, sfile: str, journal: fmt.Journal) -> None:
        idx = self.open_index(sfile, write=True)
        if idx is None:
            return
        with idx, self.open_ids(write=True) as ids:
            dead = []
            for _, slot in idx.walk(idx.bisect(journal.lo, right=False), 1):
                if slot.seq > journal.hi:
                    break
                if not slot.live:
                    dead.append(slot)
            for slot in dead:
                key = fmt.id_key(slot.cid)
                at = ids.find(key, slot.seq)
                if at is not None:
                    ids.tombstone(at, key, slot.seq)
            self._unlink_records(dead)
            self._trim(idx)

    def _load_rel(self, path: str, *, strict: bool = False) -> StoredRecord | None:
        """The valid record at a root-relative path, or ``None`` (if missing, or if
        damaged and not ``strict``)."""
        parsed = fmt.parse_record_name(path.rsplit("/", 1)[-1])
        if parsed is None:
            return None
        try:
            got = self.load_record(*parsed)
        except CheckpointDecodeError:
            if strict:
                raise
            return None
        return None if got is None else got[0]

    def _unlink_rel(self, path: str) -> None:
        parts = path.split("/")
        if len(parts) != 3 or parts[0] != fmt.RECORDS_DIR:
            return
        bucket = fmt.parse_bucket_name(parts[1])
        if bucket is None:
            return
        bfd = self.open_dir(self.fd("records"), parts[1], create=False)
        if bfd is not None:
            try:
                self.unlink_missing_ok(parts[2], bfd)
            finally:
                self.io.close(bfd)

    def _records_above(self, lo: int, hi: int) -> Iterator[tuple[int, str, StoredRecord | None]]:
        """``(seq, id, record)`` of every record file with ``lo < seq <= hi``, in
        sequence order; ``record`` is ``None`` for a damaged one."""
        records = self.fd("records")
        first, last = fmt.bucket_of(lo + 1), fmt.bucket_of(hi)
        buckets = sorted(
            b
            for b in map(fmt.parse_bucket_name, self.io.listdir(records))
            if b is not None and first <= b <= last
        )
        for bucket in buckets:
            bfd = self.open_dir(records, fmt.bucket_name(bucket), create=False)
            if bfd is None:
                continue
            try:
                names = sorted(
                    (p, n) for n in self.io.listdir(bfd) if (p := fmt.parse_record_name(n))
                )
                for (seq, cid), name in names:
                    if not lo < seq <= hi or fmt.bucket_of(seq) != bucket:
                        continue
                    try:
                        data = self.read_file(bfd, name)
                        if data is not None:
                            yield seq, cid, self.decode(data, seq, cid)
                    except (RecordProblem, CheckpointDecodeError):
                        yield seq, cid, None
            finally:
                self.io.close(bfd)

    def _remove_temps(self, lo: int, hi: int | None) -> None:
        """Remove the temp files of sequences ``lo..hi`` (``hi=None``: no upper
        bound), under the lock: a write cut short left them (sequences are never
        reused, so no write in flight owns them)."""
        records = self.fd("records")
        first = fmt.bucket_of(lo)
        for number in sorted(
            b for b in map(fmt.parse_bucket_name, self.io.listdir(records)) if b is not None
        ):
            if number < first or (hi is not None and number > fmt.bucket_of(hi)):
                continue
            bfd = self.open_dir(records, fmt.bucket_name(number), create=False)
            if bfd is None:
                continue
            try:
                for name in self.io.listdir(bfd):
                    seq = fmt.parse_temp_name(name)
                    if seq is not None and lo <= seq and (hi is None or seq <= hi):
                        self.unlink_missing_ok(name, bfd)
            finally:
                self.io.close(bfd)

    def _recover_restart(self, tx: Txn, boot: str | None) -> None:
        """After a machine restart, index again every record above the sync mark (a
        power cut may have lost unflushed index writes) and drop index entries whose
        record did not survive. A damaged record there that no index names raises
        :class:`IndexDamaged`, so the caller rebuilds (which finds its stream)."""
        lo = tx.state.synced
        hwm = max(tx.state.hwm, self._max_on_disk())
        # No write is in flight (the lock is held, and the machine restarted): a
        # temp file above the mark is a save or group commit cut short.
        self._remove_temps(lo + 1, None)
        found: dict[str, list[StoredRecord]] = {}
        present: set[int] = set()
        damaged: list[tuple[int, str]] = []
        for seq, cid, record in self._records_above(lo, hwm):
            present.add(seq)
            if record is None:
                damaged.append((seq, cid))
            else:
                found.setdefault(fmt.stream_file_name(record.stream), []).append(record)
        for sfile in set(found) | self._dirty_names():
            recs = found.get(sfile, [])
            self._merge_tail(tx, sfile, recs[0].stream if recs else None, lo, recs, present)
        for seq, cid in damaged:
            if self._stream_of(seq, cid) is None:
                raise IndexDamaged(f"damaged record {seq} is in no stream index")
        used = tx.state.ids_used
        with self.open_ids(write=True) as ids:
            for pos, key, seq in list(ids.entries()):
                if lo < seq <= hwm and seq not in present:
                    ids.tombstone(pos, key, seq)
            for recs in found.values():
                for record in recs:
                    used += ids.insert(fmt.id_key(record.id), record.sequence)
            for seq, cid in damaged:
                used += ids.insert(fmt.id_key(cid), seq)
            if self.durable:
                ids.sync()
        tx.commit(hwm=hwm, synced=hwm, boot=boot, ids_used=used)
        tx.sync()
        self.io.ftruncate(self.fd("dirty"), 0)
        self._dirty = frozenset()

    def _dirty_names(self) -> set[str]:
        dirty_fd = self.fd("dirty")
        size = self.io.fstat(dirty_fd).st_size
        text = read_exact(self.io, dirty_fd, size, 0).decode("ascii", "replace")
        return _index_names(text)

    def _merge_tail(
        self,
        tx: Txn,
        sfile: str,
        stream: str | None,
        lo: int,
        records: list[StoredRecord],
        present: set[int],
    ) -> None:
        idx = self.open_index(sfile, write=True)  # damaged: the caller rebuilds
        if idx is None:
            if stream is None:
                return
            self._create_index(tx, sfile, stream)
            idx = self.open_index(sfile, write=True)
            assert idx is not None
        with idx:
            idx.repair_tail()
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
            keep += [
                fmt.Slot(r.sequence, r.id, fmt.to_micros(r.header.expires_at))
                for r in records
                if r.sequence not in have
            ]
            keep.sort(key=lambda s: s.seq)
            if keep != tail or garbage:
                idx.truncate(start)
                for slot in keep:
                    idx.append(slot)
            self._unlink_records(doomed)
            if self.durable:
                idx.sync()

    def _rebuild_ids(self, tx: Txn) -> IdTable:
        """Build the id table afresh, larger, and return it open for writing."""
        with self.open_ids() as old:
            entries = [(key, seq) for _, key, seq in old.entries()]
        self.forget(ids=True)
        used = IdTable.build(self.io, self.fd("root"), entries, self.store_id, durable=self.durable)
        tx.commit(ids_used=used)
        return self.open_ids(write=True)

    def repair(self, drop_damaged: bool) -> dict[str, Any]:
        """Rebuild the indexes, the id table and the state from the record files,
        keeping damaged records as damaged entries (or, with ``drop_damaged``,
        removing their files). Takes the write lock for the whole pass."""
        with self.locked():
            tx = self._txn()
            journal = tx.state.journal
            if journal is not None and not self._insert_done(tx, journal):
                with contextlib.suppress(IndexDamaged):
                    if journal.op in fmt.BATCH_OPS:
                        self._resolve_batch(tx)
                    else:
                        self._recover_journal(tx)
            return self._rebuild_all(tx, drop=drop_damaged)

    def _delete_orphan_done(self, tx: Txn, seqs: list[int]) -> None:
        """After deleting records by id: if one was the newest damaged record of
        unknown stream, find the next one (a rebuild; rare)."""
        orphan = tx.state.orphan
        if orphan is not None and orphan[0] in seqs:
            self._rebuild_all(tx)

    @staticmethod
    def _quietly(action: Any) -> None:
        """Run a best-effort cleanup step; a failure is left to the journal."""
        with contextlib.suppress(Exception):
            action()


def _index_names(text: str) -> set[str]:
    """The index file names listed in ``dirty``, one a line. A power cut can tear
    its last append (zeros where the bytes were lost): NULs separate names too,
    and anything that is not a plain index file name is left out."""
    return {
        name
        for name in text.replace("\x00", "\n").split()
        if name.endswith(".idx") and "/" not in name and not name.startswith(".")
    }
