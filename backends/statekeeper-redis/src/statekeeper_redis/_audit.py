"""What every key of a Redis store says, checked against the records.

Records (``P r:<id>``) are the truth: each carries its id, stream, sequence,
tags, etag and expiry under a checksum. Every other key is derived from them and
can be rebuilt. :func:`walk` reads every key under the prefix (without writing);
:meth:`Audit.assess` compares the derived keys with the records and returns the
problems ``verify()`` reports and the guarded edits ``repair()`` applies.

An id whose record key is missing although an index still places it (and whose
expiry, if any, is not due) is a *lost* checkpoint: acknowledged, then deleted
outside statekeeper or evicted. Like a record whose bytes are damaged, it keeps
its place (``P all``, its stream's zset, its ``P i`` entry), so strict reads keep
raising for it, until it is deleted or ``repair(drop_damaged=True)`` drops it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rex

from statekeeper import Problem
from statekeeper.errors import CheckpointDecodeError, StoreFormatError
from statekeeper.record import StoredRecord

from ._lua import EXPIRY_GRACE_SECONDS

__all__ = ["Audit", "DamagedStoreError", "Fix", "Known", "index_json", "us", "walk"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
#: The fixed keys besides the meta hash, and the Redis type each must have.
FIXED_TYPES = {"all": "zset", "x": "zset", "i": "hash", "e": "hash", "n": "set", "h": "hash"}
_DIGITS = re.compile(rb"[0-9]+")
_BATCH = 500


class DamagedStoreError(StoreFormatError):
    """A key the store derives from its records (a stream or tag index, the id or
    etag hash, the sequence counter) is missing, malformed or of the wrong Redis
    type, so the call cannot answer correctly. Raised instead of answering "empty"
    or reusing a sequence; nothing was written. ``repair()`` (``statekeeper repair
    URL``) rebuilds those keys from the records."""


def us(moment: datetime) -> int:
    """Microseconds since the epoch, exactly (a float timestamp would round)."""
    return (moment - _EPOCH) // _MICROSECOND


def index_json(stream: str, tags: dict[str, str]) -> str:
    """The ``P i`` entry of a checkpoint: where its index entries are."""
    return json.dumps({"s": stream, "t": tags}, ensure_ascii=False, separators=(",", ":"))


def _store_of(blob: bytes) -> str | None:
    """The store id written in a readable envelope (to rebuild a lost meta hash)."""
    head_len = int(blob.split(b" ", 2)[1])
    start = blob.index(b"\n") + 1
    found = json.loads(blob[start : start + head_len]).get("store")
    return found if isinstance(found, str) else None


@dataclass
class Known:
    """What the keys of the store say about one id."""

    header: Any = None  # the CheckpointHeader of a readable record
    damage: str | None = None  # why an existing record key cannot be read
    sha: str | None = None  # sha1 of the record bytes as read (the repair's guard)
    all_seq: int | None = None
    streams: dict[str, int] = field(default_factory=dict)
    tags: dict[tuple[str, str], int] = field(default_factory=dict)
    idx: bytes | None = None
    etag: bytes | None = None
    exp: int | None = None

    @property
    def exists(self) -> bool:
        return self.sha is not None

    def place(self) -> tuple[int | None, str | None]:
        """Sequence and stream of a checkpoint whose record cannot tell."""
        stream: str | None = None
        try:
            info = json.loads(self.idx) if self.idx is not None else None
            if isinstance(info, dict) and isinstance(info.get("s"), str):
                stream = info["s"]
        except ValueError:
            pass
        if stream is None and self.streams:
            by_seq = [s for s, q in self.streams.items() if q == self.all_seq]
            stream = (by_seq or sorted(self.streams))[0]
        seq = self.all_seq
        if seq is None and stream is not None:
            seq = self.streams.get(stream)
        return seq, stream


@dataclass
class Fix:
    """Guarded edits for one id (``APPLY``): only if its record is as it was read."""

    id: str
    guard: str  # sha1 of the record bytes, or "absent"
    witness: str  # for "absent": a key that must still hold the id
    edits: list[tuple[str, str, str, str]]  # (op, key suffix, member/field, score/value)


@dataclass
class Audit:
    """Every key under one prefix, as read by :func:`walk`."""

    prefix: str
    location: str
    meta: dict[bytes, bytes] | None = None
    ids: dict[str, Known] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    stream_keys: set[str] = field(default_factory=set)
    tracked: set[str] = field(default_factory=set)  # the streams P h has an entry for
    wrongtype: list[tuple[str, str, str]] = field(default_factory=list)  # suffix, has, wants
    foreign: list[str] = field(default_factory=list)
    store_ids: Counter[str] = field(default_factory=Counter)

    def known(self, id: str) -> Known:
        found = self.ids.get(id)
        if found is None:
            found = self.ids[id] = Known()
        return found

    @property
    def top(self) -> int:
        """The highest sequence any key of the store mentions."""
        best = 0
        for k in self.ids.values():
            best = max(best, k.all_seq or 0, *k.streams.values(), *k.tags.values(), 0)
            if k.header is not None:
                best = max(best, k.header.sequence)
        return best

    def hwm(self) -> int | None:
        raw = (self.meta or {}).get(b"hwm")
        return int(raw) if raw is not None and _DIGITS.fullmatch(raw) else None

    def records(self) -> int:
        return sum(1 for k in self.ids.values() if k.exists or k.all_seq is not None)

    def assess(self, now: datetime) -> tuple[list[Problem], list[Fix]]:
        """The problems of the derived keys, and the edits that rebuild them."""
        problems: list[Problem] = []
        fixes: list[Fix] = []
        for suffix, has, wants in self.wrongtype:
            problems.append(
                Problem(
                    kind="index",
                    location=f"{self.location} key {self.prefix}{suffix}",
                    reason=f"holds a Redis {has}, not a {wants}; repair() replaces it "
                    "with one rebuilt from the records",
                )
            )
        for suffix in self.foreign:
            problems.append(
                Problem(
                    kind="foreign",
                    location=f"{self.location} key {self.prefix}{suffix}",
                    reason="a key under the store's prefix that is not one of its keys; "
                    "left alone (another program writes under this key_prefix)",
                )
            )
        horizon = us(now) + EXPIRY_GRACE_SECONDS * 1_000_000
        for id, k in sorted(self.ids.items()):
            problem, fix = self._assess_id(id, k, horizon)
            problems += problem
            if fix is not None and fix.edits:
                fixes.append(fix)
        for name in sorted(self.names - self.stream_keys):
            problems.append(
                self._index(
                    f"{self.prefix}n",
                    f"names stream {name!r}, whose index {self.prefix}s:{name} is missing",
                )
            )
        for name in sorted(self.stream_keys - self.names):
            problems.append(
                self._index(f"{self.prefix}n", f"lacks stream {name!r}, which has index entries")
            )
        hwm, top = self.hwm(), self.top
        if self.meta is None:
            problems.append(self._state("the meta hash is missing"))
        elif hwm is None:
            raw = self.meta.get(b"hwm")
            said = "missing" if raw is None else f"malformed ({raw!r})"
            problems.append(self._state(f"the high-water mark is {said}"))
        elif hwm < top:
            problems.append(self._state(f"the high-water mark {hwm} is below sequence {top}"))
        return problems, fixes

    def index_problem(self, key: str, reason: str) -> Problem:
        """An ``index`` problem of ``key`` (a full key name), repaired by rebuilding."""
        return self._index(key, reason)

    def _index(self, key: str, reason: str, id: str | None = None) -> Problem:
        return Problem(
            kind="index",
            location=f"{self.location} key {key}",
            reason=f"{reason}; repair() rebuilds it from the records",
            id=id,
        )

    def _state(self, reason: str) -> Problem:
        # the location matches verify_store's own high-water-mark check, so one
        # damaged counter is one problem
        return Problem(
            kind="state",
            location=self.location,
            reason=f"{reason}; saves refuse to run (they could reuse a sequence) until "
            "repair() raises it to the highest sequence in the store",
        )

    def _assess_id(self, id: str, k: Known, horizon: int) -> tuple[list[Problem], Fix | None]:
        rkey = f"{self.prefix}r:{id}"
        if k.header is not None:
            h = k.header
            exp = us(h.expires_at) if h.expires_at is not None else None
            return self._compare(id, k, h.sequence, h.stream, h.tags, h.etag, exp, k.sha or "")
        lost = not k.exists
        if lost and k.exp is not None and k.exp <= horizon:
            return [], None  # expired: its leftover entries are purge_expired's
        seq, stream = k.place()
        if lost and seq is None and stream is None:
            # only fragments (etag, tag, expiry entries) of an id nothing places: stale
            edits = self.drop_fragments(id, k)
            reason = f"entries of {id!r}, which is neither stored nor indexed"
            return [self._index(f"{self.prefix}e/t/x", reason, id)], Fix(id, "absent", "", edits)
        why = (
            f"the record key {rkey} is missing although the store's indexes hold the "
            "checkpoint and it has not expired (deleted outside statekeeper, or evicted "
            "by Redis under maxmemory)"
            if lost
            else (k.damage or "unreadable")
        )
        damaged = Problem(
            kind="damaged-record",
            location=f"{self.location} key {rkey}",
            reason=f"{why}; it stays until repair(drop_damaged=True)",
            id=id,
            sequence=seq,
            stream=stream,
        )
        if seq is None or stream is None:
            return [damaged], None  # nothing places it in a listing; reported, kept
        tags = dict(k.tags.keys())
        witness = (
            "all" if k.all_seq is not None else (f"s:{stream}" if stream in k.streams else "i")
        )
        problems, fix = self._compare(
            id, k, seq, stream, tags, None, None, "absent" if lost else (k.sha or ""), witness
        )
        return [damaged, *problems], fix

    def _compare(
        self,
        id: str,
        k: Known,
        seq: int,
        stream: str,
        tags: dict[str, str],
        etag: str | None,
        exp: int | None,
        guard: str,
        witness: str = "",
    ) -> tuple[list[Problem], Fix]:
        """Edits that make every derived entry of ``id`` agree with what places it.

        ``etag`` and ``exp`` are ``None`` for a damaged or lost checkpoint, whose
        etag, expiry and tag entries are kept as they are.
        """
        s = str(seq)
        issues: list[str] = []
        edits: list[tuple[str, str, str, str]] = []
        if k.all_seq != seq:
            issues.append("missing from P all" if k.all_seq is None else "wrong in P all")
            edits.append(("zadd", "all", id, s))
        if k.streams.get(stream) != seq:
            at = k.streams.get(stream)
            issues.append(
                f"missing from its stream index s:{stream}"
                if at is None
                else f"at sequence {at} in its stream index s:{stream}"
            )
            edits.append(("zadd", f"s:{stream}", id, s))
        for other in sorted(set(k.streams) - {stream}):
            issues.append(f"also in the index of stream {other!r}")
            edits.append(("zrem", f"s:{other}", id, ""))
        if etag is not None:  # a readable record: tags, etag and expiry come from it
            want = set(tags.items())
            for t, v in sorted(want):
                if k.tags.get((t, v)) != seq:
                    issues.append(f"missing from the index of tag {t}={v}")
                    edits.append(("zadd", f"t:{t}\0{v}", id, s))
            for t, v in sorted(set(k.tags) - want):
                issues.append(f"in the index of tag {t}={v}, which it does not have")
                edits.append(("zrem", f"t:{t}\0{v}", id, ""))
            if k.etag is None or k.etag.decode("utf-8", "replace") != etag:
                issues.append("its etag entry is missing or stale")
                edits.append(("hset", "e", id, etag))
            if k.exp != exp:
                issues.append("its expiry entry is missing or stale")
                edits.append(
                    ("zadd", "x", id, str(exp)) if exp is not None else ("zrem", "x", id, "")
                )
        try:
            idx_ok = k.idx is not None and json.loads(k.idx) == {"s": stream, "t": tags}
        except ValueError:
            idx_ok = False
        if not idx_ok and (etag is not None or k.idx is None or not _is_index(k.idx)):
            issues.append("its id-hash entry is missing or stale")
            edits.append(("hset", "i", id, index_json(stream, tags)))
        problems = []
        if issues:
            reason = f"checkpoint {id!r} (sequence {seq}, stream {stream!r}): " + "; ".join(issues)
            problems.append(self._index(f"{self.prefix}r:{id}", reason, id))
        return problems, Fix(id, guard, witness, edits)

    @staticmethod
    def drop_fragments(id: str, k: Known) -> list[tuple[str, str, str, str]]:
        edits = [("zrem", f"t:{t}\0{v}", id, "") for (t, v) in sorted(k.tags)]
        if k.etag is not None:
            edits.append(("hdel", "e", id, ""))
        if k.exp is not None:
            edits.append(("zrem", "x", id, ""))
        return edits


def _is_index(raw: bytes) -> bool:
    try:
        info = json.loads(raw)
    except ValueError:
        return False
    return (
        isinstance(info, dict)
        and isinstance(info.get("s"), str)
        and isinstance(info.get("t"), dict)
    )


def _raw(value: bytes | str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def _suffixes(keys: list[bytes], prefix: bytes) -> Iterator[tuple[bytes, str | None]]:
    for key in keys:
        try:
            yield key, key[len(prefix) :].decode("utf-8")
        except UnicodeDecodeError:
            yield key, None


async def walk(client: aioredis.Redis, prefix: str, store_id: str | None, location: str) -> Audit:
    """Read every key under ``prefix`` (SCAN, then each key by type). Writes nothing.

    Costs O(keys in the database / 1000) SCAN calls plus O(store) reads, and holds
    what the indexes say about every id in memory. ``store_id=None`` accepts
    records of any store and counts their store ids (to rebuild a lost meta hash).
    """
    audit = Audit(prefix, location)
    raw_prefix = prefix.encode("utf-8")
    keys = [k async for k in client.scan_iter(match=prefix + "*", count=1000)]
    records: list[tuple[bytes, str]] = []
    others: list[tuple[bytes, str]] = []
    for key, suffix in _suffixes(sorted(set(keys)), raw_prefix):
        if suffix is None:
            audit.foreign.append(key[len(raw_prefix) :].decode("utf-8", "replace"))
        elif suffix.startswith("r:"):
            records.append((key, suffix[2:]))
        else:
            others.append((key, suffix))
    pipe = client.pipeline(transaction=False)
    for key, _ in others:
        pipe.type(key)
    types = [t.decode() if isinstance(t, bytes) else str(t) for t in await pipe.execute()]
    meta: tuple[bytes, str, str] | None = None
    for (key, suffix), has in zip(others, types, strict=True):
        if suffix == "meta":
            meta = (key, suffix, has)
        else:
            await _read_key(client, audit, key, suffix, has)
    # an indexed id whose record key the SCAN did not list: saved after the SCAN, or lost
    seen = {id for _key, id in records}
    records += [
        ((prefix + "r:" + id).encode("utf-8"), id)
        for id, k in audit.ids.items()
        if id not in seen and (k.all_seq is not None or k.streams or k.idx is not None)
    ]
    for i in range(0, len(records), _BATCH):
        batch = records[i : i + _BATCH]
        pipe = client.pipeline(transaction=False)
        for key, _ in batch:
            pipe.get(key)
        blobs = await pipe.execute(raise_on_error=False)
        for (key, id), blob in zip(batch, blobs, strict=True):
            _read_record(audit, key, id, blob, store_id)
    if meta is not None:
        # last: the high-water mark only grows, so it covers every sequence read before
        await _read_key(client, audit, *meta)
    return audit


async def _read_key(
    client: aioredis.Redis, audit: Audit, key: bytes, suffix: str, has: str
) -> None:
    if has == "none":
        return  # deleted since the SCAN
    if suffix == "meta":
        if has == "hash":
            audit.meta = {_raw(f): _raw(v) for f, v in (await client.hgetall(key)).items()}
        else:
            audit.wrongtype.append((suffix, has, "hash"))
        return
    if suffix == "turn":
        # a writer's turn (see _lua.INSERT): short-lived and holds no checkpoint data
        if has != "string":
            audit.wrongtype.append((suffix, has, "string"))
        return
    wants = FIXED_TYPES.get(suffix)
    if wants is None and suffix.startswith(("s:", "t:")):
        wants = "zset"
    if wants is None or (suffix.startswith("t:") and "\0" not in suffix):
        audit.foreign.append(suffix)
        return
    if has != wants:
        audit.wrongtype.append((suffix, has, wants))
        return
    if suffix == "n":
        audit.names = {
            m.decode("utf-8", "replace") async for m in client.sscan_iter(key, count=1000)
        }
    elif suffix == "h":
        audit.tracked = {
            f.decode("utf-8", "replace") async for f, _v in client.hscan_iter(key, count=1000)
        }
    elif suffix in ("i", "e"):
        async for field_, value in client.hscan_iter(key, count=1000):
            k = audit.known(field_.decode("utf-8", "replace"))
            if suffix == "i":
                k.idx = value
            else:
                k.etag = value
    else:
        async for member, score in client.zscan_iter(key, count=1000):
            k = audit.known(member.decode("utf-8", "replace"))
            if suffix == "all":
                k.all_seq = int(score)
            elif suffix == "x":
                k.exp = int(score)
            elif suffix.startswith("s:"):
                k.streams[suffix[2:]] = int(score)
                audit.stream_keys.add(suffix[2:])
            else:
                tag, value = suffix[2:].split("\0", 1)
                k.tags[(tag, value)] = int(score)


def _read_record(audit: Audit, key: bytes, id: str, blob: Any, store_id: str | None) -> None:
    k = audit.known(id)
    where = f"{audit.location} key {key.decode('utf-8', 'replace')}"
    if blob is None:
        audit.ids[id].sha = None  # deleted since the SCAN
        return
    if isinstance(blob, rex.ResponseError):
        k.sha, k.damage = hashlib.sha1(b"").hexdigest(), "the key holds another Redis type"
        return
    data = bytes(blob)
    k.sha = hashlib.sha1(data).hexdigest()
    try:
        record = StoredRecord.from_bytes(
            data, location=where, expect_store_id=store_id, expect_id=id
        )
    except CheckpointDecodeError as exc:
        k.damage = exc.reason
        return
    k.header = record.header
    if store_id is None:
        found = _store_of(data)
        if found is not None:
            audit.store_ids[found] += 1
