"""Inline reads against the worker's: the differential test of the file backend.

Each read of the file backend (``get_latest``, ``load``, ``load_many``, a listed
page and its probe) is ONE function of the engine taking a budget
(:mod:`statekeeper._runtime.inline`): the store runs it on the event loop's
thread under an inline budget, where it raises ``WouldBlock`` wherever it would
block, and then runs the same function in the worker. This test holds the two
against each other over seeded random histories of saves (some with a TTL, some
over the inline record limit), ``save_many``, updates, deletes, prunes, a second
writer on the same directory (as another process would be), the clock moving
past TTLs, damage to record files, stream indexes, the id table and the state,
journals of writers in flight or crashed, orphans and repairs: after every step,
every read that answers inline answers exactly as the worker does (the same
records, pages, probes, ``None`` or error), and the store's public reads with
``inline_reads=True`` give what a store opened with ``inline_reads=False`` gives.
Enough of the reads must answer inline, and enough must block, for the test to
mean something; both are counted and checked.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from file_helpers import a_journal_in_flight, parts_of

import statekeeper as sk
from statekeeper._core.query import ScanQuery
from statekeeper._runtime.inline import WORKER, Budget, WouldBlock
from statekeeper.backends.file import FileCheckpointStore
from statekeeper.backends.file.indexes import IndexDamaged
from statekeeper.backends.file.reader import INLINE_RECORD_BYTES
from statekeeper.errors import StatekeeperError
from statekeeper.models import Checkpoint

pytestmark = pytest.mark.asyncio

STREAMS = ("a", "b", "c")
STEPS = 90
BLOCKED = ("blocked",)


def record_file(root: Path, cp: Checkpoint) -> Path:
    return root / "records" / f"{cp.sequence // 1000:017d}" / f"{cp.sequence:020d}.{cp.id}.ckpt"


@dataclass
class World:
    """One history: the store whose reads are compared, a second writer on the same
    directory, a store that never reads inline, and what was saved."""

    root: Path
    rng: random.Random
    now: list[datetime]
    store: FileCheckpointStore
    other: FileCheckpointStore
    worker: FileCheckpointStore
    saved: list[Checkpoint] = field(default_factory=list)
    #: A journal entry to hold in ``state`` during the next comparison, if any.
    journal: str | None = None
    tally: dict[str, int] = field(default_factory=lambda: {"inline": 0, "blocked": 0})

    def writer(self) -> FileCheckpointStore:
        return self.rng.choice([self.store, self.other])

    def pick(self) -> Checkpoint | None:
        return self.rng.choice(self.saved) if self.saved else None


# -- the steps of a history ---------------------------------------------------------------------


async def save(w: World) -> None:
    ttl = timedelta(seconds=w.rng.randint(1, 90)) if w.rng.random() < 0.25 else None
    stream = w.rng.choice(STREAMS)
    w.saved.append(await w.writer().save(stream, {"n": len(w.saved)}, tags=_tags(w), ttl=ttl))


async def save_big(w: World) -> None:
    """A record over the inline limit: read in the worker only."""
    state = {"pad": "x" * (INLINE_RECORD_BYTES + 10)}
    w.saved.append(await w.writer().save(w.rng.choice(STREAMS), state))


async def save_many(w: World) -> None:
    new = [
        sk.NewCheckpoint(stream=w.rng.choice(STREAMS), state={"b": i}, tags=_tags(w))
        for i in range(w.rng.randint(2, 6))
    ]
    w.saved += await w.writer().save_many(new)


async def update(w: World) -> None:
    cp = w.pick()
    if cp is not None:
        await w.writer().update(cp.id, {"updated": w.rng.random()})


async def delete(w: World) -> None:
    cp = w.pick()
    if cp is not None:
        await w.writer().delete(cp.id)


async def prune(w: World) -> None:
    await w.writer().prune(w.rng.choice(STREAMS), keep_last=w.rng.randint(1, 6))


async def tick(w: World) -> None:
    w.now[0] += timedelta(seconds=w.rng.randint(1, 60))


async def damage_record(w: World) -> None:
    cp = w.pick()
    if cp is None:
        return
    path = record_file(w.root, cp)
    if not path.exists():
        return
    how = w.rng.choice(["flip", "truncate", "unlink", "foreign"])
    data = path.read_bytes()
    if how == "flip":
        at = w.rng.randrange(len(data))
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x55]) + data[at + 1 :])
    elif how == "truncate":
        path.write_bytes(data[: w.rng.randrange(len(data))])
    elif how == "unlink":
        path.unlink()
    else:  # another stream's record under this one's name
        others = [o for o in w.saved if o.stream != cp.stream and record_file(w.root, o).exists()]
        if others:
            path.write_bytes(record_file(w.root, w.rng.choice(others)).read_bytes())


async def damage_index(w: World) -> None:
    path = w.root / "streams" / f"{w.rng.choice(STREAMS)}.idx"
    if not path.exists():
        return
    how = w.rng.choice(["slot", "junk", "unlink", "zero"])
    data = bytearray(path.read_bytes())
    if how == "slot" and len(data) > 4096:
        data[w.rng.randrange(4096, len(data))] ^= 0x55
        path.write_bytes(bytes(data))
    elif how == "junk":
        path.unlink()
        path.write_bytes(b"\0" * 5000)
    elif how == "unlink":
        path.unlink()
    else:  # in place, the same inode
        path.write_bytes(bytes(len(data)))


async def damage_ids(w: World) -> None:
    path = w.root / "ids.idx"
    data = bytearray(path.read_bytes())
    data[w.rng.randrange(min(len(data), 64))] ^= 0x55
    path.write_bytes(bytes(data))


async def tear_state(w: World) -> None:
    path = w.root / "state"
    data = bytearray(path.read_bytes())
    at = 2048 * w.rng.randint(0, 1) + 100
    data[at : at + 10] = b"#" * 10
    path.write_bytes(bytes(data))


async def journal(w: World) -> None:
    """A writer in flight (or crashed): its journal entry in ``state`` while the next
    comparison runs."""
    w.journal = w.rng.choice(["insert", "batch", "batched", "delete", "update"])


async def orphan(w: World) -> None:
    """A damaged record whose stream nobody can tell (its index is gone too)."""
    cp = w.pick()
    if cp is None or not record_file(w.root, cp).exists():
        return
    record_file(w.root, cp).write_bytes(b"\0" * 300)
    index = w.root / "streams" / f"{cp.stream}.idx"
    if index.exists():
        index.unlink()
    await w.store.repair()


async def repair(w: World) -> None:
    await w.store.repair(drop_damaged=w.rng.random() < 0.5)


STEPS_BY_WEIGHT: list[tuple[Callable[[World], Awaitable[None]], int]] = [
    (save, 30),
    (save_big, 1),
    (save_many, 5),
    (update, 5),
    (delete, 8),
    (prune, 3),
    (tick, 6),
    (damage_record, 4),
    (damage_index, 3),
    (damage_ids, 1),
    (tear_state, 2),
    (journal, 3),
    (orphan, 1),
    (repair, 6),
]


def _tags(w: World) -> dict[str, str]:
    return {"k": str(w.rng.randint(0, 1))}


# -- the comparison -----------------------------------------------------------------------------


def outcome(
    store: FileCheckpointStore, read: Callable[..., Any], args: tuple[Any, ...], budget: Budget
) -> Any:
    """What ``read(*args, budget)`` gave on the engine: its answer, its error (type and
    words), or :data:`BLOCKED`."""
    try:
        with parts_of(store).engine.files.active():
            return ("answer", read(*args, budget))
    except WouldBlock:
        return BLOCKED
    except (StatekeeperError, IndexDamaged, OSError) as exc:
        return ("raised", type(exc).__name__, str(exc))


def engine_reads(w: World) -> Iterator[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    parts, now, rng = parts_of(w.store), w.store.now(), w.rng
    for stream in (*STREAMS, "never-used"):
        yield "get_latest", parts.reader.latest, (stream, now)
    ids = [cp.id for cp in rng.sample(w.saved, min(4, len(w.saved)))] + ["never-saved"]
    for cid in ids:
        yield "load", parts.reader.get, (cid, now)
        yield "load_many", parts.reader.get_many, ([cid], now)
    yield "load_many", parts.reader.get_many, (ids, now)
    top = max((cp.sequence for cp in w.saved), default=0) + 2
    for _ in range(6):
        query = ScanQuery(
            rng.choice((*STREAMS, "never-used")),
            rng.choice(["asc", "desc"]),
            rng.choice([None, rng.randint(0, top)]),
            rng.choice([1, 2, 5, 20, 101]),
            rng.choice([{}, {"k": "1"}]),
            now,
        )
        probed = query.bound is not None and rng.random() < 0.8  # list probes past a bound
        probe_of = w.store._probe_of(query) if probed else None
        yield "list", parts.pages.scan_page, (query, probe_of)


async def public(store: FileCheckpointStore, w: World, what: str, arg: Any) -> Any:
    try:
        if what == "get_latest":
            return await store.get_latest(arg)
        if what == "load":
            return await store.load(arg)
        if what == "load_many":
            return await store.load_many(arg)
        page = await store.list(arg[0], limit=arg[1], order=arg[2], tags=arg[3])
        return (page.items, page.skipped, page.next_cursor, page.prev_cursor, page.has_more)
    except StatekeeperError as exc:
        return ("raised", type(exc).__name__, str(exc))


def public_reads(w: World) -> Iterator[tuple[str, Any]]:
    rng = w.rng
    for stream in STREAMS:
        yield "get_latest", stream
    for cp in rng.sample(w.saved, min(3, len(w.saved))):
        yield "load", cp.id
        yield "load_many", [cp.id]
    for _ in range(3):
        yield (
            "list",
            (
                rng.choice(STREAMS),
                rng.choice([1, 5, 100]),
                rng.choice(["asc", "desc"]),
                rng.choice([None, {"k": "0"}]),
            ),
        )


async def compare(w: World) -> None:
    if w.journal is not None:
        seq = max((cp.sequence for cp in w.saved), default=1)
        held: Any = a_journal_in_flight(w.store, w.root, w.journal, seq)
        w.journal = None
    else:
        held = nullcontext()
    with held:
        for what, read, args in engine_reads(w):
            inline = outcome(w.store, read, args, Budget(inline=True))
            worker = outcome(w.store, read, args, WORKER)
            if inline == BLOCKED:
                w.tally["blocked"] += 1
                continue
            w.tally["inline"] += 1
            assert inline == worker, (what, args)
    for what, arg in public_reads(w):
        assert await public(w.store, w, what, arg) == await public(w.worker, w, what, arg), (
            what,
            arg,
        )


@pytest.mark.parametrize("seed", range(1, 9))
async def test_inline_reads_answer_as_the_worker_does(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    root = tmp_path / "s"

    def clock() -> datetime:
        return now[0]

    async with (
        FileCheckpointStore(root, clock=clock, durability="fast") as store,
        FileCheckpointStore(root, clock=clock, durability="fast") as other,
        FileCheckpointStore(root, clock=clock, inline_reads=False) as worker,
    ):
        w = World(root, rng, now, store, other, worker)
        steps, weights = zip(*STEPS_BY_WEIGHT, strict=True)
        for _ in range(STEPS):
            step = rng.choices(steps, weights)[0]
            with contextlib.suppress(StatekeeperError):
                await step(w)  # a write that met damage raises, as it must
            await compare(w)
    total = w.tally["inline"] + w.tally["blocked"]
    assert w.tally["inline"] > total // 3, w.tally  # the inline path is what mostly ran
    assert w.tally["blocked"] > 0, w.tally  # and the histories made it block
