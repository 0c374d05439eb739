"""The in-memory backend runs the conformance kit (SPEC S1-S8, S11), plaintext,
encrypted (S16) and encrypted with sealed tags and metadata."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.config import Capabilities
from statekeeper.errors import (
    CheckpointDecodeError,
    CheckpointEncodeError,
    InvalidQuery,
    StoreFormatError,
)
from statekeeper.models import CheckpointHeader, NewCheckpoint
from statekeeper.record import StoredRecord
from statekeeper.testing import CheckpointStoreTests, StoreFactory, encrypted_options, kit_keyring


class TestMemoryConformance(CheckpointStoreTests):
    # The fake is the backend users test against, so it runs every set in full.
    option_sets = {
        "plain": {},
        "encrypted": encrypted_options(),
        "sealed-metadata": encrypted_options(metadata=True),
    }

    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        storage = MemoryStorage()
        return lambda **options: MemoryCheckpointStore(storage=storage, **options)


@pytest.mark.asyncio
async def test_non_mapping_metadata_is_refused_with_encode_error() -> None:
    """Regression: ``dict(metadata)`` ran before validation, so a string or a number
    raised a bare ValueError/TypeError and a list of pairs was silently accepted."""
    async with MemoryCheckpointStore() as store:
        for metadata in ("ab", 5, [("a", 1)], [1, 2]):
            with pytest.raises(CheckpointEncodeError):
                await store.save("job", {}, metadata=metadata)  # type: ignore[arg-type]
        assert await store.list_streams() == []


@pytest.mark.asyncio
async def test_mutating_what_a_read_returned_never_changes_the_store() -> None:
    """Reads may reuse the parsed envelope of the bytes the store holds, but every
    checkpoint they return is the caller's own: mutating its state, tags or
    metadata (nested too) changes nothing the store returns next."""
    meta = {"note": "n", "nested": {"list": [1, 2]}, "flat": 1.5}
    state = {"step": 1, "items": [{"a": 1}]}
    async with MemoryCheckpointStore() as store:
        saved = await store.save("job", state, tags={"kind": "step"}, metadata=meta)
        # the caller's own objects, mutated after the save
        meta["nested"]["list"].append(3)  # type: ignore[index]
        state["items"].append({"b": 2})  # type: ignore[attr-defined]

        async def reads() -> list[Any]:
            latest = await store.get_latest("job")
            assert latest is not None
            page = await store.list("job")
            many = await store.load_many([saved.id])
            return [latest, await store.load(saved.id), page.items[0], many[saved.id]]

        for _ in range(2):  # the second round reads whatever the first one cached
            for cp in await reads():
                assert cp.state == {"step": 1, "items": [{"a": 1}]}
                assert cp.tags == {"kind": "step"}
                assert cp.metadata == {"note": "n", "nested": {"list": [1, 2]}, "flat": 1.5}
                cp.state["items"].append("x")
                cp.state["step"] = 99
                cp.tags["kind"] = "changed"
                cp.metadata["nested"]["list"].append("x")
                cp.metadata["note"] = "changed"
        header = await store.load(saved.id, include_state=False)
        header.metadata["nested"]["list"].clear()
        header.tags.clear()
        again = await store.load(saved.id)
        assert again.metadata["nested"] == {"list": [1, 2]} and again.tags == {"kind": "step"}


async def plant_damage(store: MemoryCheckpointStore, cid: str, stream: str) -> bytes:
    """Flip a bit of the stored record ``cid`` (the latest of ``stream``) behind the
    store's back, and check that the next reads see it; returns the record's bytes."""
    raw = await store.backdoor_read_raw(cid)
    await store.backdoor_write_raw(cid, raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(CheckpointDecodeError):
        await store.load(cid)
    with pytest.raises(CheckpointDecodeError):
        await store.get_latest(stream)
    return raw


@pytest.mark.asyncio
async def test_reads_see_a_backdoor_write_and_an_update_at_once() -> None:
    """Whatever a read reuses is tied to the very bytes stored: a planted record or
    an update is what the next read sees."""
    async with MemoryCheckpointStore() as store:
        cp = await store.save("job", {"v": 1}, metadata={"m": 1})
        assert (await store.load(cp.id)).state == {"v": 1}
        await store.update(cp.id, {"v": 2}, metadata={"m": 2})
        latest = await store.get_latest("job")
        assert latest is not None and (latest.state, latest.metadata) == ({"v": 2}, {"m": 2})
        raw = await plant_damage(store, cp.id, "job")
        await store.backdoor_write_raw(cp.id, raw)
        assert (await store.load(cp.id)).state == {"v": 2}


@pytest.mark.asyncio
async def test_deeply_nested_planted_metadata_never_escapes_as_recursion_error() -> None:
    """Regression: copying the kept header's metadata for a read could run out of
    interpreter stack and escape as a bare RecursionError; a read now parses the
    bytes anew then, which returns or raises CheckpointDecodeError like any read."""
    import inspect
    import json
    import sys
    import zlib

    async with MemoryCheckpointStore() as store:
        cp = await store.save("job", {"v": 1})
        raw = await store.backdoor_read_raw(cp.id)
        newline = raw.index(b"\n")
        head_len = int(raw[:newline].split(b" ")[1])
        head = json.loads(raw[newline + 1 : newline + 1 + head_len])
        state = raw[newline + 1 + head_len :]
        deep: Any = 1
        for _ in range(150):
            deep = {"d": deep}
        head["meta"] = {"deep": deep}
        planted = json.dumps(head, separators=(",", ":")).encode()
        crc = zlib.crc32(state, zlib.crc32(planted))
        prefix = b"SK1 %d %d %08x\n" % (len(planted), len(state), crc)
        await store.backdoor_write_raw(cp.id, prefix + planted + state)
        assert (await store.load(cp.id)).metadata == {"deep": deep}  # parsed and kept
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(len(inspect.stack()) + 120)
        try:
            try:
                got = await store.load(cp.id)
            except CheckpointDecodeError:
                pass
            else:
                assert got.metadata == {"deep": deep}
        finally:
            sys.setrecursionlimit(old)


@pytest.mark.asyncio
async def test_mutating_what_a_save_returned_never_changes_the_store() -> None:
    """Regression: the checkpoint ``save`` returned shared its tags dict with the
    store's tag index, so ``cp.tags[k] = ...`` hid the checkpoint from ``list(tags=)``
    (and changed the tags a later read reported)."""
    async with MemoryCheckpointStore() as store:
        saved = await store.save("job", {"v": 1}, tags={"kind": "step"}, metadata={"m": [1]})
        many = await store.save_many(
            [NewCheckpoint(stream="job", state={"v": 2}, tags={"kind": "step"})]
        )
        for cp in (saved, *many):
            cp.tags["kind"] = "changed"
            cp.tags["extra"] = "x"
            cp.metadata.setdefault("m", []).append(2)
        page = await store.list("job", tags={"kind": "step"})
        assert [cp.id for cp in page.items] == [many[0].id, saved.id]
        assert [(cp.tags, cp.metadata) for cp in page.items] == [
            ({"kind": "step"}, {}),
            ({"kind": "step"}, {"m": [1]}),
        ]
        assert (await store.list("job", tags={"kind": "changed"})).items == []


@pytest.mark.asyncio
async def test_the_envelope_is_the_one_the_save_saw_whenever_it_is_built() -> None:
    """A save without metadata leaves the envelope to be built on first use: its
    bytes are still those of the values the save saw, whatever the caller does to
    what it passed or what ``save`` returned, and so are the bytes built at once
    for a save with metadata."""
    async with MemoryCheckpointStore() as store:
        for tags, metadata in (({"k": "v"}, None), ({}, {"m": [1]})):
            given = dict(tags)
            cp = await store.save("job", {"v": 1}, tags=given, metadata=metadata, ttl=60)
            header = CheckpointHeader.model_validate(cp.model_dump(exclude={"state"}))
            expected = StoredRecord(
                header=header, state=store.codec.encode({"v": 1}), codec=store.codec.name, ttl=60.0
            ).to_bytes(store.storage.store_id)
            given["k"] = "given"
            cp.tags["k"] = "changed"
            cp.metadata.setdefault("m", []).append(2)
            if metadata is not None:
                metadata["m"].append(3)
            raw = await store.backdoor_read_raw(cp.id)
            assert raw == expected
            assert (await store.load(cp.id, include_state=False)) == header
            assert await store.backdoor_read_raw(cp.id) is raw


@pytest.mark.asyncio
async def test_a_pending_envelope_reads_as_its_bytes_would() -> None:
    """A read of a checkpoint whose envelope is still pending takes the save's values
    without building the bytes only when they round-trip: it gives what parsing the
    bytes gives, field for field and type for type; any other clock reads the bytes
    (a ZoneInfo comes back as its fixed offset, a naive time is a decode error),
    as every other backend does."""
    from datetime import UTC, datetime, timedelta, timezone
    from zoneinfo import ZoneInfo

    from statekeeper.backends.memory.storage import Entry

    def parsed(store: MemoryCheckpointStore, entry: Entry) -> StoredRecord:
        return StoredRecord.from_bytes(
            entry.blob, location="t", expect_store_id=store.storage.store_id
        )

    def header_fields(header: CheckpointHeader) -> list[tuple[str, Any, type]]:
        values = {name: getattr(header, name) for name in CheckpointHeader.model_fields}
        stamps = [(v.tzinfo, v.tzname(), v.fold) for v in values.values() if type(v) is datetime]
        return [(k, v, type(v)) for k, v in sorted(values.items())] + [("tz", stamps, list)]

    def fields(record: StoredRecord) -> list[tuple[str, Any, type]]:
        extra = [("state", record.state, bytes), ("codec", record.codec, str)]
        return [*header_fields(record.header), *extra, ("ttl", record.ttl, type(record.ttl))]

    async with MemoryCheckpointStore() as store:
        header = CheckpointHeader(
            id="imported",
            stream="other",
            sequence=7,
            created_at=datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
            updated_at=datetime(2021, 1, 2, 3, 4, 5, tzinfo=UTC),
            etag="e1",
            parent_id="p1",
            tags={"k": "v"},
            expires_at=datetime(2999, 1, 1, tzinfo=UTC),
            metadata={"k": [1, 2.5]},
        )
        metadata: dict[str, Any] = {
            "deep": [1, {"x": -0.0, "big": 10**40, "f": 1e300, "t": True}, None],
            "s": "é \u2028 \x01",
            "e": {},
        }
        saved = [
            await store.save("job", {"v": 1}),
            await store.save("job \u2028 \x01 é", [1.5], tags={"t": "ü"}, ttl=0.5, parent_id="x"),
            await store.save("job", None, ttl=timedelta(days=3), id="given.id"),
            await store.import_checkpoint(header, {"v": 2}),
            await store.save("job", {"v": 4}, metadata=metadata),
        ]
        metadata["deep"][1]["x"] = 1.0  # the caller's later change never reaches the store
        for cp in saved:
            entry = store.storage.by_id[cp.id]
            direct = entry.read_pending()
            assert direct is not None
            assert fields(direct) == fields(parsed(store, entry))
            assert entry.read_pending() is None  # the bytes are built now
        fresh = await store.save("job", {"v": 3})
        entry = store.storage.by_id[fresh.id]
        got = await store.load(fresh.id)
        assert entry._blob is None  # read without building the envelope
        assert header_fields(got) == header_fields(parsed(store, entry).header)

    zone = ZoneInfo("Europe/Paris")
    clocks = [
        lambda: datetime.now(zone),
        lambda: datetime.now(timezone(timedelta(hours=2))),
        lambda: datetime.now(timezone(timedelta(0), "Z")),
        lambda: datetime.now(UTC).replace(fold=1),
    ]
    for clock in clocks:
        async with MemoryCheckpointStore(clock=clock) as store:
            cp = await store.save("job", {"v": 1}, ttl=60)
            entry = store.storage.by_id[cp.id]
            assert entry.read_pending() is None
            loaded = await store.load(cp.id)
            assert header_fields(loaded) == header_fields(parsed(store, entry).header)
    async with MemoryCheckpointStore(clock=lambda: datetime(2026, 1, 1)) as store:
        cp = await store.save("job", {"v": 1})
        assert store.storage.by_id[cp.id].read_pending() is None
        with pytest.raises(CheckpointDecodeError, match="timezone-aware"):
            await store.load(cp.id)


@pytest.mark.asyncio
async def test_a_read_kept_from_a_pending_envelope_yields_to_a_backdoor_write_or_update() -> None:
    """A read of a pending envelope is kept like any parse, tied to "no bytes yet":
    a planted record, or an update, is what the next read sees."""
    async with MemoryCheckpointStore() as store:
        cp = await store.save("job", {"v": 1})
        assert store.storage.by_id[cp.id]._blob is None
        assert (await store.load(cp.id)).state == {"v": 1}  # kept, bytes still pending
        await plant_damage(store, cp.id, "job")
        other = await store.save("job", {"v": 2})
        assert (await store.load(other.id)).etag == other.etag  # kept, pending
        await store.update(other.id, {"v": 3})
        latest = await store.get_latest("job")
        assert latest is not None and (latest.id, latest.state) == (other.id, {"v": 3})
        assert latest.etag != other.etag


@pytest.mark.asyncio
async def test_the_saved_checkpoint_is_the_one_the_default_insert_checkpoint_gives() -> None:
    """The memory store builds the checkpoint ``save`` returns straight from the
    record and its sequence (one model); it must be what the primitives' default
    (``_insert``'s header with the state) gives, for one record or several, with
    and without metadata, and a complete model whose state is the caller's object."""
    from datetime import UTC, datetime

    from statekeeper._core.primitives import StorePrimitives
    from statekeeper.models import Checkpoint
    from statekeeper.record import NewRecord

    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def record(i: int, metadata: dict[str, Any]) -> NewRecord:
        return NewRecord(
            id=f"cp-{i}", stream="s", state=b'{"a":1}', codec="sk-json/1", created_at=t0,
            updated_at=t0, etag=f"e{i}", parent_id=None, tags={"k": "v"}, metadata=metadata,
            ttl=None, expires_at=None,
        )  # fmt: skip

    async with MemoryCheckpointStore() as fast, MemoryCheckpointStore() as default:
        for i, metadata in enumerate(({}, {"m": [1]}, {}), 1):
            state = {"a": 1}
            got = await fast._insert_checkpoint(record(i, metadata), state)
            want = await StorePrimitives._insert_checkpoint(default, record(i, metadata), state)
            assert type(got) is Checkpoint and got.state is state
            assert got == want and got.model_dump() == want.model_dump()
            assert got.model_fields_set == want.model_fields_set == set(Checkpoint.model_fields)
            assert got.header() == await fast.load(got.id, include_state=False)
        batch = [record(i, {"m": i}) for i in (7, 8)]
        assert await fast._insert_many(batch) == await default._insert_many(batch)
        assert [h.sequence for h in await fast._insert_many([record(9, {})])] == [6]


@pytest.mark.asyncio
async def test_a_subclass_that_changes_insert_still_decides_every_save() -> None:
    """The memory store's own ``_insert_checkpoint`` skips ``_insert``; a subclass
    that overrides ``_insert`` (the kit's mutants do) must still see every save and
    import go through it."""
    from statekeeper.models import CheckpointHeader as Header
    from statekeeper.record import NewRecord

    seen: list[str] = []

    class Counting(MemoryCheckpointStore):
        async def _insert(self, record: NewRecord) -> Header:
            seen.append(record.id)
            return await super()._insert(record)

    async with Counting() as store:
        cp = await store.save("s", {"a": 1}, id="one")
        await store.import_checkpoint(cp.model_copy(update={"id": "two"}), {"a": 2})
        assert seen == ["one", "two"]
        assert (await store.load("two")).state == {"a": 2}


@pytest.mark.asyncio
async def test_sealed_metadata_filters_are_refused_where_the_backend_scans_them() -> None:
    """Regression: memory has no native metadata filter, so list(metadata=) filtered
    by scanning with the filter left out of the backend's query, and answered it from
    the opened metadata where a SQL store raised InvalidQuery (an empty store too)."""
    async with MemoryCheckpointStore(encryption=kit_keyring(), encrypt_metadata=True) as store:
        assert store.capabilities.metadata_filter is False
        for _ in range(2):  # empty, then with a matching checkpoint
            for stream in (None, "job"):
                for query in ({"metadata": {"m": 1}}, {"tags": {"k": "v"}}):
                    with pytest.raises(InvalidQuery, match="encrypt_metadata=True"):
                        await store.list(stream, **query)
            await store.save("job", {}, tags={"k": "v"}, metadata={"m": 1})
        page = await store.list("job")
        assert [(cp.tags, cp.metadata) for cp in page.items] == [({"k": "v"}, {"m": 1})] * 2


class _ReadsNeedStoreId(MemoryCheckpointStore):
    """A backend whose reads check each record's store id, as the Redis plugin's do."""

    async def _scan(self, query: Any) -> Any:
        assert self.store_id
        return await super()._scan(query)


@pytest.mark.asyncio
async def test_encrypted_open_checks_the_newest_record_once_the_store_is_open() -> None:
    """Regression: the plaintext check of an encrypted open scanned the newest record
    before the store counted as open, so a backend whose reads use ``store_id`` (the
    Redis plugin) raised StoreClosed on every reopen of a non-empty store."""
    storage, keyring = MemoryStorage(), kit_keyring()
    async with _ReadsNeedStoreId(storage=storage, encryption=keyring) as store:
        cp = await store.save("job", {"n": 1})
    async with _ReadsNeedStoreId(storage=storage, encryption=keyring) as store:
        assert (await store.load(cp.id)).state == {"n": 1}
    async with _ReadsNeedStoreId(storage=storage) as plain:
        await plain.save("job", {"n": "plaintext"})
    refused = _ReadsNeedStoreId(storage=storage, encryption=keyring)
    with pytest.raises(StoreFormatError, match="rekey"):
        await refused.open()
    assert not refused.is_open, "a refused open left the store open"


class _NoCapabilitiesDeclared(MemoryCheckpointStore):
    """A backend author's store that declares no capabilities at all."""

    capabilities: ClassVar[Capabilities] = Capabilities()


@pytest.mark.asyncio
async def test_a_backend_that_declares_nothing_is_not_assumed_to_expire_records() -> None:
    """Capabilities are declared, never guessed (SPEC §3): ``ttl`` too. A store that
    never declared it refuses ``ttl=`` instead of keeping the checkpoint forever."""
    assert Capabilities().ttl is False
    async with _NoCapabilitiesDeclared() as store:
        with pytest.raises(InvalidQuery, match="ttl"):
            await store.save("s", 1, ttl=60)
        assert await store.get_latest("s") is None
