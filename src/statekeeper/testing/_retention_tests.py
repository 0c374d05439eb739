"""Kit tests for retention (S17): ``sweep()`` under ``keep_last``, ``max_age`` and
``idle``, dry runs, and the promises that hold while a sweep runs (the newest never
goes first, a save made during a sweep survives, concurrent sweeps count true).

Ages are driven by the kit's :class:`FakeClock`, never by waiting. The tests that
act in the middle of a sweep wrap the store's own ``_delete_many`` (the primitive
every removal batch goes through), so they hit the same moment on every backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from .._core.store import BaseCheckpointStore
from ..models import NewCheckpoint, Retention
from ._base import FakeClock, KitBase, ids

asyncio_test = pytest.mark.asyncio(loop_scope="function")

__all__ = ["RetentionTests"]

HOUR = 3600.0


class RetentionTests(KitBase):
    async def _history(
        self, store: BaseCheckpointStore, streams: dict[str, int]
    ) -> dict[str, list[str]]:
        """``count`` saves into each stream (interleaved); their ids, oldest first."""
        made: dict[str, list[str]] = {stream: [] for stream in streams}
        for step in range(max(streams.values(), default=0)):
            for stream, count in streams.items():
                if step < count:
                    made[stream].append((await store.save(stream, {"step": step})).id)
        return made

    @staticmethod
    async def _ids_of(store: BaseCheckpointStore, stream: str) -> list[str]:
        """Every live id of ``stream``, oldest first."""
        return ids(await store.list(stream, order="asc", limit=1000, include_state=False))

    @staticmethod
    def _during_removals(
        store: BaseCheckpointStore, act: Callable[[int], Awaitable[None]]
    ) -> list[int]:
        """Run ``act(batch number)`` before each removal batch of the next sweeps;
        return the list of what each batch removed (filled as they run)."""
        real = store._delete_many
        removed: list[int] = []

        async def wrapped(batch: list[str], now: Any) -> int:
            await act(len(removed))
            count = await real(batch, now)
            removed.append(count)
            return count

        store._delete_many = wrapped  # type: ignore[method-assign,assignment]
        return removed

    # -- the rules --------------------------------------------------------------------

    @asyncio_test
    async def test_sweep_keep_last_keeps_each_streams_newest_n(
        self, store: BaseCheckpointStore
    ) -> None:
        made = await self._history(store, {"a": 5, "b": 2, "c": 1})
        report = await store.sweep(policy=Retention(keep_last=2))
        assert (report.checkpoints_removed, report.streams_removed, report.dry_run) == (3, 0, False)
        assert report.seconds >= 0
        assert await self._ids_of(store, "a") == made["a"][-2:]
        assert await self._ids_of(store, "b") == made["b"]
        assert await self._ids_of(store, "c") == made["c"]
        latest = await store.get_latest("a")
        assert latest is not None and latest.id == made["a"][-1]
        again = await store.sweep(policy=Retention(keep_last=2))
        assert (again.checkpoints_removed, again.streams_removed) == (0, 0)

    @asyncio_test
    async def test_sweep_max_age_removes_old_checkpoints_but_never_a_streams_newest(
        self, store: BaseCheckpointStore
    ) -> None:
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        old = await self._history(store, {"a": 3, "b": 2})
        clock.advance(2 * HOUR)
        fresh = await self._history(store, {"a": 2})
        clock.advance(1)
        report = await store.sweep(policy=Retention(max_age=2 * HOUR))
        # everything of "b" is old, but its newest stays; "a" keeps its fresh two
        assert report.checkpoints_removed == 3 + 1
        assert await self._ids_of(store, "a") == fresh["a"]
        assert await self._ids_of(store, "b") == old["b"][-1:]
        assert report.streams_removed == 0

    @asyncio_test
    async def test_sweep_ages_count_from_the_last_write(self, store: BaseCheckpointStore) -> None:
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        first, second = (await self._history(store, {"a": 2}))["a"]
        clock.advance(HOUR)
        await store.update(first, {"touched": True})
        clock.advance(HOUR - 1)
        report = await store.sweep(policy=Retention(max_age=HOUR))
        assert report.checkpoints_removed == 0  # "first" was written an hour ago at most
        clock.advance(2)
        report = await store.sweep(policy=Retention(max_age=HOUR))
        assert report.checkpoints_removed == 1
        assert await self._ids_of(store, "a") == [second]

    @asyncio_test
    async def test_sweep_idle_removes_whole_streams(self, store: BaseCheckpointStore) -> None:
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        await self._history(store, {"old": 3, "older": 1, "busy": 2})
        clock.advance(HOUR)
        busy = (await store.save("busy", {"step": "new"})).id
        clock.advance(1)
        dry = await store.sweep(dry_run=True, policy=Retention(idle=HOUR))
        assert (dry.streams_removed, dry.checkpoints_removed, dry.dry_run) == (2, 4, True)
        assert await store.list_streams() == ["busy", "old", "older"]
        report = await store.sweep(policy=Retention(idle=HOUR))
        assert (report.streams_removed, report.checkpoints_removed) == (2, 4)
        assert await store.list_streams() == ["busy"]
        assert await store.get_latest("old") is None
        latest = await store.get_latest("busy")
        assert latest is not None and latest.id == busy
        assert len(await self._ids_of(store, "busy")) == 3  # not idle: nothing of it goes

    @asyncio_test
    async def test_sweep_rules_combine_and_a_dry_run_changes_nothing(
        self, store: BaseCheckpointStore
    ) -> None:
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        await self._history(store, {"idle": 2, "long": 6})
        clock.advance(3 * HOUR)
        recent = await self._history(store, {"long": 3})
        policy = Retention(keep_last=4, max_age=2 * HOUR, idle=2 * HOUR)
        before = {s: await self._ids_of(store, s) for s in ("idle", "long")}
        dry = await store.sweep(dry_run=True, policy=policy)
        assert {s: await self._ids_of(store, s) for s in ("idle", "long")} == before
        assert (dry.streams_removed, dry.checkpoints_removed) == (1, 2 + 6)
        assert dry.bytes_reclaimed is None
        report = await store.sweep(policy=policy)
        assert (report.streams_removed, report.checkpoints_removed) == (1, 2 + 6)
        assert await store.list_streams() == ["long"]
        assert await self._ids_of(store, "long") == recent["long"]

    @asyncio_test
    async def test_sweep_uses_the_stores_policy_unless_given_one(
        self, store: BaseCheckpointStore
    ) -> None:
        store = await self.reopen(store, retention=Retention(keep_last=1))
        made = await self._history(store, {"a": 4})
        assert (await store.sweep(policy=Retention(keep_last=3))).checkpoints_removed == 1
        assert (await store.sweep()).checkpoints_removed == 2
        assert await self._ids_of(store, "a") == made["a"][-1:]

    @asyncio_test
    async def test_sweep_works_through_more_than_one_batch(
        self, store: BaseCheckpointStore
    ) -> None:
        for start in range(0, 1200, 400):
            await store.save_many(
                [NewCheckpoint(stream=f"s{n % 3}", state=n) for n in range(start, start + 400)]
            )
        seen: list[int] = []
        report = await store.sweep(policy=Retention(keep_last=1), progress=seen.append)
        assert report.checkpoints_removed == 1200 - 3
        assert sum(seen) == 1200
        for n, stream in enumerate(("s0", "s1", "s2")):
            latest = await store.get_latest(stream)
            assert latest is not None and latest.state == 1197 + n
            assert len(await self._ids_of(store, stream)) == 1

    @asyncio_test
    async def test_sweep_purges_expired_records(self, store: BaseCheckpointStore) -> None:
        self.require_ttl(store)
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        await store.save("a", 1, ttl=10)
        kept = await store.save("b", 2)
        clock.advance(11)
        report = await store.sweep(policy=Retention(keep_last=5))
        assert report.checkpoints_removed == 0  # expired is already gone (S8): not counted
        assert await store.purge_expired() == 0  # ... and the sweep purged it for good
        assert await self._ids_of(store, "b") == [kept.id]

    # -- the promises while a sweep runs ----------------------------------------------

    @asyncio_test
    async def test_a_sweep_never_removes_a_checkpoint_saved_after_it_started(
        self, store: BaseCheckpointStore
    ) -> None:
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        await self._history(store, {"idle": 3, "pruned": 4})
        clock.advance(HOUR)
        await store.save("pruned", {"step": "fresh"})
        clock.advance(1)
        during: list[str] = []

        async def save_meanwhile(batch: int) -> None:
            if batch == 0:  # the sweep has started and is about to remove
                during.append((await store.save("idle", {"step": "during"})).id)
                during.append((await store.save("pruned", {"step": "during"})).id)

        self._during_removals(store, save_meanwhile)
        await store.sweep(policy=Retention(keep_last=1, idle=HOUR))
        # the save into the stream being removed as idle survived, whole, alone
        assert await self._ids_of(store, "idle") == during[:1]
        latest = await store.get_latest("idle")
        assert latest is not None and latest.state == {"step": "during"}
        # keep_last=1 applies to what was there when the sweep started
        pruned = await self._ids_of(store, "pruned")
        assert len(pruned) == 2 and pruned[-1] == during[1]

    @asyncio_test
    async def test_get_latest_never_returns_an_older_checkpoint_during_an_idle_sweep(
        self, store: BaseCheckpointStore
    ) -> None:
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        for start in range(0, 1100, 550):  # more than one removal batch
            await store.save_many(
                [NewCheckpoint(stream=f"s{n % 5}", state=n) for n in range(start, start + 550)]
            )
        newest = {f"s{n % 5}": n for n in range(1100)}
        clock.advance(HOUR + 1)
        seen: list[tuple[str, Any]] = []

        async def check(batch: int) -> None:
            for stream, state in newest.items():
                latest = await store.get_latest(stream)
                seen.append((stream, None if latest is None else latest.state))
                assert latest is None or latest.state == state, (
                    f"during a sweep, get_latest({stream!r}) returned {latest.state!r}, "
                    f"older than the newest {state!r}"
                )

        self._during_removals(store, check)
        report = await store.sweep(policy=Retention(idle=HOUR))
        await check(-1)
        assert (report.streams_removed, report.checkpoints_removed) == (5, 1100)
        assert await store.list_streams() == []
        assert len(seen) > 10  # it looked between batches, not only at the end

    @asyncio_test
    async def test_concurrent_sweeps_remove_each_checkpoint_once_and_count_true(
        self, store: BaseCheckpointStore
    ) -> None:
        clock = FakeClock()
        store = await self.reopen(store, clock=clock)
        other = await self.open_store(clock=clock)
        await self._history(store, {f"s{n}": 6 for n in range(8)})
        clock.advance(HOUR + 1)
        await self._history(store, {"s0": 1, "s1": 1})  # six streams idle, two pruned
        policy = Retention(keep_last=2, idle=HOUR)
        reports = await asyncio.gather(
            store.sweep(policy=policy),
            other.sweep(policy=policy),
            store.sweep(policy=policy),
        )
        assert sum(r.checkpoints_removed for r in reports) == 6 * 6 + 2 * 5
        assert sum(r.streams_removed for r in reports) == 6
        assert await store.list_streams() == ["s0", "s1"]
        assert [len(await self._ids_of(store, s)) for s in ("s0", "s1")] == [2, 2]

    @asyncio_test
    async def test_a_sweep_counts_only_what_it_removed_itself(
        self, store: BaseCheckpointStore
    ) -> None:
        await self._history(store, {"a": 4, "b": 3})
        other = await self.open_store()
        policy = Retention(keep_last=1)
        beaten: list[int] = []

        async def another_sweep_first(batch: int) -> None:
            if batch == 0:  # this sweep has chosen its victims; another removes them
                beaten.append((await other.sweep(policy=policy)).checkpoints_removed)

        self._during_removals(store, another_sweep_first)
        report = await store.sweep(policy=policy)
        assert beaten == [5]
        assert report.checkpoints_removed == 0, "counted checkpoints another sweep removed"
        assert [len(await self._ids_of(store, s)) for s in ("a", "b")] == [1, 1]

    @asyncio_test
    async def test_saves_and_reads_go_on_while_a_sweep_runs(
        self, store: BaseCheckpointStore
    ) -> None:
        await store.save_many([NewCheckpoint(stream=f"s{n % 4}", state=n) for n in range(800)])

        async def writer() -> list[int]:
            states = []
            for n in range(30):
                cp = await store.save("live", n)
                latest = await store.get_latest("live")
                assert latest is not None and latest.sequence >= cp.sequence
                states.append(n)
            return states

        report, written = await asyncio.gather(store.sweep(policy=Retention(keep_last=1)), writer())
        assert report.checkpoints_removed >= 800 - 4
        # the writer's saves came after the sweep started or were its "newest one":
        # whichever, the newest of "live" is never removed
        latest = await store.get_latest("live")
        assert latest is not None and latest.state == written[-1]
        for n in range(4):
            assert len(await self._ids_of(store, f"s{n}")) == 1

    @asyncio_test
    async def test_a_read_only_store_sweeps_only_dry(self, store: BaseCheckpointStore) -> None:
        await self._history(store, {"a": 3})
        store = await self.reopen(store, read_only=True)
        report = await store.sweep(dry_run=True, policy=Retention(keep_last=1))
        assert (report.checkpoints_removed, report.dry_run) == (2, True)
        assert len(await self._ids_of(store, "a")) == 3
