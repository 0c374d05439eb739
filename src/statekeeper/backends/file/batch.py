"""The writes of many records at once, each under one lock hold (the purge, one
per stream): ``save_many``, the group commit of concurrent saves, ``delete_many``,
``prune``, ``delete_stream`` and ``purge_expired``.

``save_many`` (:meth:`Batches.insert_many`) is all or nothing, also after a crash
at any point, and no reader sees part of it:

1. every id is checked (a live one raises ``PreconditionFailed`` before anything
   is written), every record sealed and size-checked;
2. ``state`` gets the high-water mark ``hi`` and the journal ``batch lo..hi``,
   durably (full) before the first record file exists;
3. every record file is created under its final name, then the group is made
   durable at once (one ``syncfs``, or one ``fsync`` per file, ``batch_sync``);
4. the journal becomes ``batched lo..hi``, durably: from here recovery rolls the
   batch forward (indexes it if each sequence has a valid record, else, only
   after a power cut in ``durability="fast"``, removes it); before, back;
5. the indexes (soft), then the journal is cleared: readers, which show nothing
   above :func:`.layout.visible_cap`, see the whole batch from that write on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import Literal

from ...errors import CheckpointEncodeError, PreconditionFailed, StatekeeperError
from ...models import CheckpointHeader
from ...record import NewRecord, StoredRecord
from . import layout as fmt
from .engine import Found, Victim, Writes
from .fdcache import Descriptors
from .files import Files, Txn, quietly
from .indexes import IdTable, IndexDamaged, StreamIndex, write_index
from .io import syncfs_usable
from .recovery import Rebuild, Recovery, slot_of

__all__ = ["BatchSync", "Batches"]

#: ``"auto"`` (syncfs where usable), ``"syncfs"`` or ``"fsync"``.
BatchSync = Literal["auto", "syncfs", "fsync"]

#: Longest journal of a delete_many (the index file names it names, joined);
#: more streams than fit are deleted in several groups. A state copy is 2 KiB.
_MAX_JOURNAL_NAMES = 1200
#: Dead slots a stream index keeps before it is rewritten without them.
_COMPACT_MIN_DEAD = 64


@dataclass(eq=False)
class Batches:
    """The writes of many records (see the module docstring)."""

    files: Files
    fdcache: Descriptors
    rebuild: Rebuild
    recovery: Recovery
    writes: Writes
    _: KW_ONLY
    #: How a group of files is made durable (``FileStoreOptions.batch_sync``).
    batch_sync: BatchSync

    def insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        """Insert ``records`` atomically at consecutive sequences (module docstring)."""
        n = len(records)
        with self.recovery.writing() as tx:
            ids = self.fdcache.open_ids(write=True)
            try:
                self._check_new_ids(tx, ids, records)
                ids = self.rebuild.grown(tx, ids, n)
                lo = tx.state.hwm + 1
                hi = lo + n - 1
                sealed = [record.seal(lo + i) for i, record in enumerate(records)]
                blobs = [one.to_bytes(self.files.store_id) for one in sealed]
                for data in blobs:
                    self.writes.check_size(data)
                tx.commit(hwm=hi, journal=fmt.Journal(fmt.BATCH_PENDING, "", lo=lo, hi=hi))
                tx.sync()  # the intent is durable before any record file exists
                try:
                    self._write_files(sealed, blobs, renamed=False)
                    tx.commit(journal=fmt.Journal(fmt.BATCH_COMMITTED, "", lo=lo, hi=hi))
                    tx.sync()
                except BaseException:
                    quietly(lambda: self.recovery.roll_back_batch(tx, lo, hi))
                    raise
                # Durably: a torn later write of state falls back to the other copy,
                # which must not be this batch's "batch" intent (that would take
                # back an acknowledged batch).
                self._index_batch(tx, ids, lo, hi, sealed, sync=True)
            finally:
                ids.close()
        return [one.header for one in sealed]

    def insert_group(self, records: list[NewRecord]) -> list[CheckpointHeader | StatekeeperError]:
        """Save ``records`` as independent saves sharing one lock hold and one fsync
        group (S15); one outcome per record, in order. A live id (or one taken
        earlier in the group) gets :class:`PreconditionFailed`, an oversized record
        :class:`CheckpointEncodeError`: it fails alone and takes no sequence. The
        others get consecutive sequences under the journal ``batched lo..hi``
        (readers see none of them until it is cleared):

        1. each is written to a temp file, and the temp files made durable as one
           group (``batch_sync``);
        2. each is renamed, in sequence order, and each bucket fsynced once: every
           record is now complete, as after a one-record save;
        3. the indexes (soft), then the journal is cleared, unflushed (a power cut
           that loses it leaves ``batched``, rolled forward over the records there,
           or an older state, repaired from the records above the sync mark).

        A crash before step 3 ends leaves records no caller was told about;
        recovery keeps those under their final names and removes the temp files.
        An error (ENOSPC, EIO) fails the whole group: it is taken back durably
        (journal ``batch``, flushed, then every file of ``lo..hi`` removed).
        """
        out: list[CheckpointHeader | StatekeeperError | None] = [None] * len(records)
        with self.recovery.writing() as tx:
            ids = self.fdcache.open_ids(write=True)
            try:
                admitted = self._admit_group(tx, ids, records, out)
                ids = self.rebuild.grown(tx, ids, len(admitted))
                lo = tx.state.hwm + 1
                sealed: list[StoredRecord] = []
                blobs: list[bytes] = []
                for i in admitted:
                    one = records[i].seal(lo + len(sealed))
                    data = one.to_bytes(self.files.store_id)
                    try:
                        self.writes.check_size(data)
                    except CheckpointEncodeError as exc:
                        out[i] = exc
                        continue
                    out[i] = one.header
                    sealed.append(one)
                    blobs.append(data)
                if sealed:
                    self._commit_group(tx, ids, lo, sealed, blobs)
            finally:
                ids.close()
        assert all(one is not None for one in out)
        return [one for one in out if one is not None]

    def _admit_group(
        self,
        tx: Txn,
        ids: IdTable,
        records: list[NewRecord],
        out: list[CheckpointHeader | StatekeeperError | None],
    ) -> list[int]:
        """The positions of the records whose ids are free (an expired holder is
        removed, as a one-record save does); the others get their error in ``out``."""
        admitted: list[int] = []
        taken: set[str] = set()
        for i, record in enumerate(records):
            if record.id in taken:
                out[i] = PreconditionFailed(f"checkpoint id {record.id!r} already exists")
                continue
            live, _, _ = ids.probe(fmt.id_key(record.id))
            if live:
                try:
                    self.writes.check_new_id(tx, ids, record, live)
                except PreconditionFailed as exc:
                    out[i] = exc
                    continue
            taken.add(record.id)
            admitted.append(i)
        return admitted

    def _commit_group(
        self, tx: Txn, ids: IdTable, lo: int, sealed: list[StoredRecord], blobs: list[bytes]
    ) -> None:
        """Steps 1 to 3 of :meth:`insert_group` for the admitted records."""
        hi = lo + len(sealed) - 1
        tx.commit(hwm=hi, journal=fmt.Journal(fmt.BATCH_COMMITTED, "", lo=lo, hi=hi))
        try:
            self._write_files(sealed, blobs, renamed=True)
        except BaseException:
            quietly(lambda: self._undo_batch(tx, lo, hi, sealed))
            raise
        self._index_batch(tx, ids, lo, hi, sealed, sync=False)

    def _index_batch(
        self, tx: Txn, ids: IdTable, lo: int, hi: int, sealed: list[StoredRecord], *, sync: bool
    ) -> None:
        """Index the committed records ``lo..hi`` and clear the journal (flushed if
        ``sync``); on failure take them all back, as the caller will hear it failed."""
        try:
            took = self.rebuild.index(tx, ids, [(r.stream, slot_of(r)) for r in sealed])
            tx.commit(journal=None, ids_used=tx.state.ids_used + took)
            if sync:
                tx.sync()
        except BaseException:
            quietly(lambda: self._undo_batch(tx, lo, hi, sealed))
            raise
        self.rebuild.sync_mark_if_due(tx, ids)

    def _write_files(
        self, sealed: list[StoredRecord], blobs: list[bytes], *, renamed: bool
    ) -> None:
        """Create every record file and make them durable as one group (each file
        fsynced, or one ``syncfs``, ``batch_sync``), then each bucket directory.
        ``renamed`` (the group commit): written under temp names and renamed in
        sequence order once all are durable; else (``save_many``, whose journal
        names its files) under their own names."""
        durable = self.files.durable
        by_syncfs = durable and (
            self.batch_sync == "syncfs"
            or (self.batch_sync == "auto" and syncfs_usable(self.files.io))
        )
        buckets: dict[int, int] = {}
        moves: list[tuple[int, str, str]] = []
        try:
            for record, data in zip(sealed, blobs, strict=True):
                seq = record.sequence
                number = fmt.bucket_of(seq)
                bucket = buckets.get(number)
                if bucket is None:
                    # Its own descriptor, not the writer's cached one: a group may
                    # span two buckets, and the small cache could close the first.
                    bucket = self.files.open_dir(
                        self.files.fd("records"), fmt.bucket_name(number), create=True
                    )
                    assert bucket is not None
                    buckets[number] = bucket
                name = fmt.record_name(seq, record.id)
                written = fmt.temp_name(seq) if renamed else name
                self.files.write_new(bucket, written, data, sync=durable and not by_syncfs)
                if renamed:
                    moves.append((bucket, written, name))
            if by_syncfs:
                # One writeback of each file system the buckets are on: the records'
                # bytes and names.
                devices = {self.files.io.fstat(fd).st_dev: fd for fd in buckets.values()}
                for fd in devices.values():
                    self.files.io.syncfs(fd)  # type: ignore[attr-defined]
            for bucket, tmp, name in moves:
                self.files.io.rename(tmp, name, src_dir_fd=bucket, dst_dir_fd=bucket)
            if durable and (renamed or not by_syncfs):
                for bucket in buckets.values():
                    self.files.io.fsync(bucket)
        finally:
            for bucket in buckets.values():
                with contextlib.suppress(OSError):
                    self.files.io.close(bucket)

    def _check_new_ids(self, tx: Txn, ids: IdTable, records: list[NewRecord]) -> None:
        """Raise :class:`PreconditionFailed` if any id is live (nothing written yet);
        then remove the expired checkpoints whose ids the batch reuses."""
        expired: list[tuple[str, Found]] = []
        for record in records:
            live, _, _ = ids.probe(fmt.id_key(record.id))
            if live:
                self.writes.check_new_id(tx, ids, record, live, expired)
        for cid, found in expired:
            self.writes.delete_found(tx, ids, cid, found)

    def _undo_batch(self, tx: Txn, lo: int, hi: int, sealed: list[StoredRecord]) -> None:
        """Take back a batch: the journal back to ``batch``, durably, then roll back."""
        tx.commit(journal=fmt.Journal(fmt.BATCH_PENDING, "", lo=lo, hi=hi))
        tx.sync()
        sfiles = {fmt.stream_file_name(record.stream) for record in sealed}
        self.recovery.roll_back_batch(tx, lo, hi, sfiles)

    def delete_many(self, cids: list[str], now: datetime) -> int:
        """Delete the live ones among ``cids`` under one lock hold, in as few
        journaled operations as the journal can name."""
        with self.recovery.writing() as tx, self.fdcache.open_ids(write=True) as ids:
            groups: dict[str, list[Victim]] = {}
            unreadable: list[int] = []
            for cid in cids:
                found = self.writes.find_record(ids, cid)
                if found is None or (found.record is not None and found.record.is_expired(now)):
                    continue
                if found.record is None:
                    unreadable.append(found.seq)
                sfile, victim = self.writes.victim(cid, found)
                groups.setdefault(sfile, []).append(victim)
            for chunk in _chunks(groups):
                self.writes.delete_groups(tx, ids, chunk)
            if unreadable:
                self.recovery.delete_orphan_done(tx, unreadable)
            return sum(len(victims) for victims in groups.values())

    def prune(self, stream: str, keep_last: int, now: datetime) -> int:
        now_us = fmt.to_micros(now)

        def pick(idx: StreamIndex) -> list[Victim]:
            newest = idx.walk(idx.count - 1, -1)
            live: list[Victim] = [(p, s) for p, s in newest if s.live and not s.expired(now_us)]
            return live[keep_last:]

        return len(self._remove(fmt.stream_file_name(stream), pick))

    def delete_stream(self, stream: str, now: datetime) -> int:
        now_us = fmt.to_micros(now)

        def pick(idx: StreamIndex) -> list[Victim]:
            return [(p, s) for p, s in idx.walk(0, 1) if s.live]

        victims = self._remove(fmt.stream_file_name(stream), pick)
        return sum(1 for _, slot in victims if not slot.expired(now_us))

    def purge_expired(self, now: datetime) -> int:
        """Remove expired checkpoints stream by stream, releasing the lock in between
        so other writers are not held up for the whole pass."""
        now_us = fmt.to_micros(now)

        def pick(idx: StreamIndex) -> list[Victim]:
            return [(p, s) for p, s in idx.walk(0, 1) if s.live and s.expired(now_us)]

        files = sorted(self.fdcache.index_files())
        return sum(len(self._remove(sfile, pick, purge=True)) for sfile in files)

    def _remove(
        self, sfile: str, pick: Callable[[StreamIndex], list[Victim]], *, purge: bool = False
    ) -> list[Victim]:
        """Under one lock hold, delete the slots ``pick`` chooses from stream index
        ``sfile`` (none if it is missing, or damaged for ``purge``), then compact
        it (for ``purge``, only if it lost any)."""
        with self.recovery.writing() as tx:
            try:
                idx = self.fdcache.open_index(sfile)
            except IndexDamaged:
                if not purge:
                    raise
                return []
            if idx is None:
                return []
            with idx:
                victims = pick(idx)
            if victims:
                with self.fdcache.open_ids(write=True) as ids:
                    self.writes.delete_groups(tx, ids, {sfile: victims})
            if victims or not purge:
                self._compact(tx, sfile)
            return victims

    def _compact(self, tx: Txn, sfile: str) -> None:
        """Rewrite a stream index without its dead slots once they dominate it, and
        remove an index with nothing left."""
        idx = self.fdcache.open_index(sfile, write=True)
        if idx is None:
            return
        with idx:
            slots = [s for _, s in idx.walk(0, 1)]
            live = [s for s in slots if s.live]
            dead = len(slots) - len(live)
            if live and (dead < _COMPACT_MIN_DEAD or dead <= len(live)):
                return
            self.fdcache.forget(sfile)
            f = self.files
            streams = f.fd("streams")
            if live:
                write_index(f.io, streams, sfile, idx.stream, live, f.store_id, durable=f.durable)
                return
            self.rebuild.uncount_index(tx)
            f.unlink_missing_ok(sfile, streams)
            if f.durable:
                f.io.fsync(streams)

    def remove_empty_buckets(self) -> int:
        """Remove the empty bucket directories below the high-water mark's (no save
        lands in one again), under the write lock; how many went."""
        with self.recovery.writing() as tx:
            top = fmt.bucket_of(tx.state.hwm)
            records = self.files.fd("records")
            removed = 0
            for name in self.files.io.listdir(records):
                number = fmt.parse_bucket_name(name)
                if number is None or number >= top:
                    continue
                try:
                    self.files.io.rmdir(name, dir_fd=records)
                except OSError:  # not empty, or not a directory: left alone
                    continue
                removed += 1
            if removed and self.files.durable:
                self.files.io.fsync(records)
            return removed


def _chunks(
    groups: dict[str, list[Victim]],
) -> list[dict[str, list[Victim]]]:
    """``groups`` split so that each part's index names fit in one journal."""
    out: list[dict[str, list[Victim]]] = [{}]
    length = 0
    for sfile, victims in groups.items():
        if out[-1] and length + len(sfile) + 1 > _MAX_JOURNAL_NAMES:
            out.append({})
            length = 0
        out[-1][sfile] = victims
        length += len(sfile) + 1
    return out
