"""``cursor_at`` refuses the filters a store that seals metadata cannot answer (S16).

Regression: with ``encrypt_metadata=True``, ``cursor_at(id, tags=...)`` returned a
cursor for a query that ``list`` then refused, so the error surfaced one call
late and far from its cause.
"""

from __future__ import annotations

import os

import pytest

import statekeeper as sk
from statekeeper.errors import InvalidQuery

RING = sk.Keyring({"k": os.urandom(32)}, active="k")


@pytest.mark.parametrize("filters", [{"tags": {"a": "b"}}, {"metadata": {"m": 1}}])
@pytest.mark.asyncio
async def test_cursor_at_refuses_a_filter_on_sealed_metadata(filters: dict[str, object]) -> None:
    async with sk.open_store("memory://", encryption=RING, encrypt_metadata=True) as st:
        cp = await st.save("s", {"n": 1}, tags={"a": "b"}, metadata={"m": 1})
        with pytest.raises(InvalidQuery, match="encrypt_metadata"):
            await st.cursor_at(cp.id, **filters)  # type: ignore[arg-type]
        plain = await st.cursor_at(cp.id)  # no filter: a cursor, which list takes
        assert (await st.list("s", before=plain)).items == []


@pytest.mark.asyncio
async def test_cursor_at_keeps_filters_where_metadata_is_in_the_header() -> None:
    async with sk.open_store("memory://", encryption=RING) as st:
        cp = await st.save("s", {"n": 1}, tags={"a": "b"})
        c = await st.cursor_at(cp.id, tags={"a": "b"})
        assert (await st.list("s", tags={"a": "b"}, after=c)).items == []
