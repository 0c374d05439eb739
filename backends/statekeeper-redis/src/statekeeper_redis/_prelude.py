"""The Lua helpers every script of the Redis backend starts with (:data:`PRELUDE`).

The key layout is in ``_lua``. ``P`` is the store's prefix ``{<key_prefix>}:``.

Liveness is decided against the caller's clock (``now`` in microseconds): a
checkpoint is live when its record key exists and it has no expiry or its expiry
is after ``now``. Redis' own expiry of the record key reclaims the bytes; the
index entries of expired checkpoints stay until ``purge_expired`` (reads skip
them).

Records are the truth, and an index entry is a promise that its record exists.
An id that is indexed but whose record key is missing, while its expiry (if any)
is more than ``EXPIRY_GRACE_SECONDS`` away, is **lost**: an acknowledged
checkpoint deleted outside statekeeper or evicted under ``maxmemory``. Reads
report it as damaged (``get_latest`` never answers an older one instead); only
a delete or ``repair(drop_damaged=True)`` removes its entries. Scripts that would
write to a key of the wrong Redis type, or unlink an id whose ``P i`` entry is
missing or malformed (so its stream and tag entries cannot be found), refuse
before writing anything, for every id they touch, since a Redis script that
fails half-way keeps its first writes.

**Tracking** (format 2). An index key can vanish as a whole (``DEL``, eviction) or
lose or change one entry, and an empty or shorter zset reads like a store with
fewer checkpoints. So the scripts also keep what the indexes must hold: ``count``
in ``P meta`` is the size of ``P all``, and ``P h`` has each stream's newest
sequence and size. Every script that reads or writes ``P all`` or a stream's zset
first compares it with its tracking (:func:`untracked`, O(log n)) and refuses
(``{'untracked', key, tracked, found}``, nothing written) if they disagree;
every script that writes them sets the tracking from them afterwards. The meta
hash outlives the indexes it counts: with every index key gone, ``count`` still
says that checkpoints exist. A store of format 1 has no tracking, and its reads
skip the check until a writable open builds it (``_meta.TRACK_ALL``).

Numbers that must stay exact (sequences, microsecond timestamps) travel as
strings: Lua prints numbers with 14 significant digits.
"""

from __future__ import annotations

__all__ = ["EXPIRY_GRACE_SECONDS", "PRELUDE"]

#: A record key missing less than this long before its expiry (by the caller's
#: clock) counts as expired, not lost: clocks of different clients disagree a little.
EXPIRY_GRACE_SECONDS = 5

#: The helpers every script starts with (key names, liveness, checks, unlinking).
PRELUDE = (
    r"""
local P = ARGV[1]
local META, ALL, EXP, IDX, ETAG, NAMES = KEYS[1], P .. 'all', P .. 'x', P .. 'i', P .. 'e', P .. 'n'
local TRACK = P .. 'h'
local GRACE = """
    + str(EXPIRY_GRACE_SECONDS * 1_000_000)
    + r"""
local function rkey(id) return P .. 'r:' .. id end
local function skey(stream) return P .. 's:' .. stream end
local function tkey(k, v) return P .. 't:' .. k .. '\0' .. v end

-- the record bytes; a key of another type reads as '' (a record that fails to decode)
local function rget(id)
  local blob = redis.pcall('GET', rkey(id))
  if type(blob) == 'table' and blob.err then return '' end
  return blob
end

-- 'live'; 'gone' (never existed, deleted, or expired at now); or 'lost': the record
-- key is missing although the id is indexed and not expired
local function status(id, now, indexed)
  local e = redis.call('ZSCORE', EXP, id)
  if redis.call('EXISTS', rkey(id)) == 1 then
    if e and tonumber(e) <= now then return 'gone' end
    return 'live'
  end
  if e and tonumber(e) <= now + GRACE then return 'gone' end
  if indexed or redis.call('ZSCORE', ALL, id) or redis.call('HEXISTS', IDX, id) == 1 then
    return 'lost'
  end
  return 'gone'
end

local function live(id, now) return status(id, now, false) == 'live' end


-- the first of keys whose type is not the wanted one (or nil); scripts check before
-- writing, because a script that fails half-way keeps its first writes
local FIXED = {
  {ALL, 'zset'}, {EXP, 'zset'}, {IDX, 'hash'}, {ETAG, 'hash'}, {NAMES, 'set'}, {TRACK, 'hash'}
}
local function badtype(extra)
  for _, kt in ipairs(FIXED) do
    local t = redis.call('TYPE', kt[1])['ok']
    if t ~= 'none' and t ~= kt[2] then return kt[1] end
  end
  for _, k in ipairs(extra or {}) do
    local t = redis.call('TYPE', k)['ok']
    if t ~= 'none' and t ~= 'zset' then return k end
  end
  return nil
end

-- the P i entry of id: its decoded table, nil if there is none, false if malformed
local function idxinfo(id)
  local raw = redis.call('HGET', IDX, id)
  if not raw then return nil end
  local ok, info = pcall(cjson.decode, raw)
  if not ok or type(info) ~= 'table' or type(info.s) ~= 'string' or type(info.t) ~= 'table' then
    return false
  end
  for k, v in pairs(info.t) do
    if type(k) ~= 'string' or type(v) ~= 'string' then return false end
  end
  return info
end

local function topscore(k)
  local top = redis.call('ZREVRANGE', k, 0, 0, 'WITHSCORES')
  if top[2] then return tonumber(top[2]) end
  return 0
end

-- Tracking (see the module docstring). Whether this store keeps it (format >= 2).
-- Read once per script: no script changes the format before it asks.
local TRACKED = nil
local function tracked()
  if TRACKED == nil then
    local fmt = tonumber(redis.call('HGET', META, 'format') or '')
    TRACKED = fmt ~= nil and fmt >= 2
  end
  return TRACKED
end

-- what P h must say of stream, as the zset holds it now ('' for no entries)
local function summary(stream)
  local sk = skey(stream)
  local n = redis.call('ZCARD', sk)
  if n == 0 then return '' end
  return string.format('%d %d', topscore(sk), n)
end

-- nil if P all (when all is true) and the zsets of streams hold what the store
-- tracks of them; else {'untracked', key suffix, tracked, found}
local function untracked(streams, all)
  if not tracked() then return nil end
  if all then
    local want = redis.call('HGET', META, 'count') or ''
    local n = string.format('%d', redis.call('ZCARD', ALL))
    if want ~= n then return {'untracked', 'all', want, n} end
  end
  for _, stream in ipairs(streams) do
    local want = redis.call('HGET', TRACK, stream) or ''
    local found = summary(stream)
    if want ~= found then return {'untracked', 's:' .. stream, want, found} end
  end
  return nil
end

-- the streams whose zsets this script changed; retrack() records them in P h
local TOUCHED = {}

-- set the tracking from the indexes as they are now (after a script's writes,
-- which untracked() allowed, or by repair once the indexes are rebuilt)
local function retrack()
  if not tracked() then return end
  for stream, _ in pairs(TOUCHED) do
    local found = summary(stream)
    if found == '' then redis.call('HDEL', TRACK, stream)
    else redis.call('HSET', TRACK, stream, found) end
  end
  redis.call('HSET', META, 'count', string.format('%d', redis.call('ZCARD', ALL)))
end

-- nil if unlink() can remove every entry of each of ids without failing half-way,
-- and P all and the zsets of their streams (and of extra_streams) hold what their
-- tracking says; else the refusal: {'noidx', id} (its P i entry, which says where
-- its stream and tag entries are, is missing or malformed), {'wrongtype', key} or
-- {'untracked', ...}
local function cannot_unlink(ids, extra_streams)
  local keys, seen, named, streams = {}, {}, {}, {}
  for _, stream in ipairs(extra_streams or {}) do
    if not named[stream] then named[stream] = true; streams[#streams + 1] = stream end
  end
  for _, id in ipairs(ids) do
    local info = idxinfo(id)
    if info == false or (info == nil and redis.call('ZSCORE', ALL, id)) then
      return {'noidx', id}
    end
    if info then
      if not named[info.s] then named[info.s] = true; streams[#streams + 1] = info.s end
      local mine = {skey(info.s)}
      for k, v in pairs(info.t) do mine[#mine + 1] = tkey(k, v) end
      for _, k in ipairs(mine) do
        if not seen[k] then seen[k] = true; keys[#keys + 1] = k end
      end
    end
  end
  local bad = badtype(keys)
  if bad then return {'wrongtype', bad} end
  return untracked(streams, true)
end

-- remove every trace of id: record, index entries, expiry, etag
local function unlink(id)
  local raw = redis.call('HGET', IDX, id)
  if raw then
    local info = cjson.decode(raw)
    local sk = skey(info.s)
    TOUCHED[info.s] = true
    redis.call('ZREM', sk, id)
    if redis.call('ZCARD', sk) == 0 then redis.call('SREM', NAMES, info.s) end
    for k, v in pairs(info.t) do redis.call('ZREM', tkey(k, v), id) end
  end
  redis.call('ZREM', ALL, id)
  redis.call('ZREM', EXP, id)
  redis.call('HDEL', IDX, id)
  redis.call('HDEL', ETAG, id)
  redis.call('UNLINK', rkey(id))
end

local function write_record(id, blob, exp_us, pexpire_ms)
  if exp_us ~= '' then
    redis.call('SET', rkey(id), blob, 'PX', pexpire_ms)
    redis.call('ZADD', EXP, exp_us, id)
  else
    redis.call('SET', rkey(id), blob)
    redis.call('ZREM', EXP, id)
  end
end
"""
)
