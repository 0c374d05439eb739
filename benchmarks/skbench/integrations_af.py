"""Issues 14 and 24, Agent Framework part: ``StatekeeperCheckpointStorage`` on SQLite
and file stores against ``FileCheckpointStorage`` and ``InMemoryCheckpointStorage``.

``save``: one storage per kind and durability (ours at ``durability="fast"`` and
``"full"``, ``FileCheckpointStorage``, which does not fsync), each saving a chain of
checkpoints of one workflow (~1 KB state), beside the bare writes of the bytes our
file store writes for one such checkpoint (:class:`skbench.floors.WriteFloors`:
write, fsync, rename, fsync the directory; and ``BEGIN IMMEDIATE; INSERT; COMMIT`` at
``synchronous=FULL``), all in the same interleaved rounds. The checkpoints are
made before the timing starts.

``get_latest``: each kind gets one storage per size in ``maf_sizes``, holding one
workflow grown through the storage's own ``save`` (untimed); then every
``get_latest`` (each kind at each size) is timed in the same interleaved rounds,
after being checked once against the id of the last save. See
:mod:`skbench.integrations` for the LangGraph part and the shared machinery.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .floors import WriteFloors
from .integrations import (
    AF_FILE,
    AF_MEMORY,
    AF_SK_FILE,
    AF_SK_SQLITE,
    Results,
    Settings,
    Subject,
    _close_all,
    _measure,
    latest_at,
    run_langgraph,
)
from .payload import make_state
from .timing import Op

WORKFLOW = "bench-workflow"
SAVE_FAST = 'save, durability="fast"'
SAVE_FULL = 'save, durability="full"'
SAVE = "save"
WRITE = "write of the same bytes"
FLOOR_FILE = "bare durable file write"
FLOOR_SQLITE = "bare SQLite transaction, synchronous=FULL"


async def open_af(name: str, workdir: Path, durability: str = "fast") -> Subject:
    if name in (AF_SK_SQLITE, AF_SK_FILE):
        import statekeeper
        from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage

        kind = "sqlite" if name == AF_SK_SQLITE else "file"
        place = workdir / f"af-sk-{kind}-{durability}"
        place.mkdir()
        url = f"sqlite:///{place / 'af.db'}" if name == AF_SK_SQLITE else f"file://{place / 's'}"
        # for get_latest the build is untimed and the reads do not depend on it
        store = statekeeper.open_store(url, codec="raw", durability=durability)
        storage = StatekeeperCheckpointStorage(store)  # opened lazily, closed by aclose
        facts = {
            "setting": f'an unopened store (codec="raw", durability="{durability}"), opened '
            "by the storage on first use"
        }
        return Subject(name, storage, storage.aclose, facts=facts)
    from agent_framework import FileCheckpointStorage, InMemoryCheckpointStorage

    async def nothing() -> None:
        return None

    if name == AF_FILE:
        place = workdir / "af-file"
        storage = FileCheckpointStorage(str(place))
        return Subject(name, storage, nothing, facts={"setting": "one JSON file per checkpoint"})
    return Subject(name, InMemoryCheckpointStorage(), nothing, facts={"setting": "a dict"})


def _checkpoint(step: int, previous: str | None, workflow: str = WORKFLOW) -> Any:
    from agent_framework import WorkflowCheckpoint

    return WorkflowCheckpoint(
        workflow_name=workflow,
        graph_signature_hash="bench-graph",
        previous_checkpoint_id=previous,
        state=make_state(step),
        iteration_count=step,
        metadata={"step": step},
    )


def _save_op(subject: Subject, count: int) -> Op:
    """Saves of a chain of ``count`` checkpoints, made before the timing starts."""
    chain: list[Any] = []
    for step in range(count):
        chain.append(_checkpoint(step, chain[-1].checkpoint_id if chain else None, "bench-save"))

    async def op(i: int) -> Any:
        return await subject.handle.save(chain[i % count])

    return op


async def run_af_saves(settings: Settings, workdir: Path, results: Results) -> None:
    """Every ``save`` and both floors in the same interleaved rounds."""
    place = workdir / "af-save"
    place.mkdir()
    subjects: list[tuple[Subject, str]] = []
    floors: WriteFloors | None = None
    try:
        for name in (AF_SK_SQLITE, AF_SK_FILE):
            for durability, op in (("fast", SAVE_FAST), ("full", SAVE_FULL)):
                subjects.append((await open_af(name, place, durability), op))
        peer = await open_af(AF_FILE, place)
        subjects.append((peer, SAVE))
        count = settings.save_budget.reps + 5
        ops: dict[tuple[str, str], Op] = {(s.name, op): _save_op(s, count) for s, op in subjects}
        # the bytes our file store writes for one such checkpoint: what the floors write
        file_full = next(s for s, op in subjects if s.name == AF_SK_FILE and op == SAVE_FULL)
        cid = await file_full.handle.save(_checkpoint(0, None, "bench-floor"))
        data = await file_full.handle.store.backdoor_read_raw(file_full.handle.store_id_for(cid))
        results.meta["af_record_bytes"] = len(data)
        floors = WriteFloors(place, bytes(data))
        ops[(FLOOR_FILE, WRITE)] = floors.durable
        ops[(FLOOR_SQLITE, WRITE)] = floors.sqlite_full
        results.subjects[FLOOR_FILE] = {"setting": "write, fsync, rename, fsync the directory"}
        results.subjects[FLOOR_SQLITE] = {"setting": "BEGIN IMMEDIATE; INSERT; COMMIT, WAL"}
        await _measure(results, "Agent Framework save", ops, settings.save_budget)
    finally:
        if floors is not None:
            floors.close()
        await _close_all([s for s, _ in subjects], results)


async def grow(subject: Subject, target: int, start_step: int) -> None:
    """Save checkpoints of one workflow until it holds ``target`` (untimed)."""
    from agent_framework import WorkflowCheckpoint

    while len(subject.ids) < target:
        step = start_step + len(subject.ids)
        checkpoint = WorkflowCheckpoint(
            workflow_name=WORKFLOW,
            graph_signature_hash="bench-graph",
            previous_checkpoint_id=subject.ids[-1] if subject.ids else None,
            state=make_state(step),
            iteration_count=step,
            metadata={"step": step},
        )
        subject.ids.append(str(await subject.handle.save(checkpoint)))


def latest_op(subject: Subject) -> Op:
    async def op(i: int) -> Any:
        return await subject.handle.get_latest(workflow_name=WORKFLOW)

    return op


async def run_agent_framework(settings: Settings, workdir: Path, results: Results) -> None:
    """One storage of each kind per size, each grown to its size, then every
    ``get_latest`` in the same interleaved rounds: the sizes are compared under the
    same machine conditions, not one phase against a later one."""
    names = [AF_SK_SQLITE, AF_SK_FILE, AF_FILE, AF_MEMORY]
    if not settings.wants("agent") and not settings.wants("maf"):
        return
    instances: list[tuple[int, Subject]] = []
    try:
        for name in names:
            facts: dict[str, Any] = {}
            for size in settings.maf_sizes:
                place = workdir / f"af-{size}"
                place.mkdir(exist_ok=True)
                try:
                    subject = await open_af(name, place)
                except (ImportError, OSError) as exc:
                    facts = {"unavailable": f"{type(exc).__name__}: {exc}"}
                    results.say(f"skip {name}: {exc}")
                    break
                facts.update(subject.facts)
                subject.facts = facts  # one record per kind, whatever the size
                instances.append((size, subject))
            results.subjects[name] = facts
        results.mark_load("grow the workflows")
        ops: dict[tuple[str, str], Op] = {}
        for size, subject in instances:
            started = time.perf_counter()
            await grow(subject, size, 0)
            spent = time.perf_counter() - started
            subject.facts.setdefault("build", {})[str(size)] = spent
            results.say(f"grew {subject.name} to {size:,} in {spent:.1f} s")
            got = await subject.handle.get_latest(workflow_name=WORKFLOW)
            if got is None or got.checkpoint_id != subject.ids[-1]:
                # a peer ordering by timestamp may tie; timed anyway, and reported
                note = f"at {size:,}: get_latest did not return the last checkpoint saved"
                subject.facts.setdefault("wrong", []).append(note)
                results.say(f"  {subject.name}: {note}")
            ops[(subject.name, latest_at(size))] = latest_op(subject)
        await _measure(results, "get_latest, every size", ops, settings.latest_budget)
    finally:
        await _close_all([subject for _, subject in instances], results)


async def run(settings: Settings, workdir: Path, results: Results) -> None:
    results.mark_load("start")
    try:
        await run_langgraph(settings, workdir, results)
        if settings.wants("agent") or settings.wants("maf"):
            await run_af_saves(settings, workdir, results)
        await run_agent_framework(settings, workdir, results)
    finally:
        results.mark_load("end")
