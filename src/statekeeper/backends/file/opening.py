"""Opening a file store: creating it, checking it, and the read-only open.

A writable open takes the write lock, finishes a crashed writer's journal, after a
machine restart re-indexes what a power cut may have lost (see :mod:`.recovery`),
and then rebuilds from the records whatever the cheap checks of :mod:`.rebuild`
find damaged or missing. ``create=False`` never creates a store; a ``read_only``
open writes nothing at all (no lock file, no recovery, no rebuild) and, when the
indexes cannot be trusted, sends the reads to the records (:mod:`.view`).
"""

from __future__ import annotations

import errno
import logging
import os
from datetime import datetime

from ...errors import StoreFormatError, StoreNotFound
from . import layout as fmt
from .core import RO_FILE, RW_FILE, EngineCore, RecordProblem
from .rebuild import Rebuild
from .recovery import Recovery
from .restart import recover_restart
from .stream_index import IndexDamaged

__all__ = ["Opening"]

_log = logging.getLogger("statekeeper.backends.file")
_CREAT = os.O_CREAT
_APPEND = os.O_APPEND


class Opening:
    """Open, create and check a store (see the module docstring): a part of the
    engine, given the engine's recovery (and, through it, its files)."""

    def __init__(self, core: EngineCore, rebuild: Rebuild, recovery: Recovery) -> None:
        self.core = core
        self.rebuild = rebuild
        self.recovery = recovery

    def open(self, now: datetime) -> fmt.Meta:
        """Open the store (creating it if ``create``); finish a crashed writer's
        journal, after a machine restart re-index what a power cut may have lost, and
        rebuild from the records what is damaged or missing. A read-only open does
        none of that and writes nothing: it reads from the records instead when the
        indexes cannot be trusted (``degraded``)."""
        try:
            root = self.core.io.open_root(self.core.root, create=self.core.create)
        except (FileNotFoundError, NotADirectoryError):
            if self.core.create:
                raise
            raise self._not_found() from None
        self.core.fd_table = {"root": root}
        self.core.degraded = None
        try:
            if self.core.read_only:
                meta = self._open_read_only(root)
            else:
                meta = self._open_meta(root, now)
                self.core.store_id = meta.store_id
                with self.core.locked():
                    self.core.fd_table["records"] = self._subdir(fmt.RECORDS_DIR)
                    self.core.fd_table["streams"] = self._subdir(fmt.STREAMS_DIR)
                    self.core.fd_table["state"] = self._open_state()
                    self.core.fd_table["dirty"] = self.core.io.open(
                        fmt.DIRTY_NAME, RW_FILE | _CREAT | _APPEND, 0o666, dir_fd=root
                    )
                    self._startup_recovery()
        except BaseException:
            self.core.close_fds()
            raise
        return meta

    def _not_found(self) -> StoreNotFound:
        return StoreNotFound(
            f"there is no file store at {self.core.root}; check the path, or open it with "
            "create=True (and without read_only) to create one"
        )

    def _open_read_only(self, root: int) -> fmt.Meta:
        """Open without writing a byte: no lock file, no recovery, no rebuild."""
        if fmt.META_NAME not in self.core.io.listdir(root):
            raise self._not_found()
        try:
            data = self.core.read_file(root, fmt.META_NAME)
        except RecordProblem as exc:
            raise StoreFormatError(f"{self.core.where(fmt.META_NAME)}: {exc.reason}") from None
        if data is None:
            raise self._not_found()
        meta = fmt.Meta.from_bytes(data, self.core.where(fmt.META_NAME))
        self.core.store_id = meta.store_id
        for name in (fmt.RECORDS_DIR, fmt.STREAMS_DIR):
            try:
                fd = self.core.open_dir(root, name, create=False)
            except IndexDamaged as exc:
                raise StoreFormatError(f"{self.core.where(name)}: {exc}") from None
            if fd is not None:
                self.core.fd_table[name] = fd
        if "records" not in self.core.fd_table:
            raise StoreFormatError(
                f"{self.core.where(fmt.RECORDS_DIR)} is missing: the store's creation was cut "
                "short; open it once without read_only to finish it"
            )
        try:
            self.core.fd_table["state"] = self.core.io.open(fmt.STATE_NAME, RO_FILE, dir_fd=root)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreFormatError(
                    f"{self.core.where(fmt.STATE_NAME)} is a symbolic link"
                ) from None
            raise
        self.core.degraded = self.rebuild.damage_read_only()
        if self.core.degraded is not None:
            _log.warning(
                "file store %s (read-only): %s; reads go to the record files until a "
                "writable open or repair() rebuilds the indexes",
                self.core.root,
                self.core.degraded,
            )
        return meta

    def _subdir(self, name: str) -> int:
        try:
            fd = self.core.open_dir(self.core.fd("root"), name, create=True)
        except IndexDamaged as exc:
            raise StoreFormatError(f"{self.core.where(name)}: {exc}") from None
        assert fd is not None
        return fd

    def _open_meta(self, root: int, now: datetime) -> fmt.Meta:
        names = self.core.io.listdir(root)
        if fmt.META_NAME not in names:
            foreign = sorted(n for n in names if n not in fmt.ROOT_NAMES and not n.startswith("."))
            if foreign:
                raise StoreFormatError(
                    f"{self.core.root} is not empty and is not a statekeeper file store "
                    f"(it holds {', '.join(map(repr, foreign[:5]))}); "
                    "point the store at a new or empty directory"
                )
            if not self.core.create:
                raise self._not_found()
        self.core.fd_table["lock"] = self.core.io.open(
            fmt.LOCK_NAME, RW_FILE | _CREAT, 0o666, dir_fd=root
        )
        with self.core.locked():
            try:
                data = self.core.read_file(root, fmt.META_NAME)
            except RecordProblem as exc:
                raise StoreFormatError(f"{self.core.where(fmt.META_NAME)}: {exc.reason}") from None
            if data is not None:
                return fmt.Meta.from_bytes(data, self.core.where(fmt.META_NAME))
            meta = fmt.Meta.new(now)
            # Creating a store is always made durable, whatever the durability option.
            tmp = f".{fmt.META_NAME}.tmp"
            self.core.unlink_quiet(tmp, root)
            self.core.write_new(root, tmp, meta.to_bytes(), sync=True)
            self.core.io.rename(tmp, fmt.META_NAME, src_dir_fd=root, dst_dir_fd=root)
            self.core.io.fsync(root)
            return meta

    def _open_state(self) -> int:
        root = self.core.fd("root")
        try:
            fd = self.core.io.open(fmt.STATE_NAME, RW_FILE, dir_fd=root)
        except FileNotFoundError:
            # Both copies empty: the first transaction finds no state and rebuilds
            # it from the records (a new store, or one whose state file was lost).
            tmp = f".{fmt.STATE_NAME}.tmp"
            self.core.unlink_quiet(tmp, root)
            self.core.write_new(root, tmp, bytes(fmt.STATE_SIZE), sync=True)
            self.core.io.rename(tmp, fmt.STATE_NAME, src_dir_fd=root, dst_dir_fd=root)
            self.core.io.fsync(root)
            fd = self.core.io.open(fmt.STATE_NAME, RW_FILE, dir_fd=root)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreFormatError(
                    f"{self.core.where(fmt.STATE_NAME)} is a symbolic link"
                ) from None
            raise
        return fd

    def _startup_recovery(self) -> None:
        """After a machine restart, index the records above the sync mark again; then
        finish a crashed writer's journal; then check the derived data (see
        :meth:`damage_at_open`). What is damaged or missing is rebuilt from the
        records (an unreadable state already was, by ``txn``)."""
        tx = self.recovery.txn()
        boot = self.core.io.boot_id()
        reasons: list[str] = []
        try:
            pending = tx.state.journal
            if pending is not None and pending.op in fmt.BATCH_OPS:
                # First: a half-written batch must be gone (or complete) before the
                # restart recovery indexes the records above the sync mark.
                self.recovery.resolve_batch(tx)
            if boot is None or tx.state.boot != boot:
                recover_restart(self.recovery, tx, boot)
            journal = tx.state.journal
            if journal is not None and not self.rebuild.insert_done(tx, journal):
                self.recovery.recover_journal(tx)
        except IndexDamaged as exc:
            reasons.append(str(exc))
        reasons += self.rebuild.damage_at_open(tx)
        if reasons:
            _log.warning(
                "file store %s: rebuilding its indexes from the records: %s",
                self.core.root,
                "; ".join(reasons),
            )
            self.rebuild.rebuild_all(tx)
        if tx.state.boot != boot:
            tx.commit(boot=boot)
            tx.sync()
