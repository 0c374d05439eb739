"""Concurrent histories: record timed operations from several processes, then check them.

Each actor process wraps its store in a :class:`RecordingStore`, which writes one
JSON line per operation: who (``proc``), what (``op`` and its arguments), when it
was invoked and when it returned (``time.monotonic_ns()``, system-wide on Linux,
so processes on one host share the clock), and what it returned or raised.
:func:`analyze_history` then checks the merged history:

- **stale read**: a ``get_latest`` (or the first page of a newest-first walk) that
  started after a save was acknowledged never returns an older checkpoint, and
  after an update was acknowledged never returns an older etag of it;
- **phantom read**: everything read was written by some save or update;
- **lost update**: compare-and-set updates (``update(..., if_match=etag)``) form
  one chain per checkpoint: no two acknowledged updates started from the same
  etag, every ``if_match`` that won was a real etag, and the final state is the
  chain's last write; a ``PreconditionFailed`` is only raised when the etag
  really was superseded;
- **pages**: a walk through a stream (or through every stream, ``stream=None``)
  with cursors never repeats an item and never misses one that was acknowledged
  before the page was read;
- **sequences**: unique, and in commit order: a page that shows sequence *n*
  shows every eventually acknowledged save below *n* in its range (so a save
  can never become visible "behind" a reader), and a save acknowledged before
  another began has the smaller sequence.

Histories hold ``save``, ``update``, ``delete``, ``load``, ``get_latest`` and
``page`` operations over plain-JSON states, without TTL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._core.interface import CheckpointStore
from ..errors import CheckpointNotFound, PreconditionFailed
from ..models import Checkpoint
from .recording import Event, History, HistoryRecorder, RecordingStore

__all__ = [
    "Event",
    "History",
    "HistoryRecorder",
    "HistoryReport",
    "HistoryViolation",
    "RecordingStore",
    "analyze_history",
    "check_history",
]

_INF = float("inf")


# -- checking --------------------------------------------------------------------------


@dataclass
class HistoryReport:
    """What :func:`analyze_history` looked at and what it found."""

    events: int = 0
    saves: int = 0
    updates: int = 0
    cas_conflicts: int = 0
    latest_reads: int = 0
    pages: int = 0
    walks: int = 0
    violations: list[str] = field(default_factory=list)
    #: ids of saves that raised an error that does not rule out a write
    maybe: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        """True if the history broke no rule."""
        return not self.violations

    def add(self, kind: str, message: str) -> None:
        """Record one violation of the rule ``kind``."""
        self.violations.append(f"[{kind}] {message}")


class HistoryViolation(AssertionError):
    """Raised by :func:`check_history` when the history breaks the contract."""

    def __init__(self, report: HistoryReport) -> None:
        self.report = report
        shown = report.violations[:30]
        extra = len(report.violations) - len(shown)
        super().__init__(
            f"{len(report.violations)} violation(s) in a history of {report.events} events:\n  "
            + "\n  ".join(shown)
            + (f"\n  ... and {extra} more" if extra > 0 else "")
        )


@dataclass
class _Record:
    """Everything the history says about one checkpoint id."""

    stream: str
    sequence: int
    save: Event
    etags: dict[str, Any] = field(default_factory=dict)  # etag -> state written
    index: dict[str, int] = field(default_factory=dict)  # etag -> position in the chain
    acked_updates: list[Event] = field(default_factory=list)
    in_doubt: bool = False  # an update raised an error that does not rule out a write
    deletes: list[Event] = field(default_factory=list)


def _build(history: History, report: HistoryReport) -> dict[str, _Record]:
    records: dict[str, _Record] = {}
    for e in history.of("save"):
        if not e.ok:
            if e.in_doubt and e.args.get("id") is not None:
                report.maybe.add(e.args["id"])
            continue
        r = e.result
        if r["id"] in records:
            report.add("identity", f"two acknowledged saves of id {r['id']!r}")
            continue
        rec = _Record(e.args["stream"], r["seq"], e)
        rec.etags[r["etag"]] = r["state"]
        rec.index[r["etag"]] = 0
        records[r["id"]] = rec
    report.saves = len(records)
    for e in history.of("update"):
        target = records.get(e.args["id"])
        if target is None:
            continue
        rec = target
        if e.ok:
            rec.etags[e.result["etag"]] = e.args["state"]
            rec.acked_updates.append(e)
            report.updates += 1
        elif e.error == PreconditionFailed.__name__:
            report.cas_conflicts += 1
        elif e.in_doubt:
            rec.in_doubt = True
    for e in history.of("delete"):
        deleted = records.get(e.args["id"])
        if deleted is not None:
            deleted.deletes.append(e)
    return records


def _chains(records: dict[str, _Record], history: History, report: HistoryReport) -> None:
    """Lost update: acknowledged CAS updates of one id must form a single chain."""
    for cid, rec in records.items():
        by_parent: dict[str, list[Event]] = {}
        for u in rec.acked_updates:
            parent = u.args.get("if_match")
            if parent is None:
                continue
            by_parent.setdefault(parent, []).append(u)
            if parent not in rec.etags:
                report.add(
                    "lost update",
                    f"update of {cid!r} won with if_match={parent!r}, "
                    "an etag that no write produced",
                )
        for parent, winners in by_parent.items():
            if len(winners) > 1:
                procs = ", ".join(w.proc for w in winners)
                report.add(
                    "lost update",
                    f"{len(winners)} compare-and-set updates of {cid!r} all succeeded from "
                    f"etag {parent!r} ({procs}): all but one write was lost",
                )
        # chain positions, following if_match links from the save
        etag = rec.save.result["etag"]
        pos = 0
        while etag in by_parent and len(by_parent[etag]) == 1:
            etag = by_parent[etag][0].result["etag"]
            pos += 1
            rec.index[etag] = pos
    for e in history.of("update"):
        if e.ok or e.error != PreconditionFailed.__name__ or e.args.get("if_match") is None:
            continue
        found = records.get(e.args["id"])
        if found is None or found.in_doubt:
            continue
        rec = found
        stale = e.args["if_match"]
        superseded = any(
            u.args.get("if_match") == stale and u.inv < e.res for u in rec.acked_updates
        ) or any(u.args.get("if_match") is None and u.inv < e.res for u in rec.acked_updates)
        if not superseded and stale in rec.etags and not rec.deletes:
            report.add(
                "spurious conflict",
                f"{e.proc}: update of {e.args['id']!r} with the current etag {stale!r} "
                "raised PreconditionFailed",
            )


def _acked_before(records: Mapping[str, _Record], stream: str, t: int) -> list[tuple[int, str]]:
    return [
        (rec.sequence, cid)
        for cid, rec in records.items()
        if rec.stream == stream and rec.save.res < t
    ]


def _deleted_before(rec: _Record, t: int) -> bool:
    return any(d.inv < t for d in rec.deletes)


def _check_read(
    where: str,
    got: Mapping[str, Any],
    e: Event,
    records: Mapping[str, _Record],
    report: HistoryReport,
) -> _Record | None:
    """Phantom and stale-etag checks for one checkpoint a read returned."""
    rec = records.get(got["id"])
    if rec is None and got["id"] in report.maybe:
        return None  # a save that failed in doubt may well have been applied
    if rec is None or rec.sequence != got["seq"]:
        report.add(
            "phantom",
            f"{where} returned {got['id']!r} seq {got['seq']}, which no acknowledged save produced",
        )
        return None
    if got["etag"] not in rec.etags:
        report.add(
            "phantom",
            f"{where} returned {got['id']!r} with etag {got['etag']!r}, which no write produced",
        )
        return rec
    if "state" in got and got["state"] != rec.etags[got["etag"]]:
        report.add(
            "phantom",
            f"{where} returned a state of {got['id']!r} that does not "
            f"belong to etag {got['etag']!r}",
        )
    pos = rec.index.get(got["etag"])
    done = [
        rec.index[u.result["etag"]]
        for u in rec.acked_updates
        if u.res < e.inv and u.result["etag"] in rec.index
    ]
    if pos is not None and done and pos < max(done):
        report.add(
            "stale read",
            f"{where} returned etag #{pos} of {got['id']!r} although "
            f"etag #{max(done)} was acknowledged before the read began",
        )
    return rec


def _latest_reads(history: History, records: Mapping[str, _Record], report: HistoryReport) -> None:
    for e in history.of("get_latest"):
        if not e.ok:
            continue
        report.latest_reads += 1
        stream = e.args["stream"]
        where = f"{e.proc}: get_latest({stream!r})"
        acked = [
            (seq, cid)
            for seq, cid in _acked_before(records, stream, e.inv)
            if not any(d.res < e.inv for d in records[cid].deletes)
        ]
        got = e.result
        newest = max(acked, default=None)
        if got is None:
            if newest is not None:
                report.add(
                    "stale read",
                    f"{where} returned None although seq {newest[0]} "
                    f"({newest[1]}) was acknowledged before the read began",
                )
            continue
        _check_read(where, got, e, records, report)
        if newest is not None and got["seq"] < newest[0]:
            report.add(
                "stale read",
                f"{where} returned seq {got['seq']} although seq "
                f"{newest[0]} ({newest[1]}) was acknowledged before the read began",
            )


def _pages(history: History, records: Mapping[str, _Record], report: HistoryReport) -> None:
    walks: dict[str, list[Event]] = {}
    for e in history.of("page"):
        if e.ok:
            walks.setdefault(e.args["walk"], []).append(e)
    report.walks = len(walks)
    for walk, pages in walks.items():
        pages.sort(key=lambda p: p.args["page"])
        seen: dict[str, int] = {}
        last: int | None = None
        for p in pages:
            report.pages += 1
            stream, order, bound = p.args["stream"], p.args["order"], p.args["bound"]
            where = f"{p.proc}: page {p.args['page']} of walk {walk} over {stream!r} ({order})"
            items = p.result["items"]
            visible = {seq for _, seq, _ in items} | set(p.result["skipped"])
            for cid, seq, etag in items:
                if cid in seen:
                    report.add(
                        "pages", f"{where} repeats {cid!r} (seq {seq}) from page {seen[cid]}"
                    )
                seen[cid] = p.args["page"]
                if last is not None and (seq <= last if order == "asc" else seq >= last):
                    report.add("pages", f"{where}: seq {seq} is out of {order} order after {last}")
                last = seq
                _check_read(where, {"id": cid, "seq": seq, "etag": etag}, p, records, report)
            more = p.result["has_more"]
            positions = sorted(visible)
            # the positions this page covers: after its bound, up to its last entry
            # (to the end of the stream on the last page)
            if order == "asc":
                lo = bound if bound is not None else 0
                hi = positions[-1] if more and positions else _INF
            else:
                hi = bound if bound is not None else _INF
                lo = positions[0] if more and positions else 0

            def in_range(
                seq: int, lo: float = lo, hi: float = hi, asc: bool = order == "asc"
            ) -> bool:
                return lo < seq <= hi if asc else lo <= seq < hi

            top = positions[-1] if positions else None
            for cid, rec in records.items():
                # a walk over every stream (stream None) covers every record
                if stream is not None and rec.stream != stream:
                    continue
                if not in_range(rec.sequence) or rec.sequence in visible:
                    continue
                if _deleted_before(rec, p.res):
                    continue
                if rec.save.res < p.inv:
                    report.add(
                        "pages",
                        f"{where} misses {cid!r} (seq {rec.sequence}), "
                        "acknowledged before the page was read",
                    )
                elif top is not None and rec.sequence < top:
                    report.add(
                        "commit order",
                        f"{where} shows seq {top} but not seq {rec.sequence} ({cid!r}), which "
                        "was acknowledged later: a lower sequence committed after a higher one",
                    )


def _sequences(records: Mapping[str, _Record], report: HistoryReport) -> None:
    owners: dict[int, str] = {}
    for cid, rec in records.items():
        other = owners.setdefault(rec.sequence, cid)
        if other != cid:
            report.add("sequence", f"{other!r} and {cid!r} were both given seq {rec.sequence}")
    saves = sorted(records.items(), key=lambda kv: kv[1].save.res)
    by_inv = sorted(records.items(), key=lambda kv: kv[1].save.inv)
    best: tuple[int, str] | None = None
    i = 0
    for cid, rec in by_inv:
        while i < len(saves) and saves[i][1].save.res < rec.save.inv:
            cand = (saves[i][1].sequence, saves[i][0])
            best = cand if best is None or cand > best else best
            i += 1
        if best is not None and best[0] >= rec.sequence:
            report.add(
                "sequence",
                f"{cid!r} got seq {rec.sequence} although {best[1]!r} got "
                f"seq {best[0]}, acknowledged before {cid!r} was saved",
            )


def analyze_history(
    history: History, final: Mapping[str, Checkpoint | None] | None = None
) -> HistoryReport:
    """Check a merged history; ``final`` maps ids to their state read after all actors
    stopped (``None`` for a missing checkpoint). Returns the report; never raises."""
    report = HistoryReport(events=len(history.events))
    records = _build(history, report)
    _chains(records, history, report)
    _latest_reads(history, records, report)
    _pages(history, records, report)
    _sequences(records, report)
    if final is not None:
        for cid, rec in records.items():
            cp = final.get(cid)
            if cp is None:
                if not rec.deletes:
                    report.add("lost write", f"acknowledged {cid!r} is missing at the end")
                continue
            if cp.sequence != rec.sequence:
                report.add(
                    "sequence",
                    f"{cid!r} has seq {cp.sequence} at the end, "
                    f"but its save returned {rec.sequence}",
                )
            # the last write wins: the final etag is one no other write started after
            writes = [rec.save, *rec.acked_updates]
            last = {(w.result["etag"]) for w in writes if not any(o.inv > w.res for o in writes)}
            if cp.etag not in last and not rec.in_doubt:
                report.add(
                    "lost update",
                    f"{cid!r} ends at etag {cp.etag!r}, not at its last acknowledged write "
                    f"({', '.join(sorted(last))})",
                )
            if cp.etag in rec.etags and cp.state != rec.etags[cp.etag]:
                report.add(
                    "lost write",
                    f"{cid!r} ends with a state that is not the one written with etag {cp.etag!r}",
                )
    return report


async def check_history(
    store: CheckpointStore, history: History, *, raise_on_violation: bool = True
) -> HistoryReport:
    """Read the final state of every saved id from ``store`` and analyze ``history``.

    Raises :class:`HistoryViolation` (an ``AssertionError``) if anything is wrong,
    unless ``raise_on_violation`` is false.
    """
    final: dict[str, Checkpoint | None] = {}
    for e in history.of("save"):
        if e.ok:
            cid = e.result["id"]
            try:
                final[cid] = await store.load(cid)
            except CheckpointNotFound:
                final[cid] = None
    report = analyze_history(history, final)
    if raise_on_violation and report.violations:
        raise HistoryViolation(report)
    return report
