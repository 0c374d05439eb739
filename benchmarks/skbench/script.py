"""What the focused benchmark scripts (``api.py``, ``integrations.py``, ``hot.py``,
``pg.py``) share: their source and output options, the report's facts about what was
measured, writing the section (and splicing it into ``docs/benchmarks.md``),
re-rendering from a run's raw JSON, and the entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from skbench.adapters.statekeeper_stores import POSTGRES_URL, REDIS_URL
from skbench.machine import describe_machine
from skbench.source import ROOT, git, import_source, splice

__all__ = [
    "DOCS",
    "add_output_args",
    "last_changes",
    "load_raw",
    "measuring",
    "run_script",
    "start_meta",
    "write_section",
]

DOCS = ROOT / "docs/benchmarks.md"


def add_output_args(
    parser: argparse.ArgumentParser,
    output: str,
    *,
    from_json_help: str = "re-render from a run's raw JSON",
    workdir_help: str = "where stores live (default: a temp dir)",
) -> None:
    """The options every focused script takes after its own: where the section goes,
    where the stores live, re-rendering, and which ``src/`` is measured."""
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/raw" / output)
    parser.add_argument("--docs", action="store_true", help=f"also splice the section into {DOCS}")
    parser.add_argument("--workdir", type=Path, help=workdir_help)
    parser.add_argument("--from-json", type=Path, help=from_json_help)
    parser.add_argument("--rev", default="HEAD", help="measure this commit's src/ (default HEAD)")
    parser.add_argument(
        "--working-tree", action="store_true", help="measure src/ as it is, edits and all"
    )


def last_changes(commit: str, paths: Mapping[str, str]) -> str:
    """The last commit to touch each of ``paths`` (name to path), as of ``commit``."""
    return ", ".join(
        f"{name} `{git('log', '-1', '--format=%h', commit, '--', path)}`"
        for name, path in paths.items()
    )


def start_meta(
    args: argparse.Namespace,
    workdir: Path,
    command: str,
    paths: Mapping[str, str],
    key: str = "paths",
) -> dict[str, Any]:
    """The report's facts at the start of a run: its command and date, which
    statekeeper is measured (see :mod:`skbench.source`), and under ``key`` the last
    commit to touch each of ``paths``."""
    meta: dict[str, Any] = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M %Z")}
    commit, facts = import_source(args, workdir)
    meta.update(facts)
    if commit is not None:
        meta[key] = last_changes(commit, paths)
    return meta


@asynccontextmanager
async def measuring(
    results: Any,
    workdir: Path,
    finish: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> AsyncIterator[None]:
    """Around a run's measuring: describe the machine (then ``finish`` it) and remove
    ``workdir`` however the run ends, and on success set ``meta["elapsed"]``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        results.machine = describe_machine(workdir, POSTGRES_URL, REDIS_URL)
        if finish is not None:
            await finish(results.machine)
        shutil.rmtree(workdir, ignore_errors=True)
    results.meta["elapsed"] = time.perf_counter() - started


def write_section(
    args: argparse.Namespace,
    results: Any,
    section: str,
    heading: str,
    raw_settings: Mapping[str, Any],
) -> None:
    """Write the section to ``--output`` and the raw figures (``raw_settings`` and
    ``results``) next to it as JSON, splice it into :data:`DOCS` under ``heading``
    with ``--docs``, and print it."""
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(section, encoding="utf-8")
    raw = {"settings": raw_settings, **vars(results)}
    args.output.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    if args.docs:
        DOCS.write_text(
            splice(DOCS.read_text(encoding="utf-8"), heading, section), encoding="utf-8"
        )
        results.say(f"spliced the section into {DOCS}")
    print(section)
    results.say(f"wrote {args.output}")


def load_raw(
    args: argparse.Namespace, results: Any, keys: Iterable[str], command: str
) -> dict[str, Any]:
    """Fill ``results`` from the raw JSON named by ``--from-json`` (the ``keys`` of
    it), marked as re-rendered by ``command``; return the raw settings."""
    raw = json.loads(args.from_json.read_text(encoding="utf-8"))
    for key in keys:
        setattr(results, key, raw[key])
    results.meta["rerendered"] = command
    settings: dict[str, Any] = raw["settings"]
    return settings


def run_script(
    parse_args: Callable[[list[str]], argparse.Namespace],
    rerender: Callable[[argparse.Namespace], object],
    main: Callable[[argparse.Namespace], Coroutine[Any, Any, object]],
    argv: list[str],
) -> None:
    """The entry point: re-render under ``--from-json``, else measure."""
    arguments = parse_args(argv)
    if arguments.from_json:
        rerender(arguments)
    else:
        asyncio.run(main(arguments))
