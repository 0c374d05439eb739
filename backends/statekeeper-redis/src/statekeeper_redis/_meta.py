"""The meta hash ``{prefix}:meta``: opening a store, and rebuilding a lost one.

``create=False`` and ``read_only=True`` are honoured here: neither creates a key,
and a read-only open writes none at all. A prefix whose meta hash is missing while
other keys of the store exist is a damaged store, never a new one: a read-only
open refuses it, a writable open rebuilds the hash from the records.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from statekeeper import StoreIdentity
from statekeeper.errors import StoreFormatError, StoreNotFound

from ._audit import walk
from ._link import RedisLink, text
from ._prelude import PRELUDE

__all__ = ["FORMAT_VERSION", "SCRIPTS", "OpenedMeta", "open_meta", "restore_meta"]

#: The key-layout version written to ``{prefix}:meta`` (see ``_lua``).
FORMAT_VERSION = 2
#: The oldest key-layout version a writable open upgrades (format 1 has no
#: tracking: no ``count`` in the meta hash, no ``P h``; see ``_lua``).
_UPGRADABLE = 1
KIND = b"statekeeper-redis"
_DIGITS = re.compile(rb"[0-9]+")


#: The store's meta hash, created only when ARGV[6] is '1' and the store has no
#: index key (a store whose meta hash was lost is not a new store).
#: ARGV: P, kind, format, store_id, cursor_key, create ('1' | '0').
#: Returns {'ok', kind, format, store_id, cursor_key, hwm}, {'missing'} (nothing
#: written), {'orphaned', n} (no meta, n index keys) or {'wrongtype', type}.
INIT = (
    PRELUDE
    + r"""
local t = redis.call('TYPE', META)['ok']
if t == 'none' then
  local n = redis.call('EXISTS', ALL, EXP, IDX, ETAG, NAMES)
  if n > 0 then return {'orphaned', n} end
  if ARGV[6] ~= '1' then return {'missing'} end
  redis.call('HSET', META, 'kind', ARGV[2], 'format', ARGV[3], 'store_id', ARGV[4],
             'cursor_key', ARGV[5], 'hwm', '0', 'count', '0')
elseif t ~= 'hash' then
  return {'wrongtype', t}
end
return {'ok', unpack(redis.call('HMGET', META, 'kind', 'format', 'store_id', 'cursor_key', 'hwm'))}
"""
)


#: Recreate a lost meta hash (only if it is still missing).
#: ARGV: P, kind, format, store_id, cursor_key, hwm, count. Returns 1 if it wrote it.
#: ``count`` is what the walk found (records and P all entries), so indexes lost
#: with the meta hash stay damage that reads refuse until ``repair()``.
RESTORE_META = (
    PRELUDE
    + r"""
if redis.call('EXISTS', META) == 1 then return 0 end
local hwm = math.max(tonumber(ARGV[6]), topscore(ALL))
redis.call('HSET', META, 'kind', ARGV[2], 'format', ARGV[3], 'store_id', ARGV[4],
           'cursor_key', ARGV[5], 'hwm', string.format('%d', hwm),
           'count', string.format('%d', math.max(tonumber(ARGV[7]), redis.call('ZCARD', ALL))))
return 1
"""
)

#: Upgrade a store of format ARGV[2] (1: no tracking) to ARGV[3]: track each
#: stream P n names, and the size of P all, as the indexes are now (damage they
#: have already is verify()'s to find). O(streams). ARGV: P, from, to. Returns 1 if
#: it upgraded, 0 if the store's format was not ARGV[2] (already upgraded).
TRACK_ALL = (
    PRELUDE
    + r"""
if redis.call('HGET', META, 'format') ~= ARGV[2] then return 0 end
local bad = badtype({})
if bad then return {'wrongtype', bad} end
for _, name in ipairs(redis.call('SMEMBERS', NAMES)) do TOUCHED[name] = true end
redis.call('HSET', META, 'format', ARGV[3])
retrack()
return 1
"""
)

#: The scripts of opening a store (see ``_lua`` for the key layout).
SCRIPTS = {"INIT": INIT, "RESTORE_META": RESTORE_META, "TRACK_ALL": TRACK_ALL}


@dataclass(frozen=True)
class OpenedMeta:
    """What opening the meta hash found."""

    identity: StoreIdentity
    #: the high-water mark (0 if unreadable: only the first save's guess, which the
    #: insert script checks)
    hwm: int
    #: what rebuilding a lost meta hash did (for the next repair report), if it had to
    rebuilt: str | None


async def open_meta(link: RedisLink, *, create: bool, read_only: bool) -> OpenedMeta:
    """The identity and high-water mark of the store at ``link``'s prefix, created
    if there is none and ``create``; upgraded, or rebuilt if lost, unless ``read_only``."""
    where = f"{link.where} (key {link.meta_key})"
    rebuilt: str | None = None
    reply = await _init(link, create=False)
    if reply[0] == b"missing":
        orphaned = await _has_keys(link)
        if not orphaned and not create:
            raise StoreNotFound(
                f"there is no statekeeper store at {link.where}: no key "
                f"{link.meta_key} and no other key under its prefix (create=False, "
                "so nothing was created); check the URL and key_prefix"
            )
        if not orphaned:
            reply = await _init(link, create=True)
    if reply[0] in (b"missing", b"orphaned"):
        # keys of the store exist but its meta hash is gone: never a fresh store
        if read_only:
            raise StoreFormatError(
                f"{where} is missing although the store has other keys, so its store "
                "id and sequence counter are lost; open it without read_only (for "
                "example `statekeeper repair URL`) to rebuild them from the records"
            )
        rebuilt = await restore_meta(link)
        reply = await _init(link, create=False)
    if reply[0] == b"wrongtype":
        raise StoreFormatError(
            f"{where} holds a Redis {text(reply[1])}, not a statekeeper store; "
            "choose another key_prefix"
        )
    if reply[0] != b"ok":
        raise StoreFormatError(f"{where} disappeared while it was being opened; retry")
    kind, fmt, store_id, cursor_key, hwm = reply[1:]
    if kind != KIND or store_id is None or cursor_key is None:
        raise StoreFormatError(
            f"{where} is not a statekeeper-redis store (kind {kind!r}); choose another key_prefix"
        )
    try:
        version = int(fmt)
        key = bytes.fromhex(text(cursor_key))
    except (TypeError, ValueError) as exc:
        raise StoreFormatError(f"{where} has a malformed meta hash: {exc}") from None
    if version > FORMAT_VERSION:
        raise StoreFormatError(
            f"{where} uses key-layout format {version}, newer than the {FORMAT_VERSION} "
            "this statekeeper-redis reads; upgrade statekeeper-redis"
        )
    if version < _UPGRADABLE:
        raise StoreFormatError(f"{where} has an unknown key-layout format {version}")
    if version < FORMAT_VERSION and not read_only:
        # a read-only open reads a format-1 store as it is (without the tracking checks)
        link.check_status(await link.call("TRACK_ALL", version, FORMAT_VERSION))
        version = FORMAT_VERSION
    guess = int(hwm) if hwm is not None and _DIGITS.fullmatch(hwm) else 0
    return OpenedMeta(StoreIdentity(text(store_id), key, version), guess, rebuilt)


async def _init(link: RedisLink, *, create: bool) -> Any:
    return await link.call(
        "INIT",
        KIND,
        FORMAT_VERSION,
        secrets.token_hex(16),
        secrets.token_hex(32),
        "1" if create else "0",
    )


async def _has_keys(link: RedisLink) -> bool:
    """Whether any key exists under the prefix (SCAN: O(database) when none does)."""
    async for _ in link.client.scan_iter(match=link.prefix + "*", count=1000):
        return True
    return False


async def restore_meta(link: RedisLink) -> str:
    """Recreate a lost meta hash from the records (on a writable open); say what it did.

    The store id is the one the records carry; the high-water mark is the highest
    sequence any key mentions (sequences of checkpoints deleted above it are lost
    with the counter and may be assigned again); the cursor key is new, so cursors
    issued before are refused as foreign (``InvalidCursor``), never misread.
    """
    audit = await link.guard(walk(link.client, link.prefix, None, link.where))
    if audit.store_ids:
        store_id, count = audit.store_ids.most_common(1)[0]
        source = f"store id {store_id} from {count} readable record(s)"
    else:
        store_id = secrets.token_hex(16)
        source = "a new store id (no record was readable; they stay damaged)"
    top = audit.top
    await link.call(
        "RESTORE_META", KIND, FORMAT_VERSION, store_id, secrets.token_hex(32), top, audit.records()
    )
    return (
        f"rebuilt the lost meta hash {link.meta_key} on open: {source}, "
        f"high-water mark {top} (the highest sequence found), and a new cursor key "
        "(cursors issued before are refused)"
    )
