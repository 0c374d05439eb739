"""AES-GCM nonces are never reused (SPEC S16): one key, many writers, every nonce new.

A repeated (key, nonce) pair under GCM leaks the XOR of two plaintexts and the
authentication key, so every sealed write must draw a fresh nonce, in every
process, thread and task. Several processes save concurrently into one SQLite store
and one file store under the same keyring; threads (the blocking facade) and tasks
do the same in-process; then every record is read raw from the backend's storage,
its envelope parsed (``SKE1 | alg | flags | key id length | key id | nonce (12) |
ciphertext and tag``, see ``statekeeper.encryption.envelope``), and the nonces must
be as many as the saves, and all distinct, across both stores.

The processes are forked (``sql_helpers.start_children``), which is the harder case
for nonces: a child inherits its parent's memory, so a nonce drawn from state kept in
the process (a counter, a seeded generator) would repeat across children.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

import pytest

import statekeeper
import statekeeper.sync
from sql_helpers import finish_children, start_children
from statekeeper._core.rekey import rekey_store
from statekeeper.encryption import Keyring
from statekeeper.record.frame import split

pytestmark = pytest.mark.reliability

PROCESSES = 4
SAVES = 300  # per process: 1,200 saves per store
THREADS = 4
THREAD_SAVES = 50
TASKS = 100


def envelope_nonce(record: bytes) -> tuple[str, bytes]:
    """The key id and the nonce of a sealed record's envelope."""
    _, state = split(record)
    assert state[:4] == b"SKE1", state[:8]
    assert state[4] == 1, "algorithm 1, AES-256-GCM"
    key_len = state[6]
    key_id = state[7 : 7 + key_len].decode("ascii")
    nonce = state[7 + key_len : 7 + key_len + 12]
    assert len(nonce) == 12
    assert len(state) >= 7 + key_len + 12 + 16, "ciphertext and 16-byte tag follow"
    return key_id, nonce


def sqlite_records(path: Path) -> dict[str, bytes]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT id, record FROM statekeeper_checkpoints").fetchall()
    finally:
        conn.close()
    return {str(rid): bytes(blob) for rid, blob in rows}


def file_records(root: Path) -> dict[str, bytes]:
    # record files are named <sequence>.<id>.ckpt
    return {p.name.split(".")[1]: p.read_bytes() for p in (root / "records").rglob("*.ckpt")}


def nonces_of(records: dict[str, bytes]) -> list[bytes]:
    out = []
    for rid, record in records.items():
        key_id, nonce = envelope_nonce(record)
        assert key_id == "k1", rid
        out.append(nonce)
    return out


@pytest.fixture
def keys() -> Keyring:
    return Keyring({"k1": os.urandom(32)}, active="k1")


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, str]:
    return {
        "sqlite": f"sqlite:///{tmp_path / 'store.db'}",
        "file": f"file://{tmp_path / 'files'}",
    }


def test_nonces_are_distinct_across_processes_threads_and_tasks(
    keys: Keyring, stores: dict[str, str], tmp_path: Path
) -> None:
    saved: dict[str, set[str]] = {name: set() for name in stores}

    # processes: PROCESSES forked children per store, all saving at once
    for name, url in stores.items():
        children = start_children(url, n=PROCESSES, saves=SAVES, options={"encryption": keys})
        for events in finish_children(children):
            assert not [e for e in events if "error" in e], events
            ids = [e["id"] for e in events if "id" in e]
            assert len(ids) == SAVES
            saved[name].update(ids)

    # threads: the blocking facade, one store shared by THREADS threads, and one
    # store per thread (each with its own event loop), all at once
    lock = threading.Lock()

    def work(
        n: int, store: statekeeper.sync.SyncCheckpointStore, go: threading.Barrier, into: set[str]
    ) -> None:
        go.wait()
        ids = [store.save(f"thread-{n}", {"n": n, "i": i}).id for i in range(THREAD_SAVES)]
        with lock:
            into.update(ids)

    for name, url in stores.items():
        barrier = threading.Barrier(2 * THREADS)
        shared = statekeeper.sync.open_store(url, encryption=keys)
        with shared:
            own = [statekeeper.sync.open_store(url, encryption=keys) for _ in range(THREADS)]
            for store in own:
                store.open()
            try:
                threads = [
                    threading.Thread(target=work, args=(n, s, barrier, saved[name]))
                    for n, s in enumerate([shared] * THREADS + own)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            finally:
                for store in own:
                    store.close()

    # tasks: TASKS concurrent saves on one store, and one save_many
    async def tasks(url: str) -> list[str]:
        async with statekeeper.open_store(url, encryption=keys) as store:
            cps = await asyncio.gather(
                *(store.save(f"task-{i % 5}", {"i": i}) for i in range(TASKS))
            )
            batch = await store.save_many(
                [statekeeper.NewCheckpoint(stream="batch", state={"j": j}) for j in range(20)]
            )
            return [cp.id for cp in [*cps, *batch]]

    for name, url in stores.items():
        saved[name].update(asyncio.run(tasks(url)))

    expected = PROCESSES * SAVES + 2 * THREADS * THREAD_SAVES + TASKS + 20
    records = {
        "sqlite": sqlite_records(tmp_path / "store.db"),
        "file": file_records(tmp_path / "files"),
    }
    every: list[bytes] = []
    for name in stores:
        assert len(saved[name]) == expected, name
        assert set(records[name]) == saved[name], name
        nonces = nonces_of(records[name])
        assert len(nonces) == expected
        assert len(set(nonces)) == expected, f"{name}: a nonce was used twice"
        every += nonces
    # the two stores share the key, so their nonces must differ from each other's too
    assert len(set(every)) == len(every) == 2 * expected


def test_an_update_draws_a_new_nonce(keys: Keyring, stores: dict[str, str]) -> None:
    """Rewriting a record (update, same id and stream) seals it under a new nonce."""

    async def run(url: str) -> list[bytes]:
        seen = []
        async with statekeeper.open_store(url, encryption=keys) as store:
            cp = await store.save("s", {"v": 0})
            seen.append(envelope_nonce(await store.backdoor_read_raw(cp.id))[1])
            for v in range(1, 20):
                await store.update(cp.id, {"v": v})
                seen.append(envelope_nonce(await store.backdoor_read_raw(cp.id))[1])
            # the same state again: a new nonce still, so equal states never look equal
            await store.update(cp.id, {"v": 0})
            seen.append(envelope_nonce(await store.backdoor_read_raw(cp.id))[1])
        return seen

    for url in stores.values():
        seen = asyncio.run(run(url))
        assert len(seen) == 21
        assert len(set(seen)) == 21


def test_a_rekey_seals_every_record_under_a_new_nonce(stores: dict[str, str]) -> None:
    """Rotation re-seals each record (same id, stream and state) with a fresh nonce
    under the new key; a second run, with nothing to do, rewrites nothing."""
    old, new = os.urandom(32), os.urandom(32)
    count = 60

    async def run(url: str) -> tuple[list[bytes], list[bytes], list[bytes]]:
        async with statekeeper.open_store(
            url, encryption=Keyring({"k1": old}, active="k1")
        ) as store:
            ids = [
                cp.id
                for cp in await store.save_many(
                    [statekeeper.NewCheckpoint(stream="s", state={"i": i}) for i in range(count)]
                )
            ]
            before = [envelope_nonce(await store.backdoor_read_raw(i))[1] for i in ids]
        rotated = Keyring({"k2": new, "k1": old}, active="k2")
        report = await rekey_store(statekeeper.open_store(url, encryption=rotated))
        assert report.rekeyed == count, report
        async with statekeeper.open_store(url, encryption=rotated) as store:
            sealed = [envelope_nonce(await store.backdoor_read_raw(i)) for i in ids]
            assert {key_id for key_id, _ in sealed} == {"k2"}
            assert [(await store.load(i)).state for i in ids] == [{"i": i} for i in range(count)]
        again = await rekey_store(statekeeper.open_store(url, encryption=rotated))
        assert (again.rekeyed, again.current) == (0, count), again
        async with statekeeper.open_store(url, encryption=rotated) as store:
            kept = [envelope_nonce(await store.backdoor_read_raw(i))[1] for i in ids]
        return before, [nonce for _, nonce in sealed], kept

    for url in stores.values():
        before, after, kept = asyncio.run(run(url))
        assert len(set(after)) == count
        assert not set(before) & set(after)
        assert kept == after  # the second run left the records as they were
