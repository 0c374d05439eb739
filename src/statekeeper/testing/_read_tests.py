"""Kit tests for strict reads (S3), save/load symmetry and the codec (S5, S11) and
TTL (S8)."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any

import pytest

from .._core.store import BaseCheckpointStore
from ..errors import CheckpointDecodeError, CheckpointEncodeError, CheckpointNotFound, InvalidQuery
from ..models import Page
from ..record import StoredRecord
from ._base import (
    FakeClock,
    KitBase,
    KitColor,
    KitModel,
    KitRecord,
    assert_same_value,
    corruptions,
    ids,
)

asyncio_test = pytest.mark.asyncio(loop_scope="function")

DAMAGE = tuple(corruptions(b"SK1 0 0 00000000\n"))


def _cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


class _StrSubclass(str):
    pass


def refused_states() -> dict[str, Any]:
    """States the default codec must refuse, by name (a fresh set on every call)."""
    return {
        "object": object(),
        "function": lambda: None,
        "pydantic model not allowlisted": KitModel(name="x", count=1),
        "dataclass not allowlisted": KitRecord(x=1, label="x"),
        "enum not allowlisted": KitColor.RED,
        "nested model not allowlisted": {"ok": [1, 2], "bad": [KitRecord(x=1, label="x")]},
        "nan": float("nan"),
        "infinity": {"x": float("inf")},
        "decimal nan": Decimal("NaN"),
        "lone surrogate": "\ud800",
        "lone surrogate key": {"\udfff": 1},
        "too deep": _deep(1000),
        "cycle": _cycle(),
        "huge int": 10**5000,
        "str subclass": _StrSubclass("x"),
        "naive tzinfo without offset": datetime(2030, 1, 1, tzinfo=_NoOffset()),
    }


class _NoOffset(tzinfo):
    def utcoffset(self, dt: datetime | None) -> None:
        return None

    def tzname(self, dt: datetime | None) -> str:
        return "nowhere"

    def dst(self, dt: datetime | None) -> None:
        return None


def tagged_state() -> dict[str, Any]:
    """A state using every built-in tagged type; it must round-trip exactly."""
    return {
        "set": {1, 2, 3},
        "frozenset": frozenset({"a", "b"}),
        "tuple": (1, "two", (3.5, None)),
        "empty": [(), set(), {}, [], ""],
        "datetime": datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        "datetime+02": datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2))),
        "naive datetime": datetime(2030, 1, 2, 3, 4, 5),
        "date": date(2030, 1, 2),
        "time": time(12, 30, 1, 5),
        "timedelta": timedelta(days=-1, microseconds=7),
        "decimal": Decimal("-1.50E+3"),
        "decimal trailing zero": Decimal("1.10"),
        "uuid": uuid.UUID("1b4e28ba-2fa1-11d2-883f-0016d3cca427"),
        "bytes": b"\x00\x01\xff",
        "int keys": {1: "a", 2: "b"},
        "tuple keys": {(1, 2): "pair"},
        "reserved key": {"$sk": "user data, not a tag"},
        "big int": 10**100,
        "bool vs int": [True, 1, 1.0, 0, False],
        "float": 0.1,
        "unicode": "ünïcødé 流 🚀",
    }


class ReadTests(KitBase):
    # -- S3: strict get_latest and load ------------------------------------------------

    @asyncio_test
    @pytest.mark.parametrize("damage", DAMAGE)
    async def test_get_latest_never_falls_back_to_older(
        self, store: BaseCheckpointStore, damage: str
    ) -> None:
        """Seed scenario: the newest record is corrupt; get_latest and load name it and
        list reports it, but nothing ever returns the older one as the latest."""
        self.require_raw_access(store)
        older = await self.save_steps(store, "job", 2)
        newest = await store.save("job", {"step": 2})
        raw = await store.backdoor_read_raw(newest.id)
        await store.backdoor_write_raw(newest.id, corruptions(raw)[damage])
        with pytest.raises(CheckpointDecodeError) as caught:
            await store.get_latest("job")
        assert caught.value.id == newest.id, f"the error names {caught.value.id!r}"
        with pytest.raises(CheckpointDecodeError) as caught:
            await store.load(newest.id)
        assert caught.value.id == newest.id
        self._assert_skipped(await store.list("job"), [cp.id for cp in reversed(older)], newest.id)
        top = await store.list("job", limit=1)
        self._assert_skipped(top, [], newest.id)
        assert top.has_more, "the skipped record used the page's slot; the others remain"
        assert ids(await store.list("job", after=top.next_cursor)) == [
            cp.id for cp in reversed(older)
        ]
        assert await store.list_streams() == ["job"]
        # Only the older ones are unaffected; the store never heals the newest silently.
        assert (await store.load(older[0].id)).state == {"step": 0}
        store = await self.reopen(store)
        with pytest.raises(CheckpointDecodeError):
            await store.get_latest("job")

    @asyncio_test
    async def test_a_record_of_another_store_is_refused_not_served(
        self, store: BaseCheckpointStore
    ) -> None:
        """An intact envelope that names another store (copied in from another store,
        or read from a table another store owns) is a damaged record here: every read
        checks the store id in the envelope (``StoredRecord.from_bytes(...,
        expect_store_id=)``) and none serves another store's checkpoint."""
        self.require_raw_access(store)
        older, newest = await self.save_steps(store, "job", 2)
        raw = await store.backdoor_read_raw(newest.id)
        record = StoredRecord.from_bytes(raw, location="kit", expect_sequence=newest.sequence)
        await store.backdoor_write_raw(newest.id, record.to_bytes(f"other-{store.store_id}"))
        for reopened in (False, True):
            if reopened:
                store = await self.reopen(store)
            with pytest.raises(CheckpointDecodeError) as caught:
                await store.load(newest.id)
            assert caught.value.id == newest.id
            with pytest.raises(CheckpointDecodeError) as caught:
                await store.get_latest("job")
            assert caught.value.id == newest.id
            with pytest.raises(CheckpointDecodeError):
                await store.load_many([older.id, newest.id])
            self._assert_skipped(await store.list("job"), [older.id], newest.id)
            self._assert_skipped(
                await store.list("job", include_state=False), [older.id], newest.id
            )

    @asyncio_test
    async def test_corrupt_checkpoint_can_still_be_deleted(
        self, store: BaseCheckpointStore
    ) -> None:
        self.require_raw_access(store)
        older, newest = await self.save_steps(store, "job", 2)
        await store.backdoor_write_raw(newest.id, b"garbage")
        assert await store.delete(newest.id) is True
        latest = await store.get_latest("job")
        assert latest is not None
        assert latest.id == older.id
        assert (await store.list("job")).skipped == []

    @asyncio_test
    async def test_seed_newest_with_disallowed_type_is_named_not_skipped_over(
        self, store: BaseCheckpointStore
    ) -> None:
        """Seed scenario: the newest state names a type the reading store does not allow."""
        older = await store.save("job", {"step": 0})
        store = await self.reopen(store, allowed_types=[KitModel])
        newest = await store.save("job", KitModel(name="step", count=1))
        store = await self.reopen(store)
        with pytest.raises(CheckpointDecodeError) as caught:
            await store.get_latest("job")
        assert caught.value.id == newest.id
        with pytest.raises(CheckpointDecodeError) as caught:
            await store.load(newest.id)
        assert caught.value.id == newest.id
        self._assert_skipped(await store.list("job"), [older.id], newest.id)
        self._assert_skipped(await store.list(None, order="asc"), [older.id], newest.id)
        headers = await store.list("job", include_state=False)
        assert ids(headers) == [newest.id, older.id], "headers are readable without the state"
        assert headers.skipped == []
        # Nothing was lost: a store that allows the type (named as a string) reads it.
        store = await self.reopen(store, allowed_types=[f"{KitModel.__module__}:KitModel"])
        latest = await store.get_latest("job")
        assert latest is not None
        assert latest.state == KitModel(name="step", count=1)

    @asyncio_test
    async def test_list_reports_every_unreadable_record_and_pages_past_it(
        self, store: BaseCheckpointStore
    ) -> None:
        self.require_raw_access(store)
        saved = [await store.save(f"s{i % 2}", {"i": i}) for i in range(7)]
        bad = {saved[1].id, saved[4].id, saved[6].id}
        for cid in bad:
            await store.backdoor_write_raw(cid, b"garbage")
        for limit in (1, 2, 3, 10):
            pages = await self.walk(store, None, limit=limit, order="asc")
            got = [cp.id for page in pages for cp in page.items]
            skipped = [s.id for page in pages for s in page.skipped]
            assert got == [cp.id for cp in saved if cp.id not in bad], f"limit={limit}"
            assert sorted(skipped) == sorted(bad), f"limit={limit}"  # type: ignore[type-var]

    @staticmethod
    def _assert_skipped(page: Page, expected_items: list[str], bad_id: str) -> None:
        assert ids(page) == expected_items, "the readable checkpoints must still be listed"
        assert len(page.skipped) == 1, f"expected one skipped record, got {page.skipped}"
        entry = page.skipped[0]
        assert entry.id == bad_id
        assert entry.sequence is not None
        assert entry.location, "a skipped record must say where it lives"
        assert entry.reason, "a skipped record must say why"
        assert entry.error == "CheckpointDecodeError"

    # -- S5 / S11: save/load symmetry and the codec -------------------------------------

    @asyncio_test
    async def test_save_refuses_state_that_load_would_refuse(
        self, store: BaseCheckpointStore
    ) -> None:
        for name, state in refused_states().items():
            with pytest.raises(CheckpointEncodeError):
                await store.save("job", state)
            with pytest.raises(CheckpointEncodeError):
                await store.save("job", state, id="chosen")
            assert await store.list_streams() == [], f"{name}: a refused save left a stream"
            assert await store.get_latest("job") is None, f"{name}: a refused save was stored"
            page = await store.list(None)
            assert (page.items, page.skipped) == ([], []), f"{name}: a refused save was stored"
        assert (await store.save("job", {}, id="chosen")).id == "chosen"

    @asyncio_test
    async def test_update_refuses_state_that_load_would_refuse(
        self, store: BaseCheckpointStore
    ) -> None:
        cp = await store.save("job", {"v": 1})
        for name, state in refused_states().items():
            with pytest.raises(CheckpointEncodeError):
                await store.update(cp.id, state)
            loaded = await store.load(cp.id)
            assert (loaded.state, loaded.etag) == ({"v": 1}, cp.etag), f"{name}: state changed"

    @asyncio_test
    async def test_metadata_must_be_plain_json(self, store: BaseCheckpointStore) -> None:
        for metadata in (
            {"tuple": (1, 2)},
            {"when": datetime(2030, 1, 1, tzinfo=UTC)},
            {"set": {1}},
            {"nan": float("nan")},
            {"$sk": "reserved"},
            {"nested": {1: "non-str key"}},
            "not a mapping",
            [("looks", "like pairs")],
        ):
            with pytest.raises(CheckpointEncodeError):
                await store.save("job", {}, metadata=metadata)  # type: ignore[arg-type]
        assert await store.list_streams() == []

    @asyncio_test
    async def test_allow_nan_is_for_state_not_metadata(self, store: BaseCheckpointStore) -> None:
        # Metadata is strict JSON (the record header, the index rows). It used to pass
        # the check under allow_nan=True, then the save raised a bare ValueError.
        store = await self.reopen(store, allow_nan=True)
        for metadata in ({"inf": float("inf")}, {"deep": [{"nan": float("nan")}]}):
            with pytest.raises(CheckpointEncodeError, match="NaN or infinite"):
                await store.save("job", {}, metadata=metadata)
        assert await store.list_streams() == []
        cp = await store.save("job", {"inf": float("inf")}, metadata={"ok": 1.5})
        loaded = await store.load(cp.id)
        assert (loaded.state, loaded.metadata) == ({"inf": float("inf")}, {"ok": 1.5})

    @asyncio_test
    async def test_tagged_values_round_trip_exactly(self, store: BaseCheckpointStore) -> None:
        state = tagged_state()
        cp = await store.save("job", state)
        store = await self.reopen(store)
        latest = await store.get_latest("job")
        assert latest is not None
        page = await store.list("job")
        for got in (await store.load(cp.id), latest, page.items[0]):
            assert_same_value(got.state, tagged_state())
        await store.update(cp.id, {"again": state})
        assert_same_value((await store.load(cp.id)).state, {"again": tagged_state()})

    @asyncio_test
    async def test_allowlisted_types_round_trip(self, store: BaseCheckpointStore) -> None:
        store = await self.reopen(store, allowed_types=[KitModel, KitRecord, KitColor])
        state = {
            "model": KitModel(name="a", count=2),
            "record": KitRecord(x=1, label="b"),
            "color": KitColor.BLUE,
            "in a tuple": (KitRecord(x=2, label="c"),),
        }
        cp = await store.save("job", state)
        loaded = (await store.load(cp.id)).state
        assert_same_value(loaded, state)

    # -- S8: TTL ----------------------------------------------------------------------

    async def _ttl_store(self, store: BaseCheckpointStore) -> tuple[BaseCheckpointStore, FakeClock]:
        self.require_ttl(store)
        clock = FakeClock()
        return await self.reopen(store, clock=clock), clock

    @asyncio_test
    async def test_expired_checkpoint_behaves_as_deleted_everywhere(
        self, store: BaseCheckpointStore
    ) -> None:
        store, clock = await self._ttl_store(store)
        older = await store.save("job", {"step": 0})
        temp = await store.save("job", {"step": 1}, ttl=10, id="temp")
        assert temp.expires_at == clock.now + timedelta(seconds=10)
        only = await store.save("short-lived", {}, ttl=timedelta(seconds=10))
        cursor = (await store.list("job", limit=1)).next_cursor
        assert cursor is not None
        clock.advance(10.5)
        latest = await store.get_latest("job")
        assert latest is not None
        assert latest.id == older.id, "get_latest returned an expired checkpoint"
        assert await store.get_latest("short-lived") is None
        for cid in (temp.id, only.id):
            with pytest.raises(CheckpointNotFound):
                await store.load(cid)
            with pytest.raises(CheckpointNotFound):
                await store.update(cid, {})
            assert await store.delete(cid) is False
            assert await store.delete(cid, if_match=temp.etag) is False
        assert ids(await store.list("job")) == [older.id]
        assert ids(await store.list(None)) == [older.id]
        assert await store.list_streams() == ["job"]
        assert await store.delete_stream("short-lived") == 0
        assert await store.prune("job", keep_last=1) == 0
        # The cursor's position outlives its expired item.
        assert ids(await store.list("job", limit=1, after=cursor)) == [older.id]
        again = await store.save("job", {"step": 2}, id="temp")
        assert again.sequence > only.sequence
        assert (await store.load("temp")).state == {"step": 2}

    @asyncio_test
    async def test_info_counts_live_checkpoints_and_expired_ones_apart(
        self, store: BaseCheckpointStore
    ) -> None:
        """``info().checkpoints`` and ``streams`` count what a read can still see (S8:
        expired means deleted); expired records not yet purged are counted apart, in
        ``info().extra["expired"]``, until ``purge_expired`` removes them. (They were
        counted as checkpoints.)"""
        store, clock = await self._ttl_store(store)
        await store.save("job", {"step": 0})
        await store.save("job", {"step": 1}, ttl=10)
        await store.save("short-lived", {}, ttl=10)

        def counts(info: Any) -> tuple[Any, ...]:
            return (info.checkpoints, info.streams, info.extra.get("expired", 0))

        assert counts(await store.info()) == (3, 2, 0)
        clock.advance(10.5)
        assert counts(await store.info()) == (1, 1, 2)
        assert await store.purge_expired() == 2
        assert counts(await store.info()) == (1, 1, 0)

    @asyncio_test
    async def test_ttl_slides_on_update(self, store: BaseCheckpointStore) -> None:
        store, clock = await self._ttl_store(store)
        cp = await store.save("job", {"v": 0}, ttl=10)
        clock.advance(8)
        up = await store.update(cp.id, {"v": 1})
        assert up.expires_at == clock.now + timedelta(seconds=10)
        clock.advance(8)
        assert (await store.load(cp.id)).state == {"v": 1}, "the TTL did not slide on update"
        clock.advance(2.5)
        with pytest.raises(CheckpointNotFound):
            await store.load(cp.id)
        assert await store.get_latest("job") is None

    @asyncio_test
    async def test_purge_expired_returns_count_and_never_reuses_sequence(
        self, store: BaseCheckpointStore
    ) -> None:
        store, clock = await self._ttl_store(store)
        keep = await store.save("a", {"keep": True})
        doomed = [await store.save(s, {}, ttl=5) for s in ("a", "b", "b")]
        assert await store.purge_expired() == 0
        clock.advance(6)
        assert await store.purge_expired() == 3
        assert await store.purge_expired() == 0
        assert ids(await store.list(None)) == [keep.id]
        store = await self.reopen(store, clock=clock)
        assert (await store.save("b", {})).sequence > doomed[-1].sequence

    @asyncio_test
    async def test_invalid_ttl_raises_invalid_query(self, store: BaseCheckpointStore) -> None:
        self.require_ttl(store)
        bad_ttls: tuple[Any, ...] = (0, -1, float("nan"), float("inf"), "10", True, timedelta(-1))
        for bad in bad_ttls:
            with pytest.raises(InvalidQuery):
                await store.save("job", {}, ttl=bad)
        assert await store.list_streams() == []

    @asyncio_test
    async def test_ttl_without_the_capability_raises_invalid_query(
        self, store: BaseCheckpointStore
    ) -> None:
        if store.capabilities.ttl:
            pytest.skip(
                f"{store.backend_name} declares capabilities.ttl; this test is for a "
                "backend without it"
            )
        with pytest.raises(InvalidQuery):
            await store.save("job", {}, ttl=10)
        assert await store.list_streams() == []
