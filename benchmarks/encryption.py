"""Encryption at rest, measured: what it adds to a save and a get_latest, side by side.

    uv run nox -s bench_encryption             # ~5 minutes; writes results/raw/encryption.md
    uv run nox -s bench_encryption -- --quick  # ~1 minute (8 rounds)
    uv run nox -s bench_encryption -- --docs --compare benchmarks/results/raw/compare.md

Memory, SQLite and file (``durability="full"`` and ``"fast"``), and PostgreSQL when
``STATEKEEPER_TEST_POSTGRES_URL`` is set: plaintext against ``encryption=Keyring(...)``
(and ``encrypt_metadata=True``) stores of the same backend, interleaved, 1 KB and
100 KB states; and the envelope alone. ``--compare FILE`` includes a
``bench_compare`` run's section (the plaintext stores before and after encryption was
added) under this one. The raw figures go to ``benchmarks/results/raw/encryption.json``
(not committed). See :mod:`skbench.encryption`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from skbench.encryption import EncResults, EncSettings, run  # noqa: E402
from skbench.encryption_report import SECTION, render  # noqa: E402
from skbench.script import (  # noqa: E402
    add_output_args,
    load_raw,
    measuring,
    run_script,
    start_meta,
    write_section,
)
from skbench.source import command  # noqa: E402

#: The encryption code: the last commit to each is named in the report.
PATHS = {
    "envelope": "src/statekeeper/encryption/envelope.py",
    "sealing": "src/statekeeper/_core/sealing.py",
}
POSTGRES_ENV = "STATEKEEPER_TEST_POSTGRES_URL"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, help="rounds per store (default 40; quick 8)")
    parser.add_argument("--quick", action="store_true", help="8 rounds, shorter chunks")
    parser.add_argument("--only", help="comma-separated substrings of memory, sqlite, file, ...")
    parser.add_argument(
        "--compare",
        type=Path,
        help="a bench_compare output (.md) to include: plaintext before and after",
    )
    add_output_args(
        parser,
        "encryption.md",
        from_json_help="re-render the section from a run's raw JSON (no measuring)",
    )
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> EncSettings:
    return EncSettings(
        rounds=args.rounds or (8 if args.quick else 40),
        chunk_seconds=0.01 if args.quick else 0.02,
        raw_seconds=0.005 if args.quick else 0.02,
        postgres_url=os.environ.get(POSTGRES_ENV, ""),
        only=[x.strip().lower() for x in args.only.split(",")] if args.only else [],
    )


def _command() -> str:
    return command("bench_encryption", "benchmarks/encryption.py")


def _write(args: argparse.Namespace, results: EncResults) -> None:
    compare = args.compare.read_text(encoding="utf-8") if args.compare else None
    section = render(results, compare)
    write_section(args, results, section, SECTION, {"compare": str(args.compare or "")})


def rerender(args: argparse.Namespace) -> None:
    """Write the section again from a run's raw JSON, measuring nothing."""
    results = EncResults()
    keys = ("meta", "machine", "configs", "cells", "raw", "loads", "log")
    load_raw(args, results, keys, _command())
    _write(args, results)


async def _finish(machine: dict[str, Any]) -> None:
    machine["cryptography"] = version("cryptography")


async def main(args: argparse.Namespace) -> None:
    settings = settings_for(args)
    results = EncResults()
    workdir = Path(tempfile.mkdtemp(prefix="skbench-encryption-", dir=args.workdir))
    results.meta = start_meta(args, workdir, _command(), PATHS)
    async with measuring(results, workdir, finish=_finish):
        await run(settings, workdir, results)
    _write(args, results)


if __name__ == "__main__":
    run_script(parse_args, rerender, main, sys.argv[1:])
