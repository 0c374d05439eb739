"""``verify()`` and ``repair()`` of the Redis backend.

The walk of every key is in ``_audit``; this module runs it against an open store
and applies what it finds (a lost meta hash is rebuilt on open, by ``_meta``).
Each id's edits run in one script guarded by the record bytes the walk read
(``APPLY``), so a save, update or delete that runs during a repair is never
undone; an id that changed is left for the next repair.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from statekeeper import BaseCheckpointStore, Problem, RepairReport, VerifyReport, repair_records

from . import _tracking
from ._audit import Audit, Fix, walk
from ._batch import Inserter, delete_one
from ._link import RedisLink
from ._prelude import PRELUDE

__all__ = ["SCRIPTS", "problems", "repair", "verify_by_walk"]

_APPLY_BATCH = 200
#: What each key family is called in ``RepairReport.rebuilt``.
_FAMILY = {"all": "all", "i": "id_hash", "e": "etags", "x": "expiries"}


#: Raise a missing, malformed or too low high-water mark to at least ARGV[2] (and
#: the top of P all). ARGV: P, candidate. Returns {old or '', new} ({old, old} if kept).
SET_HWM = (
    PRELUDE
    + r"""
local old = redis.call('HGET', META, 'hwm')
local want = math.max(tonumber(ARGV[2]), topscore(ALL))
if old and string.match(old, '^%d+$') and tonumber(old) >= want then return {old, old} end
local new = string.format('%d', want)
redis.call('HSET', META, 'hwm', new)
return {old or '', new}
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
    PRELUDE
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
    PRELUDE
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
    PRELUDE
    + r"""
local key = P .. ARGV[2]
local t = redis.call('TYPE', key)['ok']
if t == 'none' or t == ARGV[3] then return 0 end
redis.call('DEL', key)
return 1
"""
)

#: The scripts of repair (see ``_lua`` for the key layout).
SCRIPTS = {
    "APPLY": APPLY,
    "DROP_WRONGTYPE": DROP_WRONGTYPE,
    "FIX_NAMES": FIX_NAMES,
    "SET_HWM": SET_HWM,
}


def _family(suffix: str) -> str:
    if suffix.startswith("s:"):
        return "stream_indexes"
    if suffix.startswith("t:"):
        return "tag_indexes"
    return _FAMILY.get(suffix, suffix)


async def _walk(link: RedisLink, store_id: str | None) -> Audit:
    return await link.guard(walk(link.client, link.prefix, store_id, link.where))


def _streams(audit: Audit, fixes: list[Fix]) -> list[str]:
    """Every stream any key of the store mentions."""
    streams = audit.names | audit.stream_keys | audit.tracked
    streams |= {
        suffix[2:] for fix in fixes for _op, suffix, _a, _b in fix.edits if suffix[:2] == "s:"
    }
    return sorted(streams)


async def problems(link: RedisLink, store_id: str, clock: Callable[[], datetime]) -> list[Problem]:
    """Every problem the walk of the keys finds (reads only).

    The walk reads the index keys before the records, so a save or delete that
    commits in between looks like a missing record or a missing index entry. Only
    problems that a second walk finds again are reported: a writer would have to
    race both walks the same way. The tracking is read atomically (``_tracking.problems``).
    """
    audit = await _walk(link, store_id)
    found, _fixes = audit.assess(clock())
    found += await _tracking.problems(link, audit, _streams(audit, []))
    if not found:
        return found
    again_audit = await _walk(link, store_id)
    again, _fixes = again_audit.assess(clock())
    again += await _tracking.problems(link, again_audit, _streams(again_audit, []))
    confirmed = {(p.kind, p.id or p.location) for p in again}
    return [p for p in found if (p.kind, p.id or p.location) in confirmed]


async def verify_by_walk(
    link: RedisLink, store_id: str, clock: Callable[[], datetime], refusal: str
) -> VerifyReport:
    """The report when the read paths refuse to answer: the walk's findings alone.

    Incomplete, since states were not decoded through the store's codec; it has
    problems anyway.
    """
    audit = await _walk(link, store_id)
    found, _fixes = audit.assess(clock())
    found += await _tracking.problems(link, audit, _streams(audit, []))
    first = Problem(kind="index", location=link.where, reason=refusal)
    return VerifyReport(
        records=audit.records(),
        streams=len(audit.names | audit.stream_keys),
        high_water_mark=audit.hwm(),
        complete=False,
        problems=[first, *found],
    )


async def repair(
    link: RedisLink,
    store: BaseCheckpointStore[Any],
    inserter: Inserter,
    drop_damaged: bool,
    *,
    meta_rebuilt: str | None,
) -> RepairReport:
    """Rebuild every derived key of ``store`` (whose link is ``link`` and whose saves
    are ``inserter``'s) from its records; ``meta_rebuilt`` is what its open did to a
    lost meta hash, if anything.

    ``store`` is used through statekeeper's public API only: its id, its clock, and
    :func:`statekeeper.repair_records`, which walks its records."""
    audit = await _walk(link, store.store_id)
    found, fixes = audit.assess(store.now())
    rebuilt: dict[str, int] = {}
    actions: list[str] = []
    if meta_rebuilt is not None:
        actions.append(meta_rebuilt)
        rebuilt["meta"] = 1
    replaced = 0
    for suffix, _has, wants in audit.wrongtype:
        if suffix != "meta":
            replaced += int(await link.call("DROP_WRONGTYPE", suffix, wants))
    if replaced:
        rebuilt["wrong_type_keys"] = replaced
        actions.append(f"replaced {replaced} key(s) of the wrong Redis type with rebuilt ones")
    applied, changed = await _apply(link, fixes, rebuilt)
    if applied:
        actions.append(f"rebuilt the index entries of {applied} checkpoint(s) from their records")
    if changed:
        actions.append(
            f"left {changed} checkpoint(s) alone that changed during the repair "
            "(a concurrent write); run repair() again to check them"
        )
    streams = _streams(audit, fixes)
    if streams:
        names = int(await link.call("FIX_NAMES", *streams))
        if names:
            rebuilt["names"] = names
            actions.append(f"corrected {names} entry(ies) of the stream-name set")
    if not changed:
        # only once every index is rebuilt: tracking a half-repaired index would hide it
        tracking = await _tracking.rebuild(link, streams)
        if tracking:
            rebuilt["tracking"] = tracking
            actions.append(
                f"reset {tracking} tracking entry(ies) (the size of {link.prefix}all in "
                f"{link.meta_key}, streams in {link.prefix}h) to the rebuilt indexes"
            )
    old, new = await link.call("SET_HWM", audit.top)
    if old != new:
        rebuilt["high_water_mark"] = 1
        said = old.decode("utf-8", "replace") if old else "missing"
        actions.append(
            f"set the high-water mark to {int(new)}, the highest sequence in the store "
            f"(it was {said!r})"
        )
        inserter.hwm = int(new)
    report = await repair_records(store, drop_damaged, rebuilt=rebuilt, actions=actions)
    return await _unplaced(link, store.now, audit, report, found, drop_damaged)


async def _apply(link: RedisLink, fixes: list[Fix], rebuilt: dict[str, int]) -> tuple[int, int]:
    """Run the guarded edits; count them by key family. Returns (applied, changed)."""
    applied = changed = 0
    script = link.script("APPLY")
    for i in range(0, len(fixes), _APPLY_BATCH):
        batch = fixes[i : i + _APPLY_BATCH]
        pipe = link.client.pipeline(transaction=False)
        for fix in batch:
            args: list[Any] = [link.prefix, fix.id, fix.guard, fix.witness]
            for edit in fix.edits:
                args.extend(edit)
            await script(keys=[link.meta_key], args=args, client=pipe)
        results = await link.guard(pipe.execute())
        for fix, ok in zip(batch, results, strict=True):
            if not ok:
                changed += 1
                continue
            applied += 1
            for _op, suffix, _a, _b in fix.edits:
                family = _family(suffix)
                rebuilt[family] = rebuilt.get(family, 0) + 1
    return applied, changed


async def _unplaced(
    link: RedisLink,
    clock: Callable[[], datetime],
    audit: Audit,
    report: RepairReport,
    found: list[Problem],
    drop: bool,
) -> RepairReport:
    """Damaged checkpoints that no index places (so no listing shows them): keep and
    report them, or drop them by id."""
    listed = {p.id for p in report.damaged} | {p.id for p in report.dropped}
    unplaced = [
        p for p in found if p.kind == "damaged-record" and p.sequence is None and p.id not in listed
    ]
    if not unplaced:
        return report
    if not drop:
        return report.model_copy(
            update={
                "damaged": [*report.damaged, *unplaced],
                "actions": [
                    *report.actions,
                    f"kept {len(unplaced)} damaged record(s) that no index places "
                    "(their sequence is unknown); repair(drop_damaged=True) removes them",
                ],
            }
        )
    fragments: list[Fix] = []
    for problem in unplaced:
        if problem.id is not None:
            await delete_one(link, problem.id, clock(), None)
            # its tag entries, which no id-hash entry pointed at
            edits = Audit.drop_fragments(problem.id, audit.known(problem.id))
            fragments.append(Fix(problem.id, "absent", "", edits))
    await _apply(link, fragments, {})
    return report.model_copy(
        update={
            "dropped": [*report.dropped, *unplaced],
            "actions": [
                *report.actions,
                f"dropped {len(unplaced)} damaged record(s) that no index placed",
            ],
        }
    )
