"""``statekeeper demo``: a job that checkpoints every step, is SIGKILLed part-way in
a real child process, and resumes from ``get_latest``.

The same :func:`run_job` runs in both processes: it starts from the stream's
latest checkpoint (or from scratch) and saves after each step. The child is this
module run as ``python -m statekeeper.cli.demo STREAM STEPS`` with the store URL
in ``$STATEKEEPER_URL`` (never on the command line, where ``ps`` would show a
password). It talks to the parent over its stdin/stdout pipes, one line per
message, so the kill is deterministic rather than timed:

    child  -> ``computed K``       step K's new state exists only in memory
    parent -> ``go``               (or SIGKILL, once K is past the kill point)
    child  -> ``saved K SEQ ID``   step K is durable

So the kill always lands after step ``kill_after`` is durable and while step
``kill_after + 1`` has been computed but not saved: that work is lost, as in a
real crash, and the resumed job redoes it. This module needs no typer or rich, so
the child starts quickly.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from .._core.store import BaseCheckpointStore
from .._registry import ENV_URL, open_store
from ..models import Checkpoint
from .output import key_options

__all__ = ["DemoResult", "demo_stream_name", "run_demo", "run_job"]

STAGES = (
    "fetch",
    "parse",
    "clean",
    "dedupe",
    "enrich",
    "score",
    "rank",
    "aggregate",
    "report",
    "publish",
)
#: How long the parent waits for one message from the child before giving up.
CHILD_TIMEOUT = 60.0

Report = Callable[[str, dict[str, Any]], None]


def stage_name(step: int) -> str:
    return STAGES[step - 1] if step <= len(STAGES) else f"stage-{step}"


def demo_stream_name() -> str:
    """A fresh stream per run, so the demo can run again and old runs stay inspectable.

    The names sort in the order the runs started, also within one second: the
    suffix's first byte is the fraction of that second (in 1/256 s), its second one
    random, so that two runs in the same 4 ms still get different names."""
    now = datetime.now(UTC)
    fraction = now.microsecond * 256 // 1_000_000
    return f"demo-{now.strftime('%Y%m%dT%H%M%S')}-{fraction:02x}{secrets.token_hex(1)}"


def initial_state(steps: int) -> dict[str, Any]:
    return {"job": "nightly-report", "steps": steps, "step": 0, "rows": 0, "done": []}


def advance(state: dict[str, Any], step: int) -> dict[str, Any]:
    """One step of the toy pipeline: the state grows by one entry per step."""
    rows = state["rows"] + 100 * step
    entry = {"stage": stage_name(step), "pid": os.getpid(), "rows": rows}
    return {**state, "step": step, "rows": rows, "done": [*state["done"], entry]}


async def run_job(
    store: BaseCheckpointStore,
    stream: str,
    steps: int,
    *,
    before_save: Callable[[int], None] | None = None,
    after_save: Callable[[Checkpoint], None] | None = None,
) -> Checkpoint | None:
    """Run the job to ``steps``, resuming from the latest checkpoint of ``stream``.

    Each checkpoint links to the previous one (``parent_id``) and records the step
    and the pid that wrote it in its metadata.
    """
    latest = await store.get_latest(stream)
    state = latest.state if latest is not None else initial_state(steps)
    last = latest
    for step in range(state["step"] + 1, steps + 1):
        state = advance(state, step)
        if before_save is not None:
            before_save(step)
        last = await store.save(
            stream,
            state,
            tags={"job": "demo"},
            metadata={"step": step, "stage": stage_name(step), "pid": os.getpid()},
            parent_id=last.id if last is not None else None,
        )
        if after_save is not None:
            after_save(last)
    return last


# -- the child ------------------------------------------------------------------------


def _child_main(argv: list[str]) -> int:
    stream, steps = argv[0], int(argv[1])

    def send(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def wait_for_go(step: int) -> None:
        send(f"computed {step}")
        # The parent answers "go" or kills us; it blocks the loop on purpose, since
        # nothing else runs in this process.
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(3)

    def saved(cp: Checkpoint) -> None:
        send(f"saved {cp.metadata['step']} {cp.sequence} {cp.id}")

    async def job() -> None:
        url = os.environ[ENV_URL]
        # the parent's store, opened the way the parent opened it ($STATEKEEPER_KEYS)
        async with open_store(url, **key_options(url)) as store:
            await run_job(store, stream, steps, before_save=wait_for_go, after_save=saved)
        send("done")

    send(f"started {os.getpid()}")
    asyncio.run(job())
    return 0


# -- the parent -----------------------------------------------------------------------


@dataclass
class DemoResult:
    stream: str
    steps: int
    kill_after: int
    child_pid: int = 0
    child_exit: int | None = None
    resumed_from: Checkpoint | None = None
    history: list[Checkpoint] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


class DemoFailed(Exception):
    """The child did something the demo did not expect; the message says what."""


async def run_demo(
    store: BaseCheckpointStore, url: str, stream: str, steps: int, kill_after: int, report: Report
) -> DemoResult:
    """Run the demo on the open ``store`` (reached by ``url`` from the child).

    ``report(event, data)`` is called as things happen: ``started``, ``saved``,
    ``killed``, ``resumed``, ``finished``.
    """
    result = DemoResult(stream, steps, kill_after)
    env = {**os.environ, ENV_URL: url}
    with tempfile.TemporaryFile() as errors:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "statekeeper.cli.demo",
            stream,
            str(steps),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            env=env,
        )
        try:
            await _drive_child(proc, result, report)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        result.child_exit = proc.returncode
        if result.child_exit != -9 and os.name == "posix":
            raise DemoFailed(_child_trouble("the job ended on its own", proc, errors))

    latest = await store.get_latest(stream)
    result.resumed_from = latest
    report("resumed", {"checkpoint": latest, "pid": os.getpid()})
    await run_job(store, stream, steps, after_save=lambda cp: report("saved", {"checkpoint": cp}))
    result.history = await _history(store, stream)
    result.checks = _checks(result, os.getpid())
    report("finished", {})
    return result


async def _drive_child(
    proc: asyncio.subprocess.Process, result: DemoResult, report: Report
) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    while True:
        try:
            raw = await asyncio.wait_for(proc.stdout.readline(), CHILD_TIMEOUT)
        except TimeoutError:
            raise DemoFailed(f"the job sent nothing for {CHILD_TIMEOUT:.0f} s") from None
        if not raw:
            return
        word, *args = raw.decode("utf-8", "replace").split()
        if word == "started":
            result.child_pid = int(args[0])
            report("started", {"pid": result.child_pid})
        elif word == "computed":
            step = int(args[0])
            if step > result.kill_after:
                proc.kill()
                await proc.wait()
                report("killed", {"pid": result.child_pid, "step": step})
                return
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        elif word == "saved":
            report("saved", {"step": int(args[0]), "sequence": int(args[1]), "id": args[2]})


def _child_trouble(what: str, proc: asyncio.subprocess.Process, errors: IO[bytes]) -> str:
    errors.seek(0)
    lines = [ln for ln in errors.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    detail = f": {lines[-1].strip()}" if lines else ""
    return f"{what} (exit status {proc.returncode}){detail}"


async def _history(store: BaseCheckpointStore, stream: str) -> list[Checkpoint]:
    items: list[Checkpoint] = []
    cursor: str | None = None
    while True:
        page = await store.list(stream, limit=100, order="asc", after=cursor)
        items.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return items


def _checks(result: DemoResult, resume_pid: int) -> dict[str, bool]:
    """What the demo proves, checked rather than claimed."""
    history = result.history
    steps = [cp.metadata.get("step") for cp in history]
    sequences = [cp.sequence for cp in history]
    pids = [cp.metadata.get("pid") for cp in history]
    expected_pids = [result.child_pid] * result.kill_after + [resume_pid] * (
        result.steps - result.kill_after
    )
    last = history[-1].state if history else {}
    return {
        "every_step_once_in_order": steps == list(range(1, result.steps + 1)),
        "sequences_increase": sequences == sorted(set(sequences)),
        "parents_link_each_step": all(
            cp.parent_id == (history[i - 1].id if i else None) for i, cp in enumerate(history)
        ),
        "resumed_from_last_durable_step": result.resumed_from is not None
        and result.resumed_from.metadata.get("step") == result.kill_after,
        "killed_steps_by_child_rest_by_resume": pids == expected_pids,
        "final_state_complete": isinstance(last, dict)
        and [d["stage"] for d in last.get("done", [])]
        == [stage_name(k) for k in range(1, result.steps + 1)],
    }


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
