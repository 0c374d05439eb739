"""``verify`` of a file store: its derived data checked against the records of
one :func:`.survey.take_survey`, read-only (no lock, no byte written):

- ``state``: both copies readable, the high-water mark at or above every sequence
  the store mentions, the stream count against the index files, the orphan
  marker against the newest damaged record of unknown stream, no pending journal
  of a crashed delete or update;
- every stream index: its header, every slot's CRC and order, and that its live
  slots are exactly the records of its stream (a damaged record counts, under
  the stream recovered for it); a slot marked dead whose record still exists;
- the id table: its header and size, one entry per record file, no entry naming
  no record, no garbage slot;
- foreign files: anything in the store that is not its own (planted files,
  links, FIFOs, misplaced records) and stray temp files.

Writers may run meanwhile: what is above the high-water mark the survey started
from (or, while a batch is in the journal, from its first sequence on) is left
out, and a record that vanished since is no problem.
"""

from __future__ import annotations

from collections.abc import Callable

from ...models import Problem
from . import layout as fmt
from .files import Files
from .survey import Entry, Survey

__all__ = ["check_store"]

_REPAIR = "repair() rebuilds it from the records"
#: ``problem(kind, location, reason, entry=None)``: add one problem.
_Report = Callable[..., None]


def check_store(files: Files, s: Survey) -> list[Problem]:
    """The problems of the derived data in ``s`` (see the module docstring)."""
    out: list[Problem] = []
    where = files.where

    def problem(kind: str, location: str, reason: str, e: Entry | None = None) -> None:
        named = {} if e is None else {"id": e.cid, "sequence": e.seq, "stream": e.stream}
        out.append(Problem(kind=kind, location=location, reason=reason, **named))

    top = max((e.seq for e in s.entries), default=0)
    _check_state(s, top, problem, where(fmt.STATE_NAME))
    cap = fmt.visible_cap(s.state)
    hwm = cap if cap is not None else s.state.hwm if s.state is not None else top
    if cap is not None:
        # Valid records saved after the survey began, and the records of a batch
        # not complete yet (the cap is just below it), are no one's problem; damage
        # above the mark still is, unless a batch is in the journal.
        pending = s.state.journal if s.state is not None else None
        batch = pending is not None and pending.op in fmt.BATCH_OPS
        s.entries = [e for e in s.entries if e.seq <= cap or (e.record is None and not batch)]
    for location, reason in s.foreign:
        problem("foreign", where(location), reason)
    for bucket, name in s.temps:
        problem(
            "foreign",
            where(fmt.RECORDS_DIR, fmt.bucket_name(bucket), name),
            "a stray temporary file left by an interrupted write; repair() removes it",
        )
    for e in s.entries:
        if e.planted is not None:
            problem("foreign", where(files.record_path(e.seq, e.cid)), e.planted, e)
        elif e.record is None and e.stream is None:
            problem(
                "damaged-record",
                where(files.record_path(e.seq, e.cid)),
                "damaged, and its stream cannot be told: get_latest of a stream whose "
                "newest checkpoint is older raises; repair(drop_damaged=True) removes it",
                e,
            )
    _check_indexes(files, s, hwm, problem)
    _check_ids(files, s, hwm, problem)
    return out


def _check_state(s: Survey, top: int, problem: _Report, location: str) -> None:
    def say(reason: str, kind: str = "state") -> None:
        problem(kind, location, reason)

    if s.state_problem is not None:
        say(f"{s.state_problem}; {_REPAIR}")
    state = s.state
    if state is None:
        return
    if state.hwm < top:
        say(f"the high-water mark {state.hwm} is below sequence {top}, which exists; {_REPAIR}")
    files = len(s.indexes)
    if state.streams is not None and files < state.streams:
        say(
            f"the state counts {state.streams} stream index file(s) but there are {files}; "
            f"{_REPAIR}",
            "index",
        )
    orphans = [e for e in s.orphans if e.seq <= state.hwm]
    if orphans:
        newest = max(orphans, key=lambda e: e.seq)
        if state.orphan is None or state.orphan[0] < newest.seq:
            say(
                f"damaged record {newest.seq} ({newest.cid!r}) belongs to no known stream "
                "and the state does not mark it, so get_latest could answer an older "
                f"checkpoint; {_REPAIR}"
            )
    journal = state.journal
    if journal is not None and journal.op != "insert":
        say(
            f"a crashed {journal.op} is unfinished; the next write (or a writable open) finishes it"
        )


def _check_indexes(files: Files, s: Survey, hwm: int, problem: _Report) -> None:
    expected: dict[str, dict[int, Entry]] = {}
    for e in s.entries:
        if e.stream is not None:
            expected.setdefault(fmt.stream_file_name(e.stream), {})[e.seq] = e
    pending = s.state.journal if s.state is not None else None
    for sfile, old in s.indexes.items():
        location = files.where(fmt.STREAMS_DIR, sfile)
        if old.damaged is not None:
            problem("index", location, f"{old.damaged}; {_REPAIR}")
        want = expected.get(sfile, {})
        for slot in old.slots:
            if slot.seq > hwm:
                continue  # saved after the survey began
            match = want.get(slot.seq)
            if slot.live and (match is None or match.cid != slot.cid):
                problem(
                    "index",
                    location,
                    f"it lists checkpoint {slot.cid!r} (sequence {slot.seq}), which has "
                    f"no record of this stream; {_REPAIR}",
                )
            elif not slot.live and match is not None and match.cid == slot.cid:
                deleting = pending is not None and pending.op == "delete"
                if not deleting and _still_there(files, slot.seq, slot.cid):
                    problem(
                        "index",
                        location,
                        f"it marks checkpoint {slot.cid!r} (sequence {slot.seq}) deleted, "
                        f"but its record exists; {_REPAIR}",
                        match,
                    )
        if old.damaged is not None:
            continue  # one problem per damaged index, not one per checkpoint it lost
        listed = {(slot.seq, slot.cid) for slot in old.slots}
        for e in want.values():
            if (e.seq, e.cid) not in listed and _still_there(files, e.seq, e.cid):
                problem(
                    "index",
                    location,
                    f"it does not list checkpoint {e.cid!r} (sequence {e.seq}); {_REPAIR}",
                    e,
                )
    for sfile, want in expected.items():
        if sfile not in s.indexes:
            first = next(iter(want.values()))
            if any(_still_there(files, e.seq, e.cid) for e in want.values()):
                problem(
                    "index",
                    files.where(fmt.STREAMS_DIR, sfile),
                    f"stream {first.stream!r} has {len(want)} record(s) but no index; {_REPAIR}",
                )


def _check_ids(files: Files, s: Survey, hwm: int, problem: _Report) -> None:
    location = files.where(fmt.IDS_NAME)
    if s.ids is None:
        problem("index", location, f"{s.ids_damaged}; {_REPAIR}")
        return
    if s.ids_garbage:
        problem("index", location, f"{s.ids_garbage} slot(s) hold garbage; {_REPAIR}")
    have = set(s.ids)
    names = {(fmt.id_key(e.cid), e.seq): e for e in s.entries}
    for key_seq, e in names.items():
        if key_seq not in have and _still_there(files, e.seq, e.cid):
            problem("index", location, f"it lacks checkpoint {e.cid!r}; {_REPAIR}", e)
    for key, seq in have:
        if seq <= hwm and (key, seq) not in names:
            problem(
                "index",
                location,
                f"it lists sequence {seq}, which has no record with that id; {_REPAIR}",
            )


def _still_there(files: Files, seq: int, cid: str) -> bool:
    """Whether record ``seq``/``cid`` exists now (a problem about a record that a
    concurrent delete removed is no problem)."""
    bucket = files.bucket(seq)
    if bucket is None:
        return False
    try:
        files.io.lstat(fmt.record_name(seq, cid), dir_fd=bucket)
    except FileNotFoundError:
        return False
    finally:
        files.close_bucket(bucket)
    return True
