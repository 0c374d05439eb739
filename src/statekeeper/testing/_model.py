"""The reference model the state machine runs a backend against.

Deliberately naive: a dict of live checkpoints and the highest sequence seen, and
listings computed by sorting and filtering that dict. Nothing here shares code with
the store (metadata matching included), so a bug in the store's helpers is not
repeated by the model that checks it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import pytest
from hypothesis import strategies as st

from .._core.interface import Order
from .._core.store import BaseCheckpointStore
from ..errors import InvalidQuery
from ..models import Checkpoint, CheckpointHeader, NewCheckpoint, Page, Retention
from ._base import FakeClock, assert_same_value

__all__ = [
    "AGES",
    "ELAPSED",
    "KEEP_LASTS",
    "NEVER_SAVED",
    "ModelCheckpoint",
    "Query",
    "ReferenceModel",
    "SavedCursor",
    "check_checkpoint",
    "check_page",
    "if_match_for",
]

#: An id the model offers to every id-taking rule, and that no rule ever saves.
NEVER_SAVED = "never-saved"

# What the state machine's rules pick from.
STREAMS = ("job", "job/../other", "ünï")
CALLER_IDS = ("id-a", "id-b", "id.c")
TAGSETS: tuple[dict[str, str], ...] = ({}, {"kind": "a"}, {"kind": "b"}, {"kind": "a", "x": "1"})
FILTERS: tuple[dict[str, str], ...] = ({}, {"kind": "a"}, {"kind": "a", "x": "1"}, {"x": "1"})
#: Metadata whose values are equal in Python but of different JSON kinds.
METADATAS: tuple[dict[str, Any], ...] = (
    {},
    {"a": True},
    {"a": 1},
    {"a": 1.0},
    {"a": None},
    {"a": "1"},
    {"a": [1]},
    {"a": 1, "b": False},
    {"b": 0},
)
META_FILTERS: tuple[dict[str, Any], ...] = (
    {},
    {"a": True},
    {"a": 1},
    {"a": 1.0},
    {"a": None},
    {"b": 0},
    {"b": False},
    {"a": 1, "b": False},
)
ORDERS: tuple[Order, ...] = ("asc", "desc")
#: What the sweep rule (S17) picks from: ``keep_last``, ages (``max_age`` and
#: ``idle``, seconds) and the time that passes first (at the boundaries too: an
#: age equal to a limit is not older than it).
KEEP_LASTS: st.SearchStrategy[int | None] = st.none() | st.integers(1, 3)
AGES: st.SearchStrategy[int | None] = st.sampled_from([None, 60, 3600])
ELAPSED: st.SearchStrategy[int] = st.sampled_from([0, 60, 61, 3601])


@dataclasses.dataclass
class ModelCheckpoint:
    id: str
    stream: str
    sequence: int
    state: Any
    tags: dict[str, str]
    etag: str
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: when it was last written, by the model's clock (set by ``ReferenceModel.add``)
    written: datetime | None = None

    @classmethod
    def saved(cls, cp: Checkpoint, item: NewCheckpoint) -> ModelCheckpoint:
        """What the model holds of ``item``, which a save returned as ``cp``."""
        tags, metadata = dict(item.tags or {}), dict(item.metadata or {})
        return cls(cp.id, item.stream, cp.sequence, item.state, tags, cp.etag, metadata)


def if_match_for(mode: str, current: ModelCheckpoint | None) -> str | None:
    """The ``if_match`` of an update or delete rule: none, the current etag, or a
    stale one (also when there is no current checkpoint)."""
    if mode == "none":
        return None
    if mode == "current" and current is not None:
        return current.etag
    return "stale-etag"


@dataclasses.dataclass(frozen=True)
class Query:
    stream: str | None
    order: Order
    tags: Mapping[str, str]
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SavedCursor:
    """A cursor the store issued, with the position the model says it marks."""

    cursor: str
    query: Query
    position: int


def refuses_filter(store: BaseCheckpointStore, query: Query, attempt: Callable[[], object]) -> bool:
    """Whether ``query`` filters on tags or metadata that ``store`` seals
    (``encrypt_metadata=True``): then ``attempt``, a listing of it, must raise
    :class:`~statekeeper.errors.InvalidQuery` (SPEC S16), which this checks, and the
    rule has nothing more to compare."""
    options = store.options
    if options.encryption is None or not options.encrypt_metadata:
        return False
    if not (query.tags or query.metadata):
        return False
    with pytest.raises(InvalidQuery):
        attempt()
    return True


def same_scalar(have: Any, want: Any) -> bool:
    """JSON equality of two scalars: the same Python type and equal (so ``True`` is
    not ``1`` and ``1`` is not ``1.0``)."""
    return type(have) is type(want) and have == want


class ReferenceModel:
    """What a correct store holds: live checkpoints by id and the sequence high-water mark."""

    def __init__(self) -> None:
        self.live: dict[str, ModelCheckpoint] = {}
        self.high_water = 0
        # In order of first save, so that a draw picks the same id when Hypothesis
        # replays a program (the ids themselves are random).
        self.known_ids: dict[str, None] = {NEVER_SAVED: None}
        #: The store's clock too (``clock=``): ages for retention come from it.
        self.clock = FakeClock()

    def add(self, cp: ModelCheckpoint) -> None:
        cp.written = self.clock.now
        self.high_water = cp.sequence
        self.known_ids.setdefault(cp.id)
        self.live[cp.id] = cp

    def matches(self, cp: ModelCheckpoint, query: Query) -> bool:
        return (
            query.stream in (None, cp.stream)
            and query.tags.items() <= cp.tags.items()
            and all(
                key in cp.metadata and same_scalar(cp.metadata[key], value)
                for key, value in query.metadata.items()
            )
        )

    def candidates(self, query: Query) -> list[ModelCheckpoint]:
        """Live checkpoints matching ``query``'s stream and filters, by ascending sequence."""
        return sorted(
            (cp for cp in self.live.values() if self.matches(cp, query)),
            key=lambda cp: cp.sequence,
        )

    def page(
        self, query: Query, limit: int, after: int | None, before: int | None
    ) -> tuple[list[ModelCheckpoint], int | None, int | None]:
        """The items, next position and previous position of one page (SPEC S4)."""
        cands = self.candidates(query)
        order, back = (query.order, "desc" if query.order == "asc" else "asc")
        step = 1 if order == "asc" else -1

        def beyond(direction: str, bound: int | None) -> list[ModelCheckpoint]:
            if direction == "asc":
                return [cp for cp in cands if bound is None or cp.sequence > bound]
            return [cp for cp in reversed(cands) if bound is None or cp.sequence < bound]

        next_pos: int | None
        prev_pos: int | None = None
        if before is None:
            got = beyond(order, after)
            items = got[:limit]
            next_pos = items[-1].sequence if len(got) > limit else None
            if after is not None:
                edge = items[0].sequence if items else after + step
                prev_pos = edge if beyond(back, edge) else None
        else:
            got = beyond(back, before)
            items = got[:limit][::-1]
            prev_pos = items[0].sequence if len(got) > limit else None
            edge = items[-1].sequence if items else before - step
            next_pos = edge if beyond(order, edge) else None
        return items, next_pos, prev_pos

    def sweep(self, policy: Retention) -> tuple[int, list[str]]:
        """What a sweep under ``policy`` removes now (SPEC S17): the number of idle
        streams, and the ids of every checkpoint that goes."""
        now, streams, doomed = self.clock.now, 0, []
        for stream in {cp.stream for cp in self.live.values()}:
            newest_first = self.candidates(Query(stream, "asc", {}))[::-1]
            for rank, cp in enumerate(newest_first, start=1):
                assert cp.written is not None
                age = now - cp.written
                if rank == 1:
                    idle = policy.idle is not None and age > policy.idle
                    streams += idle
                if (
                    idle
                    or (policy.keep_last is not None and rank > policy.keep_last)
                    or (rank > 1 and policy.max_age is not None and age > policy.max_age)
                ):
                    doomed.append(cp.id)
        return streams, doomed

    def newest(self, stream: str) -> ModelCheckpoint | None:
        found = self.candidates(Query(stream, "asc", {}))
        return found[-1] if found else None


def check_checkpoint(got: CheckpointHeader, want: ModelCheckpoint, *, state: bool) -> None:
    """Assert that the store's ``got`` is the model's ``want`` (the state too, with
    ``state``; else that it is a header, with no state)."""
    assert (got.id, got.stream, got.sequence, got.etag, got.tags, got.metadata) == (
        want.id,
        want.stream,
        want.sequence,
        want.etag,
        want.tags,
        want.metadata,
    )
    for key, value in want.metadata.items():
        assert type(got.metadata[key]) is type(value), f"metadata {key!r} changed kind"
    if state:
        assert isinstance(got, Checkpoint), "a read with the state gives a checkpoint"
        assert_same_value(got.state, want.state)
    else:
        assert type(got) is CheckpointHeader, "a read without state gives a header"


def check_page(
    page: Page,
    model: ReferenceModel,
    query: Query,
    limit: int,
    after: SavedCursor | None,
    before: SavedCursor | None,
    include_state: bool,
) -> list[SavedCursor]:
    """Assert that the store's ``page`` of ``query`` is the model's; return the
    cursors it issued, each with the position the model says it marks."""
    items, next_pos, prev_pos = model.page(
        query,
        limit,
        after.position if after else None,
        before.position if before else None,
    )
    assert [cp.id for cp in page.items] == [cp.id for cp in items]
    for got, want in zip(page.items, items, strict=True):
        check_checkpoint(got, want, state=include_state)
    assert page.skipped == []
    assert (page.next_cursor is None) == (next_pos is None), "next_cursor disagrees"
    assert (page.prev_cursor is None) == (prev_pos is None), "prev_cursor disagrees"
    assert page.has_more == (page.next_cursor is not None)
    issued = []
    if page.next_cursor is not None and next_pos is not None:
        issued.append(SavedCursor(page.next_cursor, query, next_pos))
    if page.prev_cursor is not None and prev_pos is not None:
        issued.append(SavedCursor(page.prev_cursor, query, prev_pos))
    return issued
