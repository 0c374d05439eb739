"""Kit tests for sequence (S1), and identity and names (S2).

Update (S6), delete (S7) and the store lifecycle are in ``_write_tests.py``."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from .._core.store import BaseCheckpointStore
from ..backends.memory import MemoryCheckpointStore
from ..errors import (
    InvalidQuery,
    PreconditionFailed,
)
from ._base import FakeClock, KitBase, ids

asyncio_test = pytest.mark.asyncio(loop_scope="function")

#: Stream names that a path- or key-based backend could get wrong. Every one of
#: them must be a stream of its own, and none may reach outside the store.
TRICKY_STREAMS = (
    "plain",
    "..",
    ".",
    "/",
    "a/b",
    "a/../b",
    "/etc/passwd",
    "C:\\Windows\\win.ini",
    "a b\tc\nd",
    "%2e%2e%2f",
    "*",
    "a%",
    "a_",
    "A",
    "a",
    "'; DROP TABLE checkpoints; --",
    "ünïcødé 流 🚀",
    "x" * 512,
)

BAD_STREAMS: tuple[Any, ...] = ("", "x" * 513, "a\x00b", "\ud800", 42, None, b"bytes")
BAD_IDS: tuple[Any, ...] = ("", "a b", "a/b", "x" * 201, "ü", "a\x00", 7, b"id")
BAD_LIMITS: tuple[Any, ...] = (0, -1, 1001, True, 1.5, "10", None)
BAD_ORDERS: tuple[Any, ...] = ("ASC", "ascending", "", None, 1)
ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")


class CoreTests(KitBase):
    # -- S1: the creation sequence -----------------------------------------------------

    @asyncio_test
    async def test_sequences_strictly_increase_across_streams(
        self, store: BaseCheckpointStore
    ) -> None:
        saved = [await store.save(f"s{i % 3}", {"i": i}) for i in range(9)]
        seqs = [cp.sequence for cp in saved]
        assert all(s >= 1 for s in seqs)
        assert seqs == sorted(set(seqs)), f"sequences are not strictly increasing: {seqs}"

    @asyncio_test
    async def test_seed_save_delete_save_never_reuses_sequence(
        self, store: BaseCheckpointStore
    ) -> None:
        first, newest = await self.save_steps(store, "job", 2)
        assert await store.delete(newest.id)
        again = await store.save("job", {"step": 2})
        assert again.sequence > newest.sequence, (
            f"sequence {again.sequence} after deleting sequence {newest.sequence}: the "
            "high-water mark was forgotten (max(existing)+1)"
        )
        await store.delete(first.id)
        await store.delete(again.id)
        last = await store.save("job", {"step": 3})
        assert last.sequence > again.sequence

    @asyncio_test
    async def test_high_water_mark_survives_reopen(self, store: BaseCheckpointStore) -> None:
        kept, *gone = await self.save_steps(store, "job", 3)
        for cp in gone:
            assert await store.delete(cp.id)
        store = await self.reopen(store)
        assert (await store.load(kept.id)).state == {"step": 0}
        after = await store.save("job", {"step": 3})
        assert after.sequence > gone[-1].sequence, "a sequence was reused after reopening"

    @asyncio_test
    async def test_sequence_never_reused_after_delete_stream_and_prune(
        self, store: BaseCheckpointStore
    ) -> None:
        saved = await self.save_steps(store, "a", 4)
        await store.prune("a", keep_last=1)
        await store.delete_stream("a")
        store = await self.reopen(store)
        assert (await store.save("a", {})).sequence > saved[-1].sequence

    @asyncio_test
    async def test_seed_twelve_saves_in_same_second(self, store: BaseCheckpointStore) -> None:
        """Order is by sequence, never timestamp: twelve saves at one frozen instant come
        back in save order, and the newest is step 11."""
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        saved = await self.save_steps(store, "order-42", 12)
        assert {cp.created_at for cp in saved} == {clock.now}, "clock= was not honoured"
        asc = await store.list("order-42", limit=20, order="asc")
        assert [cp.state["step"] for cp in asc.items] == list(range(12))
        desc = await store.list("order-42", limit=20, order="desc")
        assert [cp.state["step"] for cp in desc.items] == list(range(11, -1, -1))
        top = await store.list("order-42", limit=1, order="desc")
        assert [cp.state for cp in top.items] == [{"step": 11}]
        latest = await store.get_latest("order-42")
        assert latest is not None
        assert latest.state == {"step": 11}
        assert latest.id == saved[-1].id

    @asyncio_test
    async def test_update_keeps_sequence_and_position(self, store: BaseCheckpointStore) -> None:
        first, second = await self.save_steps(store, "job", 2)
        updated = await store.update(first.id, {"step": "again"})
        assert updated.sequence == first.sequence
        latest = await store.get_latest("job")
        assert latest is not None
        assert latest.id == second.id, "an update moved an older checkpoint to the end"
        page = await store.list("job", order="asc")
        assert ids(page) == [first.id, second.id]
        assert page.items[0].state == {"step": "again"}

    # -- S2: identity and names -------------------------------------------------------

    @asyncio_test
    async def test_store_assigned_ids_are_unique_and_valid(
        self, store: BaseCheckpointStore
    ) -> None:
        saved = await self.save_steps(store, "job", 10)
        assert len({cp.id for cp in saved}) == 10
        assert all(ID_RE.fullmatch(cp.id) for cp in saved)

    @asyncio_test
    async def test_caller_ids_matching_the_pattern_are_kept(
        self, store: BaseCheckpointStore
    ) -> None:
        for cid in ("A.b:c-d_9", "x" * 200, "0", "-", "..", "a..b"):
            cp = await store.save("job", {"id": cid}, id=cid)
            assert cp.id == cid
            assert (await store.load(cid)).state == {"id": cid}

    @asyncio_test
    async def test_saving_a_live_id_raises_precondition_failed(
        self, store: BaseCheckpointStore
    ) -> None:
        original = await store.save("job", {"v": 1}, id="fixed")
        with pytest.raises(PreconditionFailed):
            await store.save("job", {"v": 2}, id="fixed")
        with pytest.raises(PreconditionFailed):
            await store.save("other", {"v": 3}, id="fixed")
        loaded = await store.load("fixed")
        assert (loaded.state, loaded.sequence, loaded.etag) == (
            {"v": 1},
            original.sequence,
            original.etag,
        )
        assert ids(await store.list(None)) == ["fixed"]
        assert await store.list_streams() == ["job"]

    @asyncio_test
    async def test_seed_recreated_id_gets_new_sequence(self, store: BaseCheckpointStore) -> None:
        old = await store.save("job", {"v": "old"}, id="item")
        between = await store.save("job", {"v": "between"})
        assert await store.delete("item")
        new = await store.save("job", {"v": "new"}, id="item")
        assert new.sequence > between.sequence > old.sequence
        assert (await store.load("item")).state == {"v": "new"}
        latest = await store.get_latest("job")
        assert latest is not None
        assert latest.id == "item"
        assert ids(await store.list("job", order="asc")) == [between.id, "item"]

    @asyncio_test
    async def test_old_cursor_never_points_at_recreated_id(
        self, store: BaseCheckpointStore
    ) -> None:
        before, _item, after = (
            await store.save("job", {"n": 0}),
            await store.save("job", {"n": 1}, id="item"),
            await store.save("job", {"n": 2}),
        )
        page = await store.list("job", order="desc", limit=2)
        assert ids(page) == [after.id, "item"]
        assert await store.delete("item")
        await store.save("job", {"n": 3}, id="item")
        rest = await store.list("job", order="desc", limit=2, after=page.next_cursor)
        assert ids(rest) == [before.id], (
            "a cursor of a deleted id resumed at its re-created replacement"
        )

    @asyncio_test
    async def test_stream_names_are_opaque_and_separate(self, store: BaseCheckpointStore) -> None:
        for name in TRICKY_STREAMS:
            await store.save(name, {"name": name})
        assert await store.list_streams() == sorted(TRICKY_STREAMS)
        store = await self.reopen(store)
        for name in TRICKY_STREAMS:
            latest = await store.get_latest(name)
            assert latest is not None, f"stream {name!r} lost its checkpoint"
            assert (latest.stream, latest.state) == (name, {"name": name})
            page = await store.list(name)
            assert [cp.stream for cp in page.items] == [name]
        assert await store.delete_stream("..") == 1
        assert await store.delete_stream("/") == 1
        remaining = sorted(set(TRICKY_STREAMS) - {"..", "/"})
        assert await store.list_streams() == remaining

    @asyncio_test
    async def test_invalid_stream_names_raise_invalid_query(
        self, store: BaseCheckpointStore
    ) -> None:
        for bad in BAD_STREAMS:
            with pytest.raises(InvalidQuery):
                await store.save(bad, {})
            with pytest.raises(InvalidQuery):
                await store.get_latest(bad)
            if bad is not None:  # None lists every stream
                with pytest.raises(InvalidQuery):
                    await store.list(bad)
            with pytest.raises(InvalidQuery):
                await store.delete_stream(bad)
            with pytest.raises(InvalidQuery):
                await store.prune(bad, keep_last=1)
        assert await store.list_streams() == []

    @asyncio_test
    async def test_invalid_ids_raise_invalid_query(self, store: BaseCheckpointStore) -> None:
        await store.save("job", {})
        for bad in BAD_IDS:
            with pytest.raises(InvalidQuery):
                await store.save("job", {}, id=bad)
            with pytest.raises(InvalidQuery):
                await store.save("job", {}, parent_id=bad)
            with pytest.raises(InvalidQuery):
                await store.load(bad)
            with pytest.raises(InvalidQuery):
                await store.update(bad, {})
            with pytest.raises(InvalidQuery):
                await store.delete(bad)
        assert len((await store.list("job")).items) == 1

    @asyncio_test
    async def test_invalid_limit_and_order_raise_invalid_query(
        self, store: BaseCheckpointStore
    ) -> None:
        await self.save_steps(store, "job", 3)
        for bad_limit in BAD_LIMITS:
            with pytest.raises(InvalidQuery):
                await store.list("job", limit=bad_limit)
        for bad_order in BAD_ORDERS:
            with pytest.raises(InvalidQuery):
                await store.list("job", order=bad_order)
        bad_keeps: tuple[Any, ...] = (-1, True, 1.5, None)
        for bad_keep in bad_keeps:
            with pytest.raises(InvalidQuery):
                await store.prune("job", keep_last=bad_keep)
        assert len((await store.list("job", limit=1)).items) == 1
        assert len((await store.list("job", limit=1000)).items) == 3

    @asyncio_test
    async def test_header_fields_round_trip(self, store: BaseCheckpointStore) -> None:
        parent = await store.save("job", {"n": 0})
        meta = {"note": "plain JSON", "nested": {"list": [1, 2.5, None, True, "ü"]}}
        cp = await store.save(
            "job", {"n": 1}, tags={"kind": "step", "ü": "✓"}, metadata=meta, parent_id=parent.id
        )
        for got in (cp, await store.load(cp.id), await store.get_latest("job")):
            assert got is not None
            assert got.header() == cp.header()
            assert (got.stream, got.parent_id, got.tags, got.metadata) == (
                "job",
                parent.id,
                {"kind": "step", "ü": "✓"},
                meta,
            )
            for stamp in (got.created_at, got.updated_at):
                assert stamp.utcoffset() is not None
                assert stamp.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
            assert got.expires_at is None

    @asyncio_test
    async def test_import_checkpoint_keeps_the_header_and_gets_a_new_sequence(
        self, store: BaseCheckpointStore
    ) -> None:
        """What ``statekeeper copy`` relies on: an imported checkpoint keeps its id,
        timestamps, etag, parent, tags and metadata, and is ordered by its new sequence."""
        local = await store.save("job", {"n": "local"})
        # Copied from the past: a backend ordering by timestamp would put it first.
        async with MemoryCheckpointStore(
            clock=FakeClock(datetime(2001, 1, 1, tzinfo=UTC))
        ) as source:
            parent = await source.save("job", {"n": 0}, id="p-1")
            original = await source.save(
                "job", {"n": 1}, parent_id="p-1", tags={"k": "v"}, metadata={"m": [1]}
            )
        await store.import_checkpoint(parent, parent.state)
        copied = await store.import_checkpoint(original, original.state)
        assert copied.sequence > local.sequence, "an import gets a new sequence in this store"
        loaded = await store.load(original.id)
        assert loaded.header() == copied.header()
        for name in ("id", "stream", "created_at", "updated_at", "etag", "parent_id", "tags"):
            assert getattr(loaded, name) == getattr(original, name), name
        assert (loaded.metadata, loaded.state) == ({"m": [1]}, {"n": 1})
        latest = await store.get_latest("job")
        assert latest is not None
        assert latest.id == original.id, "order is by sequence, not by the copied timestamps"
        with pytest.raises(PreconditionFailed):
            await store.import_checkpoint(original, original.state)
