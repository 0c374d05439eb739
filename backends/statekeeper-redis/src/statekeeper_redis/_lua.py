"""The server-side half of the Redis backend: one Lua script per atomic operation.

Redis runs a script to completion before it serves any other command, so each
script below is one atomic step: no reader sees half a save (or half a
``save_many``), and sequence order is commit order. The scripts of opening a
store, of repair and of the tracking build on the same :data:`PRELUDE` and live
beside their callers, in ``_meta``, ``_repair`` and ``_tracking``.

Key layout (``P`` is ``{<key_prefix>}:``; the braces are a Redis Cluster hash tag,
so every key of one store lives in one slot, and no store's keys can be inside
another's, because a prefix may not contain braces)::

    P meta          hash    kind, format, store_id, cursor_key, hwm (sequence high-water
                            mark), count (the number of entries P all must hold)
    P all           zset    id -> sequence, every checkpoint of the store
    P s:<stream>    zset    id -> sequence, one per stream
    P t:<k>\\0<v>    zset    id -> sequence, one per tag key/value pair (NUL cannot occur in either)
    P x             zset    id -> expires_at in microseconds since the epoch, TTL'd checkpoints only
    P i             hash    id -> JSON {"s": stream, "t": {tags}}: what to unlink on delete
    P e             hash    id -> current etag (the compare-and-set token)
    P n             set     names of streams that have index entries
    P h             hash    stream -> "<newest sequence> <entries>" of P s:<stream>: what
                            the stream's zset must hold (see ``_prelude``)
    P r:<id>        string  the envelope bytes (``StoredRecord.to_bytes``), PEXPIRE'd with a TTL
    P turn          string  token of a writer that kept losing the sequence race; other
                            saves wait while it exists (PEXPIRE'd; see INSERT)

Every script takes ``P`` as ``ARGV[1]`` and ``P meta`` as ``KEYS[1]`` (so a cluster
client routes it to the slot); the other keys are derived from ``P`` inside the
script. All of them share that hash tag and so that slot.

The helpers every script starts with (:data:`PRELUDE`: liveness, lost
checkpoints, the checks before the first write, and the tracking that makes an
index that lost entries refuse instead of answer) are in ``_prelude``.
"""

from __future__ import annotations

from ._prelude import EXPIRY_GRACE_SECONDS, PRELUDE

__all__ = ["EXPIRY_GRACE_SECONDS", "PRELUDE", "SCRIPTS", "TURN_MILLISECONDS"]

#: How long a writer that keeps losing the sequence race may hold the turn (see
#: :data:`INSERT`) before it lapses, if the writer does not release it (it crashed, or
#: was cancelled mid-call): other writers wait at most this long for it.
TURN_MILLISECONDS = 1000


#: Insert records sealed at consecutive sequences from ARGV[3], which must be hwm + 1:
#: all of them or, if any check fails, none (every check runs before the first write).
#: ARGV: P, now_us, first seq, turn token | '', then seven per record: id, blob,
#: stream, index JSON, exp_us | '', pexpire_ms, etag. Returns {'ok'}, {'exists', id},
#: {'lost', id} (the id is a lost checkpoint), {'seq', hwm} (lost the race: reseal
#: from hwm + 1), {'busy'} (another writer holds the turn: try again shortly),
#: {'nometa'}, {'badhwm', hwm | '', top} (the high-water mark is missing, malformed
#: or below a sequence in use), {'noidx', id} (an expired checkpoint with this id
#: cannot be unlinked), {'wrongtype', key} or {'untracked', key, tracked, found} (an
#: index it would write does not hold what its tracking says; see ``_prelude``).
#:
#: The turn (``P turn``) keeps a writer from starving: sealing happens on the client,
#: so a large batch can lose the race to a stream of small saves from other clients
#: every time. A caller that has lost a few races passes a token; when it loses again
#: and nobody holds the turn, the script gives the turn to that token for
#: ``TURN_MILLISECONDS``, and until it is released every other INSERT answers
#: {'busy'} without writing, so the holder's next try (resealed at the hwm it was
#: told) wins. Any reply other than 'seq' to the holder releases the turn, and the
#: expiry releases it if the holder goes away.
INSERT = (
    PRELUDE
    + r"""
local TURN, token = P .. 'turn', ARGV[4]
local turn_type = redis.call('TYPE', TURN)['ok']
if turn_type ~= 'none' and turn_type ~= 'string' then return {'wrongtype', TURN} end
local holder = redis.call('GET', TURN)
if holder and holder ~= token then return {'busy'} end

local function insert()
  local now, first, n = tonumber(ARGV[2]), tonumber(ARGV[3]), (#ARGV - 4) / 7
  local ids, streams, infos, keys, seen = {}, {}, {}, {}, {}
  for i = 1, n do
    local at = i * 7 - 2
    local id = ARGV[at]
    local st = status(id, now, false)
    if st == 'live' then return {'exists', id} end
    if st == 'lost' then return {'lost', id} end
    ids[i], streams[i], infos[i] = id, ARGV[at + 2], cjson.decode(ARGV[at + 3])
    local mine = {skey(streams[i])}
    for k, v in pairs(infos[i].t) do mine[#mine + 1] = tkey(k, v) end
    for _, k in ipairs(mine) do
      if not seen[k] then seen[k] = true; keys[#keys + 1] = k end
    end
  end
  if redis.call('EXISTS', META) == 0 then return {'nometa'} end
  local bad = badtype(keys)
  if bad then return {'wrongtype', bad} end
  local hwm = redis.call('HGET', META, 'hwm')
  local top = topscore(ALL)
  for i = 1, n do top = math.max(top, topscore(skey(streams[i]))) end
  if not hwm or not string.match(hwm, '^%d+$') or tonumber(hwm) < top then
    return {'badhwm', hwm or '', string.format('%d', top)}
  end
  if tonumber(hwm) + 1 ~= first then return {'seq', hwm} end
  local refusal = cannot_unlink(ids, streams)
  if refusal then return refusal end
  -- expired (or vanished) checkpoints with these ids are replaced: drop their old entries
  for _, id in ipairs(ids) do unlink(id) end
  for i = 1, n do
    local id, seq, at = ids[i], string.format('%d', first + i - 1), i * 7 - 2
    write_record(id, ARGV[at + 1], ARGV[at + 4], ARGV[at + 5])
    redis.call('ZADD', ALL, seq, id)
    redis.call('ZADD', skey(streams[i]), seq, id)
    TOUCHED[streams[i]] = true
    redis.call('SADD', NAMES, streams[i])
    for k, v in pairs(infos[i].t) do redis.call('ZADD', tkey(k, v), seq, id) end
    redis.call('HSET', IDX, id, ARGV[at + 3])
    redis.call('HSET', ETAG, id, ARGV[at + 6])
  end
  redis.call('HSET', META, 'hwm', string.format('%d', first + n - 1))
  retrack()
  return {'ok'}
end

local reply = insert()
if token ~= '' then
  if reply[1] == 'seq' then
    if not holder then redis.call('SET', TURN, token, 'PX', """
    + str(TURN_MILLISECONDS)
    + r""") end
  elseif holder then
    redis.call('DEL', TURN)
  end
end
return reply
"""
)

#: The record of id: {'live', blob, sequence | false, etag | false}, {'lost',
#: sequence | false}, or nil. ARGV: P, id, now_us.
GET = (
    PRELUDE
    + r"""
local id = ARGV[2]
local st = status(id, tonumber(ARGV[3]), false)
if st == 'gone' then return false end
local score = redis.call('ZSCORE', ALL, id)
if st == 'lost' then return {'lost', score} end
return {'live', rget(id), score, redis.call('HGET', ETAG, id)}
"""
)

#: The records of ids, three values per id: status ('live', 'lost' or 'gone'),
#: sequence (from P all; false if absent) and blob (false unless live).
#: ARGV: P, now_us, ids...
GET_MANY = (
    PRELUDE
    + r"""
local now, out = tonumber(ARGV[2]), {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local st = status(id, now, false)
  out[#out + 1] = st
  if st == 'gone' then
    out[#out + 1] = false
    out[#out + 1] = false
  else
    out[#out + 1] = redis.call('ZSCORE', ALL, id) or false
    if st == 'live' then out[#out + 1] = rget(id) else out[#out + 1] = false end
  end
end
return out
"""
)

#: Compare-and-set the record of id.
#: ARGV: P, id, now_us, etag the caller read, if_match | '', blob, new etag, exp_us | '',
#: pexpire_ms, new index JSON | '' (tags unchanged), sequence. Returns {'ok'},
#: {'notfound'}, {'etag', current} (if_match failed), {'conflict', current} (someone
#: wrote since the caller read: re-read and retry), {'noetag'} (its P e entry is
#: gone), {'noidx'} (new tags, but its P i entry is gone) or {'wrongtype', key}.
UPDATE = (
    PRELUDE
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
#: Returns {'ok'}, {'missing'}, {'etag', current}, {'noidx', id}, {'wrongtype', key} or
#: {'untracked', ...}.
DELETE = (
    PRELUDE
    + r"""
local id = ARGV[2]
if status(id, tonumber(ARGV[3]), false) == 'gone' then return {'missing'} end
if ARGV[4] ~= '' then
  local cur = redis.call('HGET', ETAG, id)
  if cur ~= ARGV[4] then return {'etag', cur} end
end
local refusal = cannot_unlink({id})
if refusal then return refusal end
unlink(id)
retrack()
return {'ok'}
"""
)

#: Delete every live or lost checkpoint among ids, or none if one of them cannot be
#: unlinked. ARGV: P, now_us, ids... Returns {'ok', count}, {'noidx', id},
#: {'wrongtype', key} or {'untracked', ...}.
DELETE_MANY = (
    PRELUDE
    + r"""
local now, doomed = tonumber(ARGV[2]), {}
for i = 3, #ARGV do
  if status(ARGV[i], now, false) ~= 'gone' then doomed[#doomed + 1] = ARGV[i] end
end
local refusal = cannot_unlink(doomed)
if refusal then return refusal end
for _, id in ipairs(doomed) do unlink(id) end
retrack()
return {'ok', #doomed}
"""
)

#: Remove every entry of a stream; return how many were live or lost, or, with
#: nothing removed, a refusal as :func:`cannot_unlink` returns it ({'noidx', id},
#: {'wrongtype', key} or {'untracked', ...}). ARGV: P, stream, now_us.
DELETE_STREAM = (
    PRELUDE
    + r"""
local now = tonumber(ARGV[3])
local ids = redis.call('ZRANGE', skey(ARGV[2]), 0, -1)
local refusal = cannot_unlink(ids, {ARGV[2]})
if refusal then return refusal end
local removed = 0
for _, id in ipairs(ids) do
  if status(id, now, true) ~= 'gone' then removed = removed + 1 end
  unlink(id)
end
retrack()
return removed
"""
)

#: Remove all but the newest keep_last live entries of a stream; expired ones are
#: left for purge_expired, lost ones for repair(drop_damaged=True).
#: ARGV: P, stream, keep_last, now_us. Returns how many were removed, or a refusal
#: (as DELETE_STREAM) with nothing removed.
PRUNE = (
    PRELUDE
    + r"""
local keep, now = tonumber(ARGV[3]), tonumber(ARGV[4])
local kept, doomed = 0, {}
for _, id in ipairs(redis.call('ZREVRANGE', skey(ARGV[2]), 0, -1)) do
  if live(id, now) then
    if kept < keep then kept = kept + 1 else doomed[#doomed + 1] = id end
  end
end
local refusal = cannot_unlink(doomed, {ARGV[2]})
if refusal then return refusal end
for _, id in ipairs(doomed) do unlink(id) end
retrack()
return #doomed
"""
)

#: Unlink up to ARGV[3] checkpoints expired at ARGV[2] (µs). Returns how many, or a
#: refusal (as DELETE_STREAM) with nothing removed.
PURGE = (
    PRELUDE
    + r"""
local ids = redis.call('ZRANGEBYSCORE', EXP, '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
local refusal = cannot_unlink(ids)
if refusal then return refusal end
for _, id in ipairs(ids) do unlink(id) end
retrack()
return #ids
"""
)

#: Which of the given stream names have a live or lost checkpoint.
#: ARGV: P, now_us, names... (none: only the checks). Returns {'ok', names...};
#: {'noindex', name} for a stream that P n names but whose index is missing;
#: {'nonames'} if P n is empty or smaller than P h although checkpoints are
#: indexed; or {'untracked', ...} (damage, never "no stream").
LIVE_STREAMS = (
    PRELUDE
    + r"""
local now = tonumber(ARGV[2])
local out = {'ok'}
local names = {}
for i = 3, #ARGV do names[#names + 1] = ARGV[i] end
local refusal = untracked(names, true)
if refusal then return refusal end
local named = redis.call('SCARD', NAMES)
if (named == 0 and redis.call('ZCARD', ALL) > 0)
    or (tracked() and named ~= redis.call('HLEN', TRACK)) then
  return {'nonames'}
end
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
#: some stream): damaged metadata, never "empty". A reply {'untracked', ...} means
#: that index does not hold what its tracking says (see the module docstring).
SCAN = (
    PRELUDE
    + r"""
local asc = ARGV[2] == 'asc'
local bound = ARGV[3]
local limit, now, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local cands = {}
local refusal
if ARGV[7] ~= '' then
  cands[1] = skey(ARGV[7])
  refusal = untracked({ARGV[7]}, true)
else
  cands[1] = ALL
  refusal = untracked({}, true)
end
if refusal then return refusal end
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

#: Counts for info(): {live checkpoints, streams with one, hwm, expiring (with a
#: TTL), expired at now (not yet purged)}. ARGV: P, now_us.
INFO = (
    PRELUDE
    + r"""
local expired = redis.call('ZRANGEBYSCORE', EXP, '-inf', ARGV[2])
local per = {}
for _, id in ipairs(expired) do
  local info = idxinfo(id)
  if info then per[info.s] = (per[info.s] or 0) + 1 end
end
local dead = 0
for s, n in pairs(per) do
  if redis.call('ZCARD', skey(s)) <= n then dead = dead + 1 end
end
return {redis.call('ZCARD', ALL) - #expired, redis.call('SCARD', NAMES) - dead,
        redis.call('HGET', META, 'hwm') or '', redis.call('ZCARD', EXP), #expired}
"""
)

#: The scripts of the store's operations, by the name ``RedisCheckpointStore._call``
#: takes (``_meta`` and ``_repair`` hold those of opening and repairing).
SCRIPTS = {
    "DELETE": DELETE,
    "DELETE_MANY": DELETE_MANY,
    "DELETE_STREAM": DELETE_STREAM,
    "GET": GET,
    "GET_MANY": GET_MANY,
    "INFO": INFO,
    "INSERT": INSERT,
    "LIVE_STREAMS": LIVE_STREAMS,
    "PRUNE": PRUNE,
    "PURGE": PURGE,
    "SCAN": SCAN,
    "UPDATE": UPDATE,
}
