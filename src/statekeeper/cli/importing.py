"""``statekeeper import``: an Agent Framework ``FileCheckpointStorage`` directory, a
LangGraph ``SqliteSaver`` database or a LangGraph ``PostgresSaver`` database into any
store.

The work is :mod:`statekeeper.integrations.importers`; this module parses the
arguments, opens the target with ``codec="raw"`` (the integrations store the
frameworks' own bytes), shows a progress bar and reports. The source is only
read. Safe to re-run: what an earlier run imported is counted as already present.
Exit 1 when any source item could not be imported (each is listed).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from .base import DebugOpt, JsonOpt, UrlOpt, progress_bar, run_async, setup
from .output import EXIT_PROBLEM, problems_table

__all__ = ["import_"]


class Source(StrEnum):
    """What kind of checkpoints SOURCE holds."""

    agent_framework = "agent-framework"
    langgraph_sqlite = "langgraph-sqlite"
    langgraph_postgres = "langgraph-postgres"


def import_(
    ctx: typer.Context,
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE",
            help="An Agent Framework FileCheckpointStorage directory, a LangGraph "
            "SqliteSaver database file, or the connection string of a LangGraph "
            "PostgresSaver database (as PostgresSaver.from_conn_string takes it).",
        ),
    ],
    kind: Annotated[
        Source,
        typer.Option("--from", help="What SOURCE is.", case_sensitive=False),
    ],
    url: UrlOpt = None,
    allow_type: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-type",
            metavar="MODULE:QUALNAME",
            help="Agent Framework: a type the checkpoints may hold beyond the framework's "
            "own (as FileCheckpointStorage's allowed_checkpoint_types). Repeatable.",
        ),
    ] = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Import existing framework checkpoints into the store at --url.

    Reads SOURCE with the framework's own reader, item by item, and writes through
    statekeeper's integration for that framework, so the integration reads each
    checkpoint as the framework did. Unreadable items are listed (exit 1), never
    dropped silently. Safe to re-run. The store is opened with codec="raw" and
    created if needed, once SOURCE is found to be readable; SOURCE is only read.
    """
    from ..integrations import importers

    out, g = setup(ctx, json_, debug)
    code = 0
    with out.guard():
        # The source first: a mistyped SOURCE must not leave an empty target behind.
        if kind is Source.agent_framework:
            importers.check_agent_framework_source(source)
        elif kind is Source.langgraph_sqlite:
            importers.check_langgraph_sqlite_source(source)
        else:
            importers.check_langgraph_postgres_source(source)
        target = out.open(out.resolve_url(url or g.url), codec="raw")

        async def main() -> int:
            async with target:
                out.store_url = out.scrub(target.describe())
                progress, advance = progress_bar(out, "importing", None)
                with progress:
                    if kind is Source.agent_framework:
                        result = await importers.import_agent_framework(
                            source,
                            target,
                            allowed_checkpoint_types=allow_type or (),
                            advance=advance,
                        )
                    elif kind is Source.langgraph_sqlite:
                        result = await importers.import_langgraph_sqlite(
                            source, target, advance=advance
                        )
                    else:
                        result = await importers.import_langgraph_postgres(
                            source, target, advance=advance
                        )
            problems = [p.as_json() for p in result.problems]
            if out.json:
                out.emit(
                    {
                        "source": out.scrub(source),
                        "from": kind.value,
                        "seen": result.seen,
                        "imported": result.imported,
                        "already_present": result.already_present,
                        "problems": problems,
                    }
                )
            else:
                problems_table(out, "not imported", problems)
                out.line(
                    f"imported {result.imported}, already present {result.already_present}, "
                    f"not imported {len(problems)} (of {result.seen} in {out.scrub(source)})",
                    "green" if not problems else "bold red",
                )
            return EXIT_PROBLEM if problems else 0

        code = run_async(main()) or 0
    if code:
        raise typer.Exit(code)
