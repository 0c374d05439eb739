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

Records are the truth, and an index entry is a promise that its record exists.
An id that is indexed but whose record key is missing, while its expiry (if any)
is more than ``EXPIRY_GRACE_SECONDS`` away, is **lost**: an acknowledged
checkpoint deleted outside statekeeper or evicted under ``maxmemory``. Reads
report it as damaged (``get_latest`` never answers an older one instead); only
a delete or ``repair(drop_damaged=True)`` removes its entries. Scripts that would
write to a key of the wrong Redis type, or unlink an id whose ``P i`` entry is
gone (so its stream and tag entries cannot be found), refuse before writing
anything, since a Redis script that fails half-way keeps its first writes.

Numbers that must stay exact (sequences, microsecond timestamps) travel as
strings: Lua prints numbers with 14 significant digits.
"""

from __future__ import annotations

__all__ = [
    "APPLY",
    "DELETE",
    "DELETE_STREAM",
    "DROP_WRONGTYPE",
    "FIX_NAMES",
    "GET",
    "INFO",
    "INIT",
    "INSERT",
    "LIVE_STREAMS",
    "PRUNE",
    "PURGE",
    "RESTORE_META",
    "SCAN",
    "SET_HWM",
    "UPDATE",
]

#: A record key missing less than this long before its expiry (by the caller's
#: clock) counts as expired, not lost: clocks of different clients disagree a little.
EXPIRY_GRACE_SECONDS = 5

_PRELUDE = (
    r"""
local P = ARGV[1]
local META, ALL, EXP, IDX, ETAG, NAMES = KEYS[1], P .. 'all', P .. 'x', P .. 'i', P .. 'e', P .. 'n'
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

-- whether unlink(id) can find every entry of id (its P i entry says where they are)
local function unlinkable(id)
  return redis.call('HEXISTS', IDX, id) == 1 or not redis.call('ZSCORE', ALL, id)
end

-- the first of keys whose type is not the wanted one (or nil); scripts check before
-- writing, because a script that fails half-way keeps its first writes
local FIXED = {{ALL, 'zset'}, {EXP, 'zset'}, {IDX, 'hash'}, {ETAG, 'hash'}, {NAMES, 'set'}}
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

local function topscore(k)
  local top = redis.call('ZREVRANGE', k, 0, 0, 'WITHSCORES')
  if top[2] then return tonumber(top[2]) end
  return 0
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
)

#: The store's meta hash, created only when ARGV[6] is '1' and the store has no
#: index key (a store whose meta hash was lost is not a new store).
#: ARGV: P, kind, format, store_id, cursor_key, create ('1' | '0').
#: Returns {'ok', kind, format, store_id, cursor_key, hwm}, {'missing'} (nothing
#: written), {'orphaned', n} (no meta, n index keys) or {'wrongtype', type}.
INIT = (
    _PRELUDE
    + r"""
local t = redis.call('TYPE', META)['ok']
if t == 'none' then
  local n = redis.call('EXISTS', ALL, EXP, IDX, ETAG, NAMES)
  if n > 0 then return {'orphaned', n} end
  if ARGV[6] ~= '1' then return {'missing'} end
  redis.call('HSET', META, 'kind', ARGV[2], 'format', ARGV[3], 'store_id', ARGV[4],
             'cursor_key', ARGV[5], 'hwm', '0')
elseif t ~= 'hash' then
  return {'wrongtype', t}
end
return {'ok', unpack(redis.call('HMGET', META, 'kind', 'format', 'store_id', 'cursor_key', 'hwm'))}
"""
)

#: Recreate a lost meta hash (only if it is still missing).
#: ARGV: P, kind, format, store_id, cursor_key, hwm. Returns 1 if it wrote it.
RESTORE_META = (
    _PRELUDE
    + r"""
if redis.call('EXISTS', META) == 1 then return 0 end
local hwm = math.max(tonumber(ARGV[6]), topscore(ALL))
redis.call('HSET', META, 'kind', ARGV[2], 'format', ARGV[3], 'store_id', ARGV[4],
           'cursor_key', ARGV[5], 'hwm', string.format('%d', hwm))
return 1
"""
)

#: Raise a missing, malformed or too low high-water mark to at least ARGV[2] (and
#: the top of P all). ARGV: P, candidate. Returns {old or '', new} ({old, old} if kept).
SET_HWM = (
    _PRELUDE
    + r"""
local old = redis.call('HGET', META, 'hwm')
local want = math.max(tonumber(ARGV[2]), topscore(ALL))
if old and string.match(old, '^%d+$') and tonumber(old) >= want then return {old, old} end
local new = string.format('%d', want)
redis.call('HSET', META, 'hwm', new)
return {old or '', new}
"""
)

#: Insert a record sealed at sequence ARGV[3], which must be hwm + 1.
#: ARGV: P, id, seq, blob, stream, index JSON, exp_us | '', pexpire_ms, now_us, etag.
#: Returns {'ok'}, {'exists'}, {'lost'} (the id is a lost checkpoint), {'seq', hwm}
#: (lost the race: reseal at hwm + 1), {'nometa'}, {'badhwm', hwm | '', top} (the
#: high-water mark is missing, malformed or below a sequence in use), {'noidx'} (an
#: expired checkpoint with this id cannot be unlinked) or {'wrongtype', key}.
INSERT = (
    _PRELUDE
    + r"""
local id, seq, now = ARGV[2], ARGV[3], tonumber(ARGV[9])
local st = status(id, now, false)
if st == 'live' then return {'exists'} end
if st == 'lost' then return {'lost'} end
if redis.call('EXISTS', META) == 0 then return {'nometa'} end
local info = cjson.decode(ARGV[6])
local keys = {skey(ARGV[5])}
for k, v in pairs(info.t) do keys[#keys + 1] = tkey(k, v) end
local bad = badtype(keys)
if bad then return {'wrongtype', bad} end
local hwm = redis.call('HGET', META, 'hwm')
local top = math.max(topscore(ALL), topscore(keys[1]))
if not hwm or not string.match(hwm, '^%d+$') or tonumber(hwm) < top then
  return {'badhwm', hwm or '', string.format('%d', top)}
end
if tonumber(hwm) + 1 ~= tonumber(seq) then return {'seq', hwm} end
if not unlinkable(id) then return {'noidx'} end
-- an expired (or vanished) checkpoint with this id is replaced: drop its old entries
unlink(id)
redis.call('HSET', META, 'hwm', seq)
write_record(id, ARGV[4], ARGV[7], ARGV[8])
redis.call('ZADD', ALL, seq, id)
redis.call('ZADD', keys[1], seq, id)
redis.call('SADD', NAMES, ARGV[5])
for k, v in pairs(info.t) do redis.call('ZADD', tkey(k, v), seq, id) end
redis.call('HSET', IDX, id, ARGV[6])
redis.call('HSET', ETAG, id, ARGV[10])
return {'ok'}
"""
)

#: The record of id: {'live', blob, sequence | false, etag | false}, {'lost',
#: sequence | false}, or nil. ARGV: P, id, now_us.
GET = (
    _PRELUDE
    + r"""
local id = ARGV[2]
local st = status(id, tonumber(ARGV[3]), false)
if st == 'gone' then return false end
local score = redis.call('ZSCORE', ALL, id)
if st == 'lost' then return {'lost', score} end
return {'live', rget(id), score, redis.call('HGET', ETAG, id)}
"""
)

#: Compare-and-set the record of id.
#: ARGV: P, id, now_us, etag the caller read, if_match | '', blob, new etag, exp_us | '',
#: pexpire_ms, new index JSON | '' (tags unchanged), sequence. Returns {'ok'},
#: {'notfound'}, {'etag', current} (if_match failed), {'conflict', current} (someone
#: wrote since the caller read: re-read and retry), {'noetag'} (its P e entry is
#: gone), {'noidx'} (new tags, but its P i entry is gone) or {'wrongtype', key}.
UPDATE = (
    _PRELUDE
    + r"""
local id = ARGV[2]
if not live(id, tonumber(ARGV[3])) then return {'notfound'} end
local cur = redis.call('HGET', ETAG, id)
if not cur then return {'noetag'} end
if ARGV[5] ~= '' and cur ~= ARGV[5] then return {'etag', cur} end
if cur ~= ARGV[4] then return {'conflict', cur} end
local old, new, keys = nil, nil, {}
if ARGV[10] ~= '' then
  old = redis.call('HGET', IDX, id)
  if not old then return {'noidx'} end
  old, new = cjson.decode(old), cjson.decode(ARGV[10])
  for k, v in pairs(new.t) do keys[#keys + 1] = tkey(k, v) end
end
local bad = badtype(keys)
if bad then return {'wrongtype', bad} end
write_record(id, ARGV[6], ARGV[8], ARGV[9])
redis.call('HSET', ETAG, id, ARGV[7])
if new then
  -- tags replaced: move the tag index entries, keep the position
  for k, v in pairs(old.t) do redis.call('ZREM', tkey(k, v), id) end
  for _, k in ipairs(keys) do redis.call('ZADD', k, ARGV[11], id) end
  redis.call('HSET', IDX, id, ARGV[10])
end
return {'ok'}
"""
)

#: Delete id, live or lost (a lost checkpoint is acknowledged until deleted).
#: ARGV: P, id, now_us, if_match | ''.
#: Returns {'ok'}, {'missing'}, {'etag', current}, {'noidx'} or {'wrongtype', key}.
DELETE = (
    _PRELUDE
    + r"""
local id = ARGV[2]
if status(id, tonumber(ARGV[3]), false) == 'gone' then return {'missing'} end
if ARGV[4] ~= '' then
  local cur = redis.call('HGET', ETAG, id)
  if cur ~= ARGV[4] then return {'etag', cur} end
end
local bad = badtype()
if bad then return {'wrongtype', bad} end
if not unlinkable(id) then return {'noidx'} end
unlink(id)
return {'ok'}
"""
)

#: Remove every entry of a stream; return how many were live or lost, or -1 if one
#: of them cannot be unlinked (its P i entry is gone). ARGV: P, stream, now_us.
DELETE_STREAM = (
    _PRELUDE
    + r"""
local now = tonumber(ARGV[3])
if badtype() then return -2 end
local ids = redis.call('ZRANGE', skey(ARGV[2]), 0, -1)
for _, id in ipairs(ids) do
  if not unlinkable(id) then return -1 end
end
local removed = 0
for _, id in ipairs(ids) do
  if status(id, now, true) ~= 'gone' then removed = removed + 1 end
  unlink(id)
end
return removed
"""
)

#: Remove all but the newest keep_last live entries of a stream; expired ones are
#: left for purge_expired, lost ones for repair(drop_damaged=True).
#: ARGV: P, stream, keep_last, now_us. Returns how many were removed, or -1.
PRUNE = (
    _PRELUDE
    + r"""
local keep, now = tonumber(ARGV[3]), tonumber(ARGV[4])
if badtype() then return -2 end
local kept, doomed = 0, {}
for _, id in ipairs(redis.call('ZREVRANGE', skey(ARGV[2]), 0, -1)) do
  if live(id, now) then
    if kept < keep then kept = kept + 1 else doomed[#doomed + 1] = id end
  end
end
for _, id in ipairs(doomed) do
  if not unlinkable(id) then return -1 end
end
for _, id in ipairs(doomed) do unlink(id) end
return #doomed
"""
)

#: Unlink up to ARGV[3] checkpoints expired at ARGV[2] (µs). Returns how many, or -1.
PURGE = (
    _PRELUDE
    + r"""
if badtype() then return -2 end
local ids = redis.call('ZRANGEBYSCORE', EXP, '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
for _, id in ipairs(ids) do
  if not unlinkable(id) then return -1 end
end
for _, id in ipairs(ids) do unlink(id) end
return #ids
"""
)

#: Which of the given stream names have a live or lost checkpoint.
#: ARGV: P, now_us, names... Returns {'ok', names...}, or {'noindex', name} for a
#: stream that P n names but whose index is missing (damage, never "no stream").
LIVE_STREAMS = (
    _PRELUDE
    + r"""
local now = tonumber(ARGV[2])
local out = {'ok'}
for i = 3, #ARGV do
  local sk, off, found = skey(ARGV[i]), 0, false
  if redis.call('ZCARD', sk) == 0 and redis.call('SISMEMBER', NAMES, ARGV[i]) == 1 then
    return {'noindex', ARGV[i]}
  end
  while not found do
    local ids = redis.call('ZREVRANGE', sk, off, off + 63)
    for _, id in ipairs(ids) do
      if status(id, now, true) ~= 'gone' then found = true; break end
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
#: for long. Returns {exhausted (0|1|2), last examined score | '', id, seq, blob, ...}:
#: a caller with fewer than ``limit`` results and exhausted == 0 continues from the
#: returned bound. blob is nil for a lost checkpoint. exhausted == 2 means the
#: stream's (or the global) index is missing although P n names the stream (or
#: some stream): damaged metadata, never "empty".
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
  if i == 1 and n == 0 then
    local named
    if ARGV[7] ~= '' then named = redis.call('SISMEMBER', NAMES, ARGV[7]) == 1
    else named = redis.call('SCARD', NAMES) > 0 end
    if named then return {2, ''} end
  end
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
    local st = status(id, now, true)
    local ok = st ~= 'gone'
    if ok then
      for _, k in ipairs(others) do
        if not redis.call('ZSCORE', k, id) then ok = false; break end
      end
    end
    if ok then
      out[#out + 1] = id
      out[#out + 1] = score
      if st == 'live' then out[#out + 1] = rget(id) else out[#out + 1] = false end
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
        redis.call('HGET', META, 'hwm') or '', redis.call('ZCARD', EXP)}
"""
)

#: Repair one id: apply the given edits only if its record is as the repair read
#: it (so a concurrent save, update or delete is never undone).
#: ARGV: P, id, guard (sha1 of the record bytes, or 'absent'), witness (for
#: 'absent': a key suffix, 'all', 's:<stream>' or 'i', that must still hold id, so a
#: lost checkpoint deleted meanwhile is not brought back; '' for none), then edits
#: of four arguments each: op ('zadd' | 'zrem' | 'hset' | 'hdel'), key suffix after
#: P, member or field, score or value. Returns 1 if applied, 0 if the record changed.
APPLY = (
    _PRELUDE
    + r"""
local id, guard, witness = ARGV[2], ARGV[3], ARGV[4]
local blob = redis.pcall('GET', rkey(id))
if type(blob) == 'table' and blob.err then blob = '' end
if guard == 'absent' then
  if blob then return 0 end
  if witness == 'i' then
    if redis.call('HEXISTS', IDX, id) == 0 then return 0 end
  elseif witness ~= '' and not redis.call('ZSCORE', P .. witness, id) then
    return 0
  end
elseif not blob or redis.sha1hex(blob) ~= guard then
  return 0
end
for i = 5, #ARGV, 4 do
  local op, key, a, b = ARGV[i], P .. ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if op == 'zadd' then redis.call('ZADD', key, b, a)
  elseif op == 'zrem' then redis.call('ZREM', key, a)
  elseif op == 'hset' then redis.call('HSET', key, a, b)
  elseif op == 'hdel' then redis.call('HDEL', key, a)
  end
end
return 1
"""
)

#: Make P n name exactly the given streams that have entries. ARGV: P, names...
#: Returns how many names were added or removed.
FIX_NAMES = (
    _PRELUDE
    + r"""
local changed = 0
for i = 2, #ARGV do
  if redis.call('ZCARD', skey(ARGV[i])) > 0 then
    changed = changed + redis.call('SADD', NAMES, ARGV[i])
  else
    changed = changed + redis.call('SREM', NAMES, ARGV[i])
  end
end
return changed
"""
)

#: Delete the key P .. ARGV[2] if it holds another type than ARGV[3] (an index key
#: overwritten by something else; repair rebuilds it). Returns 1 if deleted.
DROP_WRONGTYPE = (
    _PRELUDE
    + r"""
local key = P .. ARGV[2]
local t = redis.call('TYPE', key)['ok']
if t == 'none' or t == ARGV[3] then return 0 end
redis.call('DEL', key)
return 1
"""
)
