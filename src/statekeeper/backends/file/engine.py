"""The engine of a file store: :class:`FileEngine`, the owner of its files, lock,
state and descriptor cache, which opens and closes the store; and
:class:`Writes`, the one-record writes.

Every write runs under the write lock and names its operation in the journal
first, so a crash at any point is finished by the next lock holder. The record
file is published first (temp file, fsync, rename, fsync of its directory), the
indexes follow, unflushed on the save path; deletes and updates flush the index
entries they change before the record file goes, so a power cut never
resurrects a deleted checkpoint.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, replace
from datetime import datetime

from ..._runtime.inline import WORKER, Budget
from ...errors import (
    CheckpointDecodeError,
    CheckpointEncodeError,
    CheckpointNotFound,
    PreconditionFailed,
    StoreFormatError,
    StoreNotFound,
)
from ...models import CheckpointHeader
from ...record import NewRecord, StoredRecord, Update
from . import layout as fmt
from .fdcache import Descriptors
from .files import Files, RecordProblem, StateFile, Txn, WriteLock, quietly
from .indexes import RO, RW, IdTable, IndexDamaged, replace_file
from .io import FileIO
from .recovery import Rebuild, Recovery

__all__ = ["FileEngine", "Found", "Writes"]

_log = logging.getLogger("statekeeper.backends.file")
#: A slot to delete and its position in its stream index (``None``: not there).
Victim = tuple[int | None, fmt.Slot]


class FileEngine:
    """The one owner of a file store's directory, write lock, state file and
    descriptor cache; it opens and closes the store and holds the write side's
    parts (the rebuild, the recovery, the one-record writes)."""

    def __init__(
        self,
        root: str,
        io: FileIO,
        *,
        durable: bool,
        lock_timeout: float,
        max_record_bytes: int,
        sync_interval: int,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        self.create = create and not read_only
        self.read_only = read_only
        #: Why the indexes cannot be trusted on this read-only open (reads then go to
        #: the records, see :func:`.survey.view_latest`); ``None`` when they can.
        self.degraded: str | None = None
        #: The write lock: this instance's mutex, then ``flock`` on ``lock``.
        self.lock = WriteLock(io, lambda: self.files.fd("lock"), lock_timeout, root)
        self.files = Files(
            root, io, durable=durable, max_record_bytes=max_record_bytes, holding=self.lock.holding
        )
        self.fdcache = Descriptors(self.files)
        self.files.cache = self.fdcache
        self.statefile = StateFile(self.files)
        self.rebuild = Rebuild(
            self.files, self.fdcache, self.statefile, sync_interval=sync_interval
        )
        self.recovery = Recovery(self.files, self.fdcache, self.statefile, self.lock, self.rebuild)
        self.writes = Writes(self.files, self.fdcache, self.statefile, self.rebuild, self.recovery)

    def close(self) -> None:
        """Close every descriptor, once the calls in flight are done."""
        self.files.close()
        self.fdcache.drop()
        self.fdcache.close_kept()

    # -- opening -------------------------------------------------------------------------

    def open(self, now: datetime) -> fmt.Meta:
        """Open the store (creating it if ``create``). A writable open takes the
        lock, finishes a crashed writer's journal, after a machine restart
        re-indexes what a power cut may have lost, and rebuilds from the records
        what the cheap checks find damaged or missing (no record is read). A
        ``read_only`` open writes nothing; when the indexes cannot be trusted
        (``degraded``), the reads go to the records."""
        try:
            root = self.files.io.open_root(self.files.root, create=self.create)
        except (FileNotFoundError, NotADirectoryError):
            if self.create:
                raise
            raise self._not_found() from None
        self.files.adopt("root", root)
        self.degraded = None
        try:
            if self.read_only:
                meta = self._open_read_only(root)
            else:
                meta = self._open_meta(root, now)
                self.files.identify(meta.store_id)
                with self.lock.held():
                    self._adopt_dirs(create=True)
                    self._open_state(writable=True)
                    dirty = self.files.io.open(
                        fmt.DIRTY_NAME, RW | os.O_CREAT | os.O_APPEND, 0o666, dir_fd=root
                    )
                    self.files.adopt("dirty", dirty)
                    self._startup_recovery()
        except BaseException:
            self.close()
            raise
        return meta

    def _not_found(self) -> StoreNotFound:
        return StoreNotFound(
            f"there is no file store at {self.files.root}; check the path, or open it with "
            "create=True (and without read_only) to create one"
        )

    def _open_read_only(self, root: int) -> fmt.Meta:
        """Open without writing a byte: no lock file, no recovery, no rebuild."""
        meta = self._read_meta(root) if fmt.META_NAME in self.files.io.listdir(root) else None
        if meta is None:
            raise self._not_found()
        self.files.identify(meta.store_id)
        self._adopt_dirs(create=False)
        if "records" not in self.files.fd_table:
            raise StoreFormatError(
                f"{self.files.where(fmt.RECORDS_DIR)} is missing: the store's creation was cut "
                "short; open it once without read_only to finish it"
            )
        self._open_state(writable=False)
        self.degraded = self._damage_read_only()
        if self.degraded is not None:
            _log.warning(
                "file store %s (read-only): %s; reads go to the record files until a "
                "writable open or repair() rebuilds the indexes",
                self.files.root,
                self.degraded,
            )
        return meta

    def _adopt_dirs(self, *, create: bool) -> None:
        """Open the records and streams directories (a missing one is left out)."""
        for name in (fmt.RECORDS_DIR, fmt.STREAMS_DIR):
            try:
                fd = self.files.open_dir(self.files.fd("root"), name, create=create)
            except IndexDamaged as exc:
                raise StoreFormatError(f"{self.files.where(name)}: {exc}") from None
            if fd is not None:
                self.files.adopt(name, fd)

    def _open_meta(self, root: int, now: datetime) -> fmt.Meta:
        names = self.files.io.listdir(root)
        if fmt.META_NAME not in names:
            foreign = sorted(n for n in names if n not in fmt.ROOT_NAMES and not n.startswith("."))
            if foreign:
                raise StoreFormatError(
                    f"{self.files.root} is not empty and is not a statekeeper file store "
                    f"(it holds {', '.join(map(repr, foreign[:5]))}); "
                    "point the store at a new or empty directory"
                )
            if not self.create:
                raise self._not_found()
        self.files.adopt(
            "lock", self.files.io.open(fmt.LOCK_NAME, RW | os.O_CREAT, 0o666, dir_fd=root)
        )
        with self.lock.held():
            meta = self._read_meta(root)
            if meta is None:
                meta = fmt.Meta.new(now)
                # Creating a store is always made durable, whatever the durability option.
                replace_file(self.files.io, root, fmt.META_NAME, meta.to_bytes(), durable=True)
            return meta

    def _read_meta(self, root: int) -> fmt.Meta | None:
        try:
            data = self.files.read_file(root, fmt.META_NAME)
        except RecordProblem as exc:
            raise StoreFormatError(f"{self.files.where(fmt.META_NAME)}: {exc.reason}") from None
        return None if data is None else fmt.Meta.from_bytes(data, self.files.where(fmt.META_NAME))

    def _open_state(self, *, writable: bool) -> None:
        """Open the state file. Missing, a writable open creates it empty (the first
        transaction then rebuilds it from the records); a symbolic link (never
        followed) is a damaged store."""
        root = self.files.fd("root")
        flags = RW if writable else RO
        try:
            fd = self.files.io.open(fmt.STATE_NAME, flags, dir_fd=root)
        except FileNotFoundError:
            if not writable:
                return
            empty = bytes(fmt.STATE_SIZE)
            replace_file(self.files.io, root, fmt.STATE_NAME, empty, durable=True)
            fd = self.files.io.open(fmt.STATE_NAME, flags, dir_fd=root)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                where = self.files.where(fmt.STATE_NAME)
                raise StoreFormatError(f"{where} is a symbolic link") from None
            raise
        self.files.adopt("state", fd)

    def _startup_recovery(self) -> None:
        """Resolve a half-written batch; after a machine restart, index the records
        above the sync mark again; finish a crashed writer's journal; rebuild from
        the records whatever is damaged or missing."""
        tx = self.recovery.txn()
        boot = self.files.io.boot_id()
        reasons: list[str] = []
        try:
            pending = tx.state.journal
            if pending is not None and pending.op in fmt.BATCH_OPS:
                # First: a half-written batch must be gone (or complete) before the
                # restart recovery indexes the records above the sync mark.
                self.recovery.resolve_batch(tx)
            if boot is None or tx.state.boot != boot:
                self.recovery.restart(tx, boot)
            self.recovery.finish(tx)
        except IndexDamaged as exc:
            reasons.append(str(exc))
        damage, files = self._damage(tx.state)
        reasons += damage
        if tx.state.streams is None or files > tx.state.streams:
            tx.commit(extra=tx.state.with_extra(streams=files))
        if reasons:
            _log.warning(
                "file store %s: rebuilding its indexes from the records: %s",
                self.files.root,
                "; ".join(reasons),
            )
            self.rebuild.rebuild_all(tx)
        if tx.state.boot != boot:
            tx.commit(boot=boot)
            tx.sync()

    def _damage(self, state: fmt.State) -> tuple[list[str], int]:
        """What the cheap checks (no record is read) find wrong with the derived
        data, and how many stream index files there are."""
        reasons: list[str] = []
        try:
            self.fdcache.open_ids().close()
        except IndexDamaged as exc:
            reasons.append(str(exc))
        files = len(self.fdcache.index_files())
        if state.streams is not None and files < state.streams:
            reasons.append(f"{state.streams - files} stream index file(s) are missing")
        top = self.rebuild.max_on_disk()
        if top > state.hwm:
            reasons.append(f"record {top} is above the high-water mark {state.hwm}")
        return reasons, files

    def _damage_read_only(self) -> str | None:
        """Why this read-only open cannot trust the indexes (``None``: it can): what
        a writable open would find damaged, or would finish or re-index first."""
        if "streams" not in self.files.fd_table:
            return "the streams directory is missing"
        state = self.statefile.read()
        if state is None:
            return "the state file is missing or unreadable"
        if state.torn:
            return "a copy of the state file is damaged"
        damage, _ = self._damage(state)
        if damage:
            return damage[0]
        journal = state.journal
        if (
            journal is not None
            and journal.op == "insert"
            and not self.rebuild.insert_done(Txn(self.statefile, state), journal)
        ):
            return "the last save is not indexed yet (a writer crashed)"
        if journal is not None and journal.op == fmt.BATCH_COMMITTED:
            # Its records are complete and durable; its index entries may not be.
            return "the last save_many is not indexed yet (a writer crashed)"
        boot = self.files.io.boot_id()
        if boot is None or boot != state.boot:
            try:
                if not self._indexed_above(state.synced, state.hwm):
                    return "records above the sync mark are not indexed (a machine restart)"
            except IndexDamaged as exc:
                return str(exc)
        return None

    def _indexed_above(self, lo: int, hi: int) -> bool:
        """Whether every record file with ``lo < seq <= hi`` is readable and in its
        stream index and the id table (at most ``sync_interval`` records are read)."""
        with self.fdcache.open_ids() as ids:
            for seq, cid, record in self.recovery.records(lo + 1, hi):
                if record is None or ids.find(fmt.id_key(cid), seq) is None:
                    return False
                idx = self.fdcache.open_index(fmt.stream_file_name(record.stream))
                if idx is None:
                    return False
                with idx:
                    if idx.find(seq) is None:
                        return False
        return True


@dataclass
class Found:
    """Where an id lives: its sequence and record (``None`` if unreadable: ``error``)."""

    seq: int
    record: StoredRecord | None
    raw: bytes | None
    error: CheckpointDecodeError | None = None


@dataclass(eq=False)
class Writes:
    """The one-record writes (save, update, delete), each under the write lock
    (:meth:`.recovery.Recovery.writing`)."""

    files: Files
    fdcache: Descriptors
    statefile: StateFile
    rebuild: Rebuild
    recovery: Recovery

    def insert(self, record: NewRecord, budget: Budget = WORKER) -> CheckpointHeader:
        """Save ``record`` at the next sequence. Inline (``durability="fast"``, on
        the event loop's thread) it blocks, before anything is written, wherever it
        would wait or sync (the lock is taken, the state needs recovering, the id
        table growing, the sync mark is due): what it does inline is page-cache
        work only."""
        if self.files.durable:
            budget.block()
        with self.recovery.writing(budget) as tx:
            return self._insert(tx, record, budget)

    def _insert(self, tx: Txn, record: NewRecord, budget: Budget) -> CheckpointHeader:
        if tx.state.hwm + 1 - tx.state.synced >= self.rebuild.sync_interval:
            budget.block()  # the sync mark is due: it fsyncs
        key = fmt.id_key(record.id)
        ids = self.fdcache.open_ids(write=True)
        try:
            ids = self.rebuild.grown(tx, ids, 1, budget)
            live, free, fresh = ids.probe(key)
            if live:
                self.check_new_id(tx, ids, record, live)
                live, free, fresh = ids.probe(key)
            seq = tx.state.hwm + 1
            stored = record.seal(seq)
            data = stored.to_bytes(self.files.store_id)
            self.check_size(data)
            sfile = fmt.stream_file_name(record.stream)
            path = self.files.record_path(seq, record.id)
            bucket = self.files.bucket(seq, create=True)
            assert bucket is not None
            try:
                tmp = self.files.spares.take(seq) or fmt.temp_name(seq)  # (see Spares)
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
                    self.files.publish(bucket, tmp, fmt.record_name(seq, record.id), data, None)
                except BaseException:
                    quietly(lambda: tx.commit(journal=None, hwm=seq))
                    raise
                slot = fmt.Slot(seq, record.id, fmt.to_micros(record.expires_at))
                try:
                    self.rebuild.index(tx, ids, [(record.stream, slot)], at=(free, fresh))
                except BaseException:
                    # The caller will hear that the save failed, so take it back.
                    quietly(lambda: self._undo_insert(tx, ids, sfile, slot, bucket))
                    raise
            finally:
                self.files.close_bucket(bucket)
            self.statefile.saved(tx.state.gen)
            if self.rebuild.sync_mark_if_due(tx, ids):
                self.statefile.saved(tx.state.gen)
        finally:
            ids.close()
        return stored.header

    def check_size(self, data: bytes) -> None:
        if len(data) > self.files.max_record_bytes:
            raise CheckpointEncodeError(
                f"the record would be {len(data)} bytes, over this file store's "
                f"{self.files.max_record_bytes}-byte limit for one record file"
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

    def _undo_insert(self, tx: Txn, ids: IdTable, sfile: str, slot: fmt.Slot, bucket: int) -> None:
        """Take back a published record whose indexing failed (the caller is told the
        save failed); its sequence stays used."""
        self.files.unlink_missing_ok(fmt.record_name(slot.seq, slot.cid), bucket)
        if self.files.durable:
            self.files.io.fsync(bucket)
        idx = self.fdcache.open_index(sfile, write=True)
        if idx is not None:
            with idx:
                if idx.count and idx.slot(idx.count - 1).seq == slot.seq:
                    idx.truncate(idx.count - 1)
        ids.drop([slot])
        tx.commit(journal=None, hwm=max(tx.state.hwm, slot.seq))

    def update(self, update: Update) -> CheckpointHeader:
        cid = update.id
        with self.recovery.writing() as tx:
            with self.fdcache.open_ids() as ids:
                found = self.find_record(ids, cid)
            if found is not None and found.error is not None:
                raise found.error
            if found is None or found.record is None or found.record.is_expired(update.now):
                raise CheckpointNotFound(cid)
            current = found.record
            _check_etag(cid, current, update.if_match)
            new = update.applied_to(current)
            data = new.to_bytes(self.files.store_id)
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
        sfile = fmt.stream_file_name(current.stream) if current is not None else ""
        path = self.files.record_path(seq, cid)
        tmp = fmt.temp_name(seq)
        old = fmt.to_micros(current.header.expires_at) if current is not None else 0
        new = fmt.to_micros(expires_at)
        bucket = self.files.bucket(seq)
        if bucket is None:
            raise CheckpointNotFound(cid)
        hinted = bool(sfile) and old != new
        name = fmt.record_name(seq, cid)
        try:
            tx.commit(
                journal=fmt.Journal("update", sfile, seq=seq, path=path, tmp=_sibling(path, tmp))
            )
            published = False
            try:
                if hinted:
                    self.rebuild.set_hint(sfile, seq, _upper(old, new), sync=self.files.durable)
                self.files.publish(bucket, tmp, name, data, previous)
                published = True
                if hinted:
                    self.rebuild.set_hint(sfile, seq, new, sync=False)
                tx.commit(journal=None)
            except BaseException:
                # The caller will hear that the update failed: put the old one back.
                if published and previous is not None:
                    quietly(lambda: self.files.put_back(bucket, tmp, name, previous))
                if hinted:
                    quietly(lambda: self.rebuild.set_hint(sfile, seq, old, sync=False))
                quietly(lambda: tx.commit(journal=None))
                raise
        finally:
            self.files.close_bucket(bucket)

    def write_raw(self, cid: str, data: bytes) -> None:
        """Overwrite record ``cid``'s bytes unchecked (the conformance kit's backdoor)."""
        with self.recovery.writing() as tx:
            with self.fdcache.open_ids() as ids:
                found = self.find_record(ids, cid)
            if found is None:
                raise CheckpointNotFound(cid)
            expires = found.record.header.expires_at if found.record is not None else None
            self._replace(tx, found.seq, cid, found.record, expires, data, found.raw)

    def delete(self, cid: str, if_match: str | None, now: datetime) -> bool:
        with self.recovery.writing() as tx, self.fdcache.open_ids(write=True) as ids:
            found = self.find_record(ids, cid)
            if found is None:
                return False
            if found.record is None:
                if if_match is not None and found.error is not None:
                    raise found.error
            else:
                if found.record.is_expired(now):
                    return False
                _check_etag(cid, found.record, if_match)
            self.delete_found(tx, ids, cid, found)
            return True

    def delete_found(self, tx: Txn, ids: IdTable, cid: str, found: Found) -> None:
        sfile, victim = self.victim(cid, found)
        self.delete_groups(tx, ids, {sfile: [victim]})
        if found.record is None:
            self.recovery.delete_orphan_done(tx, [found.seq])

    def victim(self, cid: str, found: Found) -> tuple[str, Victim]:
        """The stream index file of ``found`` (``""`` if unknown) and its slot there
        (at position ``None`` if the index does not hold it)."""
        if found.record is not None:
            sfile = fmt.stream_file_name(found.record.stream)
        else:
            sfile = self.rebuild.stream_of(found.seq, cid) or ""
        idx = self.fdcache.open_index(sfile) if sfile else None
        if idx is not None:
            with idx:
                pos = idx.find(found.seq)
                if pos is not None:
                    return sfile, (pos, idx.slot(pos))
        return sfile, (None, fmt.Slot(found.seq, cid))

    def delete_groups(self, tx: Txn, ids: IdTable, groups: dict[str, list[Victim]]) -> None:
        """Delete records of one or more stream indexes (``""``: records no index
        names) as one journaled operation: mark their slots dead, drop their ids,
        unlink the files, trim trailing dead slots. In full durability each step is
        flushed (once per file) before the next."""
        groups = {sfile: victims for sfile, victims in groups.items() if victims}
        if not groups:
            return
        slots = [slot for victims in groups.values() for _, slot in victims]
        seqs = [slot.seq for slot in slots]
        names = fmt.STREAM_SEP.join(sorted(sfile for sfile in groups if sfile))
        tx.commit(journal=fmt.Journal("delete", names, lo=min(seqs), hi=max(seqs)))
        tx.sync()
        for sfile, victims in groups.items():
            idx = self.fdcache.open_index(sfile, write=True) if sfile else None
            if idx is None:
                continue
            with idx:
                for pos, slot in victims:
                    if pos is not None:
                        idx.write(pos, replace(slot, flags=fmt.SLOT_DEAD))
                if self.files.durable:
                    idx.sync()
        ids.drop(slots)
        if self.files.durable:
            ids.sync()
        self.rebuild.unlink_records(slots)
        # Trim only once the files are gone: recovery finishes a delete from its
        # dead slots, so a slot must outlive its record file.
        for sfile in groups:
            idx = self.fdcache.open_index(sfile, write=True) if sfile else None
            if idx is not None:
                with idx:
                    self.rebuild.trim_dead(idx)
        tx.commit(journal=None)

    def find_record(
        self, ids: IdTable, cid: str, live: list[tuple[int, int]] | None = None
    ) -> Found | None:
        """Where ``cid`` lives (expired or not); an unreadable record comes back with
        ``record=None`` and its error. ``live`` is the id table's entries for it, if
        the caller has them already."""
        for _, seq in ids.lookup(fmt.id_key(cid)) if live is None else live:
            try:
                got = self.files.load_record(seq, cid)
            except CheckpointDecodeError as exc:
                return Found(seq, None, None, exc)
            if got is not None:
                return Found(seq, got[0], got[1])
        return None


def _check_etag(cid: str, record: StoredRecord, if_match: str | None) -> None:
    if if_match is not None and record.header.etag != if_match:
        etag = record.header.etag
        raise PreconditionFailed(f"checkpoint {cid!r} has etag {etag!r}, not {if_match!r}")


def _sibling(path: str, name: str) -> str:
    return f"{path.rsplit('/', 1)[0]}/{name}"


def _upper(a: int, b: int) -> int:
    """The later of two expiry hints, where 0 means never."""
    return 0 if a == 0 or b == 0 else max(a, b)
