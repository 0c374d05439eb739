"""Durability of the file backend: fsync ordering under simulated power loss.
(I/O errors injected at every step are in ``test_file_io_errors.py``.)

A SIGKILL test cannot see a missing fsync (the page cache survives the process),
so :class:`SimFS` runs the store over an in-memory file system that keeps two
versions of everything: what the running system sees, and what is on the "disk"
(file contents as of their last fsync, directory entries as of their directory's
last fsync). :meth:`SimFS.crash` returns the disk: a reboot after a power cut.
Two mutants, one whose record fsyncs do nothing and one whose directory fsyncs do
nothing, must make the power-loss check fail.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import re
import stat
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file.io import FileIO
from statekeeper.errors import (
    CheckpointDecodeError,
    CheckpointNotFound,
)

pytestmark = pytest.mark.reliability

# -- the simulated file system ----------------------------------------------------------


@dataclass(eq=False)
class _Node:
    ino: int
    is_dir: bool
    data: bytearray = field(default_factory=bytearray)
    synced: bytes = b""
    entries: dict[str, _Node] = field(default_factory=dict)
    synced_entries: dict[str, _Node] = field(default_factory=dict)
    lock_owner: int | None = None


@dataclass
class _Open:
    node: _Node
    name: str
    flags: int
    pos: int = 0


class PowerCut(BaseException):
    """The power went out: the process stops at this system call."""


class SimFS:
    """A :class:`FileIO` over an in-memory tree that forgets what was not fsynced.

    Files and directories only (no links). A power cut keeps each file as of its
    last fsync, except that half of the very last unsynced write lands (torn).
    ``cut_after=n`` cuts the power at the n-th mutating call: it raises
    :class:`PowerCut`, and so does every call after.
    """

    MUTATING = frozenset(
        {"write", "pwrite", "fsync", "fdatasync", "ftruncate", "rename", "unlink", "mkdir"}
    )

    def __init__(self, root: _Node | None = None, *, boot: int = 1, next_ino: int = 2) -> None:
        self.root = root if root is not None else _Node(1, True)
        self.boot = boot
        self._ino = next_ino
        self._fds: dict[int, _Open] = {}
        self._next_fd = 1000
        self._mutex = threading.RLock()
        self.cut_after: int | None = None
        self.mutations = 0
        self.dead = False
        self.trace: list[tuple[str, str]] = []
        # The last write not yet made durable: a power cut tears it (half lands).
        self._last_write: tuple[_Node, int, bytes] | None = None

    # plumbing ------------------------------------------------------------------------

    def _step(self, op: str, name: str = "") -> None:
        if self.dead:
            raise PowerCut(op)
        if op in self.MUTATING:
            self.mutations += 1
            if self.cut_after is not None and self.mutations >= self.cut_after:
                self.dead = True
                raise PowerCut(op)
        self.trace.append((op, name))

    def _dir(self, fd: int) -> _Node:
        node = self._fds[fd].node
        if not node.is_dir:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        return node

    def _fd(self, node: _Node, name: str, flags: int) -> int:
        self._next_fd += 1
        self._fds[self._next_fd] = _Open(node, name, flags)
        return self._next_fd

    def _new(self, is_dir: bool) -> _Node:
        self._ino += 1
        return _Node(self._ino, is_dir)

    @staticmethod
    def _stat(node: _Node) -> os.stat_result:
        mode = (stat.S_IFDIR | 0o755) if node.is_dir else (stat.S_IFREG | 0o644)
        return os.stat_result((mode, node.ino, 1, 1, 0, 0, len(node.data), 0, 0, 0))

    def crash(self) -> SimFS:
        """The disk after a power cut, as the next boot finds it."""
        with self._mutex:
            copies: dict[int, _Node] = {}

            def durable(node: _Node) -> _Node:
                if node.ino in copies:
                    return copies[node.ino]
                data = bytearray(node.synced)
                if self._last_write is not None and self._last_write[0] is node:
                    _, offset, torn = self._last_write
                    self._put(_Node(0, False, data), torn[: len(torn) // 2], offset)
                new = _Node(node.ino, node.is_dir, data, bytes(data))
                copies[node.ino] = new
                for name, child in node.synced_entries.items():
                    new.entries[name] = durable(child)
                new.synced_entries = dict(new.entries)
                return new

            return SimFS(durable(self.root), boot=self.boot + 1, next_ino=self._ino)

    def restart(self) -> SimFS:
        """The same files, unsynced data and all, as the next process finds them after
        this one was killed: the kernel dropped its locks, the boot id is the same."""
        with self._mutex:
            stack = [self.root]
            while stack:
                node = stack.pop()
                node.lock_owner = None
                stack.extend(node.entries.values())
            return SimFS(self.root, boot=self.boot, next_ino=self._ino)

    def names(self, path: str = "") -> list[str]:
        """Every path in the live tree (for assertions)."""
        out: list[str] = []

        def walk(node: _Node, prefix: str) -> None:
            for name, child in node.entries.items():
                out.append(prefix + name)
                if child.is_dir:
                    walk(child, prefix + name + "/")

        walk(self.root, path)
        return out

    # the FileIO interface -------------------------------------------------------------

    def open_root(self, path: str, *, create: bool) -> int:
        with self._mutex:
            self._step("open_root", path)
            return self._fd(self.root, path, os.O_RDONLY)

    def open(self, name: str, flags: int, mode: int = 0o666, *, dir_fd: int) -> int:
        with self._mutex:
            self._step("open", name)
            parent = self._dir(dir_fd)
            node = parent.entries.get(name)
            if node is None:
                if not flags & os.O_CREAT:
                    raise FileNotFoundError(errno.ENOENT, "no such file", name)
                node = parent.entries[name] = self._new(False)
            elif flags & os.O_CREAT and flags & os.O_EXCL:
                raise FileExistsError(errno.EEXIST, "file exists", name)
            if flags & os.O_DIRECTORY and not node.is_dir:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", name)
            if flags & os.O_TRUNC:
                node.data = bytearray()
            return self._fd(node, name, flags)

    def close(self, fd: int) -> None:
        with self._mutex:
            self._step("close")
            handle = self._fds.pop(fd)
            if handle.node.lock_owner == fd:
                handle.node.lock_owner = None

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._mutex:
            self._step("pread")
            return bytes(self._fds[fd].node.data[offset : offset + size])

    @staticmethod
    def _put(node: _Node, data: bytes, offset: int) -> None:
        if len(node.data) < offset:
            node.data.extend(bytes(offset - len(node.data)))
        node.data[offset : offset + len(data)] = data

    def write(self, fd: int, data: bytes) -> int:
        with self._mutex:
            handle = self._fds[fd]
            self._step("write", handle.name)
            if handle.flags & os.O_APPEND:
                handle.pos = len(handle.node.data)
            self._put(handle.node, bytes(data), handle.pos)
            self._last_write = (handle.node, handle.pos, bytes(data))
            handle.pos += len(data)
            return len(data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        with self._mutex:
            handle = self._fds[fd]
            self._step("pwrite", handle.name)
            self._put(handle.node, bytes(data), offset)
            self._last_write = (handle.node, offset, bytes(data))
            return len(data)

    def fsync(self, fd: int) -> None:
        with self._mutex:
            handle = self._fds[fd]
            self._step("fsync", handle.name)
            self._sync(handle)

    def fdatasync(self, fd: int) -> None:
        with self._mutex:
            handle = self._fds[fd]
            self._step("fdatasync", handle.name)
            self._sync(handle)

    def _sync(self, handle: _Open) -> None:
        node = handle.node
        if node.is_dir:
            node.synced_entries = dict(node.entries)
        else:
            node.synced = bytes(node.data)
            if self._last_write is not None and self._last_write[0] is node:
                self._last_write = None

    def ftruncate(self, fd: int, length: int) -> None:
        with self._mutex:
            handle = self._fds[fd]
            self._step("ftruncate", handle.name)
            del handle.node.data[length:]
            if len(handle.node.data) < length:
                handle.node.data.extend(bytes(length - len(handle.node.data)))

    def fstat(self, fd: int) -> os.stat_result:
        with self._mutex:
            self._step("fstat")
            return self._stat(self._fds[fd].node)

    def lstat(self, name: str, *, dir_fd: int) -> os.stat_result:
        with self._mutex:
            self._step("lstat", name)
            node = self._dir(dir_fd).entries.get(name)
            if node is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", name)
            return self._stat(node)

    def rename(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        with self._mutex:
            self._step("rename", f"{src} -> {dst}")
            source = self._dir(src_dir_fd)
            if src not in source.entries:
                raise FileNotFoundError(errno.ENOENT, "no such file", src)
            self._dir(dst_dir_fd).entries[dst] = source.entries.pop(src)

    def unlink(self, name: str, *, dir_fd: int) -> None:
        with self._mutex:
            self._step("unlink", name)
            parent = self._dir(dir_fd)
            if name not in parent.entries:
                raise FileNotFoundError(errno.ENOENT, "no such file", name)
            del parent.entries[name]

    def mkdir(self, name: str, mode: int = 0o777, *, dir_fd: int) -> None:
        with self._mutex:
            self._step("mkdir", name)
            parent = self._dir(dir_fd)
            if name in parent.entries:
                raise FileExistsError(errno.EEXIST, "file exists", name)
            parent.entries[name] = self._new(True)

    def rmdir(self, name: str, *, dir_fd: int) -> None:
        with self._mutex:
            self._step("rmdir", name)
            parent = self._dir(dir_fd)
            node = parent.entries.get(name)
            if node is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", name)
            if not node.is_dir:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", name)
            if node.entries:
                raise OSError(errno.ENOTEMPTY, "directory not empty", name)
            del parent.entries[name]

    def listdir(self, dir_fd: int) -> list[str]:
        with self._mutex:
            self._step("listdir")
            return list(self._dir(dir_fd).entries)

    def flock(self, fd: int, operation: int) -> None:
        with self._mutex:
            self._step("flock")
            node = self._fds[fd].node
            if operation & fcntl.LOCK_UN:
                if node.lock_owner == fd:
                    node.lock_owner = None
            elif node.lock_owner not in (None, fd):
                raise BlockingIOError(errno.EWOULDBLOCK, "locked")
            else:
                node.lock_owner = fd

    def boot_id(self) -> str | None:
        return f"sim-boot-{self.boot}"


_RECORD_TEMP = re.compile(r"\.\d{20}\.[0-9a-f]+\.tmp")
_BUCKET = re.compile(r"\d{17}")


class NoRecordFsync(SimFS):
    """Mutant: the fsync of a record's temp file does nothing."""

    def _sync(self, handle: _Open) -> None:
        if not handle.node.is_dir and _RECORD_TEMP.fullmatch(handle.name):
            return
        super()._sync(handle)


class NoBucketDirFsync(SimFS):
    """Mutant: the fsync of a record's directory does nothing."""

    def _sync(self, handle: _Open) -> None:
        if handle.node.is_dir and _BUCKET.fullmatch(handle.name):
            return
        super()._sync(handle)


assert isinstance(SimFS(), FileIO)

# -- the workload and its check -----------------------------------------------------------


@dataclass
class Log:
    """What the application was told: acknowledged saves, updates and deletes."""

    live: dict[str, Any] = field(default_factory=dict)  # id -> state
    streams: dict[str, list[str]] = field(default_factory=dict)  # stream -> ids in order
    deleted: set[str] = field(default_factory=set)
    in_doubt: set[str] = field(default_factory=set)  # the operation the power cut hit


async def workload(store: FileCheckpointStore, log: Log, rng: random.Random, ops: int) -> None:
    for i in range(ops):
        choice = rng.random()
        if choice < 0.7 or not log.live:
            stream = f"s{rng.randrange(3)}"
            cid = f"c{i}-{rng.randrange(10**6)}"
            log.in_doubt = {cid}
            await store.save(stream, {"i": i}, id=cid)
            log.live[cid] = {"i": i}
            log.streams.setdefault(stream, []).append(cid)
        elif choice < 0.85:
            cid = rng.choice(sorted(log.live))
            log.in_doubt = {cid}
            await store.update(cid, {"i": i, "updated": True})
            log.live[cid] = {"i": i, "updated": True}
        else:
            cid = rng.choice(sorted(log.live))
            log.in_doubt = {cid}
            await store.delete(cid)
            del log.live[cid]
            log.deleted.add(cid)
        log.in_doubt = set()


async def problems_after_reboot(fs: SimFS, log: Log) -> list[str]:
    """Open the store on the disk image and list every broken promise."""
    found: list[str] = []
    async with FileCheckpointStore("/store", io=fs) as store:
        for cid, state in log.live.items():
            if cid in log.in_doubt:
                continue
            try:
                got = await store.load(cid)
            except (CheckpointNotFound, CheckpointDecodeError) as exc:
                found.append(f"acknowledged {cid} lost: {exc}")
                continue
            if got.state != state:
                found.append(f"{cid} is {got.state}, acknowledged {state}")
        for cid in log.deleted - log.in_doubt:
            try:
                await store.load(cid)
                found.append(f"deleted {cid} came back")
            except CheckpointNotFound:
                pass
        for stream, ids in log.streams.items():
            expected = [c for c in ids if c in log.live and c not in log.in_doubt]
            try:
                latest = await store.get_latest(stream)
            except CheckpointDecodeError as exc:
                found.append(f"get_latest({stream}) fails: {exc}")
                continue
            if expected and (latest is None or latest.id not in {expected[-1], *log.in_doubt}):
                found.append(f"get_latest({stream}) is {latest and latest.id}, not {expected[-1]}")
        page = await store.list(None, limit=1000, order="asc")
        if page.skipped:
            found.append(f"unreadable records after the reboot: {page.skipped}")
        listed = [cp.id for cp in page.items]
        if listed != sorted(
            listed, key=lambda c: next(cp.sequence for cp in page.items if cp.id == c)
        ):
            found.append("list(None) is out of sequence order")
        missing = {c for c in log.live if c not in log.in_doubt} - set(listed)
        if missing:
            found.append(f"list(None) misses {sorted(missing)}")
        cp = await store.save("after", {"ok": True})
        if (await store.get_latest("after")) != cp:
            found.append("the store does not work after the reboot")
    return found


async def power_cut_run(
    fs_class: type[SimFS], seed: int, ops: int = 30, *, power: bool = True
) -> list[str]:
    """Run the workload and cut the power (or, with ``power=False``, kill the process)
    at a random call; return the broken promises."""
    rng = random.Random(seed)
    fs = fs_class()
    fs.cut_after = rng.randrange(40, 40 + ops * 14)
    log = Log()
    store = FileCheckpointStore("/store", io=fs, sync_interval=7)
    try:
        await store.open()
        await workload(store, log, rng, ops)
    except PowerCut:
        pass
    else:
        log.in_doubt = set()
    if not fs.dead:
        await store.close()
        fs.dead = True  # the power goes anyway, after the last acknowledgement
    return await problems_after_reboot(fs.crash() if power else fs.restart(), log)


# -- power loss ---------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", range(10))
async def test_acknowledged_writes_survive_a_power_cut(seed: int) -> None:
    assert await power_cut_run(SimFS, seed) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", range(10))
async def test_a_writer_killed_mid_operation_is_finished_by_the_next(seed: int) -> None:
    """No power cut: the page cache survives, so this exercises the journal alone."""
    assert await power_cut_run(SimFS, seed, power=False) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("mutant", [NoRecordFsync, NoBucketDirFsync])
async def test_dropping_either_fsync_loses_acknowledged_saves(mutant: type[SimFS]) -> None:
    """The check above has teeth: without the record's fsync, or without its
    directory's fsync, acknowledged saves do not survive the same power cuts."""
    for seed in range(4):
        assert await power_cut_run(mutant, seed), f"{mutant.__name__} survived seed {seed}"


@pytest.mark.asyncio
async def test_full_durability_orders_fsync_rename_and_directory_fsync() -> None:
    fs = SimFS()
    async with FileCheckpointStore("/store", io=fs) as store:
        await store.save("job", {"step": 0})
        fs.trace.clear()
        cp = await store.save("job", {"step": 1})
    ops = [(op, name) for op, name in fs.trace if op in SimFS.MUTATING]
    final = f"{cp.sequence:020d}.{cp.id}.ckpt"
    write = next(i for i, (op, n) in enumerate(ops) if op == "write" and _RECORD_TEMP.fullmatch(n))
    temp = ops[write][1]
    fsync = ops.index(("fsync", temp))
    rename = ops.index(("rename", f"{temp} -> {final}"))
    dir_fsync = next(i for i, (op, n) in enumerate(ops) if op == "fsync" and _BUCKET.fullmatch(n))
    index_write = next(i for i, (op, n) in enumerate(ops) if op == "pwrite" and n == "job.idx")
    assert write < fsync < rename < dir_fsync < index_write, ops


@pytest.mark.asyncio
async def test_fast_durability_makes_no_fsync_on_the_save_path() -> None:
    fs = SimFS()
    async with FileCheckpointStore("/store", io=fs, durability="fast") as store:
        await store.save("job", {"step": 0})
        fs.trace.clear()
        for i in range(5):
            await store.save("job", {"step": i})
        cp = await store.save("job", {"step": 9})
        await store.update(cp.id, {"step": 10})
        await store.delete(cp.id)
    assert not [op for op, _ in fs.trace if op in ("fsync", "fdatasync")]
