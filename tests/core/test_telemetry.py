"""Telemetry (SPEC S18) on the memory, file and SQLite stores: spans, events and
metrics through the OpenTelemetry SDK's in-memory exporter and reader; the
caller's span as parent across worker threads and the sync facade; group-commit
sizes; turning it on for the process; and nothing of it when off."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from opentelemetry import trace

import statekeeper as sk
import statekeeper.sync
from statekeeper import telemetry
from statekeeper._core.rekey import rekey_store
from statekeeper._runtime.threads import ThreadDoor
from statekeeper._runtime.worker import Worker
from statekeeper.testing import kit_keyring, rotated_keyring
from telemetry_helpers import Recorder, only, scenario

SYSTEMS = {"memory": "statekeeper.memory", "file": "statekeeper.file", "sqlite": "sqlite"}


def url_of(backend: str, tmp_path: Path) -> str:
    return {
        "memory": "memory://",
        "file": f"file://{tmp_path / 'store'}",
        "sqlite": f"sqlite:///{tmp_path / 'store.db'}",
    }[backend]


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["memory", "file", "sqlite"])
async def test_spans_events_and_metrics_match_what_was_done(
    backend: str, tmp_path: Path, rec: Recorder
) -> None:
    async with sk.open_store(url_of(backend, tmp_path), telemetry=rec.options()) as store:
        await scenario(store, rec, SYSTEMS[backend])
    namespace = (rec.spans("save")[0].attributes or {}).get("db.namespace")
    assert namespace == (None if backend == "memory" else store.path)  # type: ignore[attr-defined]


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["memory", "file", "sqlite"])
async def test_record_streams_puts_streams_and_ids_on_spans(
    backend: str, tmp_path: Path, rec: Recorder
) -> None:
    async with sk.open_store(
        url_of(backend, tmp_path), telemetry=rec.options(record_streams=True)
    ) as store:
        cp = await store.save("user-17", {"x": 1})
        await store.load(cp.id)
    save, load = only(rec.spans("save")), only(rec.spans("load"))
    assert (save.attributes or {})["statekeeper.stream"] == "user-17"
    assert (save.attributes or {})["statekeeper.checkpoint.id"] == cp.id
    assert (load.attributes or {})["statekeeper.checkpoint.id"] == cp.id


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["memory", "file", "sqlite"])
async def test_the_callers_span_is_the_parent(backend: str, tmp_path: Path, rec: Recorder) -> None:
    async with sk.open_store(url_of(backend, tmp_path), telemetry=rec.options()) as store:
        with rec.tracer.start_as_current_span("caller") as caller:
            await store.save("s", 1)
            await store.list("s")
    ours = rec.spans("save") + rec.spans("list")
    assert len(ours) == 2
    for span in ours:
        assert span.parent is not None
        assert span.parent.span_id == caller.get_span_context().span_id
        assert span.context.trace_id == caller.get_span_context().trace_id


@pytest.mark.asyncio
async def test_a_worker_thread_runs_the_call_in_the_callers_context(rec: Recorder) -> None:
    telemetry.enable(rec.options())  # turns carrying on for the process (it stays on)
    telemetry.disable()
    worker = Worker("test-carry")
    try:
        with rec.tracer.start_as_current_span("caller") as caller:
            seen = await worker.run(lambda: (trace.get_current_span(), threading.current_thread()))
        assert seen[0] is caller
        assert seen[1] is worker.thread
    finally:
        await worker.run_last(lambda: None)


@pytest.mark.asyncio
async def test_the_file_stores_threads_run_calls_in_the_callers_context(rec: Recorder) -> None:
    telemetry.enable(rec.options())
    telemetry.disable()
    door = ThreadDoor("test-door", size=2)
    try:
        with rec.tracer.start_as_current_span("caller") as caller:
            seen = await door.run(lambda: (trace.get_current_span(), threading.current_thread()))
        assert seen[0] is caller
        assert seen[1] is not threading.current_thread()
    finally:
        door.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["file", "sqlite"])
async def test_reads_say_whether_they_ran_inline_or_on_a_worker(
    backend: str, tmp_path: Path, rec: Recorder
) -> None:
    url = url_of(backend, tmp_path)
    for inline in (True, False):
        async with sk.open_store(url, inline_reads=inline, telemetry=rec.options()) as store:
            await store.save("s", 1)
            await store.get_latest("s")
            await store.list("s")
    ran = [(s.attributes or {})["statekeeper.execution"] for s in rec.spans("get_latest")]
    ran += [(s.attributes or {})["statekeeper.execution"] for s in rec.spans("list")]
    assert ran == ["inline", "worker", "inline", "worker"]


@pytest.mark.asyncio
async def test_group_commit_size_on_each_save(tmp_path: Path, rec: Recorder) -> None:
    async with sk.open_store(f"sqlite:///{tmp_path / 'g.db'}", telemetry=rec.options()) as store:
        saved = await asyncio.gather(*(store.save(f"s{i}", i) for i in range(8)))
    spans = rec.spans("save")
    assert len(spans) == len(saved) == 8
    sizes = [(s.attributes or {})["statekeeper.group_commit.size"] for s in spans]
    assert all(1 <= size <= 8 for size in sizes)
    assert {(s.attributes or {})["statekeeper.execution"] for s in spans} == {"worker"}
    assert rec.count("statekeeper.group_commit.size") == 8
    # each group of n writes is seen n times, once per write that rode in it
    assert all(sizes.count(size) % size == 0 for size in set(sizes))


@pytest.mark.asyncio
async def test_an_operation_made_of_others_is_one_span(tmp_path: Path, rec: Recorder) -> None:
    async with sk.open_store(f"file://{tmp_path / 'v'}", telemetry=rec.options()) as store:
        for i in range(3):
            await store.save("s", i)
        report = await store.verify()
    assert report.ok
    assert only(rec.spans("verify")).name.startswith("verify")
    assert [s for s in rec.spans() if (s.attributes or {})["db.operation.name"] != "save"] == [
        only(rec.spans("verify"))
    ]


@pytest.mark.asyncio
async def test_enable_and_disable_for_every_store(rec: Recorder) -> None:
    store = sk.open_store("memory://")  # made before enable(): it follows the switch
    async with store:
        telemetry.enable(rec.options())
        try:
            assert telemetry.enabled() == rec.options()
            await store.save("s", 1)
        finally:
            telemetry.disable()
        await store.save("s", 2)
    assert telemetry.enabled() is None
    assert len(rec.spans("save")) == 1


def test_sync_facade_keeps_the_callers_span(rec: Recorder, tmp_path: Path) -> None:
    store = statekeeper.sync.open_store(f"sqlite:///{tmp_path / 's.db'}", telemetry=rec.options())
    with store, rec.tracer.start_as_current_span("script") as script:
        store.save("s", 1)
    span = only(rec.spans("save"))
    assert span.parent is not None
    assert span.parent.span_id == script.get_span_context().span_id


@pytest.mark.asyncio
async def test_rekey_counts_records(tmp_path: Path, rec: Recorder) -> None:
    url, keys = f"file://{tmp_path / 'r'}", kit_keyring("k1")
    async with sk.open_store(url, encryption=keys) as store:
        for i in range(5):
            await store.save("s", i)
    store = sk.open_store(url, encryption=rotated_keyring(keys, "k2"), telemetry=rec.options())
    report = await rekey_store(store)
    assert report.rekeyed == report.examined == 5
    span = only(rec.spans("rekey"))
    assert span.status.is_ok
    assert rec.count("statekeeper.rekey.records") == report.examined


@pytest.mark.asyncio
async def test_an_error_records_its_type_never_its_message(rec: Recorder) -> None:
    async with sk.open_store("memory://", telemetry=rec.options()) as store:
        with pytest.raises(sk.errors.CheckpointEncodeError):
            await store.save("s", {"secret-key-material": object()})
    span = only(rec.spans("save"))
    assert (span.attributes or {})["error.type"] == "CheckpointEncodeError"
    assert span.status.description is None
    assert span.events == ()  # no exception event: its message could hold the state


# -- off: nothing of OpenTelemetry --------------------------------------------------


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_off_imports_nothing_of_opentelemetry(tmp_path: Path) -> None:
    done = run_python(
        "import asyncio, sys, statekeeper as sk\n"
        "async def main():\n"
        f"    async with sk.open_store('sqlite:///{tmp_path / 'o.db'}') as s:\n"
        "        await s.save('s', 1); await s.get_latest('s'); await s.list('s')\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_on_without_the_extra_names_it_at_construction() -> None:
    done = run_python(
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import statekeeper as sk\n"
        "try:\n"
        "    sk.open_store('memory://', telemetry=True)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "statekeeper[otel]" in done.stdout


def test_telemetry_from_a_url_query() -> None:
    assert sk.open_store("memory://?telemetry=true")._telemetry == sk.Telemetry()
    assert sk.open_store("memory://?telemetry=false")._telemetry is None


def test_telemetry_option_is_validated() -> None:
    with pytest.raises(sk.errors.InvalidOptions, match="telemetry"):
        sk.open_store("memory://", telemetry="yes please")


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_sweep_is_a_span_and_its_removals_are_counted(
    backend: str, tmp_path: Path, rec: Recorder
) -> None:
    """``sweep`` (S17) is an operation like the others: a span with what it removed,
    and the removals counter, which a dry run leaves alone."""
    policy = sk.Retention(keep_last=1)
    async with sk.open_store(url_of(backend, tmp_path), telemetry=rec.options()) as store:
        await store.save_many([sk.NewCheckpoint(stream=s, state=i) for s in "ab" for i in range(3)])
        dry = await store.sweep(policy=policy, dry_run=True)
        done = await store.sweep(policy=policy)
    assert dry.checkpoints_removed == done.checkpoints_removed == 4
    first, second = rec.spans("sweep")
    assert (first.attributes or {})["statekeeper.sweep.dry_run"] is True
    assert (second.attributes or {})["statekeeper.removed"] == 4
    assert (second.attributes or {})["statekeeper.sweep.streams_removed"] == 0
    assert (second.attributes or {})["db.operation.name"] == "sweep"
    assert rec.count("statekeeper.sweep.removals") == 4


def test_every_operation_is_still_a_coroutine_function() -> None:
    """Instrumenting must not change what the methods are: callers and test doubles
    (``create_autospec`` makes an ``AsyncMock`` only of a coroutine function) look.
    On Python 3.11 the plain wrapper was not one."""
    import inspect
    from unittest import mock

    from statekeeper.backends.memory import MemoryCheckpointStore
    from statekeeper.telemetry._switch import OPERATIONS

    for name in OPERATIONS:
        method = getattr(MemoryCheckpointStore, name)
        assert inspect.iscoroutinefunction(method), name
        assert asyncio.iscoroutinefunction(method), name
    double = mock.create_autospec(MemoryCheckpointStore, instance=True)
    assert isinstance(double.save, mock.AsyncMock)


def test_a_process_that_never_turns_telemetry_on_runs_the_methods_unwrapped() -> None:
    """Zero cost when off: until telemetry is first on in a process, the public
    operations are the class's own coroutine functions (no wrapper, not even its
    check); the first store made with ``telemetry=`` wraps them, once."""
    done = run_python(
        "import asyncio, statekeeper as sk\n"
        "from statekeeper import BaseCheckpointStore as B\n"
        "print(hasattr(B.save, '__wrapped__'), asyncio.iscoroutinefunction(B.save))\n"
        "sk.open_store('memory://')\n"
        "print(hasattr(B.save, '__wrapped__'))\n"
        "sk.open_store('memory://', telemetry=True)\n"
        "print(hasattr(B.save, '__wrapped__'), hasattr(B.save.__wrapped__, '__wrapped__'))\n"
        "print(asyncio.iscoroutinefunction(B.save), asyncio.iscoroutinefunction(B.sweep))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["False True", "False", "True False", "True True"]
