"""The server-side half of the Redis backend: one Lua script per atomic operation.

Redis runs a script to completion before it serves any other command, so each
script below is one atomic step: no reader sees half a save, and sequence order
is commit order.

Key layout (``P`` is ``{<key_prefix>}:``; the braces are a Redis Cluster hash tag,
so every key of one store lives in one slot, and no store's keys can be inside
another's, because a prefix may not contain braces)::

    P meta          hash    kind, format, store_id, cursor_key, hwm (sequence high-water mark)
    P all           zset    id -> sequence, every checkpoint of the store
    P s:<stream>    zset    id -> sequence, one per stream
    P t:<k>\\0<v>    zset    id -> sequence, one per tag key/value pair (NUL cannot occur in either)
    P x             zset    id -> expires_at in microseconds since the epoch, TTL'd checkpoints only
    P i             hash    id -> JSON {"s": stream, "t": {tags}}: what to unlink on delete
    P e             hash    id -> current etag (the compare-and-set token)
    P n             set     names of streams that have index entries
    P r:<id>        string  the envelope bytes (``StoredRecord.to_bytes``), PEXPIRE'd with a TTL

Every script takes ``P`` as ``ARGV[1]`` and ``P meta`` as ``KEYS[1]`` (so a cluster
client routes it to the slot); the other keys are derived from ``P`` inside the
script. All of them share that hash tag and so that slot.

Liveness is decided against the caller's clock (``now`` in microseconds): a
checkpoint is live when its record key exists and it has no expiry or its expiry
is after ``now``. Redis' own expiry of the record key reclaims the bytes; the
index entries of expired checkpoints stay until ``purge_expired`` (reads skip
them).

Numbers that must stay exact (sequences, microsecond timestamps) travel as
strings: Lua prints numbers with 14 significant digits.
"""

from __future__ import annotations

__all__ = [
    "DELETE",
    "DELETE_STREAM",
    "GET",
    "INFO",
    "INIT",
    "INSERT",
    "LIVE_STREAMS",
    "PRUNE",
    "PURGE",
    "SCAN",
    "UPDATE",
]

_PRELUDE = r"""
local P = ARGV[1]
local META, ALL, EXP, IDX, ETAG, NAMES = KEYS[1], P .. 'all', P .. 'x', P .. 'i', P .. 'e', P .. 'n'
local function rkey(id) return P .. 'r:' .. id end
local function skey(stream) return P .. 's:' .. stream end
local function tkey(k, v) return P .. 't:' .. k .. '\0' .. v end

local function live(id, now)
  if redis.call('HEXISTS', IDX, id) == 0 then return false end
  if redis.call('EXISTS', rkey(id)) == 0 then return false end
  local e = redis.call('ZSCORE', EXP, id)
  return (not e) or tonumber(e) > now
end

-- remove every trace of id: record, index entries, expiry, etag
local function unlink(id)
  local raw = redis.call('HGET', IDX, id)
  if raw then
    local info = cjson.decode(raw)
    local sk = skey(info.s)
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

#: Create the store's meta hash on first open; return its fields.
#: ARGV: P, kind, format, store_id, cursor_key.
INIT = (
    _PRELUDE
    + r"""
local t = redis.call('TYPE', META)['ok']
if t == 'none' then
  redis.call('HSET', META, 'kind', ARGV[2], 'format', ARGV[3], 'store_id', ARGV[4],
             'cursor_key', ARGV[5], 'hwm', '0')
elseif t ~= 'hash' then
  return {'wrongtype', t}
end
return {'ok', unpack(redis.call('HMGET', META, 'kind', 'format', 'store_id', 'cursor_key', 'hwm'))}
"""
)

#: Insert a record sealed at sequence ARGV[3], which must be hwm + 1.
#: ARGV: P, id, seq, blob, stream, index JSON, exp_us | '', pexpire_ms, now_us, etag.
#: Returns {'ok'}, {'exists'}, {'seq', hwm} (lost the race: reseal at hwm + 1), {'nometa'}.
INSERT = (
    _PRELUDE
    + r"""
local id, seq, now = ARGV[2], ARGV[3], tonumber(ARGV[9])
if live(id, now) then return {'exists'} end
local hwm = redis.call('HGET', META, 'hwm')
if not hwm then return {'nometa'} end
if tonumber(hwm) + 1 ~= tonumber(seq) then return {'seq', hwm} end
-- an expired (or vanished) checkpoint with this id is replaced: drop its old entries
unlink(id)
redis.call('HSET', META, 'hwm', seq)
write_record(id, ARGV[4], ARGV[7], ARGV[8])
local info = cjson.decode(ARGV[6])
redis.call('ZADD', ALL, seq, id)
redis.call('ZADD', skey(ARGV[5]), seq, id)
redis.call('SADD', NAMES, ARGV[5])
for k, v in pairs(info.t) do redis.call('ZADD', tkey(k, v), seq, id) end
redis.call('HSET', IDX, id, ARGV[6])
redis.call('HSET', ETAG, id, ARGV[10])
return {'ok'}
"""
)

#: The live record id: {blob, sequence, etag}, or nil. ARGV: P, id, now_us.
GET = (
    _PRELUDE
    + r"""
local id = ARGV[2]
if not live(id, tonumber(ARGV[3])) then return false end
return {redis.call('GET', rkey(id)), redis.call('ZSCORE', ALL, id), redis.call('HGET', ETAG, id)}
"""
)

#: Compare-and-set the record of id.
#: ARGV: P, id, now_us, etag the caller read, if_match | '', blob, new etag, exp_us | '',
#: pexpire_ms. Returns {'ok'}, {'notfound'}, {'etag', current} (if_match failed) or
#: {'conflict', current} (someone wrote since the caller read: re-read and retry).
UPDATE = (
    _PRELUDE
    + r"""
local id = ARGV[2]
if not live(id, tonumber(ARGV[3])) then return {'notfound'} end
local cur = redis.call('HGET', ETAG, id)
if ARGV[5] ~= '' and cur ~= ARGV[5] then return {'etag', cur} end
if cur ~= ARGV[4] then return {'conflict', cur} end
write_record(id, ARGV[6], ARGV[8], ARGV[9])
redis.call('HSET', ETAG, id, ARGV[7])
return {'ok'}
"""
)

#: Delete live id. ARGV: P, id, now_us, if_match | ''.
#: Returns {'ok'}, {'missing'} or {'etag', current}.
DELETE = (
    _PRELUDE
    + r"""
local id = ARGV[2]
if not live(id, tonumber(ARGV[3])) then return {'missing'} end
if ARGV[4] ~= '' then
  local cur = redis.call('HGET', ETAG, id)
  if cur ~= ARGV[4] then return {'etag', cur} end
end
unlink(id)
return {'ok'}
"""
)

#: Remove every entry of a stream; return how many were live. ARGV: P, stream, now_us.
DELETE_STREAM = (
    _PRELUDE
    + r"""
local now = tonumber(ARGV[3])
local removed = 0
for _, id in ipairs(redis.call('ZRANGE', skey(ARGV[2]), 0, -1)) do
  if live(id, now) then removed = removed + 1 end
  unlink(id)
end
return removed
"""
)

#: Remove all but the newest keep_last live entries of a stream; expired ones are left
#: for purge_expired. ARGV: P, stream, keep_last, now_us. Returns how many were removed.
PRUNE = (
    _PRELUDE
    + r"""
local keep, now = tonumber(ARGV[3]), tonumber(ARGV[4])
local kept, removed = 0, 0
for _, id in ipairs(redis.call('ZREVRANGE', skey(ARGV[2]), 0, -1)) do
  if live(id, now) then
    if kept < keep then kept = kept + 1 else unlink(id); removed = removed + 1 end
  end
end
return removed
"""
)

#: Unlink up to ARGV[3] checkpoints expired at ARGV[2] (µs). Returns how many.
PURGE = (
    _PRELUDE
    + r"""
local ids = redis.call('ZRANGEBYSCORE', EXP, '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
for _, id in ipairs(ids) do unlink(id) end
return #ids
"""
)

#: Which of the given stream names have a live checkpoint. ARGV: P, now_us, names...
LIVE_STREAMS = (
    _PRELUDE
    + r"""
local now = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local sk, off, found = skey(ARGV[i]), 0, false
  while not found do
    local ids = redis.call('ZREVRANGE', sk, off, off + 63)
    for _, id in ipairs(ids) do
      if live(id, now) then found = true; break end
    end
    if #ids < 64 then break end
    off = off + 64
  end
  if found then out[#out + 1] = ARGV[i] end
end
return out
"""
)

#: One keyset step of a listing.
#: ARGV: P, order ('asc'|'desc'), exclusive bound | '', limit, now_us, budget,
#: stream | '' (every stream), then tag key/value pairs.
#: Walks the smallest of the candidate indexes (the stream's or the global zset and
#: one zset per tag) from the bound and checks membership in the others with ZSCORE.
#: Examines at most ``budget`` index entries, so one call never blocks the server
#: for long. Returns {exhausted (0|1), last examined score | '', id, seq, blob, ...}:
#: a caller with fewer than ``limit`` results and exhausted == 0 continues from the
#: returned bound.
SCAN = (
    _PRELUDE
    + r"""
local asc = ARGV[2] == 'asc'
local bound = ARGV[3]
local limit, now, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local cands = {}
if ARGV[7] ~= '' then cands[1] = skey(ARGV[7]) else cands[1] = ALL end
for i = 8, #ARGV, 2 do cands[#cands + 1] = tkey(ARGV[i], ARGV[i + 1]) end
local drive, best = 1, -1
for i, k in ipairs(cands) do
  local n = redis.call('ZCARD', k)
  if best < 0 or n < best then drive, best = i, n end
end
local dkey, others = cands[drive], {}
for i, k in ipairs(cands) do if i ~= drive then others[#others + 1] = k end end

-- out[1] and out[2] are filled in at the end (unpack() of a big table could overflow the C stack)
local out, found, examined, exhausted = {0, ''}, 0, 0, 0
while found < limit and examined < budget do
  local want = math.min(math.max(limit - found, 16), budget - examined)
  local batch
  if asc then
    local lo = '-inf'
    if bound ~= '' then lo = '(' .. bound end
    batch = redis.call('ZRANGEBYSCORE', dkey, lo, '+inf', 'WITHSCORES', 'LIMIT', 0, want)
  else
    local hi = '+inf'
    if bound ~= '' then hi = '(' .. bound end
    batch = redis.call('ZREVRANGEBYSCORE', dkey, hi, '-inf', 'WITHSCORES', 'LIMIT', 0, want)
  end
  for j = 1, #batch, 2 do
    local id, score = batch[j], batch[j + 1]
    examined = examined + 1
    bound = score
    local ok = live(id, now)
    if ok then
      for _, k in ipairs(others) do
        if not redis.call('ZSCORE', k, id) then ok = false; break end
      end
    end
    if ok then
      out[#out + 1] = id
      out[#out + 1] = score
      out[#out + 1] = redis.call('GET', rkey(id))
      found = found + 1
      if found >= limit then break end
    end
  end
  if #batch < 2 * want then exhausted = 1; break end
end
out[1], out[2] = exhausted, bound
return out
"""
)

#: Counts for info(): {checkpoints, streams, hwm, expiring}. ARGV: P.
INFO = (
    _PRELUDE
    + r"""
return {redis.call('ZCARD', ALL), redis.call('SCARD', NAMES),
        redis.call('HGET', META, 'hwm') or '0', redis.call('ZCARD', EXP)}
"""
)
