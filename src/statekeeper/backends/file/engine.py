"""The write side of the file backend's engine: open, save, update, delete.

Every write runs under the write lock (``flock`` on ``lock``) and follows one rule:
the *record file* is published first (temp file, fsync, rename, fsync of its
directory) and the soft indexes follow, with the operation named in the journal
first so that a crash at any point is finished by the next lock holder (see
:mod:`.recovery`). The indexes are not fsynced on the save path. Deletes
and updates, which change old index entries, flush what they change before the
record file goes, so a power cut never resurrects a deleted checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from ..._runtime.inline import WORKER, Budget
from ...errors import (
    CheckpointDecodeError,
    CheckpointEncodeError,
    CheckpointNotFound,
    PreconditionFailed,
)
from ...models import CheckpointHeader
from ...record import NewRecord, RecordEdits, StoredRecord
from . import layout as fmt
from .core import EngineCore, Txn
from .id_table import IdTable
from .rebuild import Rebuild
from .recovery import Recovery
from .stream_index import IndexDamaged

__all__ = ["Found", "Writes"]

_COMPACT_MIN_DEAD = 64


@dataclass
class Found:
    """Where an id lives: its sequence and record (``None`` if unreadable: ``error``)."""

    seq: int
    record: StoredRecord | None
    raw: bytes | None
    error: CheckpointDecodeError | None = None


class Writes:
    """The one-record writes of the engine (:class:`.batch.FileEngine` adds batches)."""

    def __init__(self, core: EngineCore, rebuild: Rebuild, recovery: Recovery) -> None:
        self.core = core
        self.rebuild = rebuild
        self.recovery = recovery

    # -- save ---------------------------------------------------------------------------

    def insert(self, record: NewRecord, budget: Budget = WORKER) -> CheckpointHeader:
        """Save ``record`` at the next sequence.

        Inline (a store without ``durable``, ``durability="fast"``, on its event
        loop's thread), it blocks before anything is written wherever it could wait
        or sync: the lock is taken (by a thread or a process), the state file is
        unreadable or torn, a crashed writer's journal needs finishing, the id table
        needs growing, or the sync mark is due (it fsyncs). What it does inline is
        page-cache work only, as a bare write and rename."""
        if self.core.durable:
            budget.block()
        with self.recovery.writing(budget) as tx:
            return self._insert(tx, record, budget)

    def _insert(self, tx: Txn, record: NewRecord, budget: Budget) -> CheckpointHeader:
        """The body of :meth:`insert`, under the lock."""
        if tx.state.hwm + 1 - tx.state.synced >= self.core.sync_interval:
            budget.block()  # the sync mark is due: it fsyncs
        key = fmt.id_key(record.id)
        ids = self.core.open_ids(write=True)
        try:
            if tx.state.ids_used + 1 > ids.capacity // 2:
                budget.block()
                ids.close()
                ids = self.rebuild.rebuild_ids(tx)
            live, free, fresh = ids.probe(key)
            if live:
                self.check_new_id(tx, ids, record, live)
                live, free, fresh = ids.probe(key)
            seq = tx.state.hwm + 1
            stored = record.seal(seq)
            data = stored.to_bytes(self.core.store_id)
            self.check_size(data)
            sfile = fmt.stream_file_name(record.stream)
            path = self.core.record_path(seq, record.id)
            bucket = self.core.bucket(seq, create=True)
            assert bucket is not None
            try:
                tmp = self.core.spares.take(seq) or fmt.temp_name(seq)  # (see .spares)
                # One write of state per save: it reserves the sequence, counts the
                # id-table slot and names the operation; it is not cleared after.
                tx.commit(
                    hwm=seq,
                    ids_used=tx.state.ids_used + fresh,
                    journal=fmt.Journal(
                        "insert", sfile, seq=seq, path=path, tmp=_sibling(path, tmp)
                    ),
                )
                try:
                    self._publish(bucket, tmp, fmt.record_name(seq, record.id), data, None)
                except BaseException:
                    self.rebuild.quietly(lambda: tx.commit(journal=None, hwm=seq))
                    raise
                slot = fmt.Slot(seq, record.id, fmt.to_micros(record.expires_at))
                try:
                    self.rebuild.index_new(
                        tx, ids, sfile, record.stream, slot, key, at=(free, fresh)
                    )
                except BaseException:
                    # The caller will hear that the save failed, so take it back.
                    self.rebuild.quietly(
                        lambda: self._undo_insert(tx, ids, sfile, slot, key, bucket)
                    )
                    raise
            finally:
                self.core.close_bucket(bucket)
            self.core.done_gen = tx.state.gen
            if self.rebuild.sync_mark_if_due(tx, ids):
                self.core.done_gen = tx.state.gen
        finally:
            ids.close()
        return stored.header

    def check_size(self, data: bytes) -> None:
        if len(data) > self.core.max_record_bytes:
            raise CheckpointEncodeError(
                f"the record would be {len(data)} bytes, over this file store's "
                f"{self.core.max_record_bytes}-byte limit for one record file"
            )

    def check_new_id(
        self,
        tx: Txn,
        ids: IdTable,
        record: NewRecord,
        live: list[tuple[int, int]],
        expired: list[tuple[str, Found]] | None = None,
    ) -> None:
        found = self.find_record(ids, record.id, live)
        if found is None:
            return
        if found.record is None:
            raise PreconditionFailed(
                f"checkpoint id {record.id!r} is taken by an unreadable checkpoint "
                f"(sequence {found.seq}); delete it first"
            )
        if not found.record.is_expired(record.now):
            raise PreconditionFailed(f"checkpoint id {record.id!r} already exists")
        # expired behaves as deleted: remove it (a batch, checking all ids first, later)
        if expired is not None:
            expired.append((record.id, found))
        else:
            self.delete_found(tx, ids, record.id, found)

    def _undo_insert(
        self, tx: Txn, ids: IdTable, sfile: str, slot: fmt.Slot, key: int, bucket: int
    ) -> None:
        """Take back a published record whose indexing failed; the caller is told the
        save failed, so it must not appear later. Its sequence stays used."""
        self.core.unlink_missing_ok(fmt.record_name(slot.seq, slot.cid), bucket)
        if self.core.durable:
            self.core.io.fsync(bucket)
        idx = self.core.open_index(sfile, write=True)
        if idx is not None:
            with idx:
                if idx.count and idx.slot(idx.count - 1).seq == slot.seq:
                    idx.truncate(idx.count - 1)
        pos = ids.find(key, slot.seq)
        if pos is not None:
            ids.tombstone(pos, key, slot.seq)
        tx.commit(journal=None, hwm=max(tx.state.hwm, slot.seq))

    def _publish(
        self, bucket: int, tmp: str, name: str, data: bytes, previous: bytes | None
    ) -> None:
        """Write ``data`` to ``tmp``, fsync, rename over ``name``, fsync the directory.

        On failure nothing of the new version stays visible: the temp file is removed
        and, if the rename already happened, ``name`` is removed (``previous is
        None``) or its previous bytes are put back.
        """
        self.core.write_new(bucket, tmp, data, sync=self.core.durable)
        try:
            self.core.io.rename(tmp, name, src_dir_fd=bucket, dst_dir_fd=bucket)
        except BaseException:
            self.core.unlink_quiet(tmp, bucket)
            raise
        if not self.core.durable:
            return
        try:
            self.core.io.fsync(bucket)
        except BaseException:
            if previous is None:
                self.core.unlink_quiet(name, bucket)
            else:
                self.rebuild.quietly(lambda: self._put_back(bucket, tmp, name, previous))
            raise

    def _put_back(self, bucket: int, tmp: str, name: str, previous: bytes) -> None:
        """Restore a record's previous bytes after a failed replace (best effort: if
        this fails too, the new version stays, complete and valid)."""
        seq = fmt.parse_temp_name(tmp)
        back = fmt.temp_name(seq) if seq is not None else f"{tmp}.undo"
        try:
            self.core.write_new(bucket, back, previous, sync=self.core.durable)
            self.core.io.rename(back, name, src_dir_fd=bucket, dst_dir_fd=bucket)
            if self.core.durable:
                self.core.io.fsync(bucket)
        finally:
            self.core.unlink_quiet(back, bucket)

    # -- update -------------------------------------------------------------------------

    def update(
        self,
        cid: str,
        state: bytes,
        if_match: str | None,
        now: datetime,
        etag: str,
        edits: RecordEdits | None = None,
        codec: str | None = None,
    ) -> CheckpointHeader:
        with self.recovery.writing() as tx:
            with self.core.open_ids() as ids:
                found = self.find_record(ids, cid)
            if found is not None and found.error is not None:
                raise found.error
            if found is None or found.record is None or found.record.is_expired(now):
                raise CheckpointNotFound(cid)
            current = found.record
            if if_match is not None and current.header.etag != if_match:
                raise PreconditionFailed(
                    f"checkpoint {cid!r} has etag {current.header.etag!r}, not {if_match!r}"
                )
            new = current.updated(state, now=now, etag=etag, edits=edits, codec=codec)
            data = new.to_bytes(self.core.store_id)
            self.check_size(data)
            self._replace(tx, found.seq, cid, current, new.header.expires_at, data, found.raw)
            return new.header

    def _replace(
        self,
        tx: Txn,
        seq: int,
        cid: str,
        current: StoredRecord | None,
        expires_at: datetime | None,
        data: bytes,
        previous: bytes | None,
    ) -> None:
        """Replace record ``seq`` with ``data``, keeping its index hint an upper bound
        of its expiry at every instant (raise the hint first, lower it after)."""
        sfile = fmt.stream_file_name(current.stream) if current is not None else None
        path = self.core.record_path(seq, cid)
        tmp = fmt.temp_name(seq)
        old = fmt.to_micros(current.header.expires_at) if current is not None else 0
        new = fmt.to_micros(expires_at)
        bucket = self.core.bucket(seq)
        if bucket is None:
            raise CheckpointNotFound(cid)
        hinted = sfile is not None and old != new
        name = fmt.record_name(seq, cid)
        try:
            tx.commit(
                journal=fmt.Journal(
                    "update", sfile or "", seq=seq, path=path, tmp=_sibling(path, tmp)
                )
            )
            published = False
            try:
                if hinted and sfile is not None:
                    self.rebuild.set_hint(sfile, seq, _upper(old, new), sync=self.core.durable)
                self._publish(bucket, tmp, name, data, previous)
                published = True
                if hinted and sfile is not None:
                    self.rebuild.set_hint(sfile, seq, new, sync=False)
                tx.commit(journal=None)
            except BaseException:
                # The caller will hear that the update failed: put the old one back.
                if published and previous is not None:
                    self.rebuild.quietly(lambda: self._put_back(bucket, tmp, name, previous))
                if hinted and sfile is not None:
                    self.rebuild.quietly(lambda: self.rebuild.set_hint(sfile, seq, old, sync=False))
                self.rebuild.quietly(lambda: tx.commit(journal=None))
                raise
        finally:
            self.core.close_bucket(bucket)

    def write_raw(self, cid: str, data: bytes) -> None:
        """Overwrite record ``cid``'s bytes unchecked (the conformance kit's backdoor)."""
        with self.recovery.writing() as tx:
            with self.core.open_ids() as ids:
                found = self.find_record(ids, cid)
            if found is None:
                raise CheckpointNotFound(cid)
            expires = found.record.header.expires_at if found.record is not None else None
            self._replace(tx, found.seq, cid, found.record, expires, data, found.raw)

    # -- delete, prune, purge -------------------------------------------------------------

    def delete(self, cid: str, if_match: str | None, now: datetime) -> bool:
        with self.recovery.writing() as tx, self.core.open_ids(write=True) as ids:
            found = self.find_record(ids, cid)
            if found is None:
                return False
            if found.record is None:
                if if_match is not None and found.error is not None:
                    raise found.error
            else:
                if found.record.is_expired(now):
                    return False
                if if_match is not None and found.record.header.etag != if_match:
                    raise PreconditionFailed(
                        f"checkpoint {cid!r} has etag {found.record.header.etag!r}, "
                        f"not {if_match!r}"
                    )
            self.delete_found(tx, ids, cid, found)
            return True

    def delete_found(self, tx: Txn, ids: IdTable, cid: str, found: Found) -> None:
        if found.record is not None:
            sfile: str | None = fmt.stream_file_name(found.record.stream)
        else:
            sfile = self.rebuild.stream_of(found.seq, cid)
        victims: list[tuple[int | None, fmt.Slot]] = [(None, fmt.Slot(found.seq, cid))]
        if sfile is not None:
            idx = self.core.open_index(sfile)
            if idx is not None:
                with idx:
                    pos = idx.find(found.seq)
                    if pos is not None:
                        victims = [(pos, idx.slot(pos))]
        self._delete_slots(tx, ids, sfile or "", victims)
        if found.record is None:
            self.recovery.delete_orphan_done(tx, [found.seq])

    def _delete_slots(
        self, tx: Txn, ids: IdTable, sfile: str, victims: list[tuple[int | None, fmt.Slot]]
    ) -> None:
        """Delete records of one stream index (see :meth:`delete_groups`)."""
        self.delete_groups(tx, ids, {sfile: victims})

    def delete_groups(
        self, tx: Txn, ids: IdTable, groups: dict[str, list[tuple[int | None, fmt.Slot]]]
    ) -> None:
        """Delete records of one or more stream indexes (``""``: records no index
        names) as one operation: journal, mark their slots dead, drop their ids,
        unlink the files, trim trailing dead slots. In full durability each step
        is flushed before the next (one flush per file touched, not per record),
        so a power cut never resurrects a deleted checkpoint."""
        groups = {sfile: victims for sfile, victims in groups.items() if victims}
        if not groups:
            return
        seqs = [slot.seq for victims in groups.values() for _, slot in victims]
        names = fmt.STREAM_SEP.join(sorted(sfile for sfile in groups if sfile))
        tx.commit(journal=fmt.Journal("delete", names, lo=min(seqs), hi=max(seqs)))
        tx.sync()
        for sfile, victims in groups.items():
            idx = self.core.open_index(sfile, write=True) if sfile else None
            if idx is None:
                continue
            with idx:
                for pos, slot in victims:
                    if pos is not None:
                        idx.write(pos, replace(slot, flags=fmt.SLOT_DEAD))
                if self.core.durable:
                    idx.sync()
        for victims in groups.values():
            for _, slot in victims:
                key = fmt.id_key(slot.cid)
                at = ids.find(key, slot.seq)
                if at is not None:
                    ids.tombstone(at, key, slot.seq)
        if self.core.durable:
            ids.sync()
        self.rebuild.unlink_records([slot for victims in groups.values() for _, slot in victims])
        # Trim only once the files are gone: recovery finishes a delete from its
        # dead slots, so a slot must outlive its record file.
        for sfile in groups:
            idx = self.core.open_index(sfile, write=True) if sfile else None
            if idx is not None:
                with idx:
                    self.rebuild.trim_dead(idx)
        tx.commit(journal=None)

    def prune(self, stream: str, keep_last: int, now: datetime) -> int:
        sfile = fmt.stream_file_name(stream)
        now_us = fmt.to_micros(now)
        with self.recovery.writing() as tx:
            idx = self.core.open_index(sfile)
            if idx is None:
                return 0
            victims: list[tuple[int | None, fmt.Slot]] = []
            with idx:
                kept = 0
                for pos, slot in idx.walk(idx.count - 1, -1):
                    if not slot.live or slot.expired(now_us):
                        continue
                    if kept < keep_last:
                        kept += 1
                    else:
                        victims.append((pos, slot))
            with self.core.open_ids(write=True) as ids:
                self._delete_slots(tx, ids, sfile, victims)
            self._compact(tx, sfile)
            return len(victims)

    def delete_stream(self, stream: str, now: datetime) -> int:
        sfile = fmt.stream_file_name(stream)
        now_us = fmt.to_micros(now)
        with self.recovery.writing() as tx:
            idx = self.core.open_index(sfile)
            if idx is None:
                return 0
            with idx:
                victims: list[tuple[int | None, fmt.Slot]] = [
                    (pos, slot) for pos, slot in idx.walk(0, 1) if slot.live
                ]
            with self.core.open_ids(write=True) as ids:
                self._delete_slots(tx, ids, sfile, victims)
            self._compact(tx, sfile)
            return sum(1 for _, slot in victims if not slot.expired(now_us))

    def purge_expired(self, now: datetime) -> int:
        """Remove expired checkpoints stream by stream, releasing the lock in between
        so other writers are not held up for the whole pass."""
        now_us = fmt.to_micros(now)
        removed = 0
        for sfile in sorted(self.core.index_files()):
            with self.recovery.writing() as tx:
                try:
                    idx = self.core.open_index(sfile)
                except IndexDamaged:
                    continue
                if idx is None:
                    continue
                with idx:
                    victims: list[tuple[int | None, fmt.Slot]] = [
                        (pos, s) for pos, s in idx.walk(0, 1) if s.live and s.expired(now_us)
                    ]
                if victims:
                    with self.core.open_ids(write=True) as ids:
                        self._delete_slots(tx, ids, sfile, victims)
                    self._compact(tx, sfile)
                removed += len(victims)
        return removed

    def _compact(self, tx: Txn, sfile: str) -> None:
        """Rewrite a stream index without its dead slots once they dominate it, and
        remove an index with nothing left."""
        idx = self.core.open_index(sfile, write=True)
        if idx is None:
            return
        with idx:
            slots = [s for _, s in idx.walk(0, 1)]
            live = [s for s in slots if s.live]
            dead = len(slots) - len(live)
            if live and (dead < _COMPACT_MIN_DEAD or dead <= len(live)):
                return
            self.core.forget(sfile)
            if not live:
                self.rebuild.uncount_index(tx)
                self.core.unlink_missing_ok(sfile, self.core.fd("streams"))
                if self.core.durable:
                    self.core.io.fsync(self.core.fd("streams"))
            else:
                idx.rewrite(
                    self.core.fd("streams"), live, self.core.store_id, durable=self.core.durable
                )

    def find_record(
        self, ids: IdTable, cid: str, live: list[tuple[int, int]] | None = None
    ) -> Found | None:
        """Where ``cid`` lives (expired or not); an unreadable record comes back with
        ``record=None`` and its error. ``live`` is the id table's entries for it, if
        the caller has them already."""
        for _, seq in ids.lookup(fmt.id_key(cid)) if live is None else live:
            try:
                got = self.core.load_record(seq, cid)
            except CheckpointDecodeError as exc:
                return Found(seq, None, None, exc)
            if got is not None:
                return Found(seq, got[0], got[1])
        return None


def _sibling(path: str, name: str) -> str:
    return f"{path.rsplit('/', 1)[0]}/{name}"


def _upper(a: int, b: int) -> int:
    """The later of two expiry hints, where 0 means never."""
    return 0 if a == 0 or b == 0 else max(a, b)
