"""The public :class:`FileCheckpointStore` and its options; :class:`FileParts`, the
engine and the parts it maps its primitives onto; the saves' writer thread and its
group commit (:class:`FileSaves`, :class:`SaveWriter`). Nothing here holds the store,
so it can be collected unclosed (its finalizer closes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, ClassVar, Literal, Self, TypeVar

from pydantic import Field

from ..._core.integrity import repair_records
from ..._core.primitives import StoreIdentity
from ..._core.query import INLINE_PAGE_ROWS, Entry, PageScan, ScanQuery, probe_bound, probe_query
from ..._core.store import BaseCheckpointStore
from ..._runtime.finalizer import when_collected
from ..._runtime.group import GroupCommit, Settled
from ..._runtime.inline import WORKER, Budget, Turns, WouldBlock
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
from .pages import PageEntries, Pages, ProbeOf
from .reader import Listing, Reader
from .survey import take_survey

T = TypeVar("T")

#: The most saves committed in one group.
MAX_GROUP = 256


class FileStoreOptions(StoreOptions):
    """Options of :class:`FileCheckpointStore`. ``durability``: ``"full"`` (default)
    fsyncs every save, update and delete before it returns (it survives a power cut);
    ``"fast"`` makes none (a save survives the process being killed, not a power cut).
    """

    #: Seconds a writer waits for the inter-process write lock before
    #: :class:`~statekeeper.errors.StoreTimeout`.
    lock_timeout: float = Field(default=30.0, gt=0, le=86_400)
    #: Saves between two flushes of the indexes: what a machine restart reindexes.
    sync_interval: int = Field(default=512, ge=1, le=1_000_000)
    #: How ``save_many`` makes its records durable: ``"syncfs"``, one ``syncfs(2)``
    #: (it also writes back all else dirty on that file system); ``"fsync"``, one per
    #: file; ``"auto"``, ``syncfs`` on Linux 5.8+ (older ones hide its errors).
    batch_sync: Literal["auto", "syncfs", "fsync"] = "auto"
    #: Run ``get_latest``, ``load`` and pages of one stream (up to 100 items) on the
    #: event loop's thread when they are the cheap indexed read (cached files, no
    #: lock, no wait, no record over 1 MiB), else in the worker, with the same
    #: answers and errors. ``False``: every read in the worker.
    inline_reads: bool = True


class FileParts:
    """The engine and the parts built over it, each given the collaborators it uses;
    a white-box test builds one over a directory (then ``engine.open(now)``)."""

    def __init__(self, path: str, io: FileIO, opts: FileStoreOptions) -> None:
        self.engine = engine = FileEngine(
            path,
            io,
            durable=opts.durability == "full",
            lock_timeout=opts.lock_timeout,
            # the largest state the codec accepts, and a header at its limits
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
        """``func(*args)`` while the store is open: the one place where OS errors and
        damaged indexes become :class:`~statekeeper.errors.BackendError` with ``.orig``."""
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
    ``open_store("file:relative/dir")``. A missing directory is created, unless
    ``create=False`` or ``read_only=True``: then :class:`~statekeeper.errors.StoreNotFound`.
    A non-empty directory that is not a store, or a store of a newer format, raises
    :class:`~statekeeper.errors.StoreFormatError`. ``read_only=True`` writes nothing:
    no lock file, no recovery, no rebuild.

    **Damage.** Record files are the truth: the indexes, the id table and the state are
    rebuilt from them when an open finds them damaged, and reads that meet a damaged
    index answer from the records. A damaged record is never forgotten until
    ``repair(drop_damaged=True)``: ``get_latest`` raises
    :class:`~statekeeper.errors.CheckpointDecodeError` naming it (also when its stream
    cannot be told and it is newer than the stream's newest), ``load`` raises, ``list``
    reports it in ``skipped``. ``verify()`` checks everything derived, writing nothing.

    **Durability.** ``durability="full"`` (default): a save writes a temp file, fsyncs
    it, renames it into place and fsyncs the directory before it returns, so it
    survives a power cut; ``"fast"`` skips the fsyncs, so a save survives a crash of
    the process, but a power cut may lose the last seconds. On an I/O failure the
    temp file is removed, the previous data is intact, and
    :class:`~statekeeper.errors.BackendError` is raised with the OS error in ``.orig``.

    **Concurrency.** Any tasks, threads and processes of one host may share a store.
    Writers serialise on ``flock`` of ``<dir>/lock`` (up to ``lock_timeout``
    seconds), so sequences are unique and in commit order; saves one event loop makes
    while another is in flight are committed together (one lock hold, one fsync
    group, one outcome each, each returning once durable). Readers take no lock;
    ``get_latest`` and ``load`` are strict: never older than the newest committed
    before the call began; retried when a writer disturbs them, then
    :class:`~statekeeper.errors.ConcurrentModificationError`. A call runs in one
    worker thread hop, but the cheap indexed reads (``inline_reads``) run on the
    event loop's thread, with the same answers and errors. Not for network file
    systems (their ``flock`` is unreliable).

    **Untrusted files.** Record files are opened with ``O_NOFOLLOW|O_NONBLOCK`` and
    must be regular files with one link, under the size limit, before a byte is
    read; directories are opened relative to their parent without following links.
    ``list`` reports FIFOs, devices, links, junk and stray temp files in ``skipped``.

    ``io=`` (a :class:`~statekeeper.backends.file.io.FileIO`) runs the store over a
    fault-injecting or crash-simulating file system.
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
    #: A sweep's removal batch (S17): a save waits for a whole ``delete_many``; 128
    #: (not 500) kept a save's p99 during a sweep at ~27 ms (not ~78), same rate.
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
        # the threads end at close(), or when the store is collected unclosed
        self._door = door = ThreadDoor("statekeeper-file")
        self._saves = saves = SaveWriter("statekeeper-file-writer", FileSaves(parts))

        def release() -> None:  # holds the threads, never the store
            door.close()
            saves.close()

        when_collected(self, release)
        self._inline_reads = opts.inline_reads
        self._turns = Turns()  # the loop's turns between inline calls

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
        files = self._parts.engine.files
        return await self._run("verify", lambda: check_store(files, take_survey(files)))

    async def _repair(self, drop_damaged: bool) -> RepairReport:
        """Rebuild the indexes, the id table and the state from the records, under the
        write lock; with ``drop_damaged``, first remove the damaged record files (found
        by name, so also those whose bytes no longer say their id)."""
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
        return report.model_copy(update={"dropped": dropped + report.dropped})

    async def _run(self, what: str, func: Callable[..., T], *args: Any) -> T:
        """One whole operation in one worker thread hop."""
        return await self._door.run(self._parts.call, what, func, *args)

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
        """Group commit (S15) on the writer thread: saves queued while another is in
        flight go together, each returning once its group's fsyncs returned. With
        ``durability="fast"`` a lone save runs on this thread when it needs no wait
        and no sync."""
        insert, saves = self._parts.engine.writes.insert, self._saves
        if not self._durable and self._turns.due():
            await asyncio.sleep(0)  # before the writer is found idle, not after
        if not saves.pending and not self._durable:
            with contextlib.suppress(WouldBlock):
                return self._parts.call("save", insert, record, Budget(inline=True))
        header: CheckpointHeader = await saves.save(insert, record)
        return header

    async def _insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        return await self._run("save_many", self._parts.batches.insert_many, records)

    async def _get_many(self, ids: list[str], now: datetime) -> dict[str, StoredRecord]:
        return await self._read("load_many", self._parts.reader.get_many, ids, now, inline=False)

    async def _delete_many(self, ids: list[str], now: datetime) -> int:
        return await self._run("delete_many", self._parts.batches.delete_many, ids, now)

    async def _list_streams_prefixed(self, now: datetime, prefix: str) -> list[str]:
        return await self._run("list_streams", self._parts.listing.list_streams, now, prefix)

    async def _update(self, update: Update) -> CheckpointHeader:
        return await self._run("update", self._parts.engine.writes.update, update)

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        return await self._read("load", self._parts.reader.get, id, now)

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        return await self._read("get_latest", self._parts.reader.latest, stream, now)

    async def _read(self, what: str, read: Callable[..., T], *args: Any, inline: bool = True) -> T:
        """``read(*args, budget)``: with ``inline_reads`` (and ``inline``) first on this
        thread, and where it would block the same function again in the worker."""
        if inline and self._inline_reads:
            if self._turns.due():
                await asyncio.sleep(0)
            try:
                return self._parts.call(what, read, *args, Budget(inline=True))
            except WouldBlock:
                pass
        return await self._run(what, read, *args, WORKER)

    async def _scan(self, query: ScanQuery) -> list[StoredRecord | Skipped]:
        return (await self._scan_entries(query, None))[0]

    async def _scan_page(self, query: ScanQuery, probe: bool) -> PageScan:
        if probe and query.metadata:  # the indexed probe knows no metadata filter
            return await super()._scan_page(query, probe)
        page, found = await self._scan_entries(query, self._probe_of(query) if probe else None)
        return PageScan(page, None if found is None else bool(found))

    async def _scan_entries(self, query: ScanQuery, probe_of: ProbeOf | None) -> PageEntries:
        """A scan and, with ``probe_of``, its probe; up to
        :data:`~statekeeper._core.query.INLINE_PAGE_ROWS` rows on this thread first."""
        scan_page, inline = self._parts.pages.scan_page, query.limit <= INLINE_PAGE_ROWS
        return await self._read("list", scan_page, query, probe_of, inline=inline)

    @staticmethod
    def _probe_of(query: ScanQuery) -> ProbeOf:
        """The probe after a page of ``query``: one entry the other way from its edge."""

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
        """Removes the bucket directories left empty; sizes are not counted."""
        await self._run("reclaim", self._parts.batches.remove_empty_buckets)
        return None

    async def _list_streams(self, now: datetime) -> list[str]:
        return await self._run("list_streams", self._parts.listing.list_streams, now)

    async def _info(self) -> dict[str, Any]:
        return await self._run("info", self._parts.listing.info, self.now())

    async def backdoor_read_raw(self, id: str) -> bytes:
        self._require_open()
        return await self._run("backdoor_read_raw", self._parts.reader.read_raw, id)

    async def backdoor_write_raw(self, id: str, data: bytes) -> None:
        self._require_writable("backdoor_write_raw")
        await self._run("backdoor_write_raw", self._parts.engine.writes.write_raw, id, bytes(data))


class FileSaves:
    """The ``GroupRunner`` of file saves; a job is ``(Writes.insert, (record,), ...)``."""

    def __init__(self, parts: FileParts) -> None:
        self._parts = parts

    def alone(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        return self._parts.call("save", fn, *args)

    def group(self, jobs: Sequence[Job]) -> tuple[Sequence[Settled], Sequence[Job]]:
        """The saves in one ``insert_group``, one outcome each; an error raised fails
        them all."""
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
        """With nothing queued: make the next save's spare (a closed store or an OS
        error makes none)."""
        with contextlib.suppress(StatekeeperError, OSError):
            parts = self._parts
            parts.call("spare", parts.engine.files.spares.make)


class SaveWriter:
    """The writer thread of saves, started on the first save, again in a forked child
    and after :meth:`close`."""

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
        worker = self._worker
        if worker is None or self._pid != os.getpid():  # forked: the thread is not here
            worker = self._worker = Worker(self._name, group=self.group_commit)
            self._pid = os.getpid()
        return worker.run_grouped(insert, record)

    def close(self) -> None:
        """Let the thread end after the saves queued before this; never blocks."""
        worker, self._worker = self._worker, None
        if worker is not None and self._pid == os.getpid():
            worker.stop()
