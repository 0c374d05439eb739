"""Tracking: what the indexes of a Redis store must hold, kept beside them.

The scripts keep the size of ``P all`` (field ``count`` of ``P meta``) and each
stream's newest sequence and size (``P h``), and compare them with the indexes
before they read or write those (the Lua half is in ``_prelude``). This module
is the client half: what ``verify()`` reports, and what ``repair()`` resets once
the indexes are rebuilt from the records (what a refusal means is
``_link.untracked_reason``, since every read path can meet one).
"""

from __future__ import annotations

from statekeeper import Problem

from ._audit import Audit
from ._link import RedisLink, untracked_reason
from ._prelude import PRELUDE

__all__ = ["SCRIPTS", "problems", "rebuild"]

_BATCH = 200

#: What the tracking says and what the indexes hold (see ``_prelude``), read in one
#: script so that no concurrent write makes them look different. ARGV: P, streams...
#: Returns {} for a store without tracking or with a key of the wrong type (the walk
#: reports that), else {count said | '', entries of P all, then per stream: name,
#: P h entry | '', what its zset holds | ''}.
READ_TRACKING = (
    PRELUDE
    + r"""
if not tracked() then return {} end
local zsets = {}
for i = 2, #ARGV do zsets[#zsets + 1] = skey(ARGV[i]) end
if badtype(zsets) then return {} end
local out = {redis.call('HGET', META, 'count') or '', string.format('%d', redis.call('ZCARD', ALL))}
for i = 2, #ARGV do
  out[#out + 1] = ARGV[i]
  out[#out + 1] = redis.call('HGET', TRACK, ARGV[i]) or ''
  out[#out + 1] = summary(ARGV[i])
end
return out
"""
)


#: Set the tracking of the given streams and of P all from the indexes as they are
#: (run once they are rebuilt). ARGV: P, streams... Returns how many entries changed.
FIX_TRACKING = (
    PRELUDE
    + r"""
local changed = 0
for i = 2, #ARGV do
  if (redis.call('HGET', TRACK, ARGV[i]) or '') ~= summary(ARGV[i]) then changed = changed + 1 end
  TOUCHED[ARGV[i]] = true
end
if (redis.call('HGET', META, 'count') or '') ~= string.format('%d', redis.call('ZCARD', ALL)) then
  changed = changed + 1
end
retrack()
return changed
"""
)

#: The scripts of tracking (see ``_prelude``).
SCRIPTS = {"FIX_TRACKING": FIX_TRACKING, "READ_TRACKING": READ_TRACKING}


async def problems(link: RedisLink, audit: Audit, streams: list[str]) -> list[Problem]:
    """Where the tracking (``count`` in the meta hash, ``P h``) and the indexes disagree.

    Each batch of streams is read in one script, so a concurrent write cannot make
    them look different; the indexes are checked against the records by the walk.
    """
    found: list[Problem] = []
    for i in range(0, max(len(streams), 1), _BATCH):
        reply = await link.call("READ_TRACKING", *streams[i : i + _BATCH])
        if not reply:
            return found  # no tracking (format 1, read-only), or a key of the wrong type
        said, held = (part.decode() for part in reply[:2])
        if i == 0 and said != held:
            why = untracked_reason(link.prefix, "all", said, held)
            found.append(audit.index_problem(link.prefix + "all", why))
        for at in range(2, len(reply), 3):
            name, said, held = (part.decode("utf-8", "replace") for part in reply[at : at + 3])
            if said != held:
                key = f"{link.prefix}s:{name}"
                why = untracked_reason(link.prefix, f"s:{name}", said, held)
                found.append(audit.index_problem(key, why))
    return found


async def rebuild(link: RedisLink, streams: list[str]) -> int:
    """Reset the tracking of ``streams`` and of ``P all`` to the indexes as they are
    (once repair has rebuilt them); returns how many entries changed."""
    changed = 0
    for i in range(0, max(len(streams), 1), _BATCH):
        changed += int(await link.call("FIX_TRACKING", *streams[i : i + _BATCH]))
    return changed
