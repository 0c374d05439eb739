"""What encryption at rest adds to a save and a ``get_latest``, measured side by side.

For each backend and durability (memory; SQLite and file at ``durability="full"``
and ``"fast"``; PostgreSQL at both when ``STATEKEEPER_TEST_POSTGRES_URL`` is set),
eight stores of the same backend are opened, each its own database, directory or
table prefix:

- ``plaintext``: no ``encryption=``, the baseline;
- ``plaintext (A/A)``: the same again, the run's own null test (two stores of the
  same code: what "added cost" reads when nothing was added);
- ``encrypted``: ``encryption=Keyring(...)``;
- ``encrypted + metadata``: the same with ``encrypt_metadata=True``;
- ``plaintext, raw codec`` and ``encrypted, raw codec``: ``codec="raw"`` stores
  that save the JSON codec's bytes of the same state. The envelope seals the same
  bytes, but no JSON is decoded: at 100 KB the JSON decode costs milliseconds here,
  and its noise on a shared machine hides a difference of 100 µs, which these
  rows resolve;
- ``plaintext + AES-GCM call`` and ``plaintext + envelope call``: plaintext stores
  whose every call first makes one AES-256-GCM call (encrypt for a save, decrypt for
  a read) or one envelope call (``Sealer.seal`` / ``Sealer.open``) on the same bytes:
  what that call costs in place, between the backend's own work, where the caches
  are not warm for it as they are in a loop of the call alone.

Each holds a stream per state size for ``get_latest`` (a few checkpoints, never
written to while measured) and one for the saves, pruned back (untimed) after every
round so every store stays the same size. Every save carries the same tags and
metadata. Before anything is timed each store is checked once: the state read back
equals the one saved, and where the backend has raw access, the encrypted stores'
bytes at rest do not hold a marker string the state holds.

Rounds: in each, every (operation, size) in an order shuffled per round runs one
chunk of calls on each of the eight stores, in an order rotated per round, so
background load falls on all four alike. The collector is off while a round runs.
A chunk has the same number of calls on every store (calibrated once on the
plaintext store: about ``chunk_seconds`` of calls, at most ``WRITE_CAP`` for saves).

The added cost of a variant is a paired difference: per round, the median of its
chunk minus the median of the plaintext store's chunk in that round; the figure is
the median of those differences over the rounds, with a 95% bootstrap interval over
rounds (see :func:`added`). The raw envelope (:class:`Sealer` alone, no store) is
timed separately, as is AES-256-GCM itself.
"""

from __future__ import annotations

import gc
import os
import random
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .encryption_raw import measure_raw, raw_calls
from .payload import _WORDS, make_state

__all__ = [
    "CONFIGS",
    "OPS",
    "SIZES",
    "VARIANTS",
    "EncResults",
    "EncSettings",
    "added",
    "big_state",
    "run",
    "target_us",
]

PLAIN, TWIN, SEALED, SEALED_META = (
    "plaintext",
    "plaintext (A/A)",
    "encrypted",
    "encrypted + metadata",
)
RAW_PLAIN, RAW_SEALED = "plaintext, raw codec", "encrypted, raw codec"
#: Plaintext stores whose calls also make, first, one call of the cipher alone or of
#: the envelope alone on the same bytes: what that call costs in place, on this path.
WITH_AES, WITH_ENVELOPE = "plaintext + AES-GCM call", "plaintext + envelope call"
VARIANTS = (PLAIN, TWIN, SEALED, SEALED_META, RAW_PLAIN, RAW_SEALED, WITH_AES, WITH_ENVELOPE)
#: The call each of them adds, by op: names in :func:`_raw_calls`.
EXTRA_CALLS = {
    WITH_AES: {"save": "AES-256-GCM encrypt", "get_latest": "AES-256-GCM decrypt"},
    WITH_ENVELOPE: {"save": "seal", "get_latest": "open"},
}
RAW_VARIANTS = frozenset({RAW_PLAIN, RAW_SEALED})
#: Each family's baseline: chunks of a family have the number of calls it calibrates.
FAMILIES = {"json": PLAIN, "raw": RAW_PLAIN}
SAVE, LATEST = "save", "get_latest"
OPS = (SAVE, LATEST)
#: State sizes: label to the KB the target allows for.
SIZES = {"1 KB": 1, "100 KB": 100}
#: (name, backend, durability): durability None where the backend has one mode.
CONFIGS = (
    ("memory", "memory", None),
    ("sqlite full", "sqlite", "full"),
    ("sqlite fast", "sqlite", "fast"),
    ("file full", "file", "full"),
    ("file fast", "file", "fast"),
    ("postgresql full", "postgresql", "full"),
    ("postgresql fast", "postgresql", "fast"),
)
#: At most this many saves in a chunk (the streams are pruned back after each round).
WRITE_CAP = 20
READ_CAP = 200
#: Checkpoints each get_latest stream holds; how many a save stream is pruned back to.
PREFILL = 5
MARKER = "sk-bench-marker-7f3a"
TAGS = {"run": "bench", "shard": "3"}


def target_us(kb: int) -> float:
    """The target for the added cost of a ``kb`` KB state: 15 µs + 1 µs per KB."""
    return 15.0 + kb


def big_state(step: int, size: int = 100_000) -> dict[str, Any]:
    """The ~1 KB state of :func:`make_state` with its tool message grown to ``size``
    characters of text: a long tool result, as an agent's state gets one. Words drawn
    at random (seeded by ``step``), so the text compresses about as prose does, not as
    a repeated phrase would (PostgreSQL compresses a plaintext state; a ciphertext
    does not compress). A few long strings rather than thousands of small objects,
    so that decoding it (the same on both sides) adds little noise."""
    state = make_state(step)
    rng = random.Random(step)
    text = " ".join(rng.choice(_WORDS) for _ in range(size // 5))
    state["messages"][2]["content"] = f"tool {step}: " + text[:size]
    return state


def states() -> dict[str, dict[str, Any]]:
    return {"1 KB": make_state(1) | {"marker": MARKER}, "100 KB": big_state(1) | {"marker": MARKER}}


@dataclass
class EncSettings:
    rounds: int = 40
    chunk_seconds: float = 0.02
    raw_seconds: float = 0.02
    postgres_url: str = ""
    only: list[str] = field(default_factory=list)


@dataclass
class EncResults:
    meta: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    #: config -> facts ("unavailable", "reps", "sizes", "error")
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: config -> "op size" -> variant -> rounds of per-call ns
    cells: dict[str, dict[str, dict[str, list[list[int]]]]] = field(default_factory=dict)
    #: the envelope alone: name -> size -> per-call ns samples
    raw: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    loads: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
        self.log.append(message)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- the arithmetic -----------------------------------------------------------------


@dataclass(frozen=True)
class Added:
    """A variant's added cost over the plaintext store, in µs."""

    median: float  # median over rounds of the per-round paired difference
    low: float  # 95% bootstrap interval of that median, over rounds
    high: float
    pooled: float  # median of all the variant's calls minus the plaintext's
    rounds: int


def added(base: list[list[int]], other: list[list[int]], resamples: int = 2000) -> Added:
    """``other``'s cost over ``base``: per round the difference of the two chunks'
    medians, then their median, with a 95% bootstrap interval over rounds."""
    diffs = [
        (statistics.median(o) - statistics.median(b)) / 1e3
        for b, o in zip(base, other, strict=False)
        if b and o
    ]
    if not diffs:
        raise ValueError("no round has calls on both sides")
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(resamples))
    pooled_b = [x for r in base for x in r]
    pooled_o = [x for r in other for x in r]
    return Added(
        median=statistics.median(diffs),
        low=boots[int(0.025 * resamples)],
        high=boots[int(0.975 * resamples) - 1],
        pooled=(statistics.median(pooled_o) - statistics.median(pooled_b)) / 1e3,
        rounds=len(diffs),
    )


# -- the stores ---------------------------------------------------------------------


def _keyring() -> Any:
    import statekeeper as sk

    return sk.Keyring({"bench-1": os.urandom(32)}, active="bench-1")


def _url(backend: str, where: Path, postgres_url: str) -> tuple[str, dict[str, Any]]:
    if backend == "memory":
        return "memory://", {}
    if backend == "sqlite":
        return f"sqlite:///{where}.db", {}
    if backend == "file":
        return f"file://{where}", {}
    return postgres_url, {"table_prefix": f"skenc{secrets.token_hex(4)}_"}


async def _drop_tables(url: str, prefix: str) -> None:
    import asyncpg  # type: ignore[import-untyped,unused-ignore]

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        pattern = prefix.replace("_", r"\_") + "%"
        rows = await conn.fetch(
            "SELECT schemaname, tablename FROM pg_tables WHERE tablename LIKE $1", pattern
        )
        for row in rows:
            await conn.execute(f'DROP TABLE IF EXISTS "{row[0]}"."{row[1]}" CASCADE')
    finally:
        await conn.close()


class Subjects:
    """The eight stores of one config, opened, filled and checked."""

    def __init__(self, backend: str, durability: str | None, workdir: Path, pg: str) -> None:
        self.backend = backend
        self.durability = durability
        self.workdir = workdir
        self.pg = pg
        self.stores: dict[str, Any] = {}
        self.prefixes: dict[str, str] = {}

    async def open(self) -> None:
        import statekeeper as sk

        keyring = _keyring()
        for n, variant in enumerate(VARIANTS):
            url, options = _url(self.backend, self.workdir / f"store{n}", self.pg)
            if "table_prefix" in options:
                self.prefixes[variant] = options["table_prefix"]
            if self.durability is not None:
                options["durability"] = self.durability
            if variant in RAW_VARIANTS:
                options["codec"] = "raw"
            if variant in (SEALED, SEALED_META, RAW_SEALED):
                options["encryption"] = keyring
                options["encrypt_metadata"] = variant == SEALED_META
            store = sk.open_store(url, **options)
            await store.open()
            self.stores[variant] = store

    async def close(self) -> None:
        for store in self.stores.values():
            await store.close()
        self.stores.clear()
        for prefix in self.prefixes.values():
            await _drop_tables(self.pg, prefix)

    async def stored_sizes(self) -> dict[str, dict[str, int]]:
        """PostgreSQL only: per variant and size, the bytes a record takes in its
        table (``pg_column_size``, after TOAST compression) and its own length."""
        import asyncpg  # type: ignore[import-untyped,unused-ignore]

        out: dict[str, dict[str, int]] = {}
        conn = await asyncpg.connect(self.pg.replace("postgresql+asyncpg://", "postgresql://", 1))
        try:
            for variant, prefix in self.prefixes.items():
                for label in SIZES:
                    row = await conn.fetchrow(
                        f"SELECT avg(pg_column_size(record))::bigint AS stored, "
                        f'avg(octet_length(record))::bigint AS length FROM "{prefix}checkpoints" '
                        "WHERE stream = $1",
                        _stream(LATEST, label),
                    )
                    out.setdefault(variant, {})[label] = int(row["stored"])
                    out[variant][label + " length"] = int(row["length"])
        finally:
            await conn.close()
        return out

    async def fill_and_check(self, by_size: dict[str, dict[str, Any]]) -> None:
        """Fill the get_latest streams, then check each store once: the state read
        back is the one saved, and no encrypted store holds the marker at rest."""
        for variant, store in self.stores.items():
            for label, state in _states_of(variant, by_size).items():
                for step in range(PREFILL):
                    cp = await store.save(
                        _stream(LATEST, label), state, tags=TAGS, metadata={"step": step}
                    )
                got = await store.get_latest(_stream(LATEST, label))
                if got is None or got.state != state or got.id != cp.id:
                    raise AssertionError(f"{variant}: get_latest did not return the saved state")
                if got.tags != TAGS or got.metadata != {"step": PREFILL - 1}:
                    raise AssertionError(f"{variant}: tags or metadata did not round-trip")
                raw = b""
                if store.capabilities.raw_access:
                    raw = await store.backdoor_read_raw(cp.id)
                sealed = variant in (SEALED, SEALED_META, RAW_SEALED)
                if sealed and MARKER.encode() in raw:
                    raise AssertionError(f"{variant}: the state is in plaintext at rest")
                if not sealed and raw and MARKER.encode() not in raw:
                    raise AssertionError(f"{variant}: raw access shows no state")


def _states_of(variant: str, by_size: dict[str, Any]) -> dict[str, Any]:
    """The states a variant saves: the raw-codec stores save the JSON codec's bytes
    of the same state (so the envelope seals the same bytes)."""
    if variant not in RAW_VARIANTS:
        return by_size
    import statekeeper as sk

    codec = sk.open_store("memory://").codec
    return {label: codec.encode(state) for label, state in by_size.items()}


def family_of(variant: str) -> str:
    return "raw" if variant in RAW_VARIANTS else "json"


def _stream(op: str, label: str) -> str:
    return f"{'latest' if op == LATEST else 'save'}-{label.replace(' ', '')}"


def _call(store: Any, op: str, label: str, state: dict[str, Any]) -> Any:
    stream = _stream(op, label)
    if op == SAVE:
        return store.save(stream, state, tags=TAGS, metadata={"step": 1, "source": "loop"})
    return store.get_latest(stream)


async def _chunk(
    store: Any,
    op: str,
    label: str,
    state: dict[str, Any],
    reps: int,
    extra: Callable[[], object] | None = None,
) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(reps):
        t0 = clock()
        if extra is not None:
            extra()
        await _call(store, op, label, state)
        out.append(clock() - t0)
    return out


def _extras(by_size: dict[str, Any]) -> dict[tuple[str, str, str], Callable[[], object]]:
    """The extra call of each :data:`EXTRA_CALLS` variant, by (variant, op, size)."""
    import statekeeper as sk

    codec = sk.open_store("memory://").codec
    out = {}
    for label, state in by_size.items():
        calls = raw_calls(codec.name, codec.encode(state), TAGS)
        for variant, names in EXTRA_CALLS.items():
            for op, name in names.items():
                out[variant, op, label] = calls[name]
    return out


async def _calibrate(
    subjects: Subjects, op: str, label: str, states: dict[str, Any], chunk: float
) -> dict[str, int]:
    """Calls a chunk, per family, sized on its plaintext store."""
    for variant, store in subjects.stores.items():  # warm every store up alike
        await _chunk(store, op, label, states[variant], 3)
    reps = {}
    for family, base in FAMILIES.items():
        calls = await _chunk(subjects.stores[base], op, label, states[base], 5)
        t = statistics.median(calls) / 1e9
        cap = WRITE_CAP if op == SAVE else READ_CAP
        reps[family] = max(1, min(cap, round(chunk / max(t, 1e-9))))
    return reps


async def measure_config(
    name: str, subjects: Subjects, settings: EncSettings, results: EncResults
) -> None:
    by_size = states()
    await subjects.fill_and_check(by_size)
    per_variant = {v: _states_of(v, by_size) for v in VARIANTS}
    extras = _extras(by_size)
    keys = [(op, label) for op in OPS for label in SIZES]
    reps = {}
    for op, label in keys:
        states_now = {v: per_variant[v][label] for v in VARIANTS}
        reps[f"{op} {label}"] = await _calibrate(
            subjects, op, label, states_now, settings.chunk_seconds
        )
    info = results.configs[name]
    info["reps"] = reps
    if subjects.prefixes:
        try:
            info["stored"] = await subjects.stored_sizes()
        except Exception as exc:  # a fact for the notes, never fatal
            info["stored_error"] = f"{type(exc).__name__}: {exc}"
    info["encoded"] = {
        label: len(subjects.stores[PLAIN].codec.encode(state)) for label, state in by_size.items()
    }
    cells: dict[str, dict[str, list[list[int]]]] = {
        f"{op} {label}": {v: [] for v in VARIANTS} for op, label in keys
    }
    rng = random.Random(name)
    for rnd in range(settings.rounds):
        order = keys[:]
        rng.shuffle(order)
        turn = rnd % len(VARIANTS)
        variants = VARIANTS[turn:] + VARIANTS[:turn]
        gc.collect()
        gc.disable()
        try:
            for op, label in order:
                key = f"{op} {label}"
                for variant in variants:
                    store, state = subjects.stores[variant], per_variant[variant][label]
                    n = reps[key][family_of(variant)]
                    extra = extras.get((variant, op, label))
                    samples = await _chunk(store, op, label, state, n, extra)
                    cells[key][variant].append(samples)
        finally:
            gc.enable()
        for store in subjects.stores.values():  # untimed: every store back to its size
            for label in SIZES:
                await store.prune(_stream(SAVE, label), keep_last=PREFILL)
    results.cells[name] = cells


async def run(settings: EncSettings, workdir: Path, results: EncResults) -> None:
    results.loads.append(f"start {loadavg()}")
    results.say("the envelope alone")
    measure_raw(states(), TAGS, settings.raw_seconds, results)
    for name, backend, durability in CONFIGS:
        if settings.only and not any(k in name for k in settings.only):
            continue
        info: dict[str, Any] = {}
        results.configs[name] = info
        if backend == "postgresql" and not settings.postgres_url:
            info["unavailable"] = "STATEKEEPER_TEST_POSTGRES_URL is not set"
            results.say(f"{name} left out: {info['unavailable']}")
            continue
        results.loads.append(f"{name} {loadavg()}")
        where = workdir / name.replace(" ", "-")
        where.mkdir(parents=True, exist_ok=True)
        subjects = Subjects(backend, durability, where, settings.postgres_url)
        started = time.perf_counter()
        try:
            await subjects.open()
            await measure_config(name, subjects, settings, results)
        except Exception as exc:  # a config that fails is reported, not fatal
            info["error"] = f"{type(exc).__name__}: {exc}"
            results.say(f"{name}: ERROR {info['error']}")
        finally:
            await subjects.close()
        info["seconds"] = time.perf_counter() - started
        if "error" not in info:
            summary = ", ".join(
                f"{key} {added(cell[PLAIN], cell[SEALED]).median:+.1f} µs"
                for key, cell in results.cells[name].items()
            )
            results.say(f"{name}: {summary} ({info['seconds']:.0f} s)")
    results.loads.append(f"end {loadavg()}")
