"""``file://``: a checkpoint store in a local directory, safe across processes and
crashes. The on-disk layout is documented in ``docs/file-backend.md``.

Design in one paragraph: every checkpoint is one record file,
``records/<bucket>/<seq>.<id>.ckpt``, holding the checksummed envelope of
:mod:`statekeeper.record`; its name carries the sequence, which must match the one
inside. Per-stream index files (fixed-size slots sorted by sequence) and an id hash
table make ``get_latest``, ``load`` and a page cost the same at ten checkpoints or
ten million; they are derived data, rebuilt from the records when a crash may have
cost them writes. Writers serialise on ``flock``; readers take no lock.

The store builds the parts over the engine's (:class:`~.engine.FileEngine`): the
batches, the listing, the strict reads and the pages, and maps the base class's
primitives onto them in one worker thread hop each, or none (``inline_reads``).

**The writer thread.** The saves go through the shared group commit (SPEC S15):

- :class:`FileSaves`: the :class:`~statekeeper._runtime.group.GroupRunner` of file
  saves: a lone save is ``Writes.insert`` (one save, its fsyncs); a group is
  ``Batches.insert_group`` (one lock hold, ONE fsync group, one outcome each); there
  is nothing to abort (``insert_group`` leaves no group half done);
- :class:`SaveWriter`: the store's writer thread, a
  :class:`~statekeeper._runtime.worker.Worker` with a
  :class:`~statekeeper._runtime.group.GroupCommit` of :class:`FileSaves`, started on
  the first save, started again in a forked child (the parent's thread is not
  there) and after :meth:`SaveWriter.close`.

Nothing here holds the store itself: the writer's thread outlives nothing it
should not, and the store can be collected unclosed (its finalizer then closes it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import weakref
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, ClassVar, Literal, Self, TypeVar

from pydantic import Field

from ..._core.integrity import repair_records
from ..._core.primitives import StoreIdentity
from ..._core.query import INLINE_PAGE_ROWS, PageScan, ScanQuery, probe_bound, probe_query
from ..._core.store import BaseCheckpointStore
from ..._runtime.finalizer import when_collected
from ..._runtime.group import GroupCommit, Settled
from ..._runtime.inline import WORKER, Budget, WouldBlock
from ..._runtime.threads import ThreadDoor
from ..._runtime.worker import Job, Worker
from ..._url import StoreURL
from ...config import Capabilities, StoreOptions
from ...errors import BackendError, InvalidURL, StatekeeperError
from ...models import CheckpointHeader, Problem, RepairReport, Skipped
from ...record import NewRecord, StoredRecord, Update
from .batch import Batches
from .check import check_store
from .engine import FileEngine
from .indexes import IndexDamaged
from .io import FileIO, OsFileIO
from .pages import Entry, PageEntries, Pages, ProbeOf
from .reader import Listing, Reader
from .survey import take_survey

__all__ = [
    "MAX_GROUP",
    "FileCheckpointStore",
    "FileParts",
    "FileSaves",
    "FileStoreOptions",
    "SaveWriter",
]

T = TypeVar("T")

#: The most saves committed in one group.
MAX_GROUP = 256


class FileStoreOptions(StoreOptions):
    """Options of :class:`FileCheckpointStore` (beyond those every backend takes).

    ``durability``: ``"full"`` (default) fsyncs every save, update and delete before
    it returns, so it survives a power cut; ``"fast"`` makes no fsyncs on those
    paths: a save survives the process being killed, not the machine losing power.
    """

    #: Seconds a writer waits for the inter-process write lock before
    #: :class:`~statekeeper.errors.StoreTimeout`.
    lock_timeout: float = Field(default=30.0, gt=0, le=86_400)
    #: Saves between two flushes of the indexes. After a machine restart the records
    #: written since the last flush are indexed again, so this bounds that work.
    sync_interval: int = Field(default=512, ge=1, le=1_000_000)
    #: How ``save_many`` makes its record files durable as a group (full
    #: durability): ``"syncfs"``, one ``syncfs(2)`` of the store's file system
    #: (it also writes back whatever else is dirty on that file system);
    #: ``"fsync"``, one ``fsync`` per record file; ``"auto"``, ``syncfs`` on Linux
    #: 5.8 or later (older kernels do not report its write errors), else ``fsync``.
    batch_sync: Literal["auto", "syncfs", "fsync"] = "auto"
    #: Run ``get_latest``, ``load`` and listed pages of one stream (up to 100 items)
    #: on the event loop's thread when they are the cheap indexed read (reads of
    #: files the OS usually has cached, no lock, no wait, no record over 1 MiB), and
    #: in the worker thread otherwise (a damaged or missing index, a crashed
    #: writer's journal, a concurrent writer in the way, a damaged record, a page
    #: that would skip one), with the same answers and errors either way. ``False``
    #: sends every read to the worker thread.
    inline_reads: bool = True


class FileParts:
    """A file store's engine and the parts built over it: what
    :class:`FileCheckpointStore` maps its primitives onto, and what a white-box
    test builds over a directory (then ``engine.open(now)``) to call one part
    directly, with a budget of its choosing.

    ``engine`` owns the files, the lock, the state and the descriptor cache and
    holds the write side (``engine.writes``); ``batches``, ``listing``, ``reader``
    and ``pages`` are each given the engine's collaborators they use."""

    def __init__(self, path: str, io: FileIO, opts: FileStoreOptions) -> None:
        self.engine = engine = FileEngine(
            path,
            io,
            durable=opts.durability == "full",
            lock_timeout=opts.lock_timeout,
            # Room for the largest state the codec accepts plus a header at its limits.
            max_record_bytes=2 * opts.max_bytes + (1 << 20),
            sync_interval=opts.sync_interval,
            create=opts.create,
            read_only=opts.read_only,
        )
        files, fdcache, statefile = engine.files, engine.fdcache, engine.statefile
        self.batches = Batches(
            files,
            fdcache,
            engine.rebuild,
            engine.recovery,
            engine.writes,
            batch_sync=opts.batch_sync,
        )
        self.listing = Listing(files, fdcache, statefile, lambda: engine.degraded)
        self.reader = Reader(
            files,
            fdcache,
            statefile,
            engine.lock,
            self.listing,
            recover=engine.recovery.recover_pending,
            read_only=opts.read_only,
        )
        self.pages = Pages(files, self.listing, self.reader)

    def call(self, what: str, func: Callable[..., T], *args: Any) -> T:
        """``func(*args)``, one of the parts' functions, while the store is open
        (:meth:`.files.Files.close` waits for it): the one place where its errors become
        :class:`~statekeeper.errors.BackendError` with ``.orig``, naming the
        operation ``what`` and the store (every worker hop of the store and every
        inline call goes through it)."""
        try:
            with self.engine.files.active():
                return func(*args)
        except StatekeeperError:
            raise
        except IndexDamaged as exc:
            raise BackendError(
                f"{what} failed in the file store at {self.engine.files.root}: {exc}; "
                "FileCheckpointStore.repair() rebuilds the indexes from the records",
                orig=exc,
            ) from exc
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")
            raise BackendError(
                f"{what} failed in the file store at {self.engine.files.root}: "
                f"{exc.strerror or exc} ({name})",
                orig=exc,
            ) from exc


class FileCheckpointStore(BaseCheckpointStore[FileStoreOptions]):
    """A :class:`~statekeeper.CheckpointStore` in a local directory.

    ``FileCheckpointStore(path, **options)``, or ``open_store("file:///abs/dir")`` /
    ``open_store("file:relative/dir")``. The directory is created if missing, unless
    ``create=False`` or ``read_only=True``: then a missing store raises
    :class:`~statekeeper.errors.StoreNotFound` and nothing is created. A non-empty
    directory that is not a store raises
    :class:`~statekeeper.errors.StoreFormatError`, as does a store of a newer format.
    ``read_only=True`` writes nothing at all: no lock file, no recovery, no rebuild.

    **Damage.** Record files are the truth; the indexes, the id table and the state
    are rebuilt from them when an open finds them damaged or missing, and reads
    that meet a damaged index answer from the records. A damaged record is never
    forgotten: ``get_latest`` raises :class:`~statekeeper.errors.CheckpointDecodeError`
    naming it (also when its stream cannot be told and it is newer than the
    stream's newest), ``load`` raises, ``list`` reports it in ``skipped``, until
    ``repair(drop_damaged=True)``. ``verify()`` checks every index and table
    against the records without writing (see ``docs/file-backend.md``).

    **Durability.** With ``durability="full"`` (the default) a save writes a temp
    file in the record's directory, fsyncs it, renames it into place and fsyncs the
    directory before it returns: it survives a power cut. ``durability="fast"``
    skips those fsyncs: a save survives a crash of the process, but a power cut
    may lose the last few seconds of saves (see ``docs/file-backend.md``). On any
    I/O failure (ENOSPC, EIO) the temp file is removed, the previous data is
    intact, and a :class:`~statekeeper.errors.BackendError` is raised with the OS
    error in ``.orig``.

    **Concurrency.** Any number of tasks, threads and processes on one host may
    share a store. Writers serialise on ``flock`` of ``<dir>/lock`` (waiting up to
    ``lock_timeout`` seconds), so sequences are unique and in commit order.
    Saves that tasks of one event loop make while another of its saves is in
    flight are committed together when it returns (group commit: one lock hold
    and one fsync group; each save keeps its own outcome, and returns only once
    its record is as durable as ``durability`` says). Readers take no lock;
    ``get_latest`` and ``load`` are strict: they never return
    a checkpoint older than the newest committed before the call began, retry when
    a concurrent writer disturbs them, and raise
    :class:`~statekeeper.errors.ConcurrentModificationError` if that keeps
    happening. Every call runs its system calls in a worker thread, one hop per
    call, except that ``get_latest``, ``load`` and pages of one stream (up to 100
    items) run on the event loop's thread when they are the cheap indexed read
    (``inline_reads``, the default: reads of files the OS usually has cached, no
    lock, no wait, no record over 1 MiB) and
    take the hop wherever they would do more (damage, a crashed writer's journal, a
    concurrent writer in the way), with the same answers and errors.
    Not for network file systems (their ``flock`` is unreliable).

    **Untrusted files.** Record files are opened with ``O_NOFOLLOW|O_NONBLOCK`` and
    must be regular files with one link, under the size limit, before a byte is
    read; every directory is opened relative to its parent without following
    links. FIFOs, devices, symlinks, hard links, junk and stray temp files are
    skipped by ``list`` and reported in ``page.skipped``.

    Pass ``io=`` (a :class:`~statekeeper.backends.file.io.FileIO`) to run the store
    over a fault-injecting or crash-simulating file system.
    """

    Options: ClassVar[type[StoreOptions]] = FileStoreOptions
    capabilities: ClassVar[Capabilities] = Capabilities(
        persistent=True,
        cross_process=True,
        cross_host=False,
        power_loss_durable=True,
        ttl=True,
        raw_access=True,
        atomic_batches=True,
    )
    backend_name: ClassVar[str] = "file"
    #: A sweep's removal batch (S17): ``delete_many`` holds the write lock and syncs
    #: one index file per stream it touches, so a save waits for the whole batch.
    #: 128 against the default 500, on 20,000 checkpoints in 2,000 streams: a save's
    #: p99 during the sweep ~27 ms instead of ~78 ms, at the same removal rate.
    _sweep_batch: ClassVar[int] = 128

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        io: FileIO | None = None,
        clock: Callable[[], datetime] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(clock=clock, **options)
        raw = os.fspath(path)
        if not isinstance(raw, str) or not raw or "\x00" in raw:
            raise InvalidURL(f"a file store needs a directory path, got {path!r}")
        self.path = os.path.abspath(raw)
        opts = self.options
        self._parts = parts = FileParts(self.path, io if io is not None else OsFileIO(), opts)
        self._durable = opts.durability == "full"
        #: Every operation's worker hop (see _run), and the saves' writer thread
        #: with its group commit (see _insert). Their threads end at close(), or
        #: when this store is collected unclosed (they would otherwise wait forever).
        self._door = door = ThreadDoor("statekeeper-file")
        self._saves = saves = SaveWriter(
            "statekeeper-file-writer",
            FileSaves(parts),
        )
        self._release: weakref.finalize[[], object] = when_collected(self, _Release(door, saves))
        #: ``get_latest``, ``load`` and pages try the event loop's thread first (see
        #: _point_read and _scan_entries).
        self._inline_reads = opts.inline_reads

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> Self:
        """``file:///abs/dir`` (or ``file://localhost/abs/dir``) and ``file:rel/dir``."""
        if url.has_authority:
            if url.host not in (None, "", "localhost"):
                raise InvalidURL(
                    f"file store URLs name a local directory; {url} has host {url.host!r}"
                )
            if not url.path or url.path == "/":
                raise InvalidURL(f"{url} names no directory; use file:///abs/dir")
        elif not url.path:
            raise InvalidURL(f"{url} names no directory; use file:relative/dir")
        return cls(url.path, **url.merge_options(options))

    def describe(self) -> str:
        return f"file://{self.path}"

    async def _verify(self) -> list[Problem]:
        """Check the state, every stream index and the id table against the record
        files, and report foreign files (see :mod:`.check`). Writes nothing."""

        def checking() -> list[Problem]:
            return check_store(self._parts.engine.files, take_survey(self._parts.engine.files))

        return await self._run("verify", checking)

    async def _repair(self, drop_damaged: bool) -> RepairReport:
        """Rebuild the stream indexes, the id table and the state from the record
        files, keeping each damaged record as a damaged entry of its stream; with
        ``drop_damaged``, first remove the damaged record files (found by name, so
        also those whose bytes no longer say their id). Holds the write lock for
        the rebuild."""
        done = await self._run("repair", self._parts.engine.recovery.repair, drop_damaged)
        rebuilt = {"stream_indexes": done["streams"], "id_table": 1, "state": 1}
        actions = [
            f"rebuilt {done['streams']} stream index(es), the id table and the state "
            f"(high-water mark {done['high_water_mark']}) from {done['records']} record file(s)"
        ]
        for what, said in (("state", done["state"]), ("id table", done["ids"])):
            if said:
                actions.append(f"the {what} was damaged: {said}")
        if done["indexes"]:
            actions.append(f"replaced damaged stream index(es): {', '.join(done['indexes'])}")
        if done["temps"]:
            actions.append(f"removed {done['temps']} stray temporary file(s)")
        if done["orphans"]:
            actions.append(
                f"{done['orphans']} damaged record(s) belong to no stream that can be told; "
                "get_latest raises for streams whose newest checkpoint is older"
            )
        dropped = [
            Problem(
                kind="damaged-record",
                location=error.location or "",
                reason=error.reason,
                id=cid,
                sequence=seq,
            )
            for seq, cid, error in done["dropped"]
        ]
        if dropped:
            actions.append(f"removed {len(dropped)} damaged record file(s), as drop_damaged asked")
        report = await repair_records(self, drop_damaged, rebuilt=rebuilt, actions=actions)
        return report.model_copy(
            update={"dropped": dropped + report.dropped, "records": report.records}
        )

    # -- plumbing -----------------------------------------------------------------------

    async def _run(self, what: str, func: Callable[..., T], *args: Any) -> T:
        """Run one whole operation in a worker thread: one hop per call, not per
        system call. OS errors become :class:`BackendError` with ``.orig``."""
        return await self._door.run(self._call, what, func, *args)

    def _call(self, what: str, func: Callable[..., T], *args: Any) -> T:
        return self._parts.call(what, func, *args)

    # -- primitives ---------------------------------------------------------------------

    async def _open(self) -> StoreIdentity:
        def opening() -> StoreIdentity:
            try:
                meta = self._parts.engine.open(self.now())
            except StatekeeperError:
                raise
            except OSError as exc:
                raise BackendError(
                    f"cannot open the file store at {self.path}: {exc.strerror or exc}",
                    orig=exc,
                ) from exc
            return StoreIdentity(meta.store_id, meta.cursor_key, meta.version)

        return await self._door.run(opening)

    async def _close(self) -> None:
        try:
            await self._door.run(self._parts.engine.close)
        finally:
            self._door.close()
            self._saves.close()

    async def _insert(self, record: NewRecord) -> CheckpointHeader:
        """Group commit (S15) on the shared runtime (see the module): a save goes to
        the writer thread; the saves queued there while another is in flight go
        together (:meth:`.batch.Batches.insert_group`: one lock hold, one fsync
        group, one outcome each), each returning once that group's fsyncs returned.
        A save with none in flight goes alone, at once.

        With ``durability="fast"`` such a lone save runs on the event loop's thread,
        without the worker hop, when it can do so without waiting or syncing
        (:meth:`.engine.Writes.insert` with an inline budget: page-cache writes
        only, as a bare write + rename); where it would wait or sync, it takes the
        hop as any other."""
        insert, saves = self._parts.engine.writes.insert, self._saves
        if not saves.pending and not self._durable:
            with contextlib.suppress(WouldBlock):
                return self._call("save", insert, record, Budget(inline=True))
        header: CheckpointHeader = await saves.save(insert, record)
        return header

    async def _insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        """All or nothing, also after a crash; invisible to readers until complete;
        one fsync group (see :mod:`.batch`)."""
        return await self._run("save_many", self._parts.batches.insert_many, records)

    async def _get_many(self, ids: list[str], now: datetime) -> dict[str, StoredRecord]:
        """In the worker, one pass (``load_many`` of a single id reads it with
        :meth:`_get`, on the event loop's thread first)."""
        return await self._read("load_many", self._parts.reader.get_many, ids, now, inline=False)

    async def _delete_many(self, ids: list[str], now: datetime) -> int:
        return await self._run("delete_many", self._parts.batches.delete_many, ids, now)

    async def _list_streams_prefixed(self, now: datetime, prefix: str) -> list[str]:
        return await self._run("list_streams", self._parts.listing.list_streams, now, prefix)

    async def _update(self, update: Update) -> CheckpointHeader:
        return await self._run(
            "update",
            self._parts.engine.writes.update,
            update.id,
            update.state,
            update.if_match,
            update.now,
            update.etag,
            update.edits,
            update.codec,
        )

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        """On the event loop's thread first (see :meth:`_read`)."""
        return await self._read("load", self._parts.reader.get, id, now)

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        """On the event loop's thread first (see :meth:`_read`): the state, an index
        tail and one record file, no lock, no wait, no retry."""
        return await self._read("get_latest", self._parts.reader.latest, stream, now)

    async def _read(self, what: str, read: Callable[..., T], *args: Any, inline: bool = True) -> T:
        """``read(*args, budget)``, one function of the parts: with ``inline_reads``
        (and ``inline``) first on this thread under an inline budget, and where it
        would block (:class:`~statekeeper._runtime.inline.WouldBlock`) the same
        function again in the worker. The hop costs more than such a read."""
        if inline and self._inline_reads:
            try:
                return self._call(what, read, *args, Budget(inline=True))
            except WouldBlock:
                pass  # the worker reads it, below
        return await self._run(what, read, *args, WORKER)

    async def _scan(self, query: ScanQuery) -> list[StoredRecord | Skipped]:
        return (await self._scan_entries(query, None))[0]

    async def _scan_page(self, query: ScanQuery, probe: bool) -> PageScan:
        """A listed page's scan and its probe, read through one stream index in one
        worker hop (or none; see :meth:`_scan_entries`)."""
        if probe and query.metadata:  # the indexed probe knows no metadata filter
            return await super()._scan_page(query, probe)
        page, found = await self._scan_entries(query, self._probe_of(query) if probe else None)
        return PageScan(page, None if found is None else bool(found))

    async def _scan_entries(self, query: ScanQuery, probe_of: ProbeOf | None) -> PageEntries:
        """One scan and, with ``probe_of``, the one-entry probe the other way from the
        page's edge (:meth:`.pages.Pages.scan_page`), in one worker hop, or
        none: a page of up to :data:`~statekeeper._core.query.INLINE_PAGE_ROWS` rows
        runs on this thread first (see :meth:`_read`)."""
        scan_page, inline = self._parts.pages.scan_page, query.limit <= INLINE_PAGE_ROWS
        return await self._read("list", scan_page, query, probe_of, inline=inline)

    @staticmethod
    def _probe_of(query: ScanQuery) -> ProbeOf:
        """The probe :func:`statekeeper._core.paging.list_page` asks for after the page of
        ``query``: one entry the other way from the page's edge."""

        def probe_of(page: list[Entry]) -> ScanQuery:
            return probe_query(query, probe_bound(query, page))

        return probe_of

    async def _delete(self, id: str, *, if_match: str | None, now: datetime) -> bool:
        return await self._run("delete", self._parts.engine.writes.delete, id, if_match, now)

    async def _delete_stream(self, stream: str, now: datetime) -> int:
        return await self._run("delete_stream", self._parts.batches.delete_stream, stream, now)

    async def _prune(self, stream: str, keep_last: int, now: datetime) -> int:
        return await self._run("prune", self._parts.batches.prune, stream, keep_last, now)

    async def _purge_expired(self, now: datetime) -> int:
        return await self._run("purge_expired", self._parts.batches.purge_expired, now)

    async def _reclaim(self, full: bool) -> int | None:
        """Removed records' files are gone already; this removes the bucket
        directories they left empty. Their sizes are not counted: ``None``."""
        await self._run("reclaim", self._parts.batches.remove_empty_buckets)
        return None

    async def _list_streams(self, now: datetime) -> list[str]:
        return await self._run("list_streams", self._parts.listing.list_streams, now)

    async def _info(self) -> dict[str, Any]:
        return await self._run("info", self._parts.listing.info, self.now())

    async def backdoor_read_raw(self, id: str) -> bytes:
        """The record file's bytes, unverified (conformance kit backdoor)."""
        self._require_open()
        return await self._run("backdoor_read_raw", self._parts.reader.read_raw, id)

    async def backdoor_write_raw(self, id: str, data: bytes) -> None:
        """Replace the record file's bytes, unverified (conformance kit backdoor)."""
        self._require_writable("backdoor_write_raw")
        await self._run("backdoor_write_raw", self._parts.engine.writes.write_raw, id, bytes(data))


class FileSaves:
    """How a group of file saves is run and committed (a ``GroupRunner``) over a
    store's :class:`FileParts`. A job is ``(Writes.insert, (record,), ...)``."""

    def __init__(self, parts: FileParts) -> None:
        self._parts = parts

    def alone(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """One save, as ungrouped: its header, or its error."""
        return self._parts.call("save", fn, *args)

    def group(self, jobs: Sequence[Job]) -> tuple[Sequence[Settled], Sequence[Job]]:
        """The saves in one ``insert_group``: one lock hold, one fsync group. Each
        save gets its own outcome; an error of the group itself (raised) fails
        every save of it."""
        records: list[NewRecord] = [job[1][0] for job in jobs]
        parts = self._parts
        outcomes = parts.call("save", parts.batches.insert_group, records)
        return [
            (job, outcome, None) if isinstance(outcome, CheckpointHeader) else (job, None, outcome)
            for job, outcome in zip(jobs, outcomes, strict=True)
        ], []

    def abort(self) -> None:
        """Nothing: ``insert_group`` rolls back whatever of a failed group it did."""

    def idle(self) -> None:
        """After a lone save whose caller has its outcome, with nothing queued: the
        temp file of the next durable save, made ahead (:class:`.files.Spares`). Upkeep:
        a closed store or an OS error makes none."""
        with contextlib.suppress(StatekeeperError, OSError):
            parts = self._parts  # (anything else it raises, the worker drops)
            parts.call("spare", parts.engine.files.spares.make)


class SaveWriter:
    """The store's writer thread for saves (see the module)."""

    def __init__(self, name: str, runner: FileSaves) -> None:
        self._name = name
        self.group_commit = GroupCommit(runner, max_group=MAX_GROUP, gather_wait=0.0)
        self._worker: Worker | None = None
        self._pid = os.getpid()

    @property
    def pending(self) -> int:
        """Saves submitted by this process and not yet returned to their callers."""
        worker = self._worker
        return 0 if worker is None or self._pid != os.getpid() else worker.pending

    def save(self, insert: Callable[..., Any], record: NewRecord) -> Coroutine[Any, Any, Any]:
        """``insert(record)`` on the writer, alone or in a group with the saves
        queued with it; returns once the group's fsyncs returned."""
        worker = self._worker
        if worker is None or self._pid != os.getpid():  # forked: the thread is not here
            worker = self._worker = Worker(self._name, group=self.group_commit)
            self._pid = os.getpid()
        return worker.run_grouped(insert, record)

    def close(self) -> None:
        """Let the thread end once it has run the saves queued before this (any
        thread may call this; it never blocks). The next save starts a new one."""
        worker, self._worker = self._worker, None
        if worker is not None and self._pid == os.getpid():
            worker.stop()


class _Release:
    """The finalizer's release of a store's threads (it holds the threads' owners,
    never the store)."""

    __slots__ = ("door", "saves")

    def __init__(self, door: ThreadDoor, saves: SaveWriter) -> None:
        self.door, self.saves = door, saves

    def __call__(self) -> None:
        self.door.close()
        self.saves.close()
