"""Kit tests for headers without state, batches and their atomicity (SPEC S3, S13):
``load(include_state=False)``, ``load_many``, ``save_many`` and ``delete_many``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from .._core.store import BaseCheckpointStore
from ..errors import (
    CheckpointDecodeError,
    CheckpointEncodeError,
    CheckpointNotFound,
    InvalidQuery,
    PreconditionFailed,
    ReadOnlyStore,
)
from ..models import Checkpoint, CheckpointHeader, NewCheckpoint
from ._base import FakeClock, KitBase, ids

asyncio_test = pytest.mark.asyncio(loop_scope="function")


def _items(stream: str, count: int, **fields: Any) -> list[NewCheckpoint]:
    return [NewCheckpoint(stream=stream, state={"i": i}, **fields) for i in range(count)]


async def _everything(store: BaseCheckpointStore) -> list[str]:
    """The ids of every live checkpoint, in sequence order (and nothing unreadable)."""
    page = await store.list(None, limit=1000, order="asc", include_state=False)
    assert page.skipped == [], page.skipped
    return ids(page)


def _consecutive(saved: Sequence[CheckpointHeader]) -> bool:
    seqs = [cp.sequence for cp in saved]
    return seqs == list(range(seqs[0], seqs[0] + len(seqs)))


class BatchTests(KitBase):
    # -- load(include_state=False) ------------------------------------------------------

    @asyncio_test
    async def test_load_without_state_returns_the_header(self, store: BaseCheckpointStore) -> None:
        parent = await store.save("job", {"n": 0})
        cp = await store.save(
            "job", {"n": 1}, tags={"k": "v"}, metadata={"m": [1, None]}, parent_id=parent.id
        )
        header = await store.load(cp.id, include_state=False)
        assert isinstance(header, CheckpointHeader)
        assert not isinstance(header, Checkpoint), "include_state=False returns a header"
        assert header == cp.header()
        with pytest.raises(CheckpointNotFound):
            await store.load("never-existed", include_state=False)
        await store.delete(cp.id)
        with pytest.raises(CheckpointNotFound):
            await store.load(cp.id, include_state=False)

    @asyncio_test
    async def test_headers_of_a_state_that_cannot_be_decoded(
        self, store: BaseCheckpointStore
    ) -> None:
        """Nothing is decoded without the state: a record whose envelope is intact but
        whose state no codec reads still gives its header, in every header-only read,
        while every read of the state raises naming it."""
        older = await store.save("job", {"n": 0})
        store, bad = await self.save_undecodable(store, "job", tags={"k": "v"}, metadata={"m": 1})
        with pytest.raises(CheckpointDecodeError) as caught:
            await store.load(bad.id)
        assert caught.value.id == bad.id
        with pytest.raises(CheckpointDecodeError):
            await store.get_latest("job")
        with pytest.raises(CheckpointDecodeError) as caught:
            await store.load_many([older.id, bad.id])
        assert caught.value.id == bad.id
        header = await store.load(bad.id, include_state=False)
        assert (header.id, header.sequence, header.tags, header.metadata) == (
            bad.id,
            bad.sequence,
            {"k": "v"},
            {"m": 1},
        )
        headers = await store.load_many([bad.id, older.id], include_state=False)
        assert list(headers) == [bad.id, older.id]
        assert headers[bad.id] == header
        page = await store.list("job", include_state=False)
        assert (ids(page), page.skipped) == ([bad.id, older.id], [])
        # a position needs no state either
        cursor = await store.cursor_at(bad.id)
        assert ids(await store.list("job", after=cursor)) == [older.id]

    @asyncio_test
    async def test_load_without_state_still_raises_for_a_damaged_envelope(
        self, store: BaseCheckpointStore
    ) -> None:
        self.require_raw_access(store)
        cp = await store.save("job", {"n": 1})
        await store.backdoor_write_raw(cp.id, b"garbage")
        with pytest.raises(CheckpointDecodeError) as caught:
            await store.load(cp.id, include_state=False)
        assert caught.value.id == cp.id
        with pytest.raises(CheckpointDecodeError):
            await store.cursor_at(cp.id)

    # -- load_many ----------------------------------------------------------------------

    @asyncio_test
    async def test_load_many_returns_the_live_ones_in_the_order_asked(
        self, store: BaseCheckpointStore
    ) -> None:
        a, b, c = (
            await store.save("one", {"n": "a"}, tags={"t": "1"}),
            await store.save("two", {"n": "b"}, metadata={"m": True}),
            await store.save("one", {"n": "c"}),
        )
        gone = await store.save("two", {"n": "gone"})
        await store.delete(gone.id)
        asked = [c.id, "never-saved", a.id, gone.id, c.id, b.id, a.id]
        got = await store.load_many(asked)
        assert list(got) == [c.id, a.id, b.id], "missing ids are absent, duplicates read once"
        for cp in (a, b, c):
            assert got[cp.id].header() == cp.header()
            assert got[cp.id].state == cp.state
        bare = await store.load_many(tuple(asked), include_state=False)
        assert list(bare) == [c.id, a.id, b.id]
        assert list(bare.values()) == [cp.header() for cp in (c, a, b)]
        assert await store.load_many([]) == {}
        assert await store.load_many(["never-saved", gone.id]) == {}
        assert list(await store.load_many({b.id})) == [b.id]

    @asyncio_test
    async def test_load_many_is_strict_about_a_damaged_record(
        self, store: BaseCheckpointStore
    ) -> None:
        self.require_raw_access(store)
        good, bad = await self.save_steps(store, "job", 2)
        await store.backdoor_write_raw(bad.id, b"garbage")
        for include_state in (True, False):
            with pytest.raises(CheckpointDecodeError) as caught:
                await store.load_many([good.id, bad.id], include_state=include_state)
            assert caught.value.id == bad.id, "load_many must name the damaged record"
            with pytest.raises(CheckpointDecodeError):
                await store.load_many([bad.id], include_state=include_state)
        assert list(await store.load_many([good.id, "never-saved"])) == [good.id]

    @asyncio_test
    async def test_load_many_and_delete_many_refuse_bad_id_lists(
        self, store: BaseCheckpointStore
    ) -> None:
        cp = await store.save("job", {})
        many = [f"id-{i}" for i in range(1001)]
        bad_lists: list[Any] = [many, cp.id, b"bytes", [cp.id, "a b"], [cp.id, 7], None, 42]
        for bad in bad_lists:
            with pytest.raises(InvalidQuery):
                await store.load_many(bad)
            with pytest.raises(InvalidQuery):
                await store.delete_many(bad)
        # 1000 is the limit, not an error
        assert list(await store.load_many([*many[:999], cp.id])) == [cp.id]
        assert await store.delete_many(many[:1000]) == 0
        assert (await store.load(cp.id)).state == {}

    # -- save_many ----------------------------------------------------------------------

    @asyncio_test
    async def test_save_many_takes_consecutive_sequences_in_order_across_streams(
        self, store: BaseCheckpointStore
    ) -> None:
        before = await store.save("a", {"before": True})
        parent = before.id
        items = [
            NewCheckpoint(stream="a", state={"n": 0}),
            NewCheckpoint(stream="b", state=(1, {2}), tags={"k": "v"}, metadata={"m": None}),
            NewCheckpoint(stream="a", state={"n": 2}, parent_id=parent, id="chosen-id"),
            NewCheckpoint(stream="c/d", state=None),
        ]
        saved = await store.save_many(items)
        assert [cp.stream for cp in saved] == ["a", "b", "a", "c/d"]
        assert saved[0].sequence > before.sequence
        assert _consecutive(saved), f"sequences {[cp.sequence for cp in saved]}"
        assert [cp.state for cp in saved] == [item.state for item in items]
        assert (saved[1].tags, saved[1].metadata) == ({"k": "v"}, {"m": None})
        assert (saved[2].id, saved[2].parent_id) == ("chosen-id", parent)
        assert len({cp.id for cp in saved}) == 4
        assert await _everything(store) == [before.id, *ids(saved)]
        loaded = await store.load_many(ids(saved))
        for cp in saved:
            assert loaded[cp.id].header() == cp.header()
            assert loaded[cp.id].state == cp.state
        latest = await store.get_latest("a")
        assert latest is not None
        assert latest.id == "chosen-id"
        assert await store.list_streams() == ["a", "b", "c/d"]
        store = await self.reopen(store)
        after = await store.save("b", {})
        assert after.sequence > saved[-1].sequence
        assert await _everything(store) == [before.id, *ids(saved), after.id]

    @asyncio_test
    async def test_save_many_of_nothing_writes_nothing(self, store: BaseCheckpointStore) -> None:
        assert await store.save_many([]) == []
        assert await store.save_many(()) == []
        assert await store.list_streams() == []

    @asyncio_test
    async def test_save_many_validates_every_item_before_writing_any(
        self, store: BaseCheckpointStore
    ) -> None:
        existing = await store.save("job", {"n": 0})
        good = _items("job", 3)
        refused: dict[str, tuple[type[Exception], list[Any]]] = {
            "duplicate id": (
                PreconditionFailed,
                [
                    *good,
                    NewCheckpoint(stream="x", id="twice"),
                    NewCheckpoint(stream="y", id="twice"),
                ],
            ),
            "unencodable state": (
                CheckpointEncodeError,
                [*good, NewCheckpoint(stream="job", state=object())],
            ),
            "bad metadata": (
                CheckpointEncodeError,
                [*good, NewCheckpoint(stream="job", metadata={"m": (1, 2)})],
            ),
            "bad stream": (InvalidQuery, [*good, NewCheckpoint(stream="")]),
            "bad id": (InvalidQuery, [*good, NewCheckpoint(stream="job", id="a b")]),
            "bad parent": (InvalidQuery, [*good, NewCheckpoint(stream="job", parent_id="a/b")]),
            "bad tags": (InvalidQuery, [*good, NewCheckpoint(stream="job", tags={"k": "a\x00"})]),
            "not a NewCheckpoint": (InvalidQuery, [*good, {"stream": "job"}]),
            "too many": (InvalidQuery, _items("job", 1001)),
        }
        for name, (error, batch) in refused.items():
            with pytest.raises(error):
                await store.save_many(batch)
            assert await _everything(store) == [existing.id], f"{name}: something was written"
        for not_a_list in (NewCheckpoint(stream="job"), None, 5):
            with pytest.raises(InvalidQuery):
                await store.save_many(not_a_list)  # type: ignore[arg-type]
        assert len(await store.save_many(_items("job", 1000))) == 1000

    @asyncio_test
    async def test_save_many_with_a_live_id_writes_nothing(
        self, store: BaseCheckpointStore
    ) -> None:
        self.require_atomic_batches(store)
        existing = await store.save("job", {"n": 0}, id="taken")
        # the live id comes last, so that a one-by-one save_many has written the others
        batch = [*_items("job", 2), *_items("other", 2), NewCheckpoint(stream="x", id="taken")]
        with pytest.raises(PreconditionFailed):
            await store.save_many(batch)
        assert await _everything(store) == [existing.id]
        assert await store.list_streams() == ["job"]
        assert (await store.load("taken")).state == {"n": 0}
        again = await store.save_many(batch[:-1])
        assert _consecutive(again)

    @asyncio_test
    async def test_save_many_in_a_raw_store(self, store: BaseCheckpointStore) -> None:
        store = await self.reopen(store, codec="raw")
        saved = await store.save_many(
            [NewCheckpoint(stream="a", state=b""), NewCheckpoint(stream="b", state=b"\xff\x00")]
        )
        loaded = await store.load_many(ids(saved))
        assert [cp.state for cp in loaded.values()] == [b"", b"\xff\x00"]
        with pytest.raises(CheckpointEncodeError):
            await store.save_many(
                [
                    NewCheckpoint(stream="a", state=b"ok"),
                    NewCheckpoint(stream="a", state="text is not bytes"),
                ]
            )
        assert await _everything(store) == ids(saved)

    # -- delete_many --------------------------------------------------------------------

    @asyncio_test
    async def test_delete_many_is_idempotent_and_counts(self, store: BaseCheckpointStore) -> None:
        a, b, c = await self.save_steps(store, "job", 3)
        other = await store.save("other", {})
        assert await store.delete_many([a.id, "never-saved", c.id, a.id, other.id]) == 3
        assert await store.delete_many([a.id, c.id, other.id]) == 0
        assert await store.delete_many([]) == 0
        assert await _everything(store) == [b.id]
        assert await store.list_streams() == ["job"]
        with pytest.raises(CheckpointNotFound):
            await store.load(a.id)
        again = await store.save("other", {})
        assert again.sequence > other.sequence, "delete_many made a sequence reusable"

    @asyncio_test
    async def test_delete_many_removes_damaged_records(self, store: BaseCheckpointStore) -> None:
        self.require_raw_access(store)
        good, bad = await self.save_steps(store, "job", 2)
        await store.backdoor_write_raw(bad.id, b"garbage")
        assert await store.delete_many([bad.id]) == 1
        latest = await store.get_latest("job")
        assert latest is not None
        assert latest.id == good.id

    # -- TTL, read-only -----------------------------------------------------------------

    @asyncio_test
    async def test_batches_treat_expired_checkpoints_as_deleted(
        self, store: BaseCheckpointStore
    ) -> None:
        self.require_ttl(store)
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        keep = await store.save("keep", {})
        short = await store.save_many(
            [
                NewCheckpoint(stream="short/a", state={}, ttl=10, id="temp"),
                NewCheckpoint(stream="short/b", state={}, ttl=10),
            ]
        )
        assert short[0].expires_at == clock.now + timedelta(seconds=10)
        clock.advance(11)
        assert list(await store.load_many([keep.id, *ids(short)])) == [keep.id]
        for cp in short:
            with pytest.raises(CheckpointNotFound):
                await store.cursor_at(cp.id)
        assert await store.list_streams(prefix="short") == []
        assert await store.delete_many(ids(short)) == 0
        # an expired id may be taken again, in a batch as in a save
        again = await store.save_many([NewCheckpoint(stream="short/a", state={"v": 2}, id="temp")])
        assert again[0].sequence > short[-1].sequence
        assert (await store.load("temp")).state == {"v": 2}

    @asyncio_test
    async def test_read_only_store_reads_batches_and_refuses_batch_writes(
        self, store: BaseCheckpointStore
    ) -> None:
        saved = await self.save_steps(store, "job", 2, metadata={"m": 1})
        reader = await self.open_store(read_only=True)
        assert list(await reader.load_many(ids(saved))) == ids(saved)
        # a metadata filter, unless the store seals metadata (then it refuses filters)
        query: dict[str, Any] = {} if self.seals_metadata(store) else {"metadata": {"m": 1}}
        cursor = await reader.cursor_at(saved[1].id, **query)
        assert ids(await reader.list("job", after=cursor, **query)) == [saved[0].id]
        assert await reader.list_streams(prefix="j") == ["job"]
        writes: dict[str, Any] = {
            "save_many": lambda: reader.save_many(_items("job", 1)),
            "delete_many": lambda: reader.delete_many(ids(saved)),
            "update with edits": lambda: reader.update(saved[0].id, {}, tags={"k": "v"}),
        }
        for name, call in writes.items():
            with pytest.raises(ReadOnlyStore):
                await call()
            assert await _everything(store) == ids(saved), f"{name} wrote to a read-only store"

    # -- concurrency (atomic_batches) -------------------------------------------------

    @asyncio_test
    async def test_save_many_never_interleaves_with_concurrent_saves(
        self, store: BaseCheckpointStore
    ) -> None:
        """A concurrent save never takes a sequence between the items of a batch."""
        self.require_atomic_batches(store)
        other = await self.open_store()

        async def batch(k: int) -> list[Checkpoint]:
            target = store if k % 2 else other
            items = [NewCheckpoint(stream=f"s{i}", state={"batch": k, "i": i}) for i in range(5)]
            return await target.save_many(items)

        async def single(k: int) -> Checkpoint:
            return await (other if k % 2 else store).save(f"s{k % 5}", {"single": k})

        results = await asyncio.gather(
            *(batch(k) for k in range(6)), *(single(k) for k in range(20))
        )
        batches = [r for r in results if isinstance(r, list)]
        singles = [r for r in results if isinstance(r, Checkpoint)]
        for saved in batches:
            seqs = [cp.sequence for cp in saved]
            assert _consecutive(saved), f"a batch took sequences {seqs}"
            between = [cp.sequence for cp in singles if seqs[0] <= cp.sequence <= seqs[-1]]
            assert not between, f"saves took {between} in the middle of a batch {seqs}"
        listed = await _everything(store)
        assert len(listed) == 6 * 5 + 20
        for saved in batches:
            start = listed.index(saved[0].id)
            assert listed[start : start + 5] == ids(saved), "a batch is not contiguous in list"

    @asyncio_test
    async def test_a_concurrent_reader_never_sees_part_of_a_batch(
        self, store: BaseCheckpointStore
    ) -> None:
        """Every batch writes item i to stream s<i>; a reader polling the newest
        checkpoint overall and the latest of s0 then s4 never sees a batch half done."""
        self.require_atomic_batches(store)
        width, rounds = 5, 25
        reader = await self.open_store()
        done = asyncio.Event()
        seen: list[str] = []

        async def write() -> None:
            try:
                for k in range(1, rounds + 1):
                    await store.save_many(
                        [
                            NewCheckpoint(stream=f"s{i}", state={"batch": k, "i": i})
                            for i in range(width)
                        ]
                    )
                    await asyncio.sleep(0)
            finally:
                done.set()

        async def read() -> None:
            while not done.is_set():
                top = await reader.list(None, limit=1)
                if top.items:
                    newest = top.items[0].state
                    assert newest["i"] == width - 1, (
                        f"the newest checkpoint is {newest}: a batch is half visible"
                    )
                    seen.append("list")
                first = await reader.get_latest("s0")
                last = await reader.get_latest(f"s{width - 1}")
                if first is not None:
                    assert last is not None, "s0 has a batch that the last stream lacks"
                    assert last.state["batch"] >= first.state["batch"], (
                        f"s0 is at batch {first.state['batch']} but s{width - 1} at "
                        f"{last.state['batch']}: a batch is half visible"
                    )
                    seen.append("latest")
                await asyncio.sleep(0)

        await asyncio.gather(write(), read())
        assert seen, "the reader never ran while the batches were written"
        top = await reader.list(None, limit=1)
        assert top.items[0].state == {"batch": rounds, "i": width - 1}
