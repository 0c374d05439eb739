"""Kit tests for tolerant, cursor-paged listing (S4)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from .._core.interface import Order
from .._core.store import BaseCheckpointStore
from ..backends.memory import MemoryCheckpointStore
from ..errors import InvalidCursor, InvalidQuery
from ..models import Checkpoint, CheckpointHeader, Page
from ._base import KitBase, ids
from ._pages import PageBound, checkpoints_in

asyncio_test = pytest.mark.asyncio(loop_scope="function")
ORDERS: tuple[Order, ...] = ("asc", "desc")


def in_order(saved: list[Checkpoint], order: str) -> list[str]:
    """The ids of ``saved`` (in save order) as a listing in ``order`` returns them."""
    out = [cp.id for cp in saved]
    return out if order == "asc" else out[::-1]


def check_page_shape(page: Page) -> None:
    assert page.has_more == (page.next_cursor is not None), (
        "has_more must be true exactly when next_cursor is not None"
    )


class ListTests(KitBase):
    @asyncio_test
    async def test_empty_listing_has_no_cursors(self, store: BaseCheckpointStore) -> None:
        for stream in ("nothing-here", None):
            for order in ORDERS:
                page = await store.list(stream, order=order)
                assert (page.items, page.skipped) == ([], [])
                assert (page.next_cursor, page.prev_cursor, page.has_more) == (None, None, False)

    @asyncio_test
    async def test_global_listing_orders_every_stream_by_sequence(
        self, store: BaseCheckpointStore
    ) -> None:
        saved = [await store.save(f"s{i % 3}", {"i": i}) for i in range(8)]
        for order in ORDERS:
            page = await store.list(None, order=order, limit=100)
            assert ids(page) == in_order(saved, order)
            pages = await self.walk(store, None, limit=3, order=order)
            assert [cid for p in pages for cid in ids(p)] == in_order(saved, order)

    @asyncio_test
    async def test_listings_at_once_each_see_every_checkpoint_once(
        self, store: BaseCheckpointStore
    ) -> None:
        """Listings of every stream that run at once (on a backend's threads or
        connections side by side) each return every checkpoint once, in order: none
        may see another's progress through a shared cursor or descriptor."""
        saved = [await store.save(f"s{i % 3}", {"i": i}) for i in range(24)]
        orders = ORDERS * 4
        pages = await asyncio.gather(
            *(store.list(None, order=order, limit=100, include_state=False) for order in orders)
        )
        for page, order in zip(pages, orders, strict=True):
            assert ids(page) == in_order(saved, order)

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_walking_forward_visits_each_item_once_in_order(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        saved = await self.save_steps(store, "job", 10)
        for limit in (1, 2, 3, 4, 9, 10, 11, 1000):
            pages = await self.walk(store, "job", limit=limit, order=order)
            assert [cid for p in pages for cid in ids(p)] == in_order(saved, order), limit
            assert pages[0].prev_cursor is None, "the first page has no previous page"
            assert pages[-1].next_cursor is None
            for page in pages:
                check_page_shape(page)
            for page in pages[1:]:
                assert page.prev_cursor is not None, "a later page must lead back"
            assert all(len(p.items) == limit for p in pages[:-1]), "only the last page is short"

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_walking_backward_retraces_the_forward_pages(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        await self.save_steps(store, "job", 10)
        for limit in (1, 3, 4, 10):
            forward = await self.walk(store, "job", limit=limit, order=order)
            back = [forward[-1]]
            bound = PageBound(len(forward), follows="prev_cursor")
            while back[-1].prev_cursor is not None:
                bound.turn(back[-1].prev_cursor)
                back.append(
                    await store.list(
                        "job",
                        limit=limit,
                        order=order,
                        before=back[-1].prev_cursor,
                    )
                )
            assert [ids(p) for p in reversed(back)] == [ids(p) for p in forward], limit
            for page in back:
                check_page_shape(page)

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_seed_before_returns_adjacent_page_not_start(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        saved = in_order(await self.save_steps(store, "job", 10), order)
        pages = await self.walk(store, "job", limit=3, order=order)
        assert ids(pages[2]) == saved[6:9]
        before = await store.list("job", limit=3, order=order, before=pages[2].prev_cursor)
        assert ids(before) == saved[3:6], "before= must give the adjacent preceding page"
        assert ids(before) != saved[:3], "before= returned the start of the stream"
        again = await store.list("job", limit=3, order=order, after=before.next_cursor)
        assert ids(again) == saved[6:9], "next_cursor of a before= page leads back forward"
        check_page_shape(before)
        assert before.has_more

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_short_before_page_at_the_start_has_no_prev_cursor(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        saved = in_order(await self.save_steps(store, "job", 6), order)
        two = await store.list("job", limit=2, order=order)
        three = await store.list("job", limit=3, order=order, after=two.next_cursor)
        assert ids(three) == saved[2:5]
        head = await store.list("job", limit=3, order=order, before=three.prev_cursor)
        assert ids(head) == saved[:2], "before= gives the items nearest to the cursor"
        assert head.prev_cursor is None
        tail = await store.list("job", limit=3, order=order, after=three.next_cursor)
        assert (ids(tail), tail.next_cursor, tail.has_more) == (saved[5:], None, False)

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_empty_pages_past_either_end_keep_valid_cursors(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        await self.require_metadata_filters(store)
        # A filtered-out checkpoint at the very start (or end) of the stream: the page
        # before its cursor is empty, and so is the page before that page's next_cursor.
        # Each empty page's cursors must still be cursors (regression: the second
        # before= step made a position below 0 and list() crashed packing it).
        [first] = await self.save_steps(store, "job", 1)
        kept = await store.save("job", {"step": 1}, tags={"kind": "a"})
        [last] = await self.save_steps(store, "job", 1, start=2)
        edge = first if order == "asc" else last
        cursor = await store.cursor_at(edge.id, order=order, tags={"kind": "a"})
        # Enough steps to walk the position past 0 (or past the top) whatever the
        # store's first sequence is.
        for _ in range(min(edge.sequence, 50) + 3):
            page = await store.list("job", limit=1, order=order, tags={"kind": "a"}, before=cursor)
            assert (ids(page), page.prev_cursor) == ([], None)
            assert page.next_cursor is not None and page.has_more
            cursor = page.next_cursor
        forward = await store.list("job", limit=1, order=order, tags={"kind": "a"}, after=cursor)
        assert (ids(forward), forward.next_cursor) == ([kept.id], None)

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_seed_cursor_of_deleted_item_resumes_at_its_position(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        saved = in_order(await self.save_steps(store, "job", 9), order)
        first = await store.list("job", limit=3, order=order)
        second = await store.list("job", limit=3, order=order, after=first.next_cursor)
        # The items the cursors were taken at, and one neighbour each, go away.
        for cid in (saved[2], saved[3], saved[5], saved[6]):
            assert await store.delete(cid)
        resumed = await store.list("job", limit=3, order=order, after=first.next_cursor)
        assert ids(resumed) == [saved[4], saved[7], saved[8]], "did not resume at the position"
        tail = await store.list("job", limit=3, order=order, after=second.next_cursor)
        assert ids(tail) == saved[7:9]
        back = await store.list("job", limit=3, order=order, before=second.next_cursor)
        assert ids(back) == [saved[0], saved[1], saved[4]]
        back = await store.list("job", limit=3, order=order, before=second.prev_cursor)
        assert ids(back) == saved[:2]
        store = await self.reopen(store)
        resumed = await store.list("job", limit=3, order=order, after=first.next_cursor)
        assert ids(resumed) == [saved[4], saved[7], saved[8]], "a cursor must survive reopening"

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_seed_cursor_of_filtered_out_item_resumes_at_its_position(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        """Positions are resolved before tag filtering: a filtered cursor resumes at its
        sequence position although its neighbours never matched the filter and its own
        item was deleted and re-created with tags that no longer match."""
        await self.require_metadata_filters(store)
        kinds = ["a", "b", "b", "a", "b", "a", "a", "b"]
        saved = [
            await store.save("job", {"i": i}, tags={"kind": k}, id=f"item-{i}")
            for i, k in enumerate(kinds)
        ]
        match = in_order([cp for cp in saved if cp.tags == {"kind": "a"}], order)
        q: dict[str, Any] = {"limit": 1, "order": order, "tags": {"kind": "a"}}
        pages = await self.walk(store, "job", **q)
        assert [ids(p) for p in pages] == [[cid] for cid in match]
        cursor_at = {ids(p)[0]: p.next_cursor for p in pages}
        # Re-create the second match with other tags: it moves to the end and is filtered
        # out, and its old position holds nothing.
        moved = match[1]
        assert await store.delete(moved)
        await store.save("job", {"moved": True}, tags={"kind": "b"}, id=moved)
        await store.save("job", {"late": True}, tags={"kind": "b"})
        rest = [cid for cid in match if cid != moved]
        after_moved = await store.list("job", after=cursor_at[moved], **q)
        assert ids(after_moved) == rest[1:2]
        before_moved = await store.list("job", before=cursor_at[moved], **q)
        assert ids(before_moved) == rest[:1]
        from_first = await self.walk_from(store, "job", cursor_at[match[0]], **q)
        assert from_first == rest[1:]

    async def walk_from(
        self, store: BaseCheckpointStore, stream: str, cursor: str | None, **query: Any
    ) -> list[str]:
        out: list[str] = []
        bound = PageBound(await checkpoints_in(store))
        while cursor is not None:
            bound.turn(cursor)
            page = await store.list(stream, after=cursor, **query)
            out += ids(page)
            cursor = page.next_cursor
        return out

    @asyncio_test
    async def test_foreign_forged_and_mismatched_cursors_raise_invalid_cursor(
        self, store: BaseCheckpointStore
    ) -> None:
        await self.save_steps(store, "job", 5, tags={"kind": "a"})
        await self.save_steps(store, "other", 2)
        cursor = (await store.list("job", limit=2)).next_cursor
        assert cursor is not None
        async with MemoryCheckpointStore() as foreign:
            await self.save_steps(foreign, "job", 5)
            foreign_cursor = (await foreign.list("job", limit=2)).next_cursor
        assert foreign_cursor is not None
        forged = [
            cursor[:i] + ("A" if cursor[i] != "A" else "B") + cursor[i + 1 :]
            for i in (0, 5, 11, -1)
        ]
        bad: list[Any] = [
            foreign_cursor,
            cursor[:-2],
            cursor + "AA",
            "garbage",
            "",
            "!!!!",
            42,
            *forged,
        ]
        for value in bad:
            for key in ("after", "before"):
                with pytest.raises(InvalidCursor):
                    await store.list("job", limit=2, **{key: value})
        mismatched: list[dict[str, Any]] = [
            {"stream": "other"},
            {"stream": None},
            {"stream": "job", "order": "asc"},
            {"stream": "job", "tags": {"kind": "a"}},
        ]
        for query in mismatched:
            stream = query.pop("stream")
            # where tags are sealed, the tag filter itself is refused first
            sealed = "tags" in query and self.seals_metadata(store)
            with pytest.raises(InvalidQuery if sealed else InvalidCursor):
                await store.list(stream, limit=2, after=cursor, **query)
        with pytest.raises(InvalidQuery):
            await store.list("job", limit=2, after=cursor, before=cursor)
        assert len((await store.list("job", limit=2, after=cursor)).items) == 2

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_paging_while_the_stream_grows_neither_repeats_nor_skips(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        saved = await self.save_steps(store, "job", 7)
        seen: list[str] = []
        page = await store.list("job", limit=3, order=order)
        # Each page reads 3 and 2 are saved after it: the unread part shrinks by one
        # a page, so the stream's first 7 bound the walk; a cursor that does not move
        # on (each page starting again at its cursor's item) would page for ever.
        bound = PageBound(len(saved))
        while True:
            seen += ids(page)
            saved += await self.save_steps(store, "job", 2, start=len(saved))
            if page.next_cursor is None:
                break
            bound.turn(page.next_cursor)
            page = await store.list("job", limit=3, order=order, after=page.next_cursor)
        assert len(seen) == len(set(seen)), "an item was listed twice"
        if order == "asc":
            # Everything committed before the last page was read is reached, in order.
            assert seen == [cp.id for cp in saved[: len(seen)]]
            assert len(seen) >= 7
        else:
            assert seen == [cp.id for cp in reversed(saved[:7])], "an existing item was skipped"

    @asyncio_test
    async def test_tag_filter_requires_every_given_tag(self, store: BaseCheckpointStore) -> None:
        await self.require_metadata_filters(store)
        tagsets: list[dict[str, str]] = [
            {"a": "1"},
            {"a": "1", "b": "2"},
            {"b": "2"},
            {"a": "1", "b": "3"},
            {},
            {"a": "10"},
            {"A": "1"},
        ]
        saved = [await store.save(f"s{i % 2}", {"i": i}, tags=t) for i, t in enumerate(tagsets)]

        def expected(query: dict[str, str], stream: str | None) -> list[str]:
            return [
                cp.id
                for cp in saved
                if query.items() <= cp.tags.items() and stream in (None, cp.stream)
            ]

        for query in ({"a": "1"}, {"a": "1", "b": "2"}, {"b": "2"}, {"c": "1"}, {"a": ""}, {}):
            for stream in (None, "s0", "s1"):
                page = await store.list(stream, order="asc", tags=query, limit=100)
                assert ids(page) == expected(query, stream), (query, stream)
                walked = await self.walk(store, stream, limit=1, tags=query)
                assert [cid for p in walked for cid in ids(p)] == expected(query, stream)

    @asyncio_test
    async def test_every_read_without_state_gives_headers(self, store: BaseCheckpointStore) -> None:
        """One rule for every read with ``include_state=False`` (``load``, ``load_many``,
        ``list``): each item is a :class:`CheckpointHeader`, with no ``state`` at all,
        so it cannot be taken for a stored ``None`` (list and load_many once gave
        checkpoints with ``state=None``, and load a header)."""
        await self.save_steps(store, "job", 2, tags={"k": "v"}, metadata={"m": [1]})
        await store.save("job", None)
        full = await store.list("job")
        assert [cp.state for cp in full.items] == [None, {"step": 1}, {"step": 0}]
        bare = await store.list("job", include_state=False)
        many = await store.load_many(ids(full), include_state=False)
        one = [await store.load(cid, include_state=False) for cid in ids(full)]
        for read, headers in (("list", bare.items), ("load_many", many.values()), ("load", one)):
            got = list(headers)
            assert [type(h) for h in got] == [CheckpointHeader] * 3, read
            assert not any(hasattr(h, "state") for h in got), f"{read} gave a state"
            assert got == [cp.header() for cp in full.items], read

    @asyncio_test
    async def test_limit_one_and_limit_1000_are_accepted(self, store: BaseCheckpointStore) -> None:
        saved = await self.save_steps(store, "job", 3)
        one = await store.list("job", limit=1, order="asc")
        assert (ids(one), one.has_more) == ([saved[0].id], True)
        every = await store.list("job", limit=1000, order="asc")
        assert (ids(every), every.has_more, every.next_cursor) == (ids(saved), False, None)
