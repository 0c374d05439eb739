"""A Hypothesis state machine that runs a backend in lockstep with a reference model.

The model (``_model.py``) is deliberately naive: a dict of live checkpoints and
the highest sequence seen. Every rule does the same thing to the store and to the
model and compares the results, so any disagreement (a reused sequence, a page
that repeats or skips an item, a cursor that drifts after a delete or a reopen, a
lost update, a batch that is not consecutive or not all-or-nothing, a metadata
filter that takes ``True`` for ``1``) is found and shrunk to a short reproducible
program.

Stores are async; the machine owns an event loop (:class:`asyncio.Runner`) and
runs every step on it, so backends whose connections are bound to a loop work.
Each example starts by emptying the store the factory gives (``store_factory``
returns the same data on every call), so the model and the store start equal.

Use :func:`build_state_machine` to bind a ``store_factory``; the conformance kit
runs it as ``test_state_machine_matches_reference_model`` (``_stateful_tests.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, multiple, rule

from .._core.interface import Order
from .._core.store import BaseCheckpointStore
from ..errors import CheckpointNotFound, PreconditionFailed
from ..models import Checkpoint, NewCheckpoint, Page, Retention
from ._base import StoreFactory
from ._model import (
    AGES,
    CALLER_IDS,
    ELAPSED,
    FILTERS,
    KEEP_LASTS,
    META_FILTERS,
    METADATAS,
    ORDERS,
    STREAMS,
    TAGSETS,
    ModelCheckpoint,
    Query,
    ReferenceModel,
    SavedCursor,
    check_checkpoint,
    check_page,
    if_match_for,
    refuses_filter,
)
from ._pages import PageBound
from .strategies import states

__all__ = ["CheckpointStoreStateMachine", "ReferenceModel", "build_state_machine"]

T = TypeVar("T")


class CheckpointStoreStateMachine(RuleBasedStateMachine):
    """Rules: save and save_many (store-assigned and caller ids, across streams),
    update (with new tags and metadata or not) and delete (with a current, a stale or
    no ``if_match``), delete_many, delete_stream, prune, get_latest, load and
    load_many (with and without state), list_streams, walking pages forward then
    backward under tag and metadata filters, cursor_at, resuming from cursors kept
    across later writes and reopens, sweep (S17: keep_last, max_age, idle, dry or
    not, the model's clock moved first), and reopen itself (close,
    ``store_factory()``, open; the store's clock is the model's).

    Subclass and set :attr:`store_factory`, or use :func:`build_state_machine`.
    """

    #: ``(**options) -> unopened store`` over the same data on every call.
    store_factory: ClassVar[StoreFactory]

    cursors = Bundle("cursors")

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.model = ReferenceModel()
        self.store: BaseCheckpointStore = self.run(self._open(clear=True))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one coroutine to completion on this machine's event loop."""
        return self.runner.run(coro)

    async def _open(self, *, clear: bool = False) -> BaseCheckpointStore:
        store = type(self).store_factory(clock=self.model.clock)
        await store.open()
        if clear:
            # The factory gives the same data to every example: start from empty.
            for stream in await store.list_streams():
                await store.delete_stream(stream)
            await store.purge_expired()
            leftover = await store.list(None, limit=1)
            assert (leftover.items, leftover.skipped) == ([], []), "could not empty the store"
        return store

    def teardown(self) -> None:
        """Close the store at the end of each Hypothesis example."""
        try:
            self.run(self.store.close())
        finally:
            self.runner.close()

    # -- helpers ----------------------------------------------------------------------

    def _pick_id(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(list(self.model.known_ids)), label="id")

    def _pick_ids(self, data: st.DataObject) -> list[str]:
        known = st.sampled_from(list(self.model.known_ids))
        return data.draw(st.lists(known, max_size=5), label="ids")

    def _assert_nothing_new(self) -> None:
        """The newest checkpoint of the store is still the model's newest."""
        top = self.run(self.store.list(None, limit=1, include_state=False))
        newest = max(self.model.live.values(), key=lambda cp: cp.sequence, default=None)
        assert [cp.id for cp in top.items] == ([newest.id] if newest else []), (
            "a refused save_many left checkpoints behind"
        )

    def _list(
        self,
        query: Query,
        limit: int,
        *,
        after: SavedCursor | None = None,
        before: SavedCursor | None = None,
        include_state: bool = True,
    ) -> tuple[Page, list[SavedCursor]]:
        page = self.run(
            self.store.list(
                query.stream,
                limit=limit,
                order=query.order,
                tags=query.tags,
                metadata=query.metadata,
                after=after.cursor if after else None,
                before=before.cursor if before else None,
                include_state=include_state,
            )
        )
        return page, check_page(page, self.model, query, limit, after, before, include_state)

    # -- rules ------------------------------------------------------------------------

    def _saved(self, cp: Checkpoint, item: NewCheckpoint) -> None:
        """Check a checkpoint a save returned against the model, then record it."""
        assert cp.sequence > self.model.high_water, (
            f"sequence {cp.sequence} is not above every sequence ever assigned "
            f"({self.model.high_water})"
        )
        if item.id is not None:
            assert cp.id == item.id
        assert cp.id not in self.model.live
        assert (cp.stream, cp.tags, cp.metadata) == (item.stream, item.tags, item.metadata)
        self.model.add(ModelCheckpoint.saved(cp, item))

    @rule(
        stream=st.sampled_from(STREAMS),
        state=states(max_leaves=5),
        tags=st.sampled_from(TAGSETS),
        caller_id=st.none() | st.sampled_from(CALLER_IDS),
        metadata=st.sampled_from(METADATAS),
    )
    def save(
        self,
        stream: str,
        state: Any,
        tags: dict[str, str],
        caller_id: str | None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        item = NewCheckpoint(
            stream=stream, state=state, tags=tags, metadata=metadata or {}, id=caller_id
        )
        call = self.store.save(stream, state, tags=tags, metadata=item.metadata, id=caller_id)
        if caller_id is not None and caller_id in self.model.live:
            with pytest.raises(PreconditionFailed):
                self.run(call)
            return
        self._saved(self.run(call), item)

    @initialize(
        batch=st.lists(st.tuples(st.sampled_from(STREAMS), st.sampled_from(TAGSETS)), max_size=15)
    )
    def seed(self, batch: list[tuple[str, dict[str, str]]]) -> None:
        """Start most programs with some history, so listings have pages to walk."""
        for i, (stream, tags) in enumerate(batch):
            self.save(stream, {"seed": i}, tags, None, METADATAS[i % len(METADATAS)])

    @rule(
        stream=st.sampled_from(STREAMS),
        batch=st.lists(
            st.tuples(st.integers(), st.sampled_from(TAGSETS), st.sampled_from(METADATAS)),
            min_size=2,
            max_size=6,
        ),
    )
    def save_batch(
        self, stream: str, batch: list[tuple[int, dict[str, str], dict[str, Any]]]
    ) -> None:
        """Several saves in a row, so that streams grow long enough to page through."""
        for value, tags, metadata in batch:
            self.save(stream, {"n": value}, tags, None, metadata)

    @rule(
        batch=st.lists(
            st.builds(
                NewCheckpoint,
                stream=st.sampled_from(STREAMS),
                state=states(max_leaves=3),
                tags=st.sampled_from(TAGSETS),
                metadata=st.sampled_from(METADATAS),
                id=st.none() | st.sampled_from(CALLER_IDS),
            ),
            max_size=5,
        ),
        data=st.data(),
    )
    def save_many(self, batch: list[NewCheckpoint], data: st.DataObject) -> None:
        """A batch across streams: consecutive sequences in order, or nothing at all
        (sometimes it ends with an id that is live, after items that are not)."""
        live_ids = [cid for cid in self.model.known_ids if cid in self.model.live]
        end_with_live: bool = bool(live_ids) and data.draw(st.booleans(), label="live id last")
        if end_with_live:
            taken: str = data.draw(st.sampled_from(live_ids), label="live id")
            batch = [*batch, NewCheckpoint(stream=STREAMS[0], state=None, id=taken)]
        caller_ids = [item.id for item in batch if item.id is not None]
        duplicate = len(set(caller_ids)) < len(caller_ids)
        live = any(cid in self.model.live for cid in caller_ids)
        if live and not duplicate and not self.store.capabilities.atomic_batches:
            return  # saved one by one, the items before the live id would be written
        if duplicate or live:
            with pytest.raises(PreconditionFailed):
                self.run(self.store.save_many(batch))
            self._assert_nothing_new()
            return
        saved = self.run(self.store.save_many(batch))
        assert len(saved) == len(batch)
        seqs = [cp.sequence for cp in saved]
        if seqs:
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (
                f"save_many took sequences {seqs}, not consecutive ones in the order given"
            )
        for cp, item in zip(saved, batch, strict=True):
            self._saved(cp, item)

    @rule(
        data=st.data(),
        state=states(max_leaves=3),
        mode=st.sampled_from(["none", "current", "stale"]),
        tags=st.none() | st.sampled_from(TAGSETS),
        metadata=st.none() | st.sampled_from(METADATAS),
    )
    def update(
        self,
        data: st.DataObject,
        state: Any,
        mode: str,
        tags: dict[str, str] | None,
        metadata: dict[str, Any] | None,
    ) -> None:
        """Replace the state, and the tags and metadata where given (None keeps them)."""
        cid = self._pick_id(data)
        current = self.model.live.get(cid)
        if_match = if_match_for(mode, current)
        edits: dict[str, Any] = {"if_match": if_match}
        # only pass what changes, so the plain update keeps being exercised as such
        if tags is not None:
            edits["tags"] = tags
        if metadata is not None:
            edits["metadata"] = metadata
        if current is None:
            with pytest.raises(CheckpointNotFound):
                self.run(self.store.update(cid, state, **edits))
        elif mode == "stale":
            with pytest.raises(PreconditionFailed):
                self.run(self.store.update(cid, state, **edits))
        else:
            cp = self.run(self.store.update(cid, state, **edits))
            assert (cp.id, cp.sequence, cp.stream) == (cid, current.sequence, current.stream)
            assert cp.etag != current.etag, "an update must change the etag"
            current.state, current.etag, current.written = state, cp.etag, self.model.clock.now
            if tags is not None:
                current.tags = dict(tags)
            if metadata is not None:
                current.metadata = dict(metadata)
            check_checkpoint(cp, current, state=True)

    @rule(data=st.data(), mode=st.sampled_from(["none", "current", "stale"]))
    def delete(self, data: st.DataObject, mode: str) -> None:
        cid = self._pick_id(data)
        current = self.model.live.get(cid)
        if_match = if_match_for(mode, current)
        if current is not None and mode == "stale":
            with pytest.raises(PreconditionFailed):
                self.run(self.store.delete(cid, if_match=if_match))
            return
        assert self.run(self.store.delete(cid, if_match=if_match)) is (current is not None)
        self.model.live.pop(cid, None)

    @rule(data=st.data())
    def delete_many(self, data: st.DataObject) -> None:
        wanted = self._pick_ids(data)
        doomed = {cid for cid in wanted if cid in self.model.live}
        assert self.run(self.store.delete_many(wanted)) == len(doomed)
        for cid in doomed:
            del self.model.live[cid]

    @rule(stream=st.sampled_from(STREAMS))
    def delete_stream(self, stream: str) -> None:
        doomed = [cp.id for cp in self.model.candidates(Query(stream, "asc", {}))]
        assert self.run(self.store.delete_stream(stream)) == len(doomed)
        for cid in doomed:
            del self.model.live[cid]

    @rule(stream=st.sampled_from(STREAMS), keep_last=st.integers(0, 3))
    def prune(self, stream: str, keep_last: int) -> None:
        cands = self.model.candidates(Query(stream, "asc", {}))
        doomed = cands[: max(len(cands) - keep_last, 0)]
        assert self.run(self.store.prune(stream, keep_last=keep_last)) == len(doomed)
        for cp in doomed:
            del self.model.live[cp.id]

    @rule(stream=st.sampled_from(STREAMS))
    def get_latest(self, stream: str) -> None:
        got = self.run(self.store.get_latest(stream))
        want = self.model.newest(stream)
        if want is None:
            assert got is None, f"get_latest({stream!r}) returned {got!r} for an empty stream"
        else:
            assert got is not None, f"get_latest({stream!r}) returned None"
            check_checkpoint(got, want, state=True)

    @rule(data=st.data())
    def load(self, data: st.DataObject) -> None:
        cid = self._pick_id(data)
        want = self.model.live.get(cid)
        if want is None:
            with pytest.raises(CheckpointNotFound):
                self.run(self.store.load(cid))
        else:
            check_checkpoint(self.run(self.store.load(cid)), want, state=True)

    @rule(data=st.data(), include_state=st.booleans())
    def load_many(self, data: st.DataObject, include_state: bool) -> None:
        wanted = self._pick_ids(data)
        got = self.run(self.store.load_many(wanted, include_state=include_state))
        expected = [cid for cid in dict.fromkeys(wanted) if cid in self.model.live]
        assert list(got) == expected, "load_many: live ids in the order asked, once each"
        for cid in expected:
            check_checkpoint(got[cid], self.model.live[cid], state=include_state)
        if not include_state:
            for cid in expected:
                header = self.run(self.store.load(cid, include_state=False))
                assert header == got[cid].header()

    @rule(prefix=st.sampled_from(["", "j", "job", "job/", "ü", "x"]) | st.none())
    def list_streams(self, prefix: str | None) -> None:
        names = {cp.stream for cp in self.model.live.values()}
        want = sorted(n for n in names if prefix is None or n.startswith(prefix))
        assert self.run(self.store.list_streams(prefix=prefix)) == want

    @rule(
        target=cursors,
        stream=st.none() | st.sampled_from(STREAMS),
        order=st.sampled_from(ORDERS),
        limit=st.integers(1, 4),
        tags=st.sampled_from(FILTERS),
        include_state=st.booleans(),
        data=st.data(),
        # mostly unfiltered, so that pages are full and cursors have neighbours
        metadata=st.just({}) | st.sampled_from(META_FILTERS),
    )
    def walk_pages(
        self,
        stream: str | None,
        order: Order,
        limit: int,
        tags: dict[str, str],
        include_state: bool,
        data: st.DataObject,
        metadata: dict[str, Any],
    ) -> Any:
        """Walk forward to the end, then back to the start, comparing every page; then,
        sometimes, delete the item at one of the cursors and resume from it."""
        query = Query(stream, order, tags, metadata)
        if refuses_filter(self.store, query, lambda: self._list(query, limit)):
            return multiple()
        kept: list[SavedCursor] = []
        bound = PageBound(len(self.model.live))
        page, issued = self._list(query, limit, include_state=include_state)
        kept += issued
        assert page.prev_cursor is None, "the first page has a prev_cursor"
        last = next((c for c in issued if c.cursor == page.next_cursor), None)
        while last is not None:
            bound.turn(last.cursor)
            page, issued = self._list(query, limit, after=last, include_state=include_state)
            kept += issued
            last = next((c for c in issued if c.cursor == page.next_cursor), None)
        back = next((c for c in issued if c.cursor == page.prev_cursor), None)
        bound = PageBound(len(self.model.live), follows="prev_cursor")
        while back is not None:
            bound.turn(back.cursor)
            page, issued = self._list(query, limit, before=back, include_state=include_state)
            kept += issued
            back = next((c for c in issued if c.cursor == page.prev_cursor), None)
        churn: bool = bool(kept) and data.draw(st.booleans(), label="delete at a cursor")
        if churn:
            self.delete_at_cursor(data.draw(st.sampled_from(kept), label="cursor"), limit)
        return multiple(*kept[:8])

    @rule(
        target=cursors,
        data=st.data(),
        order=st.sampled_from(ORDERS),
        tags=st.just({}) | st.sampled_from(FILTERS),
        metadata=st.just({}) | st.sampled_from(META_FILTERS),
        limit=st.integers(1, 4),
    )
    def cursor_at(
        self,
        data: st.DataObject,
        order: Order,
        tags: dict[str, str],
        metadata: dict[str, Any],
        limit: int,
    ) -> Any:
        """The cursor of a checkpoint's position (matching the filters or not) pages
        strictly past it and to the page before it."""
        cid = self._pick_id(data)

        def issue() -> str:
            return self.run(self.store.cursor_at(cid, order=order, tags=tags, metadata=metadata))

        if refuses_filter(self.store, Query(None, order, tags, metadata), issue):
            return multiple()  # sealed tags and metadata: no cursor for a filter on them
        if (current := self.model.live.get(cid)) is None:
            with pytest.raises(CheckpointNotFound):
                issue()
            return multiple()
        cursor = issue()
        saved = SavedCursor(cursor, Query(current.stream, order, tags, metadata), current.sequence)
        _, after = self._list(saved.query, limit, after=saved)
        _, before = self._list(saved.query, limit, before=saved)
        return multiple(saved, *(after + before)[:4])

    @rule(saved=cursors, limit=st.integers(1, 4), direction=st.sampled_from(["after", "before"]))
    def resume_from_cursor(self, saved: SavedCursor, limit: int, direction: str) -> None:
        """A cursor kept across later saves, deletes and reopens still marks its position."""
        if direction == "after":
            self._list(saved.query, limit, after=saved)
        else:
            self._list(saved.query, limit, before=saved)

    @rule(saved=cursors, limit=st.integers(1, 4))
    def delete_at_cursor(self, saved: SavedCursor, limit: int) -> None:
        """Delete the checkpoint a kept cursor was issued at, if it is still live: the
        cursor goes on marking its position, in both directions."""
        target = next(
            (cp for cp in self.model.live.values() if cp.sequence == saved.position), None
        )
        if target is not None:
            assert self.run(self.store.delete(target.id)) is True
            del self.model.live[target.id]
        self._list(saved.query, limit, after=saved)
        self._list(saved.query, limit, before=saved)

    @rule(keep_last=KEEP_LASTS, max_age=AGES, idle=AGES, elapsed=ELAPSED, dry_run=st.booleans())
    def sweep(self, keep_last: int | None, max_age: int | None, idle: int | None,
              elapsed: int, dry_run: bool) -> None:  # fmt: skip
        self.model.clock.advance(elapsed)
        policy = Retention(keep_last=keep_last, max_age=max_age, idle=idle)
        streams, doomed = self.model.sweep(policy)
        report = self.run(self.store.sweep(policy=policy, dry_run=dry_run))
        assert (report.streams_removed, report.checkpoints_removed) == (streams, len(doomed))
        for cid in [] if dry_run else doomed:
            del self.model.live[cid]

    @rule()
    def reopen(self) -> None:
        self.run(self.store.close())
        self.store = self.run(self._open())


def build_state_machine(store_factory: StoreFactory) -> type[CheckpointStoreStateMachine]:
    """A :class:`CheckpointStoreStateMachine` subclass bound to ``store_factory``."""
    return type(
        "BoundCheckpointStoreStateMachine",
        (CheckpointStoreStateMachine,),
        {"store_factory": staticmethod(store_factory)},
    )
