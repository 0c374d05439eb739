"""The pyperf script of one workload (``benchmarks/run.py`` starts it; by hand:
``python benchmarks/suite.py --scratch DIR --workload save/sqlite-full -o out.json``).

pyperf's ``Runner`` parses the command line (every pyperf option works: ``--fast``,
``--rigorous``, ``--processes``, ``--values``, ``--debug-single-value``) and runs the
workload in worker processes, each of which runs this script again. A workload that
is a count (:attr:`skbench.harness.Workload.count`) is no timing: it runs once here
and its values go to ``-o`` as pyperf benchmarks of their unit.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyperf
from skbench import workloads
from skbench.harness import Context, Worker, counted, register


def main() -> None:
    def forward(cmd: list[str], args: object) -> None:
        cmd += ["--scratch", args.scratch, "--workload", args.workload]  # type: ignore[attr-defined]
        if args.quick:  # type: ignore[attr-defined]
            cmd.append("--quick")
        if args.large:  # type: ignore[attr-defined]
            cmd.append("--large")

    runner = pyperf.Runner(add_cmdline_args=forward)
    runner.argparser.add_argument("--scratch", required=True, help="the run's scratch directory")
    runner.argparser.add_argument("--workload", required=True, help="the workload's name")
    runner.argparser.add_argument("--quick", action="store_true", help="the quick sizes")
    runner.argparser.add_argument("--large", action="store_true", help="the opt-in read size")
    args = runner.parse_args()
    by_name = {w.name: w for w in workloads(args.quick, args.large)}
    if args.workload not in by_name:
        raise SystemExit(f"no workload {args.workload!r}")
    workload = by_name[args.workload]
    worker = Worker(Context(Path(args.scratch), args.quick))
    try:
        if workload.count is not None:
            values = worker.loop.run_until_complete(workload.count(worker.ctx))
            suite = counted(values)
            if args.output:
                suite.dump(args.output, replace=True)
            for name, (value, unit) in values.items():
                print(f"{name}: {value:g} {unit}")
        else:
            register(runner, workload, worker)
    finally:
        worker.close()  # before exit: a peer's connection thread would keep it alive


if __name__ == "__main__":
    main()
