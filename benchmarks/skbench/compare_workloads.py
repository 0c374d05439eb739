"""The workloads ``compare.py`` times on both revisions, through the public API only
(``statekeeper.open_store``, the store's methods, ``NewCheckpoint``, the store's
``codec``), since the internals are what the redesign rewrites: the same code must
run unchanged against both ends.

One :class:`StoreWorkload` per backend holds a stream of ``size`` checkpoints (the
~1 KB state of :func:`skbench.payload.make_state`; one in :data:`MATCH_EVERY` with
``metadata["source"] == "input"``) plus 10% more over five other streams and a
stream of :data:`WHOLE` checkpoints, built with ``save_many`` in batches of
:data:`BUILD_BATCH` through a ``durability="fast"`` handle where the backend has
one. :meth:`StoreWorkload.check` runs every workload once against the ids the build
returned (a fast wrong answer is an error, not a figure); :meth:`StoreWorkload.ops`
gives the timed calls, each taking a running call index. :class:`CodecWorkload`
encodes and decodes a ~1 KB and a ~100 KB state through ``open_store(...).codec``.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .payload import make_state

Op = Callable[[int], Awaitable[Any]]

MAIN = "cmp-main"
WHOLE_STREAM = "cmp-whole"
WRITES = "cmp-writes"
NOISE = tuple(f"cmp-noise-{i}" for i in range(5))
PAGE = 20
BATCH = 100
WHOLE = 200
BUILD_BATCH = 1000
MATCH = {"source": "input"}
MATCH_EVERY = 100
ROTATE = 16  # ids, cursors and batches a workload cycles through
SEED = 23

SAVE = "save"  # memory: its only mode
SAVE_FULL = "save (full)"
SAVE_FAST = "save (fast)"
SAVE_MANY = f"save_many({BATCH}) (full)"
GET_LATEST = "get_latest"
LOAD = "load by id"
LOAD_MANY = f"load_many({BATCH})"
FIRST = f"first page of {PAGE}"
MIDDLE = f"middle page of {PAGE} (cursor)"
FILTERED = f"page of {PAGE} filtered on metadata"
LIST_WHOLE = f"list of {WHOLE}, whole"
#: The order of the rows in the report.
STORE_OPS = (
    SAVE,
    SAVE_FULL,
    SAVE_FAST,
    SAVE_MANY,
    GET_LATEST,
    LOAD,
    LOAD_MANY,
    FIRST,
    MIDDLE,
    FILTERED,
    LIST_WHOLE,
)
#: The ops that add checkpoints: fewer calls per chunk, so the stores stay near their
#: built size through the run.
WRITE_OPS = frozenset({SAVE, SAVE_FULL, SAVE_FAST, SAVE_MANY})
CODEC_OPS = ("encode ~1 KB", "decode ~1 KB", "encode ~100 KB", "decode ~100 KB")

#: Backends that have ``durability="fast"``: the build uses it, ``save (fast)`` times it.
HAS_FAST = {"file", "sqlite", "postgresql"}


def store_url(backend: str, workdir: Path, postgres_url: str) -> tuple[str, dict[str, Any]]:
    """The URL and options of a fresh store of ``backend`` (PostgreSQL: own tables)."""
    if backend == "memory":
        return "memory://", {}
    if backend == "file":
        return f"file://{workdir / 'file-store'}", {}
    if backend == "sqlite":
        return f"sqlite:///{workdir / 'store.db'}", {}
    if backend == "postgresql":
        return postgres_url, {"table_prefix": f"skcmp{secrets.token_hex(4)}_"}
    raise ValueError(f"unknown backend {backend!r}")


def _metadata(index: int) -> dict[str, Any]:
    return {"step": index, "source": "input" if index % MATCH_EVERY == 0 else "loop"}


class StoreWorkload:
    """One store of one backend, built, checked and driven through its public API."""

    def __init__(self, backend: str, workdir: Path, size: int, postgres_url: str) -> None:
        self.backend = backend
        self.size = size
        self.url, self.options = store_url(backend, workdir, postgres_url)
        self.handles: dict[str, Any] = {}
        self.ids: list[str] = []
        self.matching: list[str] = []
        self.whole: list[str] = []
        self.step = 0

    @property
    def full(self) -> Any:
        return self.handles["full"]

    async def open(self) -> None:
        import statekeeper

        modes = ("full", "fast") if self.backend in HAS_FAST else ("full",)
        for mode in modes:
            extra = {"durability": mode} if mode == "fast" else {}
            store = statekeeper.open_store(self.url, **self.options, **extra)
            await store.open()
            self.handles[mode] = store

    async def close(self) -> None:
        for store in self.handles.values():
            await store.close()
        self.handles.clear()
        if self.backend == "postgresql":
            await self._each_table("DROP TABLE IF EXISTS {} CASCADE")

    async def _each_table(self, statement: str) -> None:
        """``statement`` (``{}`` for the name) on each of this store's PostgreSQL
        tables, through asyncpg itself: the store has no public "analyze" or "drop"."""
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        dsn = self.url.replace("postgresql+asyncpg://", "postgresql://", 1)
        conn = await asyncpg.connect(dsn)
        try:
            pattern = self.options["table_prefix"].replace("_", r"\_") + "%"
            rows = await conn.fetch(
                "SELECT schemaname, tablename FROM pg_tables WHERE tablename LIKE $1", pattern
            )
            for row in rows:
                await conn.execute(statement.format(f'"{row[0]}"."{row[1]}"'))
        finally:
            await conn.close()

    async def build(self) -> int:
        """Fill the streams (untimed); return how many checkpoints were saved."""
        from statekeeper import NewCheckpoint

        bulk = self.handles.get("fast", self.full)
        noise = self.size // 10
        plan: list[tuple[str, int]] = []
        for k in range(self.size + noise):
            is_noise = (k + 1) * noise // (self.size + noise) > k * noise // (self.size + noise)
            plan.append((NOISE[k % len(NOISE)], k) if is_noise else (MAIN, k))
        plan += [(WHOLE_STREAM, k) for k in range(WHOLE)]
        counts: dict[str, int] = {}
        for start in range(0, len(plan), BUILD_BATCH):
            chunk = plan[start : start + BUILD_BATCH]
            items = []
            indexes = []
            for stream, _ in chunk:
                index = counts.get(stream, 0)
                counts[stream] = index + 1
                indexes.append(index)
                self.step += 1
                items.append(
                    NewCheckpoint(
                        stream=stream, state=make_state(self.step), metadata=_metadata(index)
                    )
                )
            saved = await bulk.save_many(items)
            for (stream, _), index, cp in zip(chunk, indexes, saved, strict=True):
                if stream == MAIN:
                    self.ids.append(cp.id)
                    if index % MATCH_EVERY == 0:
                        self.matching.append(cp.id)
                elif stream == WHOLE_STREAM:
                    self.whole.append(cp.id)
        if self.backend == "postgresql":
            # as autovacuum would have by now in steady state; left to it, one side's
            # tables may be analyzed mid-run and the other's not, and plans differ
            await self._each_table("ANALYZE {}")
        return len(plan)

    async def check(self) -> dict[str, str]:
        """Every workload once, against the build's ids; op -> what is wrong."""
        from statekeeper import NewCheckpoint

        store, ids = self.full, self.ids
        problems: dict[str, str] = {}
        latest = await store.get_latest(MAIN)
        if latest is None or latest.id != ids[-1]:
            problems[GET_LATEST] = "get_latest is not the last checkpoint saved"
        probe = ids[len(ids) // 3]
        got = await store.load(probe)
        if got.id != probe or got.stream != MAIN or got.state["status"] != "running":
            problems[LOAD] = "load returned another checkpoint"
        wanted = self._load_sets()[0]
        many = await store.load_many(wanted)
        if sorted(many) != sorted(wanted) or any(many[i].id != i for i in wanted):
            problems[LOAD_MANY] = f"load_many returned {len(many)} of {len(wanted)} ids"
        page = await store.list(MAIN, limit=PAGE)
        if [c.id for c in page.items] != ids[::-1][:PAGE]:
            problems[FIRST] = "first page is not the newest 20"
        mid = len(ids) // 2
        cursor = await store.cursor_at(ids[mid])
        page = await store.list(MAIN, limit=PAGE, after=cursor)
        if [c.id for c in page.items] != ids[mid - PAGE : mid][::-1]:
            problems[MIDDLE] = "the page after the middle is not the 20 just older"
        page = await store.list(MAIN, limit=PAGE, metadata=MATCH)
        if [c.id for c in page.items] != self.matching[::-1][:PAGE]:
            problems[FILTERED] = "filtered page is not the newest 20 matches"
        page = await store.list(WHOLE_STREAM, limit=WHOLE)
        if [c.id for c in page.items] != self.whole[::-1] or page.has_more:
            problems[LIST_WHOLE] = f"the {WHOLE}-checkpoint stream did not come back whole"
        for label, mode in self._save_ops():
            if mode in self.handles:
                state = make_state(-1)
                cp = await self.handles[mode].save(WRITES, state, metadata=_metadata(1))
                if (await store.load(cp.id)).state != state:
                    problems[label] = "a saved state did not load back equal"
        items = [NewCheckpoint(stream=WRITES, state=make_state(-n)) for n in range(BATCH)]
        saved = await store.save_many(items)
        back = await store.load_many([cp.id for cp in saved])
        if len(saved) != BATCH or [back[cp.id].state for cp in saved] != [i.state for i in items]:
            problems[SAVE_MANY] = "save_many's checkpoints did not load back equal"
        return problems

    def _save_ops(self) -> list[tuple[str, str]]:
        if "fast" not in self.handles:
            return [(SAVE, "full")]
        return [(SAVE_FULL, "full"), (SAVE_FAST, "fast")]

    def _load_sets(self) -> list[list[str]]:
        rng = random.Random(SEED)
        return [rng.sample(self.ids, BATCH) for _ in range(ROTATE)]

    async def prepare(self) -> dict[str, Op]:
        """The timed calls, their arguments made beforehand (cursors too)."""
        from statekeeper import NewCheckpoint

        store, ids = self.full, self.ids
        rng = random.Random(SEED)
        probes = [rng.choice(ids) for _ in range(ROTATE * 4)]
        sets = self._load_sets()
        mid = len(ids) // 2
        cursors = [await store.cursor_at(ids[mid - k]) for k in range(ROTATE)]
        states = [(make_state(10_000_000 + n), _metadata(n)) for n in range(ROTATE)]
        batches = [
            [
                NewCheckpoint(stream=WRITES, state=make_state(20_000_000 + b * BATCH + n))
                for n in range(BATCH)
            ]
            for b in range(4)
        ]

        def saver(handle: Any) -> Op:
            async def save(i: int) -> Any:
                state, meta = states[i % ROTATE]
                return await handle.save(WRITES, state, metadata=meta)

            return save

        async def save_many(i: int) -> Any:
            return await store.save_many(batches[i % len(batches)])

        async def get_latest(i: int) -> Any:
            return await store.get_latest(MAIN)

        async def load(i: int) -> Any:
            return await store.load(probes[i % len(probes)])

        async def load_many(i: int) -> Any:
            return await store.load_many(sets[i % ROTATE])

        async def first(i: int) -> Any:
            return await store.list(MAIN, limit=PAGE)

        async def middle(i: int) -> Any:
            return await store.list(MAIN, limit=PAGE, after=cursors[i % ROTATE])

        async def filtered(i: int) -> Any:
            return await store.list(MAIN, limit=PAGE, metadata=MATCH)

        async def whole(i: int) -> Any:
            return await store.list(WHOLE_STREAM, limit=WHOLE)

        ops = {label: saver(self.handles[mode]) for label, mode in self._save_ops()}
        ops.update(
            {
                SAVE_MANY: save_many,
                GET_LATEST: get_latest,
                LOAD: load,
                LOAD_MANY: load_many,
                FIRST: first,
                MIDDLE: middle,
                FILTERED: filtered,
                LIST_WHOLE: whole,
            }
        )
        return ops


def big_state() -> dict[str, Any]:
    """About 100 KB of the same agent-like JSON: a long history of ~1 KB steps."""
    return {"step": 0, "history": [make_state(n) for n in range(100)], "status": "running"}


class CodecWorkload:
    """The codec alone, as the store uses it: ``open_store("memory://").codec``."""

    def __init__(self) -> None:
        self.store: Any = None
        self.values = {"~1 KB": make_state(7), "~100 KB": big_state()}
        self.encoded: dict[str, bytes] = {}
        self.size = 0
        self._fallback: Any = None

    async def open(self) -> None:
        import statekeeper

        self.store = statekeeper.open_store("memory://")
        await self.store.open()

    async def close(self) -> None:
        await self.store.close()

    @property
    def codec(self) -> Any:
        """The store's own codec; the public ``statekeeper.codec.Codec()`` should a
        revision not expose it (:meth:`sizes` says which was used)."""
        codec = getattr(self.store, "codec", None)
        if codec is None:
            if self._fallback is None:
                from statekeeper.codec import Codec

                self._fallback = Codec()
            codec = self._fallback
        return codec

    async def build(self) -> int:
        self.encoded = {size: self.codec.encode(v) for size, v in self.values.items()}
        return 0

    async def check(self) -> dict[str, str]:
        problems = {}
        for size, value in self.values.items():
            if self.codec.decode(self.encoded[size]) != value:
                problems[f"decode {size}"] = "decoding did not give the value back"
        return problems

    def sizes(self) -> dict[str, Any]:
        out: dict[str, Any] = {size: len(data) for size, data in self.encoded.items()}
        if getattr(self.store, "codec", None) is None:
            out["through"] = "statekeeper.codec.Codec()"
        return out

    async def prepare(self) -> dict[str, Op]:
        codec = self.codec
        ops: dict[str, Op] = {}
        for size, value in self.values.items():
            data = self.encoded[size]

            async def encode(i: int, value: Any = value) -> Any:
                return codec.encode(value)

            async def decode(i: int, data: bytes = data) -> Any:
                return codec.decode(data)

            ops[f"encode {size}"] = encode
            ops[f"decode {size}"] = decode
        return ops
