"""Issue 24's workloads beyond the checkpoint calls: ``aput_writes`` and a whole graph.

- ``aput_writes``: call ``i`` writes a task's output (the ~1 KB state and a step
  counter) to the ``i``-th checkpoint put, with a task id of its own: each call is
  the first writes of its checkpoint, as a graph's super-step with one task makes
  them. The records it makes stay, so the reads measured after it return pending
  writes too, as a graph's checkpoints have them.
- The graph: a compiled ``StateGraph`` of one node that loops ``GRAPH_STEPS``
  times, each step writing the ~1 KB state of that step to its one channel, run
  with ``ainvoke`` on a new thread per call, with LangGraph's default durability.
  That is what users feel: every ``aput``, ``aput_writes`` and ``aget_tuple`` the
  runtime makes, in its own order, with its own concurrency. Every saver runs the
  graph the same number of times, so that the threads it leaves count alike in the
  databases' size.

Both take the saver and the ids put (``subject.handle``, ``subject.ids``) and use
nothing of :mod:`skbench.integrations` but those.
"""

from __future__ import annotations

import itertools
from typing import Any, TypedDict

from .payload import make_state
from .timing import Op

GRAPH_STEPS = 100
_THREAD = "bench-thread"


def writes_op(subject: Any) -> Op:
    async def op(i: int) -> None:
        config = {
            "configurable": {
                "thread_id": _THREAD,
                "checkpoint_ns": "",
                "checkpoint_id": subject.ids[i % len(subject.ids)],
            }
        }
        writes = [("state", make_state(i)), ("step", i)]
        await subject.handle.aput_writes(config, writes, f"task-{i:06}", "~__pregel_pull, step")

    return op


class _State(TypedDict):
    n: int
    state: dict[str, Any]


def _graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    def step(s: _State) -> dict[str, Any]:
        return {"n": s["n"] + 1, "state": make_state(s["n"])}

    def route(s: _State) -> str:
        return "step" if s["n"] < GRAPH_STEPS else END

    builder = StateGraph(_State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", route)
    return builder.compile(checkpointer=saver)


def graph_op(subject: Any) -> Op:
    graph = _graph(subject.handle)
    runs = itertools.count()

    async def op(i: int) -> None:
        config = {
            "configurable": {"thread_id": f"graph-{next(runs)}"},
            "recursion_limit": GRAPH_STEPS * 2 + 10,
        }
        out = await graph.ainvoke({"n": 0, "state": {}}, config)
        if out["n"] != GRAPH_STEPS:
            raise RuntimeError(f"the graph stopped at step {out['n']}")

    return op
