"""A damaged record whose stream cannot be told (an *orphan*, see
``statekeeper.backends.file.survey``) in ``list(stream)`` (SPEC S3, S3a).

``get_latest`` raises naming such a record for every stream it may belong to. A
listing must agree: a page of any stream whose range holds the record's sequence
reports it in ``skipped``, with a reason that says its stream is unknown, on a
read-only open, a writable one, and after ``repair()``; exactly once over a walk of
the pages in either order; and ``verify`` keeps naming it until
``repair(drop_damaged=True)`` removes it (and nothing readable).

The sweep reproduces the damage of the issue: the newest or a middle record
truncated, zero-filled or flipped, with its stream's index damaged the same way or
deleted, alone or together with ``state`` and ``ids.idx``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from test_file_damage import (
    DAMAGE,
    fill_two_streams,
    flip,
    record_file,
    snapshot,
    truncate,
    zero_fill,
)

from cli_helpers import run_cli
from statekeeper.backends.file import FileCheckpointStore
from statekeeper.errors import CheckpointDecodeError, CheckpointNotFound
from statekeeper.models import Checkpoint, Page, Skipped

RECORD_DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncate": truncate,
    "zero-fill": zero_fill,
    "flip": flip,
}
#: Which of job's records is damaged: its newest (seq 7) or a middle one (seq 3).
WHICH = {"newest": -1, "middle": 2}
#: What else is damaged the same way as the stream index (deleted with "delete").
ALSO = {"alone": (), "state": ("state",), "ids": ("ids.idx",), "state+ids": ("state", "ids.idx")}
STREAMS = ("job", "other", "never-used")


def unknown(entry: Skipped) -> bool:
    return "stream cannot be told" in entry.reason


async def walk(
    store: FileCheckpointStore, stream: str, order: str, limit: int
) -> tuple[list[Checkpoint], list[Skipped]]:
    """Every page of ``list(stream)`` by ``next_cursor``, then back by ``prev_cursor``
    (the same pages again); each page's entries in order, no entry on two pages."""
    pages: list[Page] = []
    cursor: str | None = None
    while True:
        page = await store.list(stream, limit=limit, order=order, after=cursor)  # type: ignore[arg-type]
        pages.append(page)
        assert len(page.items) + len(page.skipped) <= limit
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        assert len(pages) < 50, "the cursor does not move"
    back = [pages[-1]]
    while back[-1].prev_cursor is not None:
        prev = await store.list(stream, limit=limit, order=order, before=back[-1].prev_cursor)  # type: ignore[arg-type]
        back.append(prev)
        assert len(back) <= len(pages), "the walk back makes more pages than the walk forward"
    assert [(p.items, p.skipped) for p in back[::-1]] == [(p.items, p.skipped) for p in pages]
    items = [c for p in pages for c in p.items]
    skipped = [s for p in pages for s in p.skipped]
    seqs = [c.sequence for c in items] + [s.sequence for s in skipped if s.sequence is not None]
    assert len(seqs) == len(set(seqs)), f"an entry is on two pages: {pages}"
    want = sorted((c.sequence for c in items), reverse=order == "desc")
    assert [c.sequence for c in items] == want
    return items, skipped


async def latest_error(store: FileCheckpointStore, stream: str) -> CheckpointDecodeError | None:
    try:
        await store.get_latest(stream)
    except CheckpointDecodeError as exc:
        return exc
    return None


async def assert_listed(
    store: FileCheckpointStore, saved: list[Checkpoint], damaged: Checkpoint
) -> bool:
    """``list`` agrees with ``get_latest``: every page walk of every stream lists the
    intact checkpoints of that stream, and reports ``damaged`` in ``skipped``
    wherever it may belong (its own stream, or every stream once its stream is
    unknown), with the reason saying so. Returns whether its stream was unknown."""
    full = await store.list("job", limit=1000)
    assert [s.id for s in full.skipped] == [damaged.id], "list('job') leaves it out"
    entry = full.skipped[0]
    assert entry.sequence == damaged.sequence
    assert damaged.id in entry.location
    orphan = unknown(entry)
    for stream in STREAMS:
        error = await latest_error(store, stream)
        if error is not None:
            assert error.id == damaged.id
        mine = {cp.id for cp in saved if cp.stream == stream and cp.id != damaged.id}
        expect_skipped = stream == "job" or orphan
        if error is not None:
            assert expect_skipped, f"get_latest({stream!r}) raises, list does not skip it"
        for order, limit in itertools.product(("desc", "asc"), (1000, 1, 2)):
            items, skipped = await walk(store, stream, order, limit)
            assert {c.id for c in items} == mine, (stream, order, limit)
            assert [s.id for s in skipped] == ([damaged.id] if expect_skipped else []), (
                stream,
                order,
                limit,
                skipped,
            )
            if orphan:
                assert all(unknown(s) for s in skipped), skipped
    everything = await store.list(None, limit=1000)
    assert [s.id for s in everything.skipped] == [damaged.id]
    return orphan


async def assert_verify_names(store: FileCheckpointStore, damaged: Checkpoint) -> None:
    report = await store.verify()
    assert not report.ok
    assert damaged.id in {p.id for p in report.problems if p.kind == "damaged-record"}


CASES = list(itertools.product(WHICH, RECORD_DAMAGE, list(DAMAGE), ALSO))


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("which", "record", "index", "also"), CASES, ids=["-".join(c) for c in CASES]
)
async def test_a_damaged_record_and_its_index(
    tmp_path: Path, which: str, record: str, index: str, also: str
) -> None:
    saved = await fill_two_streams(tmp_path)
    job = [cp for cp in saved if cp.stream == "job"]
    damaged = job[WHICH[which]]
    RECORD_DAMAGE[record](record_file(tmp_path, damaged))
    for name in ("streams/job.idx", *ALSO[also]):
        DAMAGE[index](tmp_path / name)

    before = snapshot(tmp_path)
    async with FileCheckpointStore(tmp_path, read_only=True) as store:
        await assert_listed(store, saved, damaged)
        await assert_verify_names(store, damaged)
    assert snapshot(tmp_path) == before

    async with FileCheckpointStore(tmp_path) as store:
        await assert_listed(store, saved, damaged)
        await assert_verify_names(store, damaged)
        repaired = await store.repair()
        assert [p.id for p in repaired.damaged] == [damaged.id]
        await assert_listed(store, saved, damaged)
        await assert_verify_names(store, damaged)

    # every page in a worker hop, none on the event loop's thread: the same answers
    async with FileCheckpointStore(tmp_path, inline_reads=False) as store:
        await assert_listed(store, saved, damaged)
        dropped = await store.repair(drop_damaged=True)
        assert [p.id for p in dropped.dropped] == [damaged.id]
        for cp in saved:
            if cp.id == damaged.id:
                with pytest.raises(CheckpointNotFound):
                    await store.load(cp.id)
            else:
                assert (await store.load(cp.id)).state == cp.state
        for stream in ("job", "other"):
            page = await store.list(stream, limit=1000)
            assert page.skipped == []
            assert {c.id for c in page.items} == {
                cp.id for cp in saved if cp.stream == stream and cp.id != damaged.id
            }
        assert (await store.verify()).ok


async def two_orphans(
    root: Path, backup: dict[str, bytes] | None = None
) -> tuple[list[Checkpoint], list[Checkpoint]]:
    """job's newest (7) and middle (3) records zero-filled, job's index and the
    state deleted: nothing names their stream. Returns (saved, the two); their
    bytes as saved go to ``backup``."""
    saved = await fill_two_streams(root)
    job = [cp for cp in saved if cp.stream == "job"]
    orphans = [job[-1], job[2]]
    for cp in orphans:
        if backup is not None:
            backup[cp.id] = record_file(root, cp).read_bytes()
        zero_fill(record_file(root, cp))
    (root / "streams" / "job.idx").unlink()
    (root / "state").unlink()
    return saved, orphans


@pytest.mark.asyncio
@pytest.mark.parametrize("inline_reads", [True, False], ids=["inline", "worker"])
async def test_every_orphan_is_on_the_page_of_its_range(tmp_path: Path, inline_reads: bool) -> None:
    """Two damaged records of unknown stream: each is on exactly one page of any
    stream, the one whose range holds its sequence, whatever the tag filter (a
    record that cannot be read is reported whatever the filters say), before and
    after repair(), in a worker hop or on the event loop's thread."""
    saved, orphans = await two_orphans(tmp_path)
    by_seq = {cp.sequence: cp.id for cp in orphans}
    for read_only in (True, False):
        async with FileCheckpointStore(
            tmp_path, read_only=read_only, inline_reads=inline_reads
        ) as store:
            for _ in range(2):
                for stream in STREAMS:
                    for order in ("desc", "asc"):
                        _, skipped = await walk(store, stream, order, 1)
                        want = sorted(by_seq, reverse=order == "desc")
                        assert [s.sequence for s in skipped] == want, (stream, order)
                        assert [s.id for s in skipped] == [by_seq[q] for q in want]
                        assert all(unknown(s) and stream in s.reason for s in skipped)
                # other's only checkpoint is 4: a page of one from the top holds 7
                page = await store.list("other", limit=1)
                assert [s.sequence for s in page.skipped] == [7] and page.items == []
                assert page.has_more and page.next_cursor is not None
                rest = await store.list("other", limit=1, after=page.next_cursor)
                assert [c.sequence for c in rest.items] == [4] and rest.skipped == []
                last = await store.list("other", limit=1, after=rest.next_cursor)
                assert [s.sequence for s in last.skipped] == [3] and not last.has_more
                tagged = await store.list("job", tags={"no": "such"}, limit=1000)
                assert tagged.items == [] and {s.id for s in tagged.skipped} == set(by_seq.values())
                if read_only:
                    break
                await store.repair()
    async with FileCheckpointStore(tmp_path) as store:
        dropped = await store.repair(drop_damaged=True)
        assert {p.id for p in dropped.dropped} == set(by_seq.values())
        for stream in STREAMS:
            page = await store.list(stream, limit=1000)
            assert page.skipped == []
            assert {c.id for c in page.items} == {
                cp.id for cp in saved if cp.stream == stream and cp.sequence not in by_seq
            }
        assert (await store.verify()).ok


def test_verify_exits_1_naming_each_orphan(tmp_path: Path) -> None:
    """The command line: ``verify`` of the store exits 1 and names both records, as
    damaged records that belong to no stream it can tell, before and after repair."""
    root = tmp_path / "store"
    saved, orphans = asyncio.run(two_orphans(root))
    url = f"file://{root}"
    for step in ("before", "repair", "after"):
        if step == "repair":
            run_cli("repair", "--url", url, cwd=tmp_path, expect=None)
            continue
        doc = run_cli("verify", "--url", url, "--json", cwd=tmp_path, expect=1).json()
        assert doc["ok"] is False
        named = {p["id"] for p in doc["problems"] if p["kind"] == "damaged-record"}
        assert named == {cp.id for cp in orphans}, (step, doc["problems"])
    assert len(saved) == 7


@pytest.mark.asyncio
async def test_the_orphans_a_reader_keeps_follow_deletes_and_other_writers(
    tmp_path: Path,
) -> None:
    """After repair() the pages come from the indexes, with the orphans a reader
    surveyed once: one deleted by id since is left out, one restored is listed as
    the checkpoint it is, and another store's repair(drop_damaged=True) is seen."""
    backup: dict[str, bytes] = {}
    saved, (newest, middle) = await two_orphans(tmp_path, backup)
    async with FileCheckpointStore(tmp_path) as store, FileCheckpointStore(tmp_path) as other:
        await store.repair()
        for reader in (store, other):
            got = (await reader.list("other", limit=1000)).skipped
            assert [s.id for s in got] == [newest.id, middle.id]
        assert await store.delete(middle.id)
        for reader in (store, other):
            got = (await reader.list("other", limit=1000)).skipped
            assert [s.id for s in got] == [newest.id]
            with pytest.raises(CheckpointDecodeError):
                await reader.get_latest("other")
        # more damage, and another store's repair: a new orphan under the same marker
        second = next(cp for cp in saved if cp.sequence == 2)
        zero_fill(record_file(tmp_path, second))
        (tmp_path / "streams" / "job.idx").unlink()
        await other.repair()
        for reader in (store, other):
            got = (await reader.list("other", limit=1000)).skipped
            assert [s.id for s in got] == [newest.id, second.id]
        # restored from a backup: listed as the checkpoint it is, in its stream only
        record_file(tmp_path, newest).write_bytes(backup[newest.id])
        for reader in (store, other):
            page = await reader.list("job", limit=1000)
            assert [s.id for s in page.skipped] == [second.id] and page.items[0].id == newest.id
            assert page.items[0].state == newest.state
            page = await reader.list("other", limit=1000)
            assert [s.id for s in page.skipped] == [second.id]
            assert [c.id for c in page.items] == [saved[3].id]
            latest = await reader.get_latest("job")
            assert latest is not None and latest.id == newest.id
        zero_fill(record_file(tmp_path, newest))
        await other.repair(drop_damaged=True)
        for reader in (store, other):
            for stream in STREAMS:
                page = await reader.list(stream, limit=1000)
                assert page.skipped == []
                assert {c.id for c in page.items} == {
                    cp.id
                    for cp in saved
                    if cp.stream == stream and cp not in (newest, middle, second)
                }


@pytest.mark.asyncio
async def test_removing_a_stream_leaves_the_orphans_it_lists(tmp_path: Path) -> None:
    """A page of ``other`` reports the orphans (they may be its checkpoints), but
    they may as well be job's: prune and delete_stream of ``other`` remove only
    what its index holds, never an orphan."""
    saved, orphans = await two_orphans(tmp_path)
    async with FileCheckpointStore(tmp_path) as store:
        await store.repair()
        assert await store.prune("other", keep_last=0) == 1
        assert await store.delete_stream("never-used") == 0
        await store.save("other", {"n": 1})
        assert await store.delete_stream("other") == 1
        for cp in orphans:
            with pytest.raises(CheckpointDecodeError):
                await store.load(cp.id)
        page = await store.list("job", limit=1000)
        assert [s.id for s in page.skipped] == [cp.id for cp in orphans]
        assert [s.id for s in (await store.list("other")).skipped] == [cp.id for cp in orphans]
    assert len(saved) == 7
