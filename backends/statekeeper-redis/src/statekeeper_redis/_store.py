"""``RedisCheckpointStore``: the statekeeper contract on one Redis database."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

import redis.asyncio as aioredis
import redis.exceptions as rex
from pydantic import Field

from statekeeper import (
    BaseCheckpointStore,
    Capabilities,
    CheckpointHeader,
    Problem,
    RepairReport,
    ScanQuery,
    Skipped,
    StoreIdentity,
    StoreOptions,
    StoreURL,
    VerifyReport,
    skipped_from,
)
from statekeeper.errors import (
    BackendError,
    CheckpointDecodeError,
    CheckpointNotFound,
    ConcurrentModificationError,
    InvalidURL,
    PreconditionFailed,
    StoreFormatError,
)
from statekeeper.record import NewRecord, StoredRecord, Update
from statekeeper.telemetry import PoolUsage

from . import _batch, _lua, _meta, _repair, _tracking
from ._audit import DamagedStoreError, index_json, us
from ._batch import MAX_ATTEMPTS, Inserter, expiry
from ._link import RedisLink, client_options, text
from ._meta import FORMAT_VERSION
from ._server import PERSISTENCE_SETTINGS, ServerPersistence

#: OpenTelemetry's attribute for a pooled connection's state (``used``, ``idle``), as
#: redis-py's ``get_connection_count()`` labels its counts.
POOL_STATE = "db.client.connection.state"

__all__ = ["FORMAT_VERSION", "RedisCheckpointStore", "RedisOptions"]

_DIGITS = re.compile(rb"[0-9]+")
_PURGE_BATCH = 500


class RedisOptions(StoreOptions):
    """Options of the Redis backend (beyond ``durability``, ``allowed_types``, codec limits)."""

    #: Namespace of every key of the store: keys are ``{<key_prefix>}:...``. Stores
    #: with different prefixes share one database without seeing each other.
    key_prefix: str = Field(default="statekeeper", pattern=r"^[A-Za-z0-9._:/-]{1,200}$")
    #: Open even if the server can lose acknowledged writes (no AOF, or
    #: ``appendfsync`` weaker than ``durability`` needs, a ``maxmemory-policy`` that
    #: evicts keys, or CONFIG unreadable).
    allow_unsafe_durability: bool = False
    #: Seconds to wait for a connection or a reply before :class:`StoreTimeout`.
    socket_timeout: float = Field(default=30.0, gt=0)
    #: Upper bound of the connection pool (``None``: redis-py's default).
    max_connections: int | None = Field(default=None, ge=1)


class RedisCheckpointStore(BaseCheckpointStore[RedisOptions]):
    """A checkpoint store in one Redis database (``redis://`` and ``rediss://`` URLs).

    URL: ``redis[s]://[user[:password]@]host[:port][/db][?option=value...]``; the
    options are those of :class:`RedisOptions`.

    **Atomicity.** save, save_many, update (etag compare-and-set), delete,
    delete_many, prune and delete_stream are each one Lua script, which Redis runs
    without interleaving any other command: sequence order is commit order, and no
    concurrent writer, task, process or host, can fork a stream or lose an
    acknowledged save. ``save_many`` checks every item before it writes any, so it
    writes all of them, with consecutive sequences, or none; no reader sees part of
    it (``capabilities.atomic_batches``).

    **Sequences.** The high-water mark lives in ``{prefix}:meta``. The record
    envelope carries its sequence under its checksum, so a save seals the record at
    the sequence it expects (the last one it saw, plus one) and the script commits it
    only if that is still next; a writer that lost the race reseals at the number
    the script returns. One writer alone pays one round trip per save.

    Tasks of one instance take turns to save, so they never race each other.

    **Reads.** ``get_latest``, ``load`` and ``load_many`` are one round trip and
    decode only their records; a page is one script call per :attr:`scan_budget`
    index entries examined. Strict reads raise :class:`CheckpointDecodeError`;
    listings report unreadable records in ``page.skipped``. Filters on metadata
    are not indexed: ``list(metadata=...)`` scans the stream (or store) and keeps
    the matches, O(entries scanned); ``list_streams(prefix=)`` filters every stream
    name on the server, O(stream names).

    **TTL.** The record key gets a Redis expiry, which reclaims its bytes; its index
    entries are ignored by reads from the moment it expires (by the store's clock)
    and removed by :meth:`purge_expired`.

    **Damage** (SPEC S3a). Records are the truth. An indexed checkpoint whose
    record key is missing before its expiry (deleted outside statekeeper, or
    evicted) is *lost*: strict reads raise :class:`CheckpointDecodeError` for it and
    listings report it, like a corrupt record, until :meth:`delete` or
    ``repair(drop_damaged=True)``. A missing or wrong-typed index key, id-hash or
    etag entry, or sequence counter makes the calls that need it raise
    :class:`DamagedStoreError` (never "empty", never a reused sequence). So does an
    index that lost its key or an entry, down to every index key at once: the
    scripts keep the size of the global index in the meta hash and each stream's
    newest sequence and size in ``{prefix}:h``, and compare them with the indexes
    before they read or write them (the README's *Design* has the cost);
    :meth:`verify` reports it without writing and :meth:`repair` rebuilds it. A
    lost meta hash is rebuilt on a writable open; a read-only open refuses.

    **create / read_only.** ``create=False`` on a prefix without any key raises
    :class:`StoreNotFound` and writes nothing; ``read_only=True`` writes no key.

    **Durability.** On open the store reads ``appendonly``, ``appendfsync`` and
    ``maxmemory-policy``. ``durability="full"`` (the default) refuses a server
    without ``appendfsync always``, ``"fast"`` one without AOF, and both refuse
    a server that evicts keys (any ``maxmemory-policy`` but ``noeviction``), unless
    ``allow_unsafe_durability=True``. The class-level
    :attr:`capabilities` (``power_loss_durable``) hold because of that check.
    """

    Options: ClassVar[type[StoreOptions]] = RedisOptions
    capabilities: ClassVar[Capabilities] = Capabilities(
        persistent=True,
        cross_process=True,
        cross_host=True,
        power_loss_durable=True,
        ttl=True,
        raw_access=True,
        atomic_batches=True,
    )
    backend_name: ClassVar[str] = "redis"
    #: Index entries one listing script may examine before it returns to the client
    #: (which calls again from where it stopped): bounds how long one call holds the
    #: server when many entries are expired or filtered out by tags.
    scan_budget: ClassVar[int] = 2000

    def __init__(
        self,
        url: str | StoreURL = "redis://127.0.0.1:6379/0",
        *,
        clock: Callable[[], datetime] | None = None,
        **options: Any,
    ) -> None:
        parsed = StoreURL.parse(url)
        if parsed.scheme not in ("redis", "rediss") or parsed.driver is not None:
            raise InvalidURL(
                f"{parsed} is not a Redis URL; expected redis://host:port/db or rediss://..."
            )
        super().__init__(clock=clock, **parsed.merge_options(options))
        path = parsed.path.strip("/")
        if path and not path.isdigit():
            raise InvalidURL(f"the path of {parsed} must be a database number, like /0")
        self.url = parsed.with_(query={})
        self.db = int(path) if path else 0
        opts = self.redis_options
        self._prefix = f"{{{opts.key_prefix}}}:"
        #: the client, the scripts, and what their replies mean
        self._link = RedisLink(self._prefix, self.describe(), opts.socket_timeout)
        #: the saves: the high-water mark's guess, and the lock tasks take turns on
        self._inserter = Inserter(self._link, self.now)
        self.server: ServerPersistence | None = None
        # what an open that had to rebuild the meta hash did, for the next repair report
        self._meta_rebuilt: str | None = None

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> RedisCheckpointStore:
        return cls(url, **options)

    @property
    def redis_options(self) -> RedisOptions:
        return self.options

    @property
    def key_prefix(self) -> str:
        """The literal prefix of every key of this store, ``{<key_prefix>}:``."""
        return self._prefix

    @property
    def client(self) -> aioredis.Redis:
        """The open ``redis.asyncio.Redis`` client (for tools and tests)."""
        return self._link.client

    def describe(self) -> str:
        return self.url.with_(query={"key_prefix": self.redis_options.key_prefix}).render()

    # -- lifecycle ---------------------------------------------------------------------

    async def _open(self) -> StoreIdentity:
        opts = self.redis_options
        client = aioredis.Redis(
            host=self.url.host or "localhost",
            port=self.url.port or 6379,
            db=self.db,
            username=self.url.username,
            password=self.url.password,
            ssl=self.url.scheme == "rediss",
            socket_timeout=opts.socket_timeout,
            socket_connect_timeout=opts.socket_timeout,
            max_connections=opts.max_connections,
            decode_responses=False,
            **client_options(),
        )
        link = self._link
        try:
            self.server = await link.guard(self._read_persistence(client))
            # a read-only store cannot lose a write, so it opens on any server
            if not opts.allow_unsafe_durability and not self.options.read_only:
                refusal = self.server.refuse(self.describe(), self.options.durability)
                if refusal is not None:
                    raise refusal
            link.register(
                client, {**_lua.SCRIPTS, **_meta.SCRIPTS, **_repair.SCRIPTS, **_tracking.SCRIPTS}
            )
            await link.load_scripts(client)
            link.attach(client)
            opened = await _meta.open_meta(
                link, create=self.options.create, read_only=self.options.read_only
            )
        except BaseException:
            link.detach()
            await client.aclose()
            raise
        if opened.rebuilt is not None:
            self._meta_rebuilt = opened.rebuilt
        self._inserter.reset(opened.hwm)
        return opened.identity

    async def _close(self) -> None:
        client = self._link.detach()
        if client is not None:
            await client.aclose()

    def _pool_usage(self) -> list[PoolUsage]:
        """How the client's connection pool stands, for telemetry (S18): connections in
        use and idle, from redis-py's public ``ConnectionPool.get_connection_count()``
        (present in the redis-py 8 this project pins; a client without it, or a
        closed store, reports nothing).
        Callers waiting are not reported: the pool redis-py builds for a client does
        not queue them, a checkout past ``max_connections`` fails at once."""
        client = self._link.attached
        count = getattr(client.connection_pool, "get_connection_count", None) if client else None
        if count is None:
            return []
        states = {"used": 0, "idle": 0}
        for value, attributes in count():
            state = attributes.get(POOL_STATE)
            if state in states:
                states[state] += int(value)
        return [PoolUsage("redis", used=states["used"], idle=states["idle"])]

    async def _read_persistence(self, client: aioredis.Redis) -> ServerPersistence:
        config: dict[str, str] = {}
        try:
            for name in PERSISTENCE_SETTINGS:
                reply = await client.config_get(name)
                for key, value in reply.items():
                    if key is not None and value is not None:
                        config[text(key)] = text(value)
        except rex.ResponseError as exc:
            return ServerPersistence.unknown(f"CONFIG GET failed: {exc}")
        return ServerPersistence.from_config(config)

    # -- primitives ------------------------------------------------------------------------

    async def _insert(self, record: NewRecord) -> CheckpointHeader:
        return (await self._inserter.insert([record], self.store_id))[0]

    async def _insert_many(self, records: list[NewRecord]) -> list[CheckpointHeader]:
        """One script call: all or none, consecutive sequences, invisible until whole."""
        return await self._inserter.insert(records, self.store_id)

    async def _update(self, update: Update) -> CheckpointHeader:
        id, if_match, now, etag = update.id, update.if_match, update.now, update.etag
        for _ in range(MAX_ATTEMPTS):
            current, read_etag = await self._read(id, now)
            if current is None:
                raise CheckpointNotFound(id)
            if read_etag is None:
                raise self._link.damaged(f"the etag entry ({self._prefix}e) of {id!r} is missing")
            seen = text(read_etag)
            if if_match is not None and seen != if_match:
                raise PreconditionFailed(f"checkpoint {id!r} has etag {seen!r}, not {if_match!r}")
            new = update.applied_to(current)
            exp, millis = expiry(new.header.expires_at, now)
            try:
                result = await self._link.call(
                    "UPDATE",
                    id,
                    us(now),
                    seen,
                    if_match or "",
                    new.to_bytes(self.store_id),
                    etag,
                    exp,
                    millis,
                    ""
                    if new.header.tags == current.header.tags
                    else index_json(new.header.stream, new.header.tags),
                    new.header.sequence,
                )
            except BackendError as exc:
                result = await _batch.updated(self._link, id, etag, now, exc)
            status = result[0]
            if status == b"ok":
                return new.header
            if status == b"notfound":
                raise CheckpointNotFound(id)
            if status == b"etag":
                raise PreconditionFailed(
                    f"checkpoint {id!r} has etag {text(result[1])!r}, not {if_match!r}"
                )
            if status == b"noetag":
                raise self._link.damaged(f"the etag entry ({self._prefix}e) of {id!r} is missing")
            self._link.check_status(result, id)
            # b"conflict": another writer updated it since we read it; read again
        raise ConcurrentModificationError(
            f"update of {id!r} in {self.describe()} kept losing to concurrent writers; retry"
        )

    async def _read(self, id: str, now: datetime) -> tuple[StoredRecord | None, bytes | None]:
        """The live record of ``id`` and its etag entry; raises for a damaged or lost one."""
        reply = await self._link.call("GET", id, us(now))
        if reply is None:
            return None, None
        if reply[0] == b"lost":
            raise self._link.lost(id, None if reply[1] is None else int(reply[1]))
        _status, blob, score, etag = reply
        # a record missing from P all is still read (by its own sequence): records
        # are the truth, and verify() reports the index
        sequence = None if score is None else int(score)
        return self._link.parse(id, sequence, blob, self.store_id), etag

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        return (await self._read(id, now))[0]

    async def _scan(self, query: ScanQuery) -> list[StoredRecord | Skipped]:
        out: list[StoredRecord | Skipped] = []
        bound = "" if query.bound is None else str(query.bound)
        tag_args = [part for pair in sorted(query.tags.items()) for part in pair]
        while True:
            reply = await self._link.call(
                "SCAN",
                query.order,
                bound,
                query.limit - len(out),
                us(query.now),
                self.scan_budget,
                query.stream or "",
                *tag_args,
            )
            self._link.check_status(reply)
            if reply[0] == 2:
                raise self._link.damaged(
                    f"the index {self._prefix}s:{query.stream} of stream {query.stream!r} is "
                    f"missing although {self._prefix}n names the stream"
                    if query.stream
                    else f"the global index {self._prefix}all is missing although "
                    f"{self._prefix}n names streams"
                )
            exhausted, bound = reply[0], text(reply[1])
            for i in range(2, len(reply), 3):
                rid, seq, blob = text(reply[i]), int(reply[i + 1]), reply[i + 2]
                try:
                    if blob is None:
                        raise self._link.lost(rid, seq)
                    out.append(self._link.parse(rid, seq, blob, self.store_id))
                except CheckpointDecodeError as exc:
                    out.append(skipped_from(exc, rid, seq))
            if exhausted or len(out) >= query.limit:
                return out

    async def _latest(self, stream: str, now: datetime) -> StoredRecord | None:
        # one SCAN call holds a snapshot; a later call (only after scan_budget expired
        # entries) continues below the first, so the answer is still the newest live
        # record as of the first call: a newer save would have a higher sequence
        found = await self._scan(ScanQuery(stream, "desc", None, 1, {}, now))
        if not found:
            return None
        top = found[0]
        if isinstance(top, Skipped):
            raise CheckpointDecodeError(
                top.reason, id=top.id, location=top.location, sequence=top.sequence
            )
        return top

    async def _delete(self, id: str, *, if_match: str | None, now: datetime) -> bool:
        return await _batch.delete_one(self._link, id, now, if_match)

    async def _get_many(self, ids: list[str], now: datetime) -> dict[str, StoredRecord]:
        """One script call for every id; strict like :meth:`_get`."""
        return await _batch.get_many(self._link, ids, now, self.store_id)

    async def _delete_many(self, ids: list[str], now: datetime) -> int:
        """One script call; deletes none if one id's index entries are damaged."""
        return await _batch.delete_many(self._link, ids, now)

    async def _delete_stream(self, stream: str, now: datetime) -> int:
        reply = await self._link.call("DELETE_STREAM", stream, us(now))
        self._link.check_status(reply)
        return int(reply)

    async def _prune(self, stream: str, keep_last: int, now: datetime) -> int:
        reply = await self._link.call("PRUNE", stream, keep_last, us(now))
        self._link.check_status(reply)
        return int(reply)

    async def _purge_expired(self, now: datetime) -> int:
        removed = 0
        while True:
            reply = await self._link.call("PURGE", us(now), _PURGE_BATCH)
            self._link.check_status(reply)
            n = int(reply)
            removed += n
            if n < _PURGE_BATCH:
                return removed

    async def _list_streams(self, now: datetime) -> list[str]:
        return await _batch.stream_names(self._link, now, "")

    async def _list_streams_prefixed(self, now: datetime, prefix: str) -> list[str]:
        """Filtered on the server (``SSCAN MATCH``): O(stream names), not O(matches)."""
        return await _batch.stream_names(self._link, now, prefix)

    async def _info(self) -> dict[str, Any]:
        call = self._link.call("INFO", us(self.now()))
        checkpoints, streams, hwm, expiring, expired = await call
        server = self.server
        # the class declares power_loss_durable; say whether this server backs it
        problems = server.problems(self.options.durability) if server else ["not checked"]
        return {
            "checkpoints": int(checkpoints),
            "streams": int(streams),
            # None when the counter is missing or malformed (verify() reports it)
            "high_water_mark": int(hwm) if _DIGITS.fullmatch(hwm) else None,
            "expiring": int(expiring),
            **({"expired": int(expired)} if int(expired) else {}),
            "key_prefix": self.redis_options.key_prefix,
            "appendonly": server.appendonly if server else None,
            "appendfsync": server.appendfsync if server else None,
            "maxmemory_policy": server.maxmemory_policy if server else None,
            "durability": (
                f"{self.options.durability}: checked on open"
                if not problems
                else "NOT guaranteed, opened with allow_unsafe_durability: " + "; ".join(problems)
            ),
        }

    # -- verify and repair -----------------------------------------------------------------

    async def _verify_refused(self, error: StoreFormatError) -> VerifyReport | None:
        """When the read paths refuse to answer (an index key missing or of the
        wrong type: :class:`DamagedStoreError`), the report of ``verify()`` comes
        from the walk of every key under the prefix alone, with the refusal as one
        more problem."""
        if not isinstance(error, DamagedStoreError):
            return None
        return await _repair.verify_by_walk(self._link, self.store_id, self.now, str(error))

    async def _verify(self) -> list[Problem]:
        """Every derived key checked against the records (a read-only walk)."""
        return await _repair.problems(self._link, self.store_id, self.now)

    async def _repair(self, drop_damaged: bool) -> RepairReport:
        """Rebuild every derived key from the records; keep damaged checkpoints.

        A damaged or lost checkpoint keeps its place (its entries are completed
        from whatever index still places it), so strict reads keep raising for it
        until ``drop_damaged=True`` deletes it. Each id's edits apply only if its
        record is unchanged since it was read, so concurrent writers are never
        undone; the high-water mark is raised to the highest sequence found.
        """
        rebuilt, self._meta_rebuilt = self._meta_rebuilt, None
        return await _repair.repair(
            self._link, self, self._inserter, drop_damaged, meta_rebuilt=rebuilt
        )

    # -- backdoor (conformance kit) --------------------------------------------------------

    async def backdoor_read_raw(self, id: str) -> bytes:
        blob = await self._link.guard(self.client.get(f"{self._prefix}r:{id}"))
        if blob is None:
            raise CheckpointNotFound(id)
        return blob.encode() if isinstance(blob, str) else bytes(blob)

    async def backdoor_write_raw(self, id: str, data: bytes) -> None:
        written = await self._link.guard(
            self.client.set(f"{self._prefix}r:{id}", bytes(data), xx=True, keepttl=True)
        )
        if not written:
            raise CheckpointNotFound(id)
