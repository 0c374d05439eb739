"""The pyperf script of one workload (``benchmarks/run.py`` starts it; by hand:
``python benchmarks/suite.py --scratch DIR --workload save/sqlite-full -o out.json``).

pyperf's ``Runner`` parses the command line (every pyperf option works: ``--fast``,
``--rigorous``, ``--processes``, ``--values``, ``--debug-single-value``) and runs the
workload in worker processes, each of which runs this script again.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyperf
from skbench import workloads
from skbench.harness import Context, Worker, register


def main() -> None:
    def forward(cmd: list[str], args: object) -> None:
        cmd += ["--scratch", args.scratch, "--workload", args.workload]  # type: ignore[attr-defined]
        if args.quick:  # type: ignore[attr-defined]
            cmd.append("--quick")

    runner = pyperf.Runner(add_cmdline_args=forward)
    runner.argparser.add_argument("--scratch", required=True, help="the run's scratch directory")
    runner.argparser.add_argument("--workload", required=True, help="the workload's name")
    runner.argparser.add_argument("--quick", action="store_true", help="the quick sizes")
    args = runner.parse_args()
    by_name = {w.name: w for w in workloads(args.quick)}
    if args.workload not in by_name:
        raise SystemExit(f"no workload {args.workload!r}")
    worker = Worker(Context(Path(args.scratch), args.quick))
    try:
        register(runner, by_name[args.workload], worker)
    finally:
        worker.close()  # before exit: a peer's connection thread would keep it alive


if __name__ == "__main__":
    main()
