"""statekeeper's benchmark harness: its workloads, timed by pyperf, and the report.

``benchmarks/run.py`` is the one command; ``benchmarks/suite.py`` is the pyperf
script it runs for each workload. The modules:

- ``subjects``: the stores under test, ours and the peers', behind one interface;
- ``harness``: what a workload is, and the glue that lets pyperf time it;
- ``stores``: saves, the bare floors, the thread hop, WAL frames per commit, reads,
  listings, concurrency, batch access;
- ``frameworks``: under LangGraph and Agent Framework;
- ``features``: encryption, telemetry, retention sweeps, start-up;
- ``render``: the one table renderer over pyperf results;
- ``report``: the sections of ``docs/benchmarks.md``;
- ``plots``: its plots;
- ``payload``: the ~1 KB state every store saves.
"""

from __future__ import annotations

from .harness import Workload


def workloads(quick: bool, large: bool = False) -> list[Workload]:
    """Every workload of a run, in the order it takes them; ``large`` adds the reads
    at :data:`skbench.stores.LARGE` checkpoints (opt-in: slow to build and to list)."""
    from . import features, frameworks, stores

    return [
        *stores.catalogue(quick, large),
        *frameworks.catalogue(quick, stores.sizes(quick)),
        *features.catalogue(quick),
    ]
