"""Listed pages of one stream (up to 100 items) of the file backend run on the event
loop's thread when they are the cheap indexed read (``inline_reads``, on by
default), and take the worker hop wherever the scan would do more: a page they
give is exactly the page, with the same cursors, that the hop path
(``inline_reads=False``) gives, and a page that would hold a skipped entry always
comes from the worker."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from file_helpers import a_journal_in_flight, count_hops, read_state, write_state

from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file.reader import INLINE_RECORD_BYTES
from statekeeper.errors import CheckpointDecodeError
from statekeeper.models import Checkpoint, Page

pytestmark = pytest.mark.asyncio


def record_file(root: Path, cp: Checkpoint) -> Path:
    return root / "records" / f"{cp.sequence // 1000:017d}" / f"{cp.sequence:020d}.{cp.id}.ckpt"


def seen(page: Page) -> tuple[Any, ...]:
    """Everything a caller can see of a page."""
    return (
        [(cp.id, cp.sequence, cp.state, cp.tags, cp.etag) for cp in page.items],
        [(s.id, s.sequence, s.error, s.reason) for s in page.skipped],
        page.next_cursor,
        page.prev_cursor,
        page.has_more,
    )


async def inline_and_hop(
    store: FileCheckpointStore,
    hops: list[str],
    call: Callable[[], Awaitable[Page]],
    want: list[str] | None,
) -> Page:
    """``call`` makes the hops ``want`` (``None``: whichever). That a page read
    inline is the worker's page is ``test_file_inline_differential.py``'s to show."""
    before = len(hops)
    page = await call()
    assert want is None or hops[before:] == want, hops[before:]
    return page


async def walk(
    store: FileCheckpointStore,
    hops: list[str],
    stream: str,
    inline: bool = True,
    **query: Any,
) -> list[Page]:
    """Every page of ``stream`` forward, then back with ``before=``; each page read
    inline (no hop), unless ``inline`` is false (then either way)."""
    want: list[str] | None = [] if inline else None
    pages: list[Page] = []
    cursor = None
    while True:
        page = await inline_and_hop(
            store, hops, lambda c=cursor: store.list(stream, after=c, **query), want
        )
        pages.append(page)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    back = pages[-1].prev_cursor
    while back is not None:
        page = await inline_and_hop(
            store, hops, lambda c=back: store.list(stream, before=c, **query), want
        )
        back = page.prev_cursor
    return pages


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_pages_take_no_hop(tmp_path: Path, order: str) -> None:
    """Three streams interleaved, tags, deleted and expired checkpoints, and a save
    between two pages: every page inline, with what the stream holds."""
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    async with FileCheckpointStore(tmp_path / "s", clock=lambda: now[0]) as store:
        rng = random.Random(15)
        saved: dict[str, list[Checkpoint]] = {"a": [], "b": [], "c": []}
        for i in range(150):
            stream = rng.choice("aab c")
            stream = "c" if stream == " " else stream
            ttl = timedelta(seconds=1) if i % 17 == 0 else None
            saved[stream].append(
                await store.save(stream, {"i": i}, tags={"odd": str(i % 2)}, ttl=ttl)
            )
        for cp in saved["a"][3:40:4]:
            assert await store.delete(cp.id)
        now[0] += timedelta(seconds=10)  # the ttl ones have expired
        hops = count_hops(store)
        for limit in (1, 2, 7, 100):
            for stream in ("a", "b", "c", "nothing-here-yet"):
                if stream == "nothing-here-yet":
                    # no index: the first look lists streams/ in the worker (is an
                    # index missing?); once it is known whole, one fstat on the
                    # loop tells, as for get_latest
                    page = await inline_and_hop(
                        store,
                        hops,
                        lambda n=limit: store.list("nothing-here-yet", limit=n),
                        ["list"] if limit == 1 else [],
                    )
                    assert page.items == [] and page.skipped == []
                    continue
                pages = await walk(store, hops, stream, limit=limit, order=order)
                got = [cp.id for p in pages for cp in p.items]
                want = [
                    cp.id
                    for cp in saved[stream]
                    if cp.expires_at is None and cp.id not in {d.id for d in saved["a"][3:40:4]}
                ]
                assert got == (want if order == "asc" else want[::-1])
                # a tag filter passes over records: inline up to a bound (tested below)
                tagged = await walk(
                    store, hops, stream, inline=False, limit=limit, order=order, tags={"odd": "1"}
                )
                odd = [
                    i
                    for i in want
                    if next(c for c in saved[stream] if c.id == i).tags["odd"] == "1"
                ]
                got = [cp.id for p in tagged for cp in p.items]
                assert got == (odd if order == "asc" else odd[::-1])
        # a save between two pages is seen by the next one, as in the worker
        first = await store.list("b", limit=5, order="asc")
        fresh = await store.save("b", {"i": "fresh"})
        cursor = first.next_cursor
        while cursor is not None:
            page = await inline_and_hop(
                store, hops, lambda c=cursor: store.list("b", limit=5, order="asc", after=c), []
            )
            last, cursor = page, page.next_cursor
        assert last.items[-1].id == fresh.id


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "stream"])
async def test_a_page_with_a_damaged_record_comes_from_the_worker(
    tmp_path: Path, damage: str
) -> None:
    """A record the worker would report as skipped (or find deleted meanwhile): the
    page is the worker's, never one that silently leaves it out."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(12)]
        other = await store.save("other", {"x": 1})
        hops = count_hops(store)
        victim = saved[6]
        path = record_file(tmp_path / "s", victim)
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[:40])
        elif damage == "flip":
            data = bytearray(path.read_bytes())
            data[-2] ^= 0x55
            path.write_bytes(bytes(data))
        elif damage == "delete":
            path.unlink()
        else:  # another stream's record under this one's name
            path.write_bytes(record_file(tmp_path / "s", other).read_bytes())
        page = await inline_and_hop(store, hops, lambda: store.list("job", limit=20), ["list"])
        assert victim.id not in [cp.id for cp in page.items]
        assert [s.id for s in page.skipped] == [victim.id]
        # a page that does not reach it (4 items, 5 rows: the newest five) stays inline
        await inline_and_hop(store, hops, lambda: store.list("job", limit=4), [])


async def test_a_large_record_in_the_page_is_read_in_the_worker(tmp_path: Path) -> None:
    async with FileCheckpointStore(tmp_path / "s") as store:
        await store.save("job", {"n": 1})
        big = await store.save("job", {"pad": "x" * (INLINE_RECORD_BYTES + 1)})
        hops = count_hops(store)
        page = await inline_and_hop(store, hops, lambda: store.list("job", limit=5), ["list"])
        assert page.items[0].id == big.id  # newest first


async def test_what_the_worker_decides_takes_the_hop(tmp_path: Path) -> None:
    """A page over 100 items, a listing of every stream, a metadata filter, a journal
    that hides a batch, and ``inline_reads=False``: the worker scans."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        for i in range(3):
            await store.save("job", {"i": i}, metadata={"k": i})
        hops = count_hops(store)
        await inline_and_hop(store, hops, lambda: store.list("job", limit=100), [])
        await inline_and_hop(store, hops, lambda: store.list("job", limit=101), ["list"])
        await inline_and_hop(store, hops, lambda: store.list(None, limit=5), ["list"])
        await inline_and_hop(
            store, hops, lambda: store.list("job", limit=5, metadata={"k": 1}), ["list"]
        )
        with a_journal_in_flight(store, tmp_path / "s", "batch", 3):
            hidden = len(hops)
            await store.list("job", limit=5)
            assert hops[hidden:] == ["list"]
    async with FileCheckpointStore(tmp_path / "s", inline_reads=False) as store:
        hops = count_hops(store)
        assert len((await store.list("job", limit=5)).items) == 3
        assert hops == ["list"]


async def test_pages_from_a_second_event_loop_thread(tmp_path: Path) -> None:
    """Another thread's loop reads pages through descriptors of its own."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [await store.save("job", {"i": i}) for i in range(30)]
        hops = count_hops(store)
        mine = await store.list("job", limit=10, order="asc")
        theirs = await asyncio.to_thread(
            asyncio.run,
            store.list("job", limit=10, order="asc"),  # type: ignore[arg-type]
        )
        assert seen(mine) == seen(theirs)
        assert [cp.id for cp in mine.items] == [cp.id for cp in saved[:10]]
        assert hops == []


async def test_a_page_spread_over_many_buckets(tmp_path: Path) -> None:
    """A sparse stream: each of its records in a bucket of its own, more buckets than
    a thread keeps open. Every page inline, every page the worker's."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        sparse = []
        for i in range(12):
            sparse.append(await store.save("sparse", {"i": i}))
            state = read_state(store.path)  # move the next sequence to the next bucket
            assert state is not None
            write_state(store.path, state.next(hwm=(state.hwm // 1000 + 1) * 1000))
        hops = count_hops(store)
        pages = await walk(store, hops, "sparse", limit=5, order="asc")
        assert [cp.id for p in pages for cp in p.items] == [cp.id for cp in sparse]
        assert len({cp.sequence // 1000 for cp in sparse}) == 12


async def test_a_walk_while_another_writer_saves_and_deletes(tmp_path: Path) -> None:
    """Pages read on the loop's thread while another store on the same directory (as
    another process would be) saves to the stream and deletes from it, on a thread
    of its own: every page is in order with no repeats, and the walk sees each
    checkpoint that was there before it began and was never deleted, exactly once."""
    import threading

    root = tmp_path / "s"
    async with FileCheckpointStore(root) as store:
        before = [await store.save("job", {"i": i}) for i in range(120)]
        doomed = {cp.id for cp in before[5::9]}
        stop = threading.Event()
        errors: list[BaseException] = []

        def writer() -> None:
            async def run() -> None:
                async with FileCheckpointStore(root) as other:
                    for cp_id in sorted(doomed):
                        await other.delete(cp_id)
                        await other.save("job", {"new": True})
                    while not stop.is_set():
                        await other.save("job", {"new": True})

            try:
                asyncio.run(run())
            except BaseException as exc:  # reported by the test
                errors.append(exc)

        pages = 0
        thread = threading.Thread(target=writer)
        thread.start()
        try:
            for _ in range(5):
                seen: list[Checkpoint] = []
                cursor = None
                while True:
                    page = await store.list("job", limit=7, order="asc", after=cursor)
                    pages += 1
                    assert not page.skipped
                    seqs = [cp.sequence for cp in page.items]
                    assert seqs == sorted(set(seqs))
                    seen += page.items
                    cursor = page.next_cursor
                    if cursor is None or len(seen) > 400:
                        break
                ids = [cp.id for cp in seen]
                assert len(ids) == len(set(ids)), "a checkpoint listed twice"
                assert [cp.sequence for cp in seen] == sorted(cp.sequence for cp in seen)
                kept = [cp.id for cp in before if cp.id not in doomed]
                assert [i for i in ids if i in set(kept)] == kept
        finally:
            stop.set()
            thread.join()
        assert not errors, errors
        # how many of these pages ran on the loop's thread depends on timing, so it is
        # not asserted here
        assert pages >= 5


async def test_what_a_page_passes_over_on_the_loop_is_bounded(tmp_path: Path) -> None:
    """Deleted checkpoints and records a tag filter leaves out are passed over on the
    loop's thread only up to a bound (64 slots, 16 records); past it the worker
    reads the page, so a sparse filter or a long run of deletions never stalls the
    loop. The pages are the worker's either way."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        saved = [
            await store.save("job", {"i": i}, tags={"rare": str(i % 50 == 0)}) for i in range(200)
        ]
        hops = count_hops(store)
        # 3 matches among 200: far more than 16 records passed over
        page = await inline_and_hop(
            store, hops, lambda: store.list("job", limit=5, tags={"rare": "True"}), ["list"]
        )
        assert [cp.state["i"] for cp in page.items] == [150, 100, 50, 0]
        # a few passed over: still inline
        await inline_and_hop(
            store, hops, lambda: store.list("job", limit=3, tags={"rare": "False"}), []
        )
        # 70 deletions in a row near the start of the stream: over the 64 slots
        for cp in saved[1:71]:
            assert await store.delete(cp.id)
        page = await inline_and_hop(
            store, hops, lambda: store.list("job", limit=5, order="asc"), ["list"]
        )
        assert [cp.state["i"] for cp in page.items] == [0, 71, 72, 73, 74]
        # 10 in a row: inline
        for cp in saved[150:160]:
            assert await store.delete(cp.id)
        after = await store.cursor_at(saved[149].id, order="asc")
        page = await inline_and_hop(
            store, hops, lambda: store.list("job", limit=5, order="asc", after=after), []
        )
        assert [cp.state["i"] for cp in page.items] == [160, 161, 162, 163, 164]


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "hop"])
async def test_a_state_the_codec_refuses_is_skipped_in_the_same_words(
    tmp_path: Path, inline: bool
) -> None:
    """A page decodes states as it reads records; a well-formed record whose state
    this store's codec refuses (nested deeper than its max_depth) is handed back and
    reported as skipped with the strict read's words, on either path."""
    root = tmp_path / "s"
    deep: object = "leaf"
    for _ in range(30):
        deep = [deep]
    async with FileCheckpointStore(root) as writer:
        saved = [await writer.save("job", {"i": i}) for i in range(3)]
        bad = await writer.save("job", {"deep": deep})
        after = await writer.save("job", {"i": 9})
    async with FileCheckpointStore(root, max_depth=10, inline_reads=inline) as store:
        hops = count_hops(store)
        page = await store.list("job", limit=10, order="asc")
        assert hops == ([] if inline else ["list"])
        assert [cp.id for cp in page.items] == [*(cp.id for cp in saved), after.id]
        assert [s.id for s in page.skipped] == [bad.id]
        with pytest.raises(CheckpointDecodeError) as strict:
            await store.load(bad.id)
        assert page.skipped[0].reason == strict.value.reason
        assert page.skipped[0].sequence == bad.sequence


async def test_load_many_of_one_id_takes_no_hop(tmp_path: Path) -> None:
    """One id is the cheap read load() is: on the loop's thread, with load()'s
    answers (and the worker's, for what it leaves to the worker); more ids are
    one pass in the worker."""
    async with FileCheckpointStore(tmp_path / "s") as store:
        a, b = await store.save("job", {"n": 1}), await store.save("job", {"n": 2})
        assert await store.delete(b.id)
        hops = count_hops(store)
        assert (await store.load_many([a.id]))[a.id].state == {"n": 1}
        assert await store.load_many([b.id]) == {}
        assert await store.load_many(["no-such-id"]) == {}
        assert hops == []
        assert set(await store.load_many([a.id, b.id])) == {a.id}
        assert hops == ["load_many"]
        # a damaged record: the worker's read raises, as load() does
        path = tmp_path / "s" / "records" / f"{a.sequence // 1000:017d}"
        record = path / f"{a.sequence:020d}.{a.id}.ckpt"
        record.write_bytes(record.read_bytes()[:40])
        with pytest.raises(CheckpointDecodeError) as many:
            await store.load_many([a.id])
        with pytest.raises(CheckpointDecodeError) as one:
            await store.load(a.id)
        assert str(many.value) == str(one.value)
        assert hops[-2:] == ["load", "load"]  # one id: load_many reads it as load does
