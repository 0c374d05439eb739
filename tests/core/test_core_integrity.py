"""verify() and repair() in the core: what every backend shares (_integrity.py)."""

from __future__ import annotations

import builtins
from datetime import datetime

import pytest

import statekeeper
from statekeeper import ScanQuery
from statekeeper.backends.memory import MemoryCheckpointStore
from statekeeper.record import StoredRecord


class _DeletesDuringVerify(MemoryCheckpointStore):
    """Deletes the newest checkpoint of a stream right after verify's listing walk,
    as a concurrent writer would."""

    doomed: str | None = None

    async def list_streams(self, *, prefix: str | None = None) -> builtins.list[str]:
        if self.doomed is not None:
            await self.delete(self.doomed)
            self.doomed = None
        return await super().list_streams(prefix=prefix)


@pytest.mark.asyncio
async def test_a_concurrent_delete_during_verify_is_not_a_problem() -> None:
    async with _DeletesDuringVerify() as store:
        await store.save("s", {"i": 1})
        newest = await store.save("s", {"i": 2})
        store.doomed = newest.id
        report = await store.verify()
    assert report.problems == []
    assert report.ok


@pytest.mark.asyncio
async def test_a_stream_deleted_during_verify_is_not_a_problem() -> None:
    async with _DeletesDuringVerify() as store:
        only = await store.save("gone", {"i": 1})
        store.doomed = only.id
        report = await store.verify()
    assert report.ok, report.problems


class _StaleLatest(MemoryCheckpointStore):
    """A broken backend whose get_latest answers an older checkpoint."""

    async def get_latest(self, stream: str) -> statekeeper.Checkpoint | None:
        page = await self.list(stream, limit=2, order="desc")
        return page.items[-1] if page.items else None


@pytest.mark.asyncio
async def test_verify_reports_a_get_latest_that_answers_older_state() -> None:
    async with _StaleLatest() as store:
        await store.save("s", {"i": 1})
        await store.save("s", {"i": 2})
        report = await store.verify()
    assert not report.ok
    assert [p.kind for p in report.problems] == ["index"]
    assert "get_latest('s')" in report.problems[0].reason


def test_repair_records_is_public_for_backend_authors() -> None:
    assert statekeeper.repair_records.__module__ == "statekeeper._core.integrity"
    assert "repair_records" in statekeeper.__all__


class _IdPathAnswersAnother(MemoryCheckpointStore):
    """A broken id table: load(id) of the newest answers the record before it."""

    async def _get(self, id: str, now: datetime) -> StoredRecord | None:
        record = await super()._get(id, now)
        if record is None or record.sequence < 2:
            return record
        older = await self._scan(ScanQuery(record.stream, "desc", record.sequence, 1, {}, now))
        return older[0] if older and isinstance(older[0], StoredRecord) else record


@pytest.mark.asyncio
async def test_verify_reports_a_load_by_id_that_answers_another_record() -> None:
    async with _IdPathAnswersAnother() as store:
        await store.save("s", {"i": 1})
        newest = await store.save("s", {"i": 2})
        report = await store.verify()
    assert not report.ok
    assert [(p.kind, p.id) for p in report.problems] == [("index", newest.id)]
    assert "load() by id finds sequence 1" in report.problems[0].reason


class _RefusingReads(MemoryCheckpointStore):
    """A backend whose listing refuses to answer (damaged derived data), with a walk
    of its own for verify() when ``walk`` is set."""

    walk = False

    async def _scan(self, query: ScanQuery) -> builtins.list[StoredRecord | statekeeper.Skipped]:
        raise statekeeper.errors.StoreFormatError("the index is of the wrong type")

    async def _verify_refused(
        self, error: statekeeper.errors.StoreFormatError
    ) -> statekeeper.VerifyReport | None:
        if not self.walk:
            return await super()._verify_refused(error)
        problem = statekeeper.Problem(kind="index", location="walk", reason=str(error))
        return statekeeper.VerifyReport(
            records=1, streams=1, high_water_mark=1, complete=False, problems=[problem]
        )


@pytest.mark.asyncio
async def test_verify_answers_from_the_backends_walk_when_a_read_path_refuses() -> None:
    async with _RefusingReads() as store:
        await store.save("s", {"i": 1})
        with pytest.raises(statekeeper.errors.StoreFormatError, match="wrong type"):
            await store.verify()  # the default: no walk, the refusal propagates
        store.walk = True
        report = await store.verify()
    assert not report.ok and not report.complete
    assert [p.reason for p in report.problems] == ["the index is of the wrong type"]
