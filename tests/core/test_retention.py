"""The retention policy's public types and options (SPEC S17): ``Retention`` and
``SweepReport`` validation, the ``retention=`` option, and ``sweep()``'s refusals.
The sweep's behaviour on every backend is the kit's (``testing/_retention_tests.py``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

import statekeeper as sk
import statekeeper.sync
from statekeeper.backends.memory import MemoryCheckpointStore, MemoryStorage
from statekeeper.errors import BackendError, InvalidOptions, InvalidQuery, ReadOnlyStore


def test_retention_takes_seconds_or_timedeltas_and_every_field_is_optional() -> None:
    assert sk.Retention() == sk.Retention(keep_last=None, max_age=None, idle=None)
    policy = sk.Retention(keep_last=3, max_age=90, idle=1.5, sweep_every=timedelta(minutes=5))
    assert policy.keep_last == 3
    assert policy.max_age == timedelta(seconds=90)
    assert policy.idle == timedelta(seconds=1.5)
    assert policy.sweep_every == timedelta(minutes=5)
    assert policy.has_rules and not sk.Retention(sweep_every=60).has_rules


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("keep_last", 0, "keep_last must be an int >= 1"),
        ("keep_last", -2, "keep_last must be an int >= 1"),
        ("keep_last", True, "keep_last must be an int >= 1"),
        ("keep_last", 2.0, "keep_last must be an int >= 1"),
        ("max_age", 0, "must be positive"),
        ("idle", -1, "must be positive"),
        ("sweep_every", timedelta(0), "must be positive"),
        ("max_age", float("nan"), "must be positive"),
        ("idle", float("inf"), "must be positive"),
        ("max_age", "30d", "must be seconds"),
        ("idle", True, "must be seconds"),
    ],
)
def test_retention_refuses_bad_values_clearly(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        sk.Retention(**{field: value})


def test_retention_is_frozen_and_forbids_unknown_fields() -> None:
    policy = sk.Retention(keep_last=1)
    with pytest.raises(ValidationError):
        policy.keep_last = 2  # type: ignore[misc]
    with pytest.raises(ValidationError, match="keep_latest"):
        sk.Retention(keep_latest=1)  # type: ignore[call-arg]


def test_sweep_report_fields() -> None:
    report = sk.SweepReport(
        streams_removed=1, checkpoints_removed=4, bytes_reclaimed=None, seconds=0.5, dry_run=True
    )
    assert (report.streams_removed, report.checkpoints_removed, report.dry_run) == (1, 4, True)
    with pytest.raises(ValidationError):
        sk.SweepReport(streams_removed=-1, checkpoints_removed=0, seconds=0.0, dry_run=False)


def test_open_store_takes_retention_on_every_backend_and_refuses_a_bad_one() -> None:
    store = sk.open_store("memory://", retention=sk.Retention(keep_last=2))
    assert store.options.retention == sk.Retention(keep_last=2)
    with pytest.raises(InvalidOptions, match="retention"):
        sk.open_store("memory://", retention="keep everything")


def test_a_read_only_store_refuses_a_background_sweep(tmp_path: Any) -> None:
    with pytest.raises(InvalidOptions, match="read_only"):
        sk.open_store(
            f"sqlite:///{tmp_path}/s.db", read_only=True, retention=sk.Retention(sweep_every=60)
        )


@pytest.mark.asyncio
async def test_sweep_without_any_policy_raises_invalid_query() -> None:
    async with MemoryCheckpointStore() as store:
        await store.save("s", 1)
        with pytest.raises(InvalidQuery, match="needs a retention policy"):
            await store.sweep()
        with pytest.raises(InvalidQuery, match="needs a retention policy"):
            await store.sweep(policy={"keep_last": 1})  # type: ignore[arg-type]
        assert (await store.get_latest("s")) is not None


@pytest.mark.asyncio
async def test_a_read_only_store_allows_only_a_dry_run_sweep() -> None:
    storage = MemoryStorage()
    async with MemoryCheckpointStore(storage=storage) as store:
        for step in range(3):
            await store.save("s", step)
    async with MemoryCheckpointStore(storage=storage, read_only=True) as store:
        report = await store.sweep(dry_run=True, policy=sk.Retention(keep_last=1))
        assert (report.checkpoints_removed, report.dry_run) == (2, True)
        with pytest.raises(ReadOnlyStore):
            await store.sweep(policy=sk.Retention(keep_last=1))
        with pytest.raises(ReadOnlyStore):
            await store.compact()
        assert len((await store.list("s")).items) == 3


def test_the_sync_facade_sweeps() -> None:
    with statekeeper.sync.open_store("memory://", retention=sk.Retention(keep_last=1)) as store:
        for step in range(3):
            store.save("s", step)
        report = store.sweep()
        assert report.checkpoints_removed == 2 and not report.dry_run
        assert [c.state for c in store.list("s").items] == [2]


class _Sweeps(logging.Handler):
    """Collects the background sweep's log records and wakes a waiter on each."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.changed.set()

    async def wait_for(self, done: Callable[[list[logging.LogRecord]], bool]) -> None:
        # a guard against hanging forever, not a deadline for the behaviour
        async with asyncio.timeout(60):
            while not done(self.records):
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
def sweeps() -> Iterator[_Sweeps]:
    logger = logging.getLogger("statekeeper.retention")
    handler, level = _Sweeps(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.asyncio
async def test_sweep_every_sweeps_in_the_background_while_open(sweeps: _Sweeps) -> None:
    policy = sk.Retention(keep_last=1, sweep_every=0.001)
    async with MemoryCheckpointStore(retention=policy) as store:
        # one atomic batch: the first sweep to see it removes four at once
        await store.save_many([sk.NewCheckpoint(stream="s", state=step) for step in range(5)])
        await sweeps.wait_for(lambda records: any("removed=4" in r.getMessage() for r in records))
        assert [c.state for c in (await store.list("s")).items] == [4]
        sweeper = store._sweeper
        assert sweeper is not None and sweeper._task is not None
        task = sweeper._task
    assert task.done() and store._sweeper is None  # close cancelled it and waited


@pytest.mark.asyncio
async def test_a_failing_background_sweep_is_logged_and_retried(sweeps: _Sweeps) -> None:
    async with MemoryCheckpointStore(retention=sk.Retention(sweep_every=0.001)) as store:
        real, calls = store._reclaim, []

        async def flaky(full: bool) -> int | None:
            calls.append(full)
            if len(calls) == 1:
                raise OSError("disk hiccup")
            return await real(full)

        store._reclaim = flaky  # type: ignore[method-assign]
        await sweeps.wait_for(lambda records: len(records) >= 2)
        failed, retried = sweeps.records[:2]
        assert failed.levelno == logging.ERROR and "retrying" in failed.getMessage()
        assert failed.exc_info is not None and isinstance(failed.exc_info[1], OSError)
        assert retried.levelno == logging.DEBUG and "background sweep" in retried.getMessage()
        assert (await store.save("s", 1)).state == 1  # the application never saw it


@pytest.mark.asyncio
async def test_no_background_sweep_without_sweep_every() -> None:
    async with MemoryCheckpointStore(retention=sk.Retention(keep_last=1)) as store:
        assert store._sweeper is None


class _SmallBatches(MemoryCheckpointStore):
    """A backend that asks a sweep for removal batches of at most 3."""

    _sweep_batch = 3
    calls: list[int]

    async def _delete_many(self, ids: list[str], now: Any) -> int:
        self.calls.append(len(ids))
        return await super()._delete_many(ids, now)


@pytest.mark.asyncio
async def test_a_sweep_removes_in_the_batches_the_backend_asks_for() -> None:
    """A backend that holds a lock through each removal call (the file store) bounds
    how long other writers wait by asking for smaller batches."""
    async with _SmallBatches() as store:
        store.calls = []
        await store.save_many([sk.NewCheckpoint(stream="s", state=i) for i in range(11)])
        report = await store.sweep(policy=sk.Retention(keep_last=1))
    assert report.checkpoints_removed == 10
    assert store.calls and max(store.calls) <= 3 and sum(store.calls) == 10


class _RepeatedScan(MemoryCheckpointStore):
    """A backend whose scan of every stream returns each entry twice (what the file
    store's shared directory listing did under concurrent sweeps)."""

    async def _scan(self, query: Any) -> Any:
        entries = await super()._scan(query)
        return entries + entries if query.stream is None else entries


@pytest.mark.asyncio
async def test_a_sweep_stops_before_removing_anything_when_a_scan_goes_back() -> None:
    """The sweep ranks each stream's checkpoints in scan order; a scan that repeats
    an entry (or goes back) would rank a stream's newest ones as old and remove
    them, so the sweep raises instead and removes nothing."""
    async with _RepeatedScan() as store:
        await store.save_many([sk.NewCheckpoint(stream=f"s{i % 2}", state=i) for i in range(6)])
        with pytest.raises(BackendError, match="scan went back"):
            await store.sweep(policy=sk.Retention(keep_last=2))
        assert [len((await store.list(s)).items) for s in ("s0", "s1")] == [3, 3]
