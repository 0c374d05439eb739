"""Kit tests for ``list_streams(prefix=)`` and ``codec="raw"`` (both codecs reading
each other's records)."""

from __future__ import annotations

from typing import Any

import pytest

from .._core.store import BaseCheckpointStore
from ..errors import (
    CheckpointEncodeError,
    InvalidQuery,
)
from ..record import StoredRecord
from ._base import KitBase

asyncio_test = pytest.mark.asyncio(loop_scope="function")
__all__ = ["CodecTests"]

#: Stream names around which a prefix query (SQL ``LIKE`` with ``%``, ``_`` and
#: ``\\``, a range ending in U+10FFFF, a case-insensitive collation) goes wrong.
PREFIX_STREAMS = (
    "a",
    "a/",
    "a/b",
    "a%",
    "a%b",
    "a_",
    "a_b",
    "ab",
    "aB",
    "A/b",
    "a\\",
    "a\\b",
    "a\\%",
    "a'b",
    "b/a",
    "%",
    "_",
    "\\",
    "thread-7/x",
    "thread-7/y",
    "thread-70",
    "ü",
    "ünï/1",
    "ünï",
    "u",
    "🚀/x",
    "a\U0010ffff",
    "a\U0010ffffz",
    "x" * 512,
)
PREFIXES = (
    "",
    "a",
    "a/",
    "A",
    "a%",
    "a_",
    "a\\",
    "a\\%",
    "%",
    "_",
    "\\",
    "'",
    "a'",
    "thread-7/",
    "thread-7",
    "ü",
    "ünï/",
    "u",
    "🚀",
    "a\U0010ffff",
    "x" * 511,
    "x" * 512,
    "nothing",
)


class CodecTests(KitBase):
    # -- list_streams(prefix=) ----------------------------------------------------------

    @asyncio_test
    async def test_list_streams_by_prefix(self, store: BaseCheckpointStore) -> None:
        for name in PREFIX_STREAMS:
            await store.save(name, {"name": name})
        gone = await store.save("a/gone", {})
        await store.delete(gone.id)
        for prefix in PREFIXES:
            want = sorted(n for n in PREFIX_STREAMS if n.startswith(prefix))
            assert await store.list_streams(prefix=prefix) == want, f"prefix {prefix!r}"
        assert await store.list_streams(prefix=None) == sorted(PREFIX_STREAMS)
        await store.delete_stream("a/b")
        assert await store.list_streams(prefix="a/") == ["a/"]
        for bad in ("a\x00", 7, b"a"):
            with pytest.raises(InvalidQuery):
                await store.list_streams(prefix=bad)  # type: ignore[arg-type]

    # -- codec="raw" --------------------------------------------------------------------

    @asyncio_test
    async def test_raw_codec_stores_bytes_verbatim(self, store: BaseCheckpointStore) -> None:
        store = await self.reopen(store, codec="raw")
        payloads = [b"", b"\xff\xfe\x00 not utf-8 \x80", bytes(range(256)), b'{"$sk": "b64"}']
        saved = [await store.save("raw", payload) for payload in payloads]
        for cp, payload in zip(saved, payloads, strict=True):
            loaded = await store.load(cp.id)
            assert type(loaded.state) is bytes
            assert loaded.state == payload
        latest = await store.get_latest("raw")
        assert latest is not None
        assert latest.state == payloads[-1]
        page = await store.list("raw", order="asc")
        assert [cp.state for cp in page.items] == payloads
        updated = await store.update(saved[0].id, b"\x00\x01", metadata={"m": "json still"})
        assert (await store.load(saved[0].id)).state == b"\x00\x01"
        assert updated.metadata == {"m": "json still"}
        if store.capabilities.raw_access:
            raw = await store.backdoor_read_raw(saved[1].id)
            record = StoredRecord.from_bytes(raw, location="kit", expect_sequence=saved[1].sequence)
            if self.is_encrypted(store):
                # verbatim inside the envelope: sealed as raw bytes, not as JSON
                assert record.codec == "aes256gcm:raw"
                opened = self.sealer_of(store).open(saved[1].id, "raw", record.codec, record.state)
                assert (opened.codec, opened.state) == ("raw", payloads[1]), "not sealed verbatim"
                assert payloads[1] not in raw, "the raw state is in the stored bytes"
            else:
                assert (record.codec, record.state) == ("raw", payloads[1]), "not stored verbatim"
                assert raw.endswith(payloads[1])

    @asyncio_test
    async def test_raw_codec_refuses_anything_but_bytes(self, store: BaseCheckpointStore) -> None:
        store = await self.reopen(store, codec="raw", max_bytes=64)
        cp = await store.save("raw", b"kept")
        refused: list[Any] = [
            "text",
            bytearray(b"x"),
            memoryview(b"x"),
            {"a": 1},
            None,
            1,
            [b"x"],
            b"x" * 65,
        ]
        for state in refused:
            with pytest.raises(CheckpointEncodeError):
                await store.save("raw", state)
            with pytest.raises(CheckpointEncodeError):
                await store.update(cp.id, state)
        assert (await store.save("raw", b"x" * 64)).state == b"x" * 64
        loaded = await store.load(cp.id)
        assert (loaded.state, loaded.etag) == (b"kept", cp.etag)
        assert len((await store.list("raw")).items) == 2

    @asyncio_test
    async def test_each_codec_reads_records_of_the_other(self, store: BaseCheckpointStore) -> None:
        """Records name their codec: the codec option only decides how new states
        are encoded, so a JSON store reads raw records and a raw store JSON ones."""
        as_json = await store.save("mixed", {"codec": "json", "b": b"\xff"})
        store = await self.reopen(store, codec="raw")
        as_raw = await store.save("mixed", b"\xff raw")
        assert (await store.load(as_json.id)).state == {"codec": "json", "b": b"\xff"}
        store = await self.reopen(store)
        assert (await store.load(as_raw.id)).state == b"\xff raw"
        latest = await store.get_latest("mixed")
        assert latest is not None
        assert latest.state == b"\xff raw"
        page = await store.list("mixed", order="asc")
        assert [cp.state for cp in page.items] == [{"codec": "json", "b": b"\xff"}, b"\xff raw"]

    @asyncio_test
    async def test_update_re_encodes_with_the_updating_stores_codec(
        self, store: BaseCheckpointStore
    ) -> None:
        as_json = await store.save("mixed", {"codec": "json"})
        store = await self.reopen(store, codec="raw")
        as_raw = await store.save("mixed", b"\xff raw")
        await store.update(as_json.id, b"now raw")
        store = await self.reopen(store)
        await store.update(as_raw.id, {"now": "json"})
        both = await store.load_many([as_json.id, as_raw.id])
        assert [cp.state for cp in both.values()] == [b"now raw", {"now": "json"}]
        store = await self.reopen(store, codec="raw")
        assert (await store.load(as_raw.id)).state == {"now": "json"}
