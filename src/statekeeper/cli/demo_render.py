"""How ``statekeeper demo`` tells its story: live lines, a history table, the checks."""

from __future__ import annotations

import os
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from .._core.store import BaseCheckpointStore
from ..models import Checkpoint
from .demo import DemoFailed, DemoResult, demo_stream_name, run_demo, stage_name
from .hints import command
from .output import EXIT_PROBLEM, EXIT_USAGE, Output, when

__all__ = ["render_demo"]

_CHECKS = {
    "every_step_once_in_order": "every step was saved exactly once, in order",
    "sequences_increase": "sequences increase with every save",
    "parents_link_each_step": "each checkpoint links to the one before (parent_id)",
    "resumed_from_last_durable_step": "the resume started from the last saved step",
    "killed_steps_by_child_rest_by_resume": (
        "the killed job wrote the first steps, the resume the rest"
    ),
    "final_state_complete": "the final state holds all the steps",
}


async def render_demo(out: Output, store: BaseCheckpointStore, steps: int, kill_after: int) -> int:
    """Run the demo on ``store`` and print it; return the exit status."""
    if not store.capabilities.cross_process:
        out.fail(
            f"the demo runs the job in a second process, and {store.describe()} cannot be "
            "shared between processes; use a file or SQLite store, e.g. --url sqlite:///demo.db",
            EXIT_USAGE,
        )
    assert out.url is not None
    stream = demo_stream_name()
    safe = out.safe_url(out.url)
    out.line(
        f"statekeeper demo: a {steps}-step job that saves a checkpoint after every step", "bold"
    )
    out.line(f"  store   {safe}")
    out.line(f"  stream  {stream}")
    out.line("")
    resume_pid = os.getpid()

    def report(event: str, data: dict[str, Any]) -> None:
        if event == "started":
            out.line(f"1. The job starts in a child process (pid {data['pid']}).")
        elif event == "saved":
            saved: Checkpoint | None = data.get("checkpoint")
            step = saved.metadata["step"] if saved is not None else data["step"]
            seq = saved.sequence if saved is not None else data["sequence"]
            out.line(f"   step {step:>2} {stage_name(step):<10} checkpointed as sequence {seq}")
        elif event == "killed":
            step = data["step"]
            out.line(
                f"2. Step {step} ({stage_name(step)}) is computed but not saved yet: "
                f"SIGKILL the job (pid {data['pid']}).",
                "bold red",
            )
        elif event == "resumed":
            cp: Checkpoint | None = data["checkpoint"]
            got = (
                "nothing" if cp is None else f"step {cp.metadata['step']} (sequence {cp.sequence})"
            )
            out.line(
                f"3. Resume in this process (pid {data['pid']}): get_latest returns {got}.", "bold"
            )
            out.line(f"   The job goes on from step {kill_after + 1}.")

    try:
        result = await run_demo(store, out.url, stream, steps, kill_after, report)
    except DemoFailed as exc:
        out.fail(f"the demo's job failed: {exc}", EXIT_PROBLEM)
    if out.json:
        out.emit(_as_json(result, resume_pid))
    else:
        _print_summary(out, result, resume_pid)
    return 0 if result.ok else EXIT_PROBLEM


def _print_summary(out: Output, result: DemoResult, resume_pid: int) -> None:
    out.line(f"4. Done. The history of {result.stream}, oldest first:", "bold")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("step", "stage", "seq", "created_at (UTC)", "etag", "pid"):
        table.add_column(name, no_wrap=True)
    for cp in result.history:
        step = cp.metadata.get("step")
        pid = cp.metadata.get("pid")
        table.add_row(
            str(step),
            stage_name(step) if isinstance(step, int) else "?",
            str(cp.sequence),
            when(cp.created_at),
            Text(cp.etag),
            Text(str(pid), style="red" if pid == result.child_pid else "green"),
        )
    out.say(table)
    out.line(f"pid {result.child_pid}: the job that was killed; pid {resume_pid}: the resume.")
    for key, ok in result.checks.items():
        mark, style = ("ok  ", "green") if ok else ("FAIL", "bold red")
        out.line(f"  {mark} {_CHECKS.get(key, key)}", style)
    url = out.url_args()
    out.line("")
    out.line("Look around (each run of the demo uses a new stream):")
    out.line(f"  {command('ls', result.stream, '--order', 'asc', *url)}")
    out.line(f"  {command('latest', result.stream, *url)}")
    out.line(f"  {command('verify', *url)}")


def _as_json(result: DemoResult, resume_pid: int) -> dict[str, Any]:
    resumed = result.resumed_from
    history = []
    for cp in result.history:
        step = cp.metadata.get("step")
        history.append(
            {
                "step": step,
                "stage": stage_name(step) if isinstance(step, int) else None,
                "sequence": cp.sequence,
                "id": cp.id,
                "created_at": cp.created_at.isoformat(),
                "etag": cp.etag,
                "parent_id": cp.parent_id,
                "pid": cp.metadata.get("pid"),
                "by": "job" if cp.metadata.get("pid") == result.child_pid else "resume",
            }
        )
    return {
        "stream": result.stream,
        "steps": result.steps,
        "kill_after": result.kill_after,
        "child": {
            "pid": result.child_pid,
            "exit_status": result.child_exit,
            "killed_during_step": result.kill_after + 1,
        },
        "resume_pid": resume_pid,
        "resumed_from": None
        if resumed is None
        else {
            "step": resumed.metadata.get("step"),
            "sequence": resumed.sequence,
            "id": resumed.id,
            "etag": resumed.etag,
        },
        "history": history,
        "final_state": result.history[-1].state if result.history else None,
        "checks": result.checks,
        "ok": result.ok,
    }
