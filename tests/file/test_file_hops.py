"""Worker hops of the file backend's reads: one per listed page (the page scan
runs, in the same hop, the probe that decides the other cursor), with the same
pages and cursors as two hops gave; none for a page of one stream with
``inline_reads`` (the default), which scans and probes on the event loop's thread
and keeps the probe the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
from file_helpers import count_hops

from statekeeper.backends.file import FileCheckpointStore

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=[False, True], ids=["hop", "inline"])
def inline(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def page_hops(inline: bool, stream: str | None = "s") -> list[str]:
    """The hops of one listed page: none inline (a global listing always hops)."""
    return [] if inline and stream is not None else ["list"]


@pytest.mark.parametrize("stream", ["s", None])
@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_one_hop_per_page_forward_and_back(
    tmp_path: Path, stream: str | None, order: str, inline: bool
) -> None:
    one = page_hops(inline, stream)
    async with FileCheckpointStore(tmp_path / "store", inline_reads=inline) as store:
        saved = [await store.save("s", {"i": i}) for i in range(23)]  # 5 pages of 5
        await store.save("other", {"x": 1}) if stream is None else None
        want = [cp.id for cp in saved]
        if stream is None:
            want.append((await store.get_latest("other")).id)  # type: ignore[union-attr]
        if order == "desc":
            want.reverse()
        hops = count_hops(store)
        got: list[str] = []
        pages = []
        cursor = None
        while True:
            before = len(hops)
            page = await store.list(stream, order=order, limit=5, after=cursor)  # type: ignore[arg-type]
            assert hops[before:] == one, hops[before:]
            pages.append(page)
            got += [cp.id for cp in page.items]
            assert (page.prev_cursor is None) == (cursor is None)
            cursor = page.next_cursor
            if cursor is None:
                break
        assert got == want
        # past the end: with the last page deleted, the page after the cursor that
        # led to it is empty, and its prev_cursor leads back
        for cp in pages[-1].items:
            await store.delete(cp.id)
        want = want[: -len(pages[-1].items)]
        before = len(hops)
        empty = await store.list(stream, order=order, limit=5, after=pages[-2].next_cursor)  # type: ignore[arg-type]
        assert hops[before:] == one and empty.items == []
        assert empty.next_cursor is None and empty.prev_cursor is not None
        # and back again with before=, one hop a page
        back: list[str] = []
        cursor = empty.prev_cursor
        while cursor is not None:
            before = len(hops)
            page = await store.list(stream, order=order, limit=5, before=cursor)  # type: ignore[arg-type]
            assert hops[before:] == one, hops[before:]
            # nothing follows the first page back (the last ones were deleted)
            assert (page.next_cursor is None) == (not back)
            back = [cp.id for cp in page.items] + back
            cursor = page.prev_cursor
        assert back == want


async def test_a_page_and_its_probe_share_one_hop_and_see_later_saves(
    tmp_path: Path, inline: bool
) -> None:
    async with FileCheckpointStore(tmp_path / "store", inline_reads=inline) as store:
        for i in range(12):
            await store.save("s", {"i": i})
        first = await store.list("s", order="asc", limit=5)
        hops = count_hops(store)
        page = await store.list("s", order="asc", limit=5, after=first.next_cursor)
        assert hops == page_hops(inline)
        # a save in between: the next page sees it and its cursors are fresh
        await store.save("s", {"i": 12})
        hops.clear()
        nxt = await store.list("s", order="asc", limit=5, after=page.next_cursor)
        assert hops == page_hops(inline)
        assert [cp.state["i"] for cp in nxt.items] == [10, 11, 12]
        assert nxt.prev_cursor is not None and nxt.next_cursor is None


async def test_empty_pages_past_the_start_stay_one_hop(tmp_path: Path, inline: bool) -> None:
    # Walking before= past the start of a filtered stream: every page is empty and
    # its next_cursor sits at position 0. The page's hop must have probed exactly
    # where list_page asks next (both take it from _paging.probe_bound).
    async with FileCheckpointStore(tmp_path / "store", inline_reads=inline) as store:
        first = await store.save("s", {"i": 0})
        await store.save("s", {"i": 1}, tags={"k": "a"})
        cursor = await store.cursor_at(first.id, order="asc", tags={"k": "a"})
        hops = count_hops(store)
        for _ in range(3):
            before = len(hops)
            page = await store.list("s", order="asc", limit=2, tags={"k": "a"}, before=cursor)
            assert hops[before:] == page_hops(inline), hops[before:]
            assert page.items == [] and page.next_cursor is not None
            cursor = page.next_cursor
