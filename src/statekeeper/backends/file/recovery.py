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
- :meth:`Recovery.repair` and the rebuild on open, which rebuild both
  indexes, the id table and the state from the records (see :mod:`.survey`),
  keeping every damaged record as a damaged entry.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..._runtime.inline import WORKER, Budget
from ...errors import CheckpointDecodeError
from ...record import StoredRecord
from . import layout as fmt
from .core import EngineCore, RecordProblem, Txn
from .id_table import IdTable
from .rebuild import Rebuild
from .stream_index import IndexDamaged

__all__ = ["Recovery"]

_log = logging.getLogger("statekeeper.backends.file")


class Recovery:
    """Journal, sync mark, restart recovery and repair. See the module docstring."""

    def __init__(self, core: EngineCore, rebuild: Rebuild) -> None:
        self.core = core
        self.rebuild = rebuild

    # -- the lock holder's view ------------------------------------------------------------

    def txn(self, state: fmt.State | None = None, budget: Budget = WORKER) -> Txn:
        """A transaction over the current state (read now, unless the caller just
        read it under the lock and passes it). An unreadable or torn state blocks
        (a rebuild, a write)."""
        if state is None:
            state = self.core.read_state()
        if state is None:
            # Both copies are unreadable (wiped, or a power cut mid-write in fast mode;
            # a new store starts this way too): rebuild everything from the records,
            # the high-water mark included.
            budget.block()
            tx = Txn(self.core, fmt.State(gen=2))
            self.rebuild.rebuild_all(tx)
            return tx
        if state.torn:
            # The newer copy is torn, so this one may lag a save: never hand out a
            # sequence that a record on disk already has.
            budget.block()
            state = state.next(hwm=max(state.hwm, self.rebuild.max_on_disk()))
            self.core.write_state(state)
        if state.gen != self.core.my_gen:
            self.core.descriptors.epoch += (
                1  # another process wrote since: re-validate cached handles
            )
        return Txn(self.core, state)

    @contextmanager
    def writing(self, budget: Budget = WORKER) -> Iterator[Txn]:
        """The write lock plus the current state, with any crashed journal finished.
        Inline, a lock held elsewhere blocks, and so does a journal to finish."""
        with self.core.locked(wait=not budget.inline) as got:
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
                _log.warning("file store %s: rebuilding its indexes: %s", self.core.root, exc)
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
            self._roll_insert_forward(tx, journal)
        elif journal.op == "update" and journal.path:
            got = self._load_rel(journal.path)
            if got is not None and journal.stream:
                self.rebuild.set_hint(
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
        with self.core.open_ids(write=True) as ids:
            slot = fmt.Slot(record.sequence, record.id, fmt.to_micros(record.header.expires_at))
            took = self.rebuild.index_new(
                tx, ids, journal.stream, record.stream, slot, fmt.id_key(record.id)
            )
        tx.commit(ids_used=tx.state.ids_used + took)

    def _finish_delete(self, journal: fmt.Journal) -> None:
        for sfile in journal.stream.split(fmt.STREAM_SEP):
            if sfile:
                self._finish_delete_in(sfile, journal)

    def _finish_delete_in(self, sfile: str, journal: fmt.Journal) -> None:
        idx = self.core.open_index(sfile, write=True)
        if idx is None:
            return
        with idx, self.core.open_ids(write=True) as ids:
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
            self.rebuild.unlink_records(dead)
            self.rebuild.trim_dead(idx)

    def _load_rel(self, path: str, *, strict: bool = False) -> StoredRecord | None:
        """The valid record at a root-relative path, or ``None`` (if missing, or if
        damaged and not ``strict``)."""
        parsed = fmt.parse_record_name(path.rsplit("/", 1)[-1])
        if parsed is None:
            return None
        try:
            got = self.core.load_record(*parsed)
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
        bfd = self.core.open_dir(self.core.fd("records"), parts[1], create=False)
        if bfd is not None:
            try:
                self.core.unlink_missing_ok(parts[2], bfd)
            finally:
                self.core.io.close(bfd)

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
            records = self._batch_records(lo, hi)
            if records:
                _log.warning(
                    "file store %s: finishing save_many or save group %d..%d",
                    self.core.root,
                    lo,
                    hi,
                )
                ids = self.core.open_ids(write=True)
                try:
                    if tx.state.ids_used + len(records) > ids.capacity // 2:
                        ids.close()
                        ids = self.rebuild.rebuild_ids(tx)
                    took = self.index_batch(tx, ids, records)
                finally:
                    ids.close()
                used = tx.state.ids_used + took
            else:
                used = tx.state.ids_used
            tx.commit(journal=None, hwm=max(tx.state.hwm, hi), ids_used=used)
            return
        _log.warning(
            "file store %s: taking back unfinished save_many %d..%d", self.core.root, lo, hi
        )
        self.roll_back_batch(tx, lo, hi)

    def _batch_files(self, lo: int, hi: int) -> list[tuple[int, str]]:
        """``(seq, id)`` of every record file with ``lo <= seq <= hi``."""
        found: list[tuple[int, str]] = []
        records = self.core.fd("records")
        for number in range(fmt.bucket_of(lo), fmt.bucket_of(hi) + 1):
            bfd = self.core.open_dir(records, fmt.bucket_name(number), create=False)
            if bfd is None:
                continue
            try:
                for name in self.core.io.listdir(bfd):
                    parsed = fmt.parse_record_name(name)
                    if parsed is not None and lo <= parsed[0] <= hi:
                        found.append(parsed)
            finally:
                self.core.io.close(bfd)
        return sorted(found)

    def _batch_records(self, lo: int, hi: int) -> list[StoredRecord]:
        """The batch's records that are there; :class:`IndexDamaged` if one is
        damaged."""
        out = []
        for seq, cid in self._batch_files(lo, hi):
            try:
                got = self.core.load_record(seq, cid)
            except CheckpointDecodeError as exc:
                raise IndexDamaged(f"a record of save_many {lo}..{hi} is damaged: {exc}") from None
            if got is not None:
                out.append(got[0])
        return out

    def roll_back_batch(self, tx: Txn, lo: int, hi: int, sfiles: set[str] | None = None) -> None:
        """Remove every trace of batch ``lo..hi``: its record files first (flushed,
        so none comes back), then its index slots and id entries, then the
        journal. Its sequences stay used."""
        self.rebuild.remove_temps(lo, hi)
        files = self._batch_files(lo, hi)
        sfiles = set(sfiles or ())
        for seq, cid in files:
            with contextlib.suppress(CheckpointDecodeError, RecordProblem, IndexDamaged):
                got = self.core.load_record(seq, cid)
                if got is not None:
                    sfiles.add(fmt.stream_file_name(got[0].stream))
        self.rebuild.unlink_records([fmt.Slot(seq, cid) for seq, cid in files])
        for sfile in sorted(sfiles):
            idx = self.core.open_index(sfile, write=True)
            if idx is not None:
                with idx:
                    idx.repair_tail()
                    # The batch held the highest sequences: its slots are the tail.
                    idx.truncate(idx.bisect(lo, right=False))
        with self.core.open_ids(write=True) as ids:
            for seq, cid in files:
                key = fmt.id_key(cid)
                at = ids.find(key, seq)
                if at is not None:
                    ids.tombstone(at, key, seq)
        tx.commit(journal=None, hwm=max(tx.state.hwm, hi))

    def index_batch(self, tx: Txn, ids: IdTable, records: list[StoredRecord]) -> int:
        """Add the batch to the stream indexes and the id table; idempotent (a roll
        forward runs it again). Returns how many empty id-table slots it took."""
        by_sfile: dict[str, tuple[str, list[fmt.Slot]]] = {}
        for record in records:
            slot = fmt.Slot(record.sequence, record.id, fmt.to_micros(record.header.expires_at))
            sfile = fmt.stream_file_name(record.stream)
            by_sfile.setdefault(sfile, (record.stream, []))[1].append(slot)
        for sfile, (stream, slots) in by_sfile.items():
            idx = self.core.open_index(sfile, write=True)
            if idx is None:
                self.rebuild.create_index(tx, sfile, stream)
                idx = self.core.open_index(sfile, write=True)
                if idx is None:
                    raise IndexDamaged(f"streams/{sfile} vanished right after it was created")
            with idx:
                idx.repair_tail()
                last = idx.last_seq()
                idx.append_many([slot for slot in slots if slot.seq > last])
            self.rebuild.mark_dirty(tx, sfile)
        return sum(ids.insert(fmt.id_key(r.id), r.sequence) for r in records)

    def repair(self, drop_damaged: bool) -> dict[str, Any]:
        """Rebuild the indexes, the id table and the state from the record files,
        keeping damaged records as damaged entries (or, with ``drop_damaged``,
        removing their files). Takes the write lock for the whole pass."""
        with self.core.locked():
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
