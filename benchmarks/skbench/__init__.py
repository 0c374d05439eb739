"""statekeeper's benchmark harness: stores side by side with their peers, in one run.

``benchmarks/run.py`` is the entry point. The modules here are the pieces: adapters
that drive each store (ours and the peers) through the same workloads, the timing
loop, the physical floors, the concurrent-writer test and the report.
"""
