"""``RedisLink``: one store's connection to its Redis database, and what replies mean.

The link owns the open ``redis.asyncio`` client and the store's registered Lua
scripts, and knows the store's key prefix and how to name it in messages. Every
other part of the plugin talks to Redis through it: :meth:`RedisLink.call` runs
one script (one EVALSHA), :meth:`RedisLink.guard` turns driver errors into
statekeeper errors, and :meth:`RedisLink.check_status` raises for the damage
statuses the scripts share.

Lost connections: the client re-sends nothing and replaces a pooled connection
the server closed (:func:`client_options`; redis-py's default would run a write
script again after it committed). A read-only script
that meets a lost connection runs once more (:data:`READ_SCRIPTS`); a write's
caller finds out what happened (:meth:`RedisLink.lost_reply`, then a lookup, or
:class:`~statekeeper.errors.OutcomeUnknown`). It imports no other part of the plugin but ``_audit``
(for :class:`DamagedStoreError`), so each part takes the link it needs and nothing
reaches back into the store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.maint_notifications import MaintNotificationsConfig

from statekeeper.errors import BackendError, CheckpointDecodeError, OutcomeUnknown, StoreTimeout
from statekeeper.record import StoredRecord

from ._audit import DamagedStoreError

__all__ = ["READ_SCRIPTS", "RedisLink", "client_options", "text", "untracked_reason"]

T = TypeVar("T")

#: The scripts that write nothing: run once more after a lost connection.
READ_SCRIPTS = frozenset({"GET", "GET_MANY", "SCAN", "INFO", "LIVE_STREAMS", "READ_TRACKING"})


def client_options() -> dict[str, Any]:
    """The ``redis.asyncio.Redis`` arguments that make lost connections safe:

    - ``retry``: none. redis-py's default retries a command after a connection
      error, which for a write script whose reply was lost runs it twice;
    - ``maint_notifications_config``: off. While it is on (redis-py 8's ``"auto"``),
      the pool skips its check of a pooled connection at checkout, so a connection
      the server closed while idle (a restart, ``CLIENT KILL``, a ``timeout``) would
      fail the next call instead of being replaced.
    """
    return {
        "retry": Retry(NoBackoff(), 0),
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }


def text(value: bytes | str) -> str:
    """A reply part as text (replies are bytes: the client does not decode them)."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


class RedisLink:
    """The client, the scripts and the key prefix of one store.

    ``where`` is how messages name the store (its URL with the key prefix);
    ``timeout`` is the socket timeout, named by :class:`StoreTimeout`. The client
    exists from :meth:`attach` (on open) to :meth:`detach` (on close).
    """

    def __init__(self, prefix: str, where: str, timeout: float) -> None:
        #: ``{<key_prefix>}:``, the literal prefix of every key of the store
        self.prefix = prefix
        self.meta_key = prefix + "meta"
        self.where = where
        self.timeout = timeout
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}

    @property
    def client(self) -> aioredis.Redis:
        """The open client; :class:`BackendError` when the store is not open."""
        if self._client is None:
            raise BackendError(f"{self.where} is not open")
        return self._client

    def register(self, client: aioredis.Redis, sources: Mapping[str, str]) -> None:
        """Register the scripts ``sources`` (name: Lua source) on ``client``."""
        self._scripts = {name: client.register_script(src) for name, src in sources.items()}

    async def load_scripts(self, client: aioredis.Redis) -> None:
        """Load every registered script, so that steady-state calls are one EVALSHA,
        never EVALSHA+LOAD+EVALSHA."""
        pipe = client.pipeline(transaction=False)
        for script in self._scripts.values():
            pipe.script_load(script.script)
        await self.guard(pipe.execute())

    @property
    def attached(self) -> aioredis.Redis | None:
        """The open client, or ``None`` when the store is not open."""
        return self._client

    def attach(self, client: aioredis.Redis) -> None:
        """Make ``client`` (its scripts registered and loaded) the store's client."""
        self._client = client

    def detach(self) -> aioredis.Redis | None:
        """Forget the client and return it (for the caller to close), if any."""
        client, self._client = self._client, None
        return client

    def script(self, name: str) -> AsyncScript:
        """The registered script ``name`` (to queue it on a pipeline)."""
        return self._scripts[name]

    # -- calls -------------------------------------------------------------------------

    async def guard(self, call: Awaitable[T]) -> T:
        """Await ``call``, turning driver errors into statekeeper errors."""
        try:
            return await call
        except rex.TimeoutError as exc:
            raise StoreTimeout(
                f"{self.where} did not answer within {self.timeout}s", orig=exc
            ) from exc
        except rex.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise BackendError(f"{self.where} failed: {exc}", orig=exc) from exc
            raise self.damaged(
                "a key of the store holds the wrong Redis type (overwritten by another "
                f"program?): {exc}"
            ) from exc
        except rex.ConnectionError as exc:
            raise BackendError(
                f"{self.where}: the connection to Redis was refused or lost ({exc}); retry "
                "once the server is back",
                orig=exc,
                retryable=True,
            ) from exc
        except rex.RedisError as exc:
            raise BackendError(
                f"{self.where} failed: {exc}",
                orig=exc,
                retryable="LOADING" in str(exc) or "BUSY" in str(exc),
            ) from exc

    async def call(self, script: str, *args: Any) -> Any:
        """Run one of the store's scripts (one EVALSHA round trip); a read-only one
        (:data:`READ_SCRIPTS`) once more if its connection was lost, a write never."""
        run = self._scripts[script]
        keys, argv = [self.meta_key], [self.prefix, *args]
        try:
            return await self.guard(run(keys=keys, args=argv))
        except BackendError as exc:
            if script not in READ_SCRIPTS or not self.lost_reply(exc):
                raise
        return await self.guard(run(keys=keys, args=argv))

    @staticmethod
    def lost_reply(exc: BaseException) -> bool:
        """Whether ``exc`` is a connection that broke with a command in flight (not a
        timeout: a command that timed out may still run)."""
        return isinstance(exc, BackendError) and isinstance(exc.orig, rex.ConnectionError)

    def unknown(self, what: str, id: str, exc: BaseException, why: str) -> OutcomeUnknown:
        """The error for a write to ``id`` whose reply was lost, when a lookup did
        not tell what happened."""
        return OutcomeUnknown(
            f"{what} {id!r} in {self.where}: the connection was lost before the reply "
            f"({exc}); {why}. Retry with the same id: a save raises PreconditionFailed, "
            "an update with if_match raises PreconditionFailed and a delete returns "
            "False if the first was applied",
            id=id,
            orig=getattr(exc, "orig", None),
        )

    # -- what replies mean ---------------------------------------------------------------

    def damaged(self, what: str) -> DamagedStoreError:
        return DamagedStoreError(
            f"{self.where}: {what}. Nothing was written. verify() lists the damage; "
            "repair() (statekeeper repair URL) rebuilds the store's indexes and counter "
            "from its records"
        )

    def check_status(self, reply: Any, id: str | None = None) -> None:
        """Raise for the damage statuses the scripts share (a refusal is a list)."""
        if not isinstance(reply, list):
            return
        status = reply[0]
        if status == b"wrongtype":
            raise self.damaged(f"the key {text(reply[1])} holds the wrong Redis type")
        if status == b"noidx":
            whose = f"checkpoint {text(reply[1])!r}" if len(reply) > 1 else f"{id!r}"
            raise self.damaged(
                f"the id-hash entry ({self.prefix}i) of {whose} is missing or malformed, "
                "so its stream and tag index entries cannot be found to remove them"
            )
        if status == b"untracked":
            suffix, tracked, found = (text(part) for part in reply[1:4])
            raise self.damaged(untracked_reason(self.prefix, suffix, tracked, found))

    def location(self, id: str) -> str:
        return f"{self.where} key {self.prefix}r:{id}"

    def lost(self, id: str, sequence: int | None) -> CheckpointDecodeError:
        """The error for an indexed checkpoint whose record key is gone."""
        return CheckpointDecodeError(
            "the record key is missing although the store's indexes hold this checkpoint "
            "and it has not expired (deleted outside statekeeper, or evicted by Redis "
            "under maxmemory); it stays reported until delete() or "
            "repair(drop_damaged=True) removes it",
            id=id,
            location=self.location(id),
            sequence=sequence,
        )

    def parse(self, id: str, sequence: int | None, blob: bytes, store_id: str) -> StoredRecord:
        """The record ``blob`` of ``id``, checked to be of store ``store_id``."""
        return StoredRecord.from_bytes(
            blob,
            location=self.location(id),
            expect_store_id=store_id,
            expect_id=id,
            expect_sequence=sequence,
        )


def untracked_reason(prefix: str, suffix: str, tracked: str, found: str) -> str:
    """What it means that the index ``P <suffix>`` holds ``found`` (its size, or for a
    stream's zset ``"<newest> <size>"``) while the store tracks ``tracked``."""
    key = prefix + suffix
    if suffix == "all":
        said = f"{tracked} entries" if tracked else "no count (field count is missing)"
        return (
            f"the global index {key} holds {found} entries, but the store's meta hash "
            f"({prefix + 'meta'}, field count) says {said}: index entries or the whole "
            "key were deleted (by an operator or by Redis eviction) or added outside "
            "statekeeper, so a listing could leave out acknowledged checkpoints"
        )

    def held(summary: str) -> str:
        if not summary:
            return "no entries"
        top, n = summary.split(" ", 1) if " " in summary else (summary, "?")
        return f"{n} entries up to sequence {top}"

    return (
        f"the index {key} of stream {suffix[2:]!r} holds {held(found)}, but the "
        f"store tracks {held(tracked)} for it ({prefix}h): entries were removed "
        "or re-scored, or the key deleted (by an operator or by Redis eviction), so "
        "get_latest could answer an older checkpoint and a listing could leave one out"
    )
