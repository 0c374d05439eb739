"""Kit tests for positions and filters (SPEC S14): ``cursor_at``, ``list(metadata=)``
and ``update`` with edits. ``list_streams(prefix=)`` and ``codec="raw"`` are in
``_codec_tests.py``."""

from __future__ import annotations

from typing import Any

import pytest

from .._core.interface import Order
from .._core.store import BaseCheckpointStore
from ..errors import (
    CheckpointEncodeError,
    CheckpointNotFound,
    InvalidCursor,
    InvalidQuery,
    PreconditionFailed,
)
from ..models import Checkpoint
from ._base import FakeClock, KitBase, ids
from ._pages import PageBound

asyncio_test = pytest.mark.asyncio(loop_scope="function")
ORDERS: tuple[Order, ...] = ("asc", "desc")

#: Metadata of the filter tests' checkpoints, by name: JSON kinds that a filter must
#: keep apart although Python's ``==`` (or a loosely typed column) does not.
KINDS: dict[str, dict[str, Any]] = {
    "true": {"a": True},
    "one": {"a": 1},
    "one-float": {"a": 1.0},
    "null": {"a": None},
    "missing": {},
    "string-one": {"a": "1"},
    "true-and-b": {"a": True, "b": "x"},
    "list": {"a": [1]},
    "object": {"a": {"b": "x"}},
    "only-b-null": {"b": None},
    "false": {"a": False},
    "zero": {"a": 0},
    "empty-string": {"a": ""},
    "big": {"a": 2**53 + 1},
}

#: Filter -> the names in :data:`KINDS` it keeps.
FILTERS: list[tuple[dict[str, Any], list[str]]] = [
    ({"a": True}, ["true", "true-and-b"]),
    ({"a": 1}, ["one"]),
    ({"a": 1.0}, ["one-float"]),
    ({"a": None}, ["null"]),
    ({"b": None}, ["only-b-null"]),
    ({"a": "1"}, ["string-one"]),
    ({"a": False}, ["false"]),
    ({"a": 0}, ["zero"]),
    ({"a": ""}, ["empty-string"]),
    ({"a": 2**53 + 1}, ["big"]),
    ({"a": 2**53}, []),
    ({"a": True, "b": "x"}, ["true-and-b"]),
    ({"a": True, "b": None}, []),
    ({"c": None}, []),
    ({}, list(KINDS)),
]


class FilterTests(KitBase):
    # -- cursor_at ----------------------------------------------------------------------

    async def _interleaved(self, store: BaseCheckpointStore) -> list[Checkpoint]:
        """Ten checkpoints of ``job`` (tags and metadata alternating) between saves to
        another stream, so that their sequences are not contiguous."""
        saved = []
        for i in range(10):
            kind = "a" if i % 3 == 0 else "b"
            await store.save("other", {"i": i}, tags={"kind": kind}, metadata={"even": True})
            saved.append(
                await store.save(
                    "job", {"i": i}, tags={"kind": kind}, metadata={"even": i % 2 == 0}
                )
            )
        return saved

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_cursor_at_marks_the_position_of_a_checkpoint(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        saved = await self._interleaved(store)
        listed = ids(saved) if order == "asc" else ids(saved)[::-1]
        for at, cid in enumerate(listed):
            cursor = await store.cursor_at(cid, order=order)
            after = await store.list("job", limit=3, order=order, after=cursor)
            assert ids(after) == listed[at + 1 : at + 4], f"after= the cursor of item {at}"
            assert after.has_more == (at + 4 < len(listed))
            before = await store.list("job", limit=3, order=order, before=cursor)
            assert ids(before) == listed[max(at - 3, 0) : at], f"before= the cursor of item {at}"
            assert (before.prev_cursor is not None) == (at > 3)

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_cursor_at_with_filters(self, store: BaseCheckpointStore, order: Order) -> None:
        """The checkpoint need not match the filters: its cursor marks a position."""
        await self.require_metadata_filters(store)
        saved = await self._interleaved(store)
        listed = saved if order == "asc" else saved[::-1]
        queries: list[dict[str, Any]] = [
            {"tags": {"kind": "a"}},
            {"metadata": {"even": True}},
            {"tags": {"kind": "b"}, "metadata": {"even": False}},
        ]
        for query in queries:

            def matches(cp: Checkpoint, query: dict[str, Any] = query) -> bool:
                tags: dict[str, str] = query.get("tags", {})
                metadata: dict[str, Any] = query.get("metadata", {})
                return tags.items() <= cp.tags.items() and metadata.items() <= cp.metadata.items()

            for at, cp in enumerate(listed):
                cursor = await store.cursor_at(cp.id, order=order, **query)
                later = [c.id for c in listed[at + 1 :] if matches(c)]
                earlier = [c.id for c in listed[:at] if matches(c)]
                after = await store.list("job", limit=2, order=order, after=cursor, **query)
                assert ids(after) == later[:2], (query, at)
                before = await store.list("job", limit=2, order=order, before=cursor, **query)
                assert ids(before) == earlier[-2:], (query, at)

    @asyncio_test
    async def test_cursor_at_is_bound_to_its_query(self, store: BaseCheckpointStore) -> None:
        await self.require_metadata_filters(store)
        a, b, c = await self.save_steps(store, "job", 3, tags={"k": "v"}, metadata={"a": True})
        cursor = await store.cursor_at(b.id, metadata={"a": True})
        assert ids(await store.list("job", after=cursor, metadata={"a": True})) == [a.id]
        mismatched: list[tuple[str | None, dict[str, Any]]] = [
            ("job", {"metadata": {"a": 1}}),
            ("job", {"metadata": {"a": "True"}}),
            ("job", {}),
            ("job", {"metadata": {"a": True}, "tags": {"k": "v"}}),
            ("job", {"metadata": {"a": True}, "order": "asc"}),
            (None, {"metadata": {"a": True}}),
            ("other", {"metadata": {"a": True}}),
        ]
        for stream, query in mismatched:
            for key in ("after", "before"):
                position: dict[str, Any] = {key: cursor}
                with pytest.raises(InvalidCursor):
                    await store.list(stream, **position, **query)
        tagged = await store.cursor_at(b.id, order="asc", tags={"k": "v"})
        assert ids(await store.list("job", order="asc", after=tagged, tags={"k": "v"})) == [c.id]
        with pytest.raises(InvalidCursor):
            await store.list("job", order="asc", after=tagged)

    @asyncio_test
    async def test_cursor_at_outlives_its_checkpoint(self, store: BaseCheckpointStore) -> None:
        saved = await self.save_steps(store, "job", 5)
        cursor = await store.cursor_at(saved[2].id, order="asc")
        assert await store.delete(saved[2].id)
        assert await store.delete(saved[3].id)
        assert ids(await store.list("job", order="asc", after=cursor)) == [saved[4].id]
        assert ids(await store.list("job", order="asc", before=cursor)) == ids(saved[:2])
        with pytest.raises(CheckpointNotFound):
            await store.cursor_at(saved[2].id)
        store = await self.reopen(store)
        assert ids(await store.list("job", order="asc", after=cursor)) == [saved[4].id]

    @asyncio_test
    async def test_cursor_at_refuses_unknown_ids_and_bad_queries(
        self, store: BaseCheckpointStore
    ) -> None:
        cp = await store.save("job", {})
        with pytest.raises(CheckpointNotFound):
            await store.cursor_at("never-saved")
        bad_calls: list[dict[str, Any]] = [
            {"id": "a b"},
            {"id": 7},
            {"order": "ASC"},
            {"tags": {"k": 1}},
            {"metadata": {"m": [1]}},
            {"metadata": {"m": {"x": 1}}},
        ]
        for call in bad_calls:
            with pytest.raises(InvalidQuery):
                await store.cursor_at(**{"id": cp.id, **call})

    # -- list(metadata=) ----------------------------------------------------------------

    async def _kinds(self, store: BaseCheckpointStore) -> dict[str, Checkpoint]:
        saved = {}
        for i, (name, metadata) in enumerate(KINDS.items()):
            tags = {"half": str(i % 2)}
            saved[name] = await store.save(
                f"s{i % 2}", {"name": name}, tags=tags, metadata=metadata
            )
        return saved

    @asyncio_test
    async def test_metadata_filter_matches_by_json_kind_and_value(
        self, store: BaseCheckpointStore
    ) -> None:
        """``True`` is not ``1``, ``1`` is not ``1.0``, ``None`` matches null and never
        a missing key, and a key with a nested value never equals a scalar."""
        await self.require_metadata_filters(store)
        saved = await self._kinds(store)
        for query, names in FILTERS:
            want = [saved[name] for name in names]
            for stream in (None, "s0", "s1"):
                for tags in (None, {"half": "1"}):
                    page = await store.list(
                        stream, order="asc", limit=100, metadata=query, tags=tags
                    )
                    expected = [
                        cp.id
                        for cp in want
                        if stream in (None, cp.stream) and (tags or {}).items() <= cp.tags.items()
                    ]
                    assert ids(page) == expected, (query, stream, tags)
                    assert (page.has_more, page.skipped) == (False, [])
        store = await self.reopen(store)
        page = await store.list(None, metadata={"a": True}, order="asc")
        assert ids(page) == [saved["true"].id, saved["true-and-b"].id]

    @asyncio_test
    async def test_metadata_filter_values_must_be_scalars(self, store: BaseCheckpointStore) -> None:
        await store.save("job", {}, metadata={"a": [1]})
        bad: list[Any] = [
            {"a": [1]},
            {"a": {"b": 1}},
            {"a": (1,)},
            {"a": {1}},
            {"a": b"x"},
            {"a": float("nan")},
            {"a": float("inf")},
            {1: "x"},
            {"": "x"},
            "a=1",
            [("a", 1)],
        ]
        for metadata in bad:
            with pytest.raises(InvalidQuery):
                await store.list("job", metadata=metadata)

    @asyncio_test
    @pytest.mark.parametrize("order", ORDERS)
    async def test_paging_a_metadata_filter_neither_repeats_nor_skips(
        self, store: BaseCheckpointStore, order: Order
    ) -> None:
        await self.require_metadata_filters(store)
        saved = [
            await store.save(
                "job", {"i": i}, metadata={"m": i % 3 == 0, "n": i}, tags={"t": str(i % 2)}
            )
            for i in range(40)
        ]
        for query, tags in (({"m": True}, None), ({"m": False}, {"t": "1"}), ({"n": 7}, None)):
            want = [
                cp.id
                for cp in saved
                if query.items() <= cp.metadata.items() and (tags or {}).items() <= cp.tags.items()
            ]
            want = want if order == "asc" else want[::-1]
            for limit in (1, 2, 5, 100):
                pages = await self.walk(
                    store, "job", limit=limit, order=order, tags=tags, metadata=query
                )
                assert [cid for p in pages for cid in ids(p)] == want, (query, limit)
                back = [pages[-1]]
                bound = PageBound(len(pages), follows="prev_cursor")
                while back[-1].prev_cursor is not None:
                    bound.turn(back[-1].prev_cursor)
                    back.append(
                        await store.list(
                            "job",
                            limit=limit,
                            order=order,
                            tags=tags,
                            metadata=query,
                            before=back[-1].prev_cursor,
                        )
                    )
                assert [ids(p) for p in reversed(back)] == [ids(p) for p in pages], (query, limit)

    @asyncio_test
    async def test_filtered_listing_reports_damaged_records(
        self, store: BaseCheckpointStore
    ) -> None:
        self.require_raw_access(store)
        await self.require_metadata_filters(store)
        good, bad, plain = (
            await store.save("job", {}, metadata={"m": 1}),
            await store.save("job", {}, metadata={"m": 1}),
            await store.save("job", {}, metadata={"m": 2}),
        )
        await store.backdoor_write_raw(bad.id, b"garbage")
        page = await store.list("job", metadata={"m": 1}, order="asc")
        assert ids(page) == [good.id]
        assert [s.id for s in page.skipped] == [bad.id], "a filter hid an unreadable record"
        assert plain.id not in ids(page)

    # -- update(tags=, metadata=, parent_id=) ---------------------------------------------

    @asyncio_test
    async def test_update_replaces_tags_metadata_and_parent(
        self, store: BaseCheckpointStore
    ) -> None:
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        first, second = await self.save_steps(store, "job", 2)
        cp = await store.save(
            "job", {"v": 1}, tags={"kind": "a"}, metadata={"m": 1}, parent_id=first.id
        )
        last = await store.save("job", {"v": "last"}, tags={"kind": "b"})
        clock.advance(3)
        up = await store.update(
            cp.id,
            {"v": 2},
            tags={"kind": "b"},
            metadata={"m": True, "new": None},
            parent_id=second.id,
        )
        assert (up.id, up.stream, up.sequence, up.created_at) == (
            cp.id,
            cp.stream,
            cp.sequence,
            cp.created_at,
        )
        assert (up.tags, up.metadata, up.parent_id) == (
            {"kind": "b"},
            {"m": True, "new": None},
            second.id,
        )
        assert up.etag != cp.etag
        assert up.updated_at == clock.now > cp.updated_at
        assert (await store.load(cp.id)).header() == up.header()
        # filters see the new fields at once, at the checkpoint's old position
        assert (await self.filtered_ids(store, "job", tags={"kind": "a"})) == []
        assert (await self.filtered_ids(store, "job", tags={"kind": "b"})) == [last.id, cp.id]
        assert (await self.filtered_ids(store, "job", metadata={"m": 1})) == []
        assert (await self.filtered_ids(store, "job", metadata={"m": True})) == [cp.id]
        assert (await self.filtered_ids(store, "job", metadata={"new": None})) == [cp.id]
        latest = await store.get_latest("job")
        assert latest is not None
        assert latest.id == last.id, "an update with edits moved the checkpoint"
        # None keeps a field; an empty mapping clears it
        kept = await store.update(cp.id, {"v": 3})
        assert (kept.tags, kept.metadata, kept.parent_id) == (up.tags, up.metadata, second.id)
        cleared = await store.update(cp.id, {"v": 4}, tags={}, metadata={})
        assert (cleared.tags, cleared.metadata, cleared.parent_id) == ({}, {}, second.id)
        assert (await self.filtered_ids(store, "job", tags={"kind": "b"})) == [last.id]
        assert (await self.filtered_ids(store, "job", metadata={"m": True})) == []
        store = await self.reopen(store, clock=clock)
        assert (await store.load(cp.id)).header() == cleared.header()
        assert (await self.filtered_ids(store, "job", tags={"kind": "b"})) == [last.id]

    @asyncio_test
    async def test_update_with_edits_is_a_compare_and_set(self, store: BaseCheckpointStore) -> None:
        cp = await store.save("job", {"v": 1}, tags={"kind": "a"}, metadata={"m": 1})
        mine = await store.update(cp.id, {"v": 2}, if_match=cp.etag, tags={"kind": "b"})
        with pytest.raises(PreconditionFailed):
            await store.update(cp.id, {"v": 3}, if_match=cp.etag, metadata={"m": 2})
        refused: list[tuple[type[Exception], dict[str, Any]]] = [
            (InvalidQuery, {"tags": {"kind": 1}}),
            (InvalidQuery, {"parent_id": "a b"}),
            (CheckpointEncodeError, {"metadata": {"m": (1, 2)}}),
            (CheckpointEncodeError, {"metadata": {"$sk": "x"}}),
        ]
        for error, edits in refused:
            with pytest.raises(error):
                await store.update(cp.id, {"v": 3}, **edits)
        loaded = await store.load(cp.id)
        assert loaded.header() == mine.header()
        assert (await self.filtered_ids(store, "job", metadata={"m": 1}, tags={"kind": "b"})) == [
            cp.id
        ]
        with pytest.raises(CheckpointNotFound):
            await store.update("never-saved", {}, tags={"k": "v"})
