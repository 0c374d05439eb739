"""The caller's context, carried to a worker thread while telemetry is on (SPEC S18).

A call handed to a :class:`~.worker.Worker` runs on another thread, where the
caller's ``contextvars`` (OpenTelemetry's current span among them) are not set.
While :data:`CARRY` is on (statekeeper's telemetry turns it on, and it stays on), a
worker wraps each call it is given in :class:`Carried`: the caller's context,
copied when the call is submitted, is the one the call runs in on the thread, so a
span opened there (by an instrumented driver, say) has the caller's span as its
parent. While it is off, nothing is wrapped and nothing is copied: one attribute
read per call.

:class:`Notes` is what an instrumented operation learns from the runtime without
asking: whether any part of it ran on a worker thread, the size of the group commit
its write rode in (:mod:`.group` notes it), and the bytes of the states it encoded
or decoded (noted by the core). An operation that telemetry watches sets
:data:`NOTES` for its duration; with telemetry off it is ``None`` and nothing is
noted.

This module imports nothing; :mod:`.worker` and :mod:`.group` import it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import Context, ContextVar, copy_context
from typing import Any

__all__ = ["CARRY", "NOTES", "Carried", "Notes", "carry_on", "note_bytes", "note_group"]


class Notes:
    """What the runtime noted of one operation (see the module)."""

    __slots__ = ("bytes", "group", "sizes", "worker")

    def __init__(self) -> None:
        #: Some part of the operation ran on one of the store's worker threads.
        self.worker = False
        #: The size of the group commit its write rode in (0: none).
        self.group = 0
        #: The bytes of the encoded states written or read (0: none noted).
        self.bytes = 0
        #: The size of each of those states.
        self.sizes: list[int] = []


#: The notes of the operation telemetry is watching in this context, if any.
NOTES: ContextVar[Notes | None] = ContextVar("statekeeper_notes", default=None)


class _Switch:
    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


#: Whether workers carry their callers' contexts (``CARRY.on``).
CARRY = _Switch()


def carry_on() -> None:
    """Workers carry their callers' contexts from now on (it is never turned off:
    a context copied costs little, and a call already queued keeps its wrapper)."""
    CARRY.on = True


class Carried:
    """``fn`` to run in the context it was submitted from (see the module)."""

    __slots__ = ("context", "fn", "notes")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.context: Context = copy_context()
        self.notes = NOTES.get()

    def __call__(self, *args: Any) -> Any:
        notes = self.notes
        if notes is not None:
            notes.worker = True
        return self.context.run(self.fn, *args)


def note_group(jobs: Sequence[tuple[Any, ...]]) -> None:
    """The jobs (``Job`` tuples whose first item is the call) ran as one group."""
    size = len(jobs)
    for job in jobs:
        fn = job[0]
        if type(fn) is Carried and fn.notes is not None:
            fn.notes.worker = True
            fn.notes.group = size


def note_bytes(size: int) -> None:
    """An encoded state of ``size`` bytes was written or read by the operation."""
    notes = NOTES.get()
    if notes is not None:
        notes.bytes += size
        notes.sizes.append(size)
