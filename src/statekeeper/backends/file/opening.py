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
from . import format as fmt
from .core import RO_FILE, RW_FILE, RecordProblem
from .index import IndexDamaged
from .recovery import RecoveryMixin
from .restart import recover_restart

__all__ = ["Opening"]

_log = logging.getLogger("statekeeper.backends.file")
_CREAT = os.O_CREAT
_APPEND = os.O_APPEND


class Opening:
    """Open, create and check a store (see the module docstring): a part of the
    engine, given the engine's recovery (and, through it, its files)."""

    def __init__(self, engine: RecoveryMixin) -> None:
        self.engine = engine

    def open(self, now: datetime) -> fmt.Meta:
        """Open the store (creating it if ``create``); finish a crashed writer's
        journal, after a machine restart re-index what a power cut may have lost, and
        rebuild from the records what is damaged or missing. A read-only open does
        none of that and writes nothing: it reads from the records instead when the
        indexes cannot be trusted (``degraded``)."""
        try:
            root = self.engine.io.open_root(self.engine.root, create=self.engine.create)
        except (FileNotFoundError, NotADirectoryError):
            if self.engine.create:
                raise
            raise self._not_found() from None
        self.engine._fds = {"root": root}
        self.engine.degraded = None
        try:
            if self.engine.read_only:
                meta = self._open_read_only(root)
            else:
                meta = self._open_meta(root, now)
                self.engine.store_id = meta.store_id
                with self.engine.locked():
                    self.engine._fds["records"] = self._subdir(fmt.RECORDS_DIR)
                    self.engine._fds["streams"] = self._subdir(fmt.STREAMS_DIR)
                    self.engine._fds["state"] = self._open_state()
                    self.engine._fds["dirty"] = self.engine.io.open(
                        fmt.DIRTY_NAME, RW_FILE | _CREAT | _APPEND, 0o666, dir_fd=root
                    )
                    self._startup_recovery()
        except BaseException:
            self.engine.close_fds()
            raise
        return meta

    def _not_found(self) -> StoreNotFound:
        return StoreNotFound(
            f"there is no file store at {self.engine.root}; check the path, or open it with "
            "create=True (and without read_only) to create one"
        )

    def _open_read_only(self, root: int) -> fmt.Meta:
        """Open without writing a byte: no lock file, no recovery, no rebuild."""
        if fmt.META_NAME not in self.engine.io.listdir(root):
            raise self._not_found()
        try:
            data = self.engine.read_file(root, fmt.META_NAME)
        except RecordProblem as exc:
            raise StoreFormatError(f"{self.engine.where(fmt.META_NAME)}: {exc.reason}") from None
        if data is None:
            raise self._not_found()
        meta = fmt.Meta.from_bytes(data, self.engine.where(fmt.META_NAME))
        self.engine.store_id = meta.store_id
        for name in (fmt.RECORDS_DIR, fmt.STREAMS_DIR):
            try:
                fd = self.engine.open_dir(root, name, create=False)
            except IndexDamaged as exc:
                raise StoreFormatError(f"{self.engine.where(name)}: {exc}") from None
            if fd is not None:
                self.engine._fds[name] = fd
        if "records" not in self.engine._fds:
            raise StoreFormatError(
                f"{self.engine.where(fmt.RECORDS_DIR)} is missing: the store's creation was cut "
                "short; open it once without read_only to finish it"
            )
        try:
            self.engine._fds["state"] = self.engine.io.open(fmt.STATE_NAME, RO_FILE, dir_fd=root)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreFormatError(
                    f"{self.engine.where(fmt.STATE_NAME)} is a symbolic link"
                ) from None
            raise
        self.engine.degraded = self.engine.damage_read_only()
        if self.engine.degraded is not None:
            _log.warning(
                "file store %s (read-only): %s; reads go to the record files until a "
                "writable open or repair() rebuilds the indexes",
                self.engine.root,
                self.engine.degraded,
            )
        return meta

    def _subdir(self, name: str) -> int:
        try:
            fd = self.engine.open_dir(self.engine.fd("root"), name, create=True)
        except IndexDamaged as exc:
            raise StoreFormatError(f"{self.engine.where(name)}: {exc}") from None
        assert fd is not None
        return fd

    def _open_meta(self, root: int, now: datetime) -> fmt.Meta:
        names = self.engine.io.listdir(root)
        if fmt.META_NAME not in names:
            foreign = sorted(n for n in names if n not in fmt.ROOT_NAMES and not n.startswith("."))
            if foreign:
                raise StoreFormatError(
                    f"{self.engine.root} is not empty and is not a statekeeper file store "
                    f"(it holds {', '.join(map(repr, foreign[:5]))}); "
                    "point the store at a new or empty directory"
                )
            if not self.engine.create:
                raise self._not_found()
        self.engine._fds["lock"] = self.engine.io.open(
            fmt.LOCK_NAME, RW_FILE | _CREAT, 0o666, dir_fd=root
        )
        with self.engine.locked():
            try:
                data = self.engine.read_file(root, fmt.META_NAME)
            except RecordProblem as exc:
                raise StoreFormatError(
                    f"{self.engine.where(fmt.META_NAME)}: {exc.reason}"
                ) from None
            if data is not None:
                return fmt.Meta.from_bytes(data, self.engine.where(fmt.META_NAME))
            meta = fmt.Meta.new(now)
            # Creating a store is always made durable, whatever the durability option.
            tmp = f".{fmt.META_NAME}.tmp"
            self.engine.unlink_quiet(tmp, root)
            self.engine.write_new(root, tmp, meta.to_bytes(), sync=True)
            self.engine.io.rename(tmp, fmt.META_NAME, src_dir_fd=root, dst_dir_fd=root)
            self.engine.io.fsync(root)
            return meta

    def _open_state(self) -> int:
        root = self.engine.fd("root")
        try:
            fd = self.engine.io.open(fmt.STATE_NAME, RW_FILE, dir_fd=root)
        except FileNotFoundError:
            # Both copies empty: the first transaction finds no state and rebuilds
            # it from the records (a new store, or one whose state file was lost).
            tmp = f".{fmt.STATE_NAME}.tmp"
            self.engine.unlink_quiet(tmp, root)
            self.engine.write_new(root, tmp, bytes(fmt.STATE_SIZE), sync=True)
            self.engine.io.rename(tmp, fmt.STATE_NAME, src_dir_fd=root, dst_dir_fd=root)
            self.engine.io.fsync(root)
            fd = self.engine.io.open(fmt.STATE_NAME, RW_FILE, dir_fd=root)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreFormatError(
                    f"{self.engine.where(fmt.STATE_NAME)} is a symbolic link"
                ) from None
            raise
        return fd

    def _startup_recovery(self) -> None:
        """After a machine restart, index the records above the sync mark again; then
        finish a crashed writer's journal; then check the derived data (see
        :meth:`damage_at_open`). What is damaged or missing is rebuilt from the
        records (an unreadable state already was, by ``_txn``)."""
        tx = self.engine._txn()
        boot = self.engine.io.boot_id()
        reasons: list[str] = []
        try:
            pending = tx.state.journal
            if pending is not None and pending.op in fmt.BATCH_OPS:
                # First: a half-written batch must be gone (or complete) before the
                # restart recovery indexes the records above the sync mark.
                self.engine._resolve_batch(tx)
            if boot is None or tx.state.boot != boot:
                recover_restart(self.engine, tx, boot)
            journal = tx.state.journal
            if journal is not None and not self.engine._insert_done(tx, journal):
                self.engine._recover_journal(tx)
        except IndexDamaged as exc:
            reasons.append(str(exc))
        reasons += self.engine.damage_at_open(tx)
        if reasons:
            _log.warning(
                "file store %s: rebuilding its indexes from the records: %s",
                self.engine.root,
                "; ".join(reasons),
            )
            self.engine._rebuild_all(tx)
        if tx.state.boot != boot:
            tx.commit(boot=boot)
            tx.sync()
