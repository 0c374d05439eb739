"""The five invariants every persistent backend keeps after a crash or a fault.

A workload writes through a :class:`LoggedStore`, which records every save, update
and delete in a write log *before* calling the store (``begin``) and again once
the call returned (``ack``) or raised (``err``). The log is the ground truth of
what the application was told. After the workload was killed (SIGKILL at a random
time, at the K-th system call, on simulated power loss, under I/O errors),
:func:`check_invariants` opens the store and checks:

- **D** (durable): every acknowledged save, update and delete is reflected in the
  store, and the record decodes.
- **A** (atomic): an unacknowledged operation is either absent or complete; a
  crash never leaves a torn or foreign record behind.
- **R** (reported): ``list`` reports exactly what it skipped: every item loads,
  every skipped entry fails to load with :class:`CheckpointDecodeError`, and
  nothing that exists is silently left out.
- **L** (latest): ``get_latest`` returns the newest live checkpoint or raises; it
  never falls back to an older one.
- **S** (sequence): sequences are unique and increasing, follow real time (a save
  acknowledged before another began has the smaller sequence), and are never
  reused, even after the newest checkpoint was deleted (checked with a probe save).

The log is JSON lines. Give :class:`LogWriter` a path (each entry is fsynced, so
it survives the kill) or a file descriptor (a pipe or a socket to the parent,
which the kernel keeps when the child dies). A line torn by the kill is ignored:
an ``ack`` that was not fully written is, correctly, an unacknowledged operation.

What the checker supports: ``save`` (with or without an explicit id), ``update``
(with or without ``if_match``) and ``delete``, with plain-JSON states and without
TTL. Each checkpoint id must be written by one writer at a time (operations on an
id are ordered by their ``begin`` time); the writers may be different processes
over time. Timestamps come from ``time.monotonic_ns()``, which is system-wide on
Linux, so logs from several processes on one host can be merged.
"""

from __future__ import annotations

import secrets
from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._core.interface import CheckpointStore
from ..errors import CheckpointDecodeError, CheckpointNotFound
from ..models import Checkpoint, Skipped
from ._pages import PageBound, checkpoints_in
from .recording import DEFINITE_ERRORS, LoggedOp, LoggedStore, LogWriter, WriteLog

__all__ = [
    "DEFINITE_ERRORS",
    "PROBE_STREAM",
    "InvariantViolation",
    "LogWriter",
    "LoggedOp",
    "LoggedStore",
    "Report",
    "Violation",
    "WriteLog",
    "check_invariants",
    "list_all",
]

#: Where :func:`check_invariants` saves (and deletes) its probe checkpoint.
PROBE_STREAM = "__statekeeper_probe__"


# -- the report ------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One broken invariant: ``code`` is D, A, R, L or S."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class InvariantViolation(AssertionError):
    """Raised by :func:`check_invariants` when any invariant is broken."""

    def __init__(self, report: Report) -> None:
        self.report = report
        lines = [str(v) for v in report.violations[:40]]
        more = len(report.violations) - len(lines)
        if more > 0:
            lines.append(f"... and {more} more")
        super().__init__(
            f"{len(report.violations)} invariant violation(s) after {report.ops} logged "
            f"operations ({report.acked} acknowledged):\n  " + "\n  ".join(lines)
        )


@dataclass
class Report:
    """What :func:`check_invariants` looked at and found."""

    ops: int = 0
    acked: int = 0
    in_doubt: int = 0
    records: int = 0
    skipped: int = 0
    streams: int = 0
    max_sequence: int = 0
    probe_sequence: int | None = None
    torn_log_lines: int = 0
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True if no invariant was broken."""
        return not self.violations

    def codes(self) -> set[str]:
        """The letters of the broken invariants."""
        return {v.code for v in self.violations}

    def add(self, code: str, message: str) -> None:
        """Record one violation of the invariant with letter ``code``."""
        self.violations.append(Violation(code, message))


# -- the checker -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Present:
    state: Any
    tags: Mapping[str, str]
    etag: str | None
    sequence: int | None

    def matches(self, cp: Checkpoint) -> bool:
        return (
            cp.state == self.state
            and dict(cp.tags) == dict(self.tags)
            and (self.etag is None or cp.etag == self.etag)
            and (self.sequence is None or cp.sequence == self.sequence)
        )


_Outcome = _Present | None  # None: the checkpoint does not exist


@dataclass
class _Expected:
    """What may be in the store for one id after its logged operations."""

    stream: str | None
    possible: list[_Outcome]
    last_acked: bool
    sequence: int | None
    describe: str


def _expectations(log: WriteLog) -> dict[str, _Expected]:
    by_id: dict[str, list[LoggedOp]] = {}
    for op in log.ops:
        if op.id is not None:
            by_id.setdefault(op.id, []).append(op)
    out: dict[str, _Expected] = {}
    for cid, ops in by_id.items():
        possible: list[_Outcome] = [None]
        stream: str | None = None
        tags: Mapping[str, str] = {}
        seq: int | None = None
        last_acked = False
        for op in ops:
            result: _Outcome
            if op.op == "save":
                stream, tags = op.stream, op.tags
                seq = op.sequence if op.acked else None
                result = _Present(op.state, tags, op.etag, seq)
            elif op.op == "update":
                result = _Present(op.state, tags, op.etag, seq)
            elif op.op == "delete":
                result = None
            else:
                continue
            if op.acked:
                possible, last_acked = [result], True
            elif op.in_doubt:
                possible = [*possible, result]
                last_acked = False
        last = ops[-1]
        out[cid] = _Expected(
            stream, possible, last_acked, seq, f"{last.op} #{last.n} of {last.session}"
        )
    return out


async def list_all(
    store: CheckpointStore, stream: str | None, *, order: str = "asc", limit: int = 200
) -> tuple[list[Checkpoint], list[Skipped]]:
    """Every entry of ``stream`` (all streams for ``None``), paging with cursors.

    Raises ``AssertionError`` when the walk reads more pages than the store has
    checkpoints (its cursors do not move on) instead of paging for ever."""
    items: list[Checkpoint] = []
    skipped: list[Skipped] = []
    cursor: str | None = None
    bound = PageBound(await checkpoints_in(store))
    while True:
        if cursor is not None:
            bound.turn(cursor)
        page = await store.list(stream, limit=limit, order=order, after=cursor)  # type: ignore[arg-type]
        items.extend(page.items)
        skipped.extend(page.skipped)
        if page.next_cursor is None:
            return items, skipped
        cursor = page.next_cursor


async def _load(store: CheckpointStore, cid: str) -> Checkpoint | BaseException:
    try:
        return await store.load(cid)
    except Exception as exc:  # the caller classifies; anything untyped is a violation
        return exc


async def check_invariants(
    store: CheckpointStore,
    log: WriteLog,
    *,
    streams: Collection[str] | None = None,
    expect_corrupt: Collection[str] = (),
    probe_stream: str | None = PROBE_STREAM,
    floor: int = 0,
    raise_on_violation: bool = True,
) -> Report:
    """Check D, A, R, L and S on an open ``store`` against ``log``.

    ``streams`` are the streams to check (default: every stream in the log);
    other streams are only part of the global sequence check. ``expect_corrupt``
    names ids that the test corrupted on purpose: they must be reported (R, L)
    rather than match the log. With ``probe_stream`` set, one probe checkpoint is
    saved there and deleted again to prove the next sequence is fresh (S) and
    that the store still accepts writes. ``floor`` is a sequence known to have
    been assigned before (say the previous round's ``report.probe_sequence``,
    whose checkpoint is gone): the probe must exceed it too.

    Raises :class:`InvariantViolation` (an ``AssertionError``) listing every broken
    invariant, unless ``raise_on_violation`` is false; the :class:`Report` is
    returned either way.
    """
    report = Report(ops=len(log.ops), torn_log_lines=log.torn_lines)
    report.acked = sum(op.acked for op in log.ops)
    report.in_doubt = sum(op.in_doubt for op in log.ops)
    expected = _expectations(log)
    scope = sorted(set(streams) if streams is not None else set(log.streams))
    report.streams = len(scope)
    corrupt = set(expect_corrupt)

    listed: dict[str, Checkpoint] = {}
    skipped: dict[str, Skipped] = {}
    anonymous_skips: list[Skipped] = []
    tops: dict[str, Checkpoint | Skipped | None] = {}
    for name in scope:
        items, skips = await list_all(store, name)
        entries: list[Checkpoint | Skipped] = [*items, *skips]
        entries.sort(key=lambda e: e.sequence or 0)
        tops[name] = entries[-1] if entries else None
        for item in items:
            if item.stream != name:
                report.add("R", f"list({name!r}) returned {item.id!r} of stream {item.stream!r}")
            listed[item.id] = item
        for skip in skips:
            if not skip.location or not skip.reason or not skip.error:
                report.add("R", f"list({name!r}) skipped {skip!r} without location/reason/error")
            if skip.id is None:
                anonymous_skips.append(skip)
            else:
                skipped[skip.id] = skip
    report.records = len(listed)
    report.skipped = len(skipped) + len(anonymous_skips)
    for skip in anonymous_skips:
        report.add("A", f"list skipped an unidentifiable record at {skip.location}: {skip.reason}")

    await _check_records(store, expected, listed, skipped, corrupt, scope, log, report)
    await _check_latest(store, tops, report)
    seen = await _check_sequences(store, log, listed, skipped, report)
    report.max_sequence = max([*seen, floor])
    if probe_stream is not None:
        await _probe(store, probe_stream, report)
    if raise_on_violation and report.violations:
        raise InvariantViolation(report)
    return report


async def _check_records(
    store: CheckpointStore,
    expected: dict[str, _Expected],
    listed: dict[str, Checkpoint],
    skipped: dict[str, Skipped],
    corrupt: set[str],
    scope: Collection[str],
    log: WriteLog,
    report: Report,
) -> None:
    in_scope = set(scope)
    ids = set(expected) | set(listed) | set(skipped)
    unclaimed = [
        op for op in log.ops if op.op == "save" and op.in_doubt and op.id is None
    ]  # saves whose id the store would have chosen
    for cid in sorted(ids):
        exp = expected.get(cid)
        if exp is not None and exp.stream is not None and exp.stream not in in_scope:
            continue
        got = await _load(store, cid)
        # R: what list said must agree with what load says
        if isinstance(got, Checkpoint):
            item = listed.get(cid)
            if cid in skipped:
                report.add("R", f"list skipped {cid!r} ({skipped[cid].reason}) but load reads it")
            elif item is None:
                report.add("R", f"{cid!r} loads but list left it out without reporting it")
            elif (item.sequence, item.etag, item.state) != (got.sequence, got.etag, got.state):
                report.add("R", f"list and load disagree about {cid!r}")
        elif isinstance(got, CheckpointDecodeError):
            if cid in listed:
                report.add("R", f"list returned {cid!r} as an item but load fails: {got}")
            elif cid not in skipped:
                report.add("R", f"{cid!r} does not decode and list did not report it: {got}")
        elif isinstance(got, CheckpointNotFound):
            if cid in listed or cid in skipped:
                report.add("R", f"list reported {cid!r}, which load says does not exist")
        else:
            report.add("R", f"load({cid!r}) raised an untyped {type(got).__name__}: {got}")
            continue
        if cid in corrupt:
            if not isinstance(got, CheckpointDecodeError):
                report.add("R", f"{cid!r} was corrupted on purpose but load gave {got!r:.80}")
            continue
        # D and A: what the store holds must be an outcome the log allows
        if exp is None:
            if isinstance(got, Checkpoint):
                match = next(
                    (op for op in unclaimed if op.stream == got.stream and op.state == got.state),
                    None,
                )
                if match is not None:
                    unclaimed.remove(match)
                else:
                    report.add("A", f"{cid!r} (seq {got.sequence}) was never written by the log")
            elif isinstance(got, CheckpointDecodeError):
                report.add("A", f"an unlogged, undecodable record {cid!r}: {got}")
            continue
        code = "D" if exp.last_acked else "A"
        if isinstance(got, Checkpoint):
            if not any(o is not None and o.matches(got) for o in exp.possible):
                if exp.possible == [None]:
                    what = "exists although it was deleted (or never saved)"
                else:
                    what = "holds a state no logged write produced (or an old one)"
                report.add(
                    code,
                    f"{cid!r} {what}; last op {exp.describe}; got seq "
                    f"{got.sequence} etag {got.etag} state {got.state!r:.80}",
                )
        elif isinstance(got, CheckpointNotFound):
            if None not in exp.possible:
                report.add("D", f"acknowledged {cid!r} is missing; last op {exp.describe}")
        elif isinstance(got, CheckpointDecodeError):
            report.add(code, f"{cid!r} does not decode after the crash ({exp.describe}): {got}")


async def _check_latest(
    store: CheckpointStore, tops: Mapping[str, Checkpoint | Skipped | None], report: Report
) -> None:
    for name, top in tops.items():
        try:
            latest: Checkpoint | BaseException | None = await store.get_latest(name)
        except Exception as exc:
            latest = exc
        if top is None:
            if latest is not None:
                report.add("L", f"get_latest({name!r}) gave {latest!r:.80} for an empty stream")
        elif isinstance(top, Skipped):
            if isinstance(latest, Checkpoint):
                report.add(
                    "L",
                    f"get_latest({name!r}) fell back to seq {latest.sequence} although the "
                    f"newest, seq {top.sequence}, is unreadable ({top.reason})",
                )
            elif not isinstance(latest, CheckpointDecodeError):
                report.add(
                    "L", f"get_latest({name!r}) gave {latest!r:.80} for an unreadable newest"
                )
        elif not isinstance(latest, Checkpoint):
            report.add("L", f"get_latest({name!r}) gave {latest!r:.80}, not seq {top.sequence}")
        elif (latest.id, latest.sequence, latest.etag) != (top.id, top.sequence, top.etag):
            report.add(
                "L",
                f"get_latest({name!r}) returned seq {latest.sequence} ({latest.id}) but the "
                f"newest listed is seq {top.sequence} ({top.id})",
            )


async def _check_sequences(
    store: CheckpointStore,
    log: WriteLog,
    listed: Mapping[str, Checkpoint],
    skipped: Mapping[str, Skipped],
    report: Report,
) -> list[int]:
    items, skips = await list_all(store, None)
    global_seqs = [e.sequence for e in items] + [s.sequence for s in skips if s.sequence]
    prev = 0
    for item in items:
        if item.sequence <= prev:
            report.add("S", f"list(None) is not strictly increasing: {item.sequence} after {prev}")
        prev = item.sequence
    counts: dict[int, int] = {}
    for seq in global_seqs:
        counts[seq] = counts.get(seq, 0) + 1
    for seq, count in counts.items():
        if count > 1:
            report.add("S", f"sequence {seq} appears {count} times in the store")
    in_global = {e.id for e in items} | {s.id for s in skips}
    for cid in [*listed, *skipped]:
        if cid not in in_global:
            report.add("R", f"{cid!r} is listed in its stream but not in list(None)")

    saves = [op for op in log.ops if op.op == "save" and op.acked and op.sequence is not None]
    owner: dict[int, str | None] = {}
    for op in saves:
        assert op.sequence is not None
        other = owner.setdefault(op.sequence, op.id)
        if other != op.id:
            report.add("S", f"sequence {op.sequence} was acknowledged for {other!r} and {op.id!r}")
    # real-time order: a save acknowledged before another began has the smaller sequence
    done = sorted((op.t_end or 0, op.sequence or 0, op.id) for op in saves)
    ends = [t for t, _, _ in done]
    prefix_max: list[tuple[int, str | None]] = []
    best: tuple[int, str | None] = (0, None)
    for _, seq, done_id in done:
        if seq > best[0]:
            best = (seq, done_id)
        prefix_max.append(best)
    for op in saves:
        i = bisect_left(ends, op.t_begin)
        if i and prefix_max[i - 1][0] >= (op.sequence or 0):
            earlier, eid = prefix_max[i - 1]
            report.add(
                "S",
                f"{op.id!r} got seq {op.sequence} although {eid!r} had seq {earlier} "
                "acknowledged before it began",
            )
    return global_seqs + [op.sequence for op in saves if op.sequence is not None]


async def _probe(store: CheckpointStore, stream: str, report: Report) -> None:
    try:
        cp = await store.save(stream, {"probe": secrets.token_hex(4)})
    except Exception as exc:
        report.add("S", f"the store refuses a new save after the fault: {exc!r}")
        return
    report.probe_sequence = cp.sequence
    if cp.sequence <= report.max_sequence:
        report.add(
            "S",
            f"a new save got sequence {cp.sequence}, but {report.max_sequence} was already "
            "assigned (a sequence was reused: high-water mark lost or max+1)",
        )
    try:
        await store.delete(cp.id)
    except Exception as exc:
        report.add("S", f"the store refuses to delete the probe checkpoint: {exc!r}")
