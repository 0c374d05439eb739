"""The ``statekeeper`` commands that check, repair, copy and clean up a store:
``verify``, ``repair``, ``copy``, ``prune`` and ``purge``.

- ``verify`` opens the store with ``read_only=True`` and runs
  :meth:`~statekeeper.BaseCheckpointStore.verify`: it writes nothing, lists every
  problem, and says "ok" only when the report is ``ok`` (everything was checked
  and nothing is wrong); otherwise it exits 1.
- ``repair`` opens the store writable but never creates one (``create=False``),
  and runs :meth:`~statekeeper.BaseCheckpointStore.repair`. Damaged checkpoints
  stay (exit 1) until ``--drop-damaged``, the only way they go away.
- ``copy`` reads its source with ``read_only=True``; its destination may be created.
  It names both stores as arguments and refuses a global ``--url``. With
  ``$STATEKEEPER_KEYS`` set both are opened with the keys (a new destination is
  encrypted); ``--plaintext-src`` / ``--plaintext-dst`` open one side without. Interrupted
  (Ctrl-C, exit 130), it says how far it got; running it again continues.
- ``prune`` and ``purge`` change a store, so they open it with ``create=False``.

The functions are registered on the app by :mod:`.commands`, in ``--help`` order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import StatekeeperError, StoreFormatError
from .base import (
    DebugOpt,
    JsonOpt,
    Mode,
    StreamArg,
    UrlOpt,
    opened,
    plaintext_refused,
    progress_bar,
    run_async,
    run_command,
    setup,
)
from .frameworks import framework_problems, remove_orphans
from .hints import command
from .output import (
    EXIT_INTERRUPTED,
    EXIT_PROBLEM,
    EXIT_USAGE,
    Output,
    count,
    needs_keys,
    problems_table,
)

if TYPE_CHECKING:
    from .._core.store import BaseCheckpointStore
    from ..models import Page, Problem, RepairReport, VerifyReport
    from .ops import CopyResult

__all__ = ["copy", "prune", "purge", "repair", "verify"]


def _problem_json(problem: Problem) -> dict[str, Any]:
    return problem.model_dump(mode="json")


# -- verify ---------------------------------------------------------------------------


def verify(
    ctx: typer.Context, url: UrlOpt = None, json_: JsonOpt = False, debug: DebugOpt = False
) -> None:
    """Check every record, index and table, read-only.

    Exit 1 on any problem. Opens the store read-only and writes nothing. Every
    record is read through a tolerant listing, a strict load by id and a strict
    get_latest of its stream; then the backend checks its indexes and tables
    against the records. It says "ok" only when all of that was checked and
    nothing is wrong.
    """

    async def body(out: Output, store: BaseCheckpointStore) -> int:
        try:
            total = (await store.info()).checkpoints
        except StatekeeperError:
            total = None  # damaged bookkeeping: verify itself will say what is wrong
        progress, advance = progress_bar(out, "verifying", total)
        with progress:
            report = await store.verify(progress=advance)
        extra = await framework_problems(store)
        if extra:
            report = report.model_copy(update={"problems": [*report.problems, *extra]})
        if out.json:
            out.emit({**report.model_dump(mode="json"), "ok": report.ok})
        else:
            _print_verify(out, report)
        return 0 if report.ok else EXIT_PROBLEM

    run_command(ctx, url, json_, debug, Mode.READ, body)


#: How many notices the table shows; the verdict counts them all.
_NOTICES_SHOWN = 5


def _print_verify(out: Output, report: VerifyReport) -> None:
    problems = [p for p in report.problems if not p.is_notice]
    notices = [p for p in report.problems if p.is_notice]
    problems_table(out, "problems", [_problem_json(p) for p in problems])
    shown = [_problem_json(p) for p in notices[:_NOTICES_SHOWN]]
    problems_table(out, "notices (readable, not problems)", shown)
    if len(notices) > _NOTICES_SHOWN:
        out.line(f"... and {len(notices) - _NOTICES_SHOWN} more notices (--json lists them all)")
    out.keys_hint([p.reason for p in problems])
    checked = f"checked {count(report.records, 'checkpoint')} in {count(report.streams, 'stream')}"
    rekey = command("rekey", *out.url_args())
    if report.ok:
        out.line(f"{checked}, and every index and table against them: ok", "green")
        if notices:
            out.line(
                f"{count(len(notices), 'record')} still under a retired key (readable while "
                f"that key stays in $STATEKEEPER_KEYS); move them to the active key: {rekey}",
                "yellow",
            )
        return
    verdict = f"{checked}: {count(len(problems), 'problem')}"
    if notices:
        verdict += f" (and {count(len(notices), 'record')} under a retired key)"
    if not report.complete:
        verdict += ", and not fully checked"
    out.line(verdict, "bold red")
    kinds = {p.kind for p in problems}
    if "plaintext" in kinds:
        out.line(
            "a plaintext record in an encrypted store was not written through these keys: "
            "left from before the store was encrypted, or planted. Check it; "
            f"if it is yours, rekey encrypts it: {rekey}"
        )
    if "undecryptable" in kinds:
        out.line(
            "an undecryptable record names a key that is not in $STATEKEEPER_KEYS, or was "
            "altered: add the key it names after the active one and verify again"
        )
    # repair rebuilds neither a key nor a record that is encrypted and read without keys
    skip = {"unchecked", "plaintext", "undecryptable"}
    if any(p.kind not in skip and not needs_keys(p.reason) for p in problems):
        out.line(f"repair what can be rebuilt: {command('repair', *out.url_args())}")


# -- repair ---------------------------------------------------------------------------


def repair(
    ctx: typer.Context,
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
    drop_damaged: Annotated[
        bool,
        typer.Option(
            "--drop-damaged",
            help="Delete the checkpoints whose records stay damaged (the only way they go).",
        ),
    ] = False,
) -> None:
    """Rebuild indexes and tables from the records.

    Shows what it rebuilt and what stays damaged. Never creates a store. Every
    checkpoint keeps its sequence; a damaged one stays (strict reads keep
    raising for it, exit 1) until --drop-damaged deletes it.
    """

    async def body(out: Output, store: BaseCheckpointStore) -> int:
        report = await store.repair(drop_damaged=drop_damaged)
        removed = await remove_orphans(store)
        if removed:
            n = removed["langgraph_orphaned_writes"]
            report = report.model_copy(
                update={
                    "rebuilt": {**report.rebuilt, **removed},
                    "actions": [
                        *report.actions,
                        f"removed {count(n, 'LangGraph pending-writes record')} whose "
                        "checkpoint was gone",
                    ],
                }
            )
        if out.json:
            out.emit(
                {
                    "drop_damaged": drop_damaged,
                    **report.model_dump(mode="json"),
                    "ok": not report.damaged,
                }
            )
        else:
            _print_repair(out, report, drop_damaged)
        return EXIT_PROBLEM if report.damaged else 0

    run_command(ctx, url, json_, debug, Mode.WRITE, body)


def _print_repair(out: Output, report: RepairReport, drop_damaged: bool) -> None:
    rebuilt = ", ".join(f"{k} {v}" for k, v in report.rebuilt.items()) or "nothing"
    out.line(f"rebuilt from the records: {rebuilt}")
    for action in report.actions:
        out.line(f"  - {action}")
    problems_table(out, "dropped (deleted for good)", [_problem_json(p) for p in report.dropped])
    problems_table(
        out, "still damaged (kept, strict reads raise)", [_problem_json(p) for p in report.damaged]
    )
    summary = f"{count(report.records, 'checkpoint')} in the store"
    if report.dropped:
        summary += f", {len(report.dropped)} dropped"
    if not report.damaged:
        out.line(f"{summary}; nothing stays damaged", "green")
        return
    out.line(f"{summary}; {len(report.damaged)} damaged and kept", "bold red")
    if drop_damaged:
        out.line(
            "these could not be dropped by id (their id cannot be read); "
            "remove their records by hand (see where)"
        )
    else:
        out.line(
            "strict reads keep raising for them; --drop-damaged deletes them, and is the "
            f"only way they go away: {command('repair', '--drop-damaged', *out.url_args())}"
        )


# -- copy -----------------------------------------------------------------------------


def copy(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(metavar="SRC", help="Store URL to copy from.")],
    destination: Annotated[str, typer.Argument(metavar="DST", help="Store URL to copy into.")],
    json_: JsonOpt = False,
    debug: DebugOpt = False,
    plaintext_src: Annotated[
        bool,
        typer.Option(
            "--plaintext-src", help="Read SRC without encryption, even with $STATEKEEPER_KEYS set."
        ),
    ] = False,
    plaintext_dst: Annotated[
        bool,
        typer.Option(
            "--plaintext-dst",
            help="Write DST without encryption, even with $STATEKEEPER_KEYS set: a decrypted copy.",
        ),
    ] = False,
) -> None:
    """Copy every checkpoint of store SRC into store DST, in order.

    Safe to re-run. SRC is opened read-only (it must exist); DST is created if needed.
    Ids, streams, timestamps, etags, parent links, tags, metadata and expiry are kept;
    relative order is kept. Checkpoints already in DST (same id, stream and etag) are
    skipped; a different one with the same id is reported as a conflict (exit 1).
    With $STATEKEEPER_KEYS set, both stores are opened with those keys, so DST is
    written encrypted, the safe default; --plaintext-src and --plaintext-dst open one
    side without them.
    """
    from .ops import CopyResult, copy_store

    out, g = setup(ctx, json_, debug)
    code = 0
    with out.guard():
        if g.url is not None:
            out.fail(
                "copy takes both stores as arguments and does not use --url: "
                f"{command('copy', 'SRC', 'DST')} (to copy the store at --url, pass it as SRC)",
                EXIT_USAGE,
            )
        src = out.open(source, keys=not plaintext_src, **Mode.READ.options())
        dst = out.open(destination, keys=not plaintext_dst, **Mode.CREATE.options())
        result = CopyResult()
        total: int | None = None

        async def main() -> int:
            nonlocal total
            async with opened(out, src, "copy", Mode.READ, "SRC"):
                try:
                    await dst.open()
                except StoreFormatError as exc:
                    raise plaintext_refused(out, dst, exc, "DST", destination) or exc from exc
                async with dst:
                    total = (await src.info()).checkpoints
                    progress, advance = progress_bar(out, "copying", total)
                    with progress:
                        await copy_store(src, dst, advance, result)
            problems = [p.as_json() for p in result.problems]
            if out.json:
                out.emit(
                    {
                        "source": out.scrub(src.describe()),
                        "destination": out.scrub(dst.describe()),
                        "seen": result.seen,
                        "copied": result.copied,
                        "already_present": result.already_present,
                        "problems": problems,
                    }
                )
            else:
                problems_table(out, "not copied", problems)
                out.keys_hint([p["reason"] for p in problems if p["check"] == "source"])
                out.line(
                    f"copied {result.copied}, already present {result.already_present}, "
                    f"not copied {len(problems)} (of {result.seen} in the source)",
                    "green" if not problems else "bold red",
                )
            return EXIT_PROBLEM if problems else 0

        try:
            code = run_async(main()) or 0
        except KeyboardInterrupt:
            _interrupted(out, result, total, source, destination)
    if code:
        raise typer.Exit(code)


def _interrupted(
    out: Output, result: CopyResult, total: int | None, source: str, destination: str
) -> None:
    """Ctrl-C during ``copy``: say how far it got, and that a rerun continues."""
    of = f"{result.seen} of the source's {total}" if total is not None else f"{result.seen}"
    again = command("copy", out.safe_url(source), out.safe_url(destination))
    out.fail(
        f"interrupted after {of} checkpoints: copied {result.copied}, already present "
        f"{result.already_present}, not copied {len(result.problems)}. Each copied checkpoint "
        "is whole in the destination; run the same command again to continue where this "
        f"one stopped (what is there counts as already present): {again}",
        EXIT_INTERRUPTED,
        kind="KeyboardInterrupt",
        seen=result.seen,
        copied=result.copied,
        already_present=result.already_present,
        total=total,
    )


# -- prune, purge -------------------------------------------------------------------------


def prune(
    ctx: typer.Context,
    stream: StreamArg,
    keep_last: Annotated[
        int, typer.Option(min=0, help="How many of the newest to keep (0: none).")
    ],
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Delete all but the newest N checkpoints of a stream.

    Exit 1 if the stream has no checkpoints (nothing was there to prune), as
    ``latest`` does.
    """

    async def body(out: Output, store: BaseCheckpointStore) -> int:
        from rich.text import Text

        removed = await store.prune(stream, keep_last=keep_last)
        # Nothing removed: say so apart when there was nothing there at all (a
        # mistyped name), where a damaged record still counts as something there.
        empty = removed == 0 and not _has_records(
            await store.list(stream, limit=1, include_state=False)
        )
        if out.json:
            out.emit({"stream": stream, "keep_last": keep_last, "removed": removed})
        elif not empty:
            out.line(f"removed {removed} checkpoints from {stream!r}, kept the newest {keep_last}")
        if empty:
            out.stderr.print(Text(f"stream {stream!r} has no checkpoints", style="red"))
            return EXIT_PROBLEM
        return 0

    run_command(ctx, url, json_, debug, Mode.WRITE, body)


def _has_records(page: Page) -> bool:
    return bool(page.items or page.skipped)


def purge(
    ctx: typer.Context, url: UrlOpt = None, json_: JsonOpt = False, debug: DebugOpt = False
) -> None:
    """Remove expired checkpoints for good."""

    async def body(out: Output, store: BaseCheckpointStore) -> None:
        removed = await store.purge_expired()
        if out.json:
            out.emit({"removed": removed})
        else:
            out.line(f"removed {removed} expired checkpoints")

    run_command(ctx, url, json_, debug, Mode.WRITE, body)
