"""Issue 14, Agent Framework part: ``StatekeeperCheckpointStorage`` on SQLite and file
stores against ``FileCheckpointStorage`` and ``InMemoryCheckpointStorage``.

Each kind gets one storage per size in ``maf_sizes``, holding one workflow grown
through the storage's own ``save`` (untimed); then every ``get_latest`` (each kind at
each size) is timed in the same interleaved rounds, after being checked once against
the id of the last save. See
:mod:`skbench.integrations` for the LangGraph part and the shared machinery.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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


async def open_af(name: str, workdir: Path) -> Subject:
    if name in (AF_SK_SQLITE, AF_SK_FILE):
        import statekeeper
        from statekeeper.integrations.agent_framework import StatekeeperCheckpointStorage

        place = workdir / ("af-sk-sqlite" if name == AF_SK_SQLITE else "af-sk-file")
        place.mkdir()
        url = f"sqlite:///{place / 'af.db'}" if name == AF_SK_SQLITE else f"file://{place / 's'}"
        # the build is untimed and get_latest does not depend on it: "fast" saves
        store = statekeeper.open_store(url, codec="raw", durability="fast")
        storage = StatekeeperCheckpointStorage(store)  # opened lazily, closed by aclose
        facts = {
            "setting": 'an unopened store (codec="raw", durability="fast"), opened '
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
        await run_agent_framework(settings, workdir, results)
    finally:
        results.mark_load("end")
