"""The blocking facade has the same contract as the async store."""

from __future__ import annotations

import threading

import pytest

from statekeeper.errors import CheckpointNotFound, PreconditionFailed, StoreClosed
from statekeeper.sync import SyncCheckpointStore, open_store


def test_same_methods_blocking() -> None:
    with open_store("memory://") as store:
        first = store.save("s", {"step": 1}, tags={"k": "v"})
        second = store.save("s", {"step": 2})
        assert store.get_latest("s") == second
        assert store.load(first.id).state == {"step": 1}
        page = store.list("s", limit=1, order="asc")
        assert [cp.id for cp in page.items] == [first.id] and page.has_more
        rest = store.list("s", after=page.next_cursor, order="asc", limit=1)
        assert rest.items[0].id == second.id
        updated = store.update(second.id, {"step": 3}, if_match=second.etag)
        with pytest.raises(PreconditionFailed):
            store.update(second.id, {"step": 4}, if_match=second.etag)
        assert store.list_streams() == ["s"]
        assert store.prune("s", keep_last=1) == 1
        assert store.delete(updated.id) is True
        assert store.delete(updated.id) is False
        with pytest.raises(CheckpointNotFound):
            store.load(updated.id)
        assert store.purge_expired() == 0
        assert store.info().backend == "memory"
        store.save("t", 1)
        assert store.delete_stream("t") == 1


def test_errors_propagate_and_close_stops_the_thread() -> None:
    store = open_store("memory://")
    with pytest.raises(StoreClosed):
        store.get_latest("s")
    store.open()
    _, thread = store.loop  # the private loop thread, started on first use
    assert thread.is_alive()
    store.close()
    # asserted on the thread itself: counting the process's threads raced with
    # threads that other code starts or stops meanwhile
    assert not thread.is_alive(), "close() returned before its loop thread stopped"
    store.close()  # idempotent


def test_usable_from_several_threads() -> None:
    with open_store("memory://") as store:
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(20):
                    store.save(f"s{n}", {"i": i})
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        seqs = [cp.sequence for cp in store.list(None, limit=100, order="asc").items]
        assert seqs == sorted(set(seqs)) and len(seqs) == 80


def test_wraps_an_existing_async_store() -> None:
    from statekeeper.backends.memory import MemoryCheckpointStore

    with SyncCheckpointStore(MemoryCheckpointStore()) as store:
        assert store.save("s", None).state is None
