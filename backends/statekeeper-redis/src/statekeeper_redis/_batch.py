"""Saves and batches of the Redis backend (SPEC S13): one script call each.

``save`` and ``save_many`` share one script (``_lua.INSERT``), run by
:class:`Inserter`, the part of a store that owns its saves (the guess of the
high-water mark, and the lock its tasks take turns on). The script checks every
id, the key types, the high-water mark and the entries an expired id leaves
behind before it writes anything, then writes every record and index entry and
raises the mark once. Redis runs a script without interleaving any other
command, so no reader sees part of a batch and no concurrent save takes a
sequence between its items; with AOF, a script's writes reach the log as one
transaction, so a crash keeps all of them or none.

``load_many``, ``delete`` and ``delete_many`` are one script each over every id;
stream names by prefix are filtered on the server (``SSCAN MATCH``). Each function
takes the store's :class:`~._link.RedisLink` and what else it reads, never the store.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn

from statekeeper import CheckpointHeader
from statekeeper.errors import (
    BackendError,
    ConcurrentModificationError,
    PreconditionFailed,
    StatekeeperError,
    StoreFormatError,
)
from statekeeper.record import NewRecord, StoredRecord

from ._audit import index_json, us
from ._link import RedisLink, text
from ._lua import TURN_MILLISECONDS

__all__ = [
    "MAX_ATTEMPTS",
    "Inserter",
    "delete_many",
    "delete_one",
    "expiry",
    "get_many",
    "stream_names",
    "updated",
]

# Races lost before a save or update gives up with ConcurrentModificationError;
# every lost race means another writer committed, so this is not reached in practice.
MAX_ATTEMPTS = 1000
# Races lost before a save asks for the turn (``_lua.INSERT``), which makes other
# writers wait until its next try has won.
_CLAIM_AFTER = 3
_STREAM_BATCH = 500
# the characters SSCAN MATCH (Redis glob) gives a meaning; a backslash makes them literal
_GLOB = re.compile(r"([\\*?\[\]])")


def expiry(expires_at: datetime | None, now: datetime) -> tuple[str, str]:
    """(expires_at in µs, milliseconds for PEXPIRE) or ('', '') without a TTL.

    The key's own expiry is relative, so an injected clock that is off from the
    server's does not make Redis drop a record the store still considers live.
    """
    if expires_at is None:
        return "", ""
    millis = max(1, math.ceil((expires_at - now) / timedelta(milliseconds=1)))
    return str(us(expires_at)), str(millis)


class Inserter:
    """The saves of one store instance: its guess of the high-water mark, and the
    lock that makes its tasks take turns (they would only lose sequence races to
    each other).

    ``clock`` is the store's clock, read once per attempt.
    """

    def __init__(self, link: RedisLink, clock: Callable[[], datetime]) -> None:
        self._link = link
        self._clock = clock
        #: the last sequence this instance saw; the insert script checks it
        self.hwm = 0
        self._lock = asyncio.Lock()

    def reset(self, hwm: int) -> None:
        """On open: the mark read from the meta hash, and a lock of the running loop."""
        self.hwm = hwm
        self._lock = asyncio.Lock()

    async def insert(self, records: list[NewRecord], store_id: str) -> list[CheckpointHeader]:
        """Insert ``records`` with consecutive sequences, all or none, in one script
        call (one more per sequence race lost to another writer).

        A writer that has lost :data:`_CLAIM_AFTER` races asks for the turn (see
        ``_lua.INSERT``), so a batch is not starved by other clients' single saves:
        once it holds the turn, other inserts wait for it (they get 'busy', and back
        off), and its next try wins."""
        link = self._link
        async with self._lock:
            first = self.hwm + 1
            token = ""
            busy = 0
            waited_since: float | None = None
            for attempt in range(MAX_ATTEMPTS):
                now = self._clock()
                # the envelope carries its sequence under its checksum: seal at the
                # sequences the script is expected to grant, reseal if it refuses them
                sealed = [record.seal(first + i) for i, record in enumerate(records)]
                args: list[Any] = []
                for record, stored in zip(records, sealed, strict=True):
                    exp, millis = expiry(stored.header.expires_at, now)
                    args += [
                        record.id,
                        stored.to_bytes(store_id),
                        record.stream,
                        index_json(record.stream, record.tags),
                        exp,
                        millis,
                        record.etag,
                    ]
                try:
                    reply = await link.call("INSERT", us(now), first, token, *args)
                except BackendError as exc:
                    if not link.lost_reply(exc):
                        raise
                    reply = await _inserted(link, sealed, now, store_id, exc)
                status = reply[0]
                if status == b"ok":
                    self.hwm = max(self.hwm, first + len(records) - 1)
                    return [stored.header for stored in sealed]
                if status == b"busy":
                    # another writer holds the turn for at most TURN_MILLISECONDS
                    loop = asyncio.get_running_loop()
                    if waited_since is None:
                        waited_since = loop.time()
                    elif loop.time() - waited_since > 2 * TURN_MILLISECONDS / 1000:
                        break
                    busy += 1
                    await asyncio.sleep(random.uniform(0, min(0.02, 0.0002 * 2**busy)))
                    continue
                waited_since = None
                if status != b"seq":
                    _refuse(link, reply)
                self.hwm = int(reply[1])
                first = self.hwm + 1
                if attempt + 1 >= _CLAIM_AFTER and not token:
                    token = uuid.uuid4().hex
                if attempt >= 4:
                    pause = min(0.02, 0.0005 * 2 ** (attempt - 4))
                    await asyncio.sleep(random.uniform(0, pause))
        raise ConcurrentModificationError(
            f"save to {link.where} lost the race for the next sequence "
            f"{MAX_ATTEMPTS} times (or waited over {2 * TURN_MILLISECONDS} ms for another "
            "writer's turn); retry"
        )


async def _inserted(
    link: RedisLink,
    sealed: list[StoredRecord],
    now: datetime,
    store_id: str,
    exc: BaseException,
) -> list[Any]:
    """What an INSERT whose reply was lost did, looked up on a fresh connection: the
    reply ``[b"ok"]`` if every record is there with the etag this save gave it (the
    script writes all or none, at the sequences it was sealed for); else
    :class:`OutcomeUnknown`. The client re-sends nothing, and Redis never runs a
    command of a connection it closed, but a connection lost on the client's side
    may leave it in the server's buffer: absent is not proof."""
    ids = [s.header.id for s in sealed]
    try:
        found = await get_many(link, ids, now, store_id)
    except StatekeeperError as again:
        raise link.unknown("saving", ids[0], exc, f"the lookup failed ({again})") from exc
    landed = [found.get(s.header.id) for s in sealed]
    if all(
        got is not None
        and (got.header.etag, got.header.sequence) == (s.header.etag, s.header.sequence)
        for got, s in zip(landed, sealed, strict=True)
    ):
        return [b"ok"]
    raise link.unknown("saving", ids[0], exc, "it is not found") from exc


async def updated(
    link: RedisLink, id: str, etag: str, now: datetime, exc: BackendError
) -> list[Any]:
    """What an UPDATE whose reply was lost did (``exc``; any other error is raised):
    the reply ``[b"ok"]`` if the record has the update's ``etag`` (it was applied),
    else :class:`OutcomeUnknown` (it may have been, and another write followed)."""
    if not link.lost_reply(exc):
        raise exc
    try:
        reply = await link.call("GET", id, us(now))
    except StatekeeperError as again:
        raise link.unknown("updating", id, exc, f"the lookup failed ({again})") from exc
    if reply is not None and reply[0] != b"lost" and text(reply[3] or b"") == etag:
        return [b"ok"]
    raise link.unknown("updating", id, exc, "it does not show the update") from exc


def _refuse(link: RedisLink, reply: list[Any]) -> NoReturn:
    """Raise for an INSERT reply other than 'ok' or 'seq' (nothing was written)."""
    status = reply[0]
    if status in (b"exists", b"lost"):
        raise PreconditionFailed(
            f"checkpoint id {text(reply[1])!r} already exists in {link.where}"
            + (
                " (its record key is missing: a damaged checkpoint, which "
                "delete() or repair(drop_damaged=True) removes)"
                if status == b"lost"
                else ""
            )
        )
    if status == b"nometa":
        raise StoreFormatError(
            f"{link.where}: {link.meta_key} disappeared while the store "
            "was open (was the store deleted?); reopen it, which rebuilds it "
            "from the records if any are left"
        )
    if status == b"badhwm":
        said = f"{reply[1]!r}" if reply[1] else "missing"
        raise link.damaged(
            f"the sequence counter (field hwm of {link.meta_key}) is {said}, "
            f"but sequence {text(reply[2])} is in use, so a save could reuse "
            "a sequence"
        )
    link.check_status(reply)
    raise AssertionError(f"unexpected reply of the INSERT script: {reply!r}")


async def delete_one(link: RedisLink, id: str, now: datetime, if_match: str | None) -> bool:
    """Delete the live or lost checkpoint ``id`` (if its etag is ``if_match``, when
    given): one script call. ``True`` if it was there."""
    try:
        reply = await link.call("DELETE", id, us(now), if_match or "")
    except BackendError as exc:
        if link.lost_reply(exc):
            raise link.unknown(
                "deleting", id, exc, "whether it was applied cannot be told"
            ) from exc
        raise
    if reply[0] == b"etag":
        raise PreconditionFailed(
            f"checkpoint {id!r} has etag {text(reply[1]) if reply[1] else None!r}, not {if_match!r}"
        )
    link.check_status(reply, id)
    return bool(reply[0] == b"ok")


async def get_many(
    link: RedisLink, ids: list[str], now: datetime, store_id: str
) -> dict[str, StoredRecord]:
    """The live records among ``ids``: one script call. Strict like ``_get``: a
    record that cannot be read, or a lost one (indexed, key missing), raises."""
    reply = await link.call("GET_MANY", us(now), *ids)
    found: dict[str, StoredRecord] = {}
    for id, at in zip(ids, range(0, len(reply), 3), strict=True):
        status, score, blob = reply[at : at + 3]
        sequence = None if score is None else int(score)
        if status == b"lost":
            raise link.lost(id, sequence)
        if status == b"live":
            found[id] = link.parse(id, sequence, blob, store_id)
    return found


async def delete_many(link: RedisLink, ids: list[str], now: datetime) -> int:
    """Delete the live or lost checkpoints among ``ids``: one script call, and none
    deleted if one of them cannot be unlinked (damaged index entries)."""
    try:
        reply = await link.call("DELETE_MANY", us(now), *ids)
    except BackendError as exc:
        if link.lost_reply(exc) and ids:
            raise link.unknown(
                "deleting", ids[0], exc, "whether it was applied cannot be told"
            ) from exc
        raise
    link.check_status(reply)
    return int(reply[1])


async def stream_names(link: RedisLink, now: datetime, prefix: str) -> list[str]:
    """Names of the live streams that start with ``prefix`` ("" for all).

    ``P n`` is a set, so the server filters it by a glob (``SSCAN MATCH``) with
    every glob character escaped: O(stream names) whatever the prefix. Each batch
    of names is then checked for a live checkpoint by one script call.
    """
    names: set[str] = set()
    match = _GLOB.sub(r"\\\1", prefix) + "*" if prefix else None
    cursor: int = 0
    seen = False
    while True:
        cursor, batch = await link.guard(
            link.client.sscan(link.prefix + "n", cursor, match=match, count=_STREAM_BATCH)
        )
        if batch:
            seen = True
            names.update(await _live_streams(link, now, batch))
        if not cursor:
            break
    if not seen:
        # nothing named: only the checks (an empty name set is no proof of no streams)
        await _live_streams(link, now, [])
    # the glob is exact already; this only keeps a server's glob quirk from mattering
    return [name for name in names if name.startswith(prefix)]


async def _live_streams(link: RedisLink, now: datetime, batch: list[Any]) -> list[str]:
    """Which of ``batch`` have a live or lost checkpoint; raises for damaged indexes."""
    live = await link.call("LIVE_STREAMS", us(now), *batch)
    link.check_status(live)
    if live[0] == b"noindex":
        raise link.damaged(
            f"the index {link.prefix}s:{text(live[1])} is missing although "
            f"{link.prefix}n names the stream"
        )
    if live[0] == b"nonames":
        # every indexed checkpoint has a stream, and P h tracks every stream
        raise link.damaged(
            f"the stream-name set {link.prefix}n is empty although "
            f"{link.prefix}all indexes checkpoints, or names fewer or more streams "
            f"than the store tracks ({link.prefix}h)"
        )
    return [text(name) for name in live[1:]]
