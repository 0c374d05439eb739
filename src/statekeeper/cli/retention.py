"""The ``statekeeper`` commands that keep a store bounded (SPEC S17): ``sweep`` and
``compact``.

- ``sweep`` applies a retention policy once (``--keep-last``, ``--max-age``,
  ``--idle``; at least one), with a progress bar. ``--dry-run`` opens the store
  read-only and reports what would go; otherwise it opens it with
  ``create=False``. Durations are ``30d``, ``12h``, ``15m``, ``90s``, ``2w`` or
  plain seconds.
- ``compact`` gives all free space back where the backend can (SQLite: a full
  ``VACUUM``), and otherwise says what the backend does with it instead.

The store is named by ``--url`` (or ``$STATEKEEPER_URL``), or as the argument.
The functions are registered on the app by :mod:`.commands`, in ``--help`` order.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from .base import DebugOpt, JsonOpt, Mode, UrlOpt, progress_bar, run_command
from .output import EXIT_USAGE, Output, count

if TYPE_CHECKING:
    from .._core.store import BaseCheckpointStore

__all__ = ["compact", "parse_duration", "sweep"]

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

#: What ``compact`` says of a backend that has nothing to compact.
_ELSEWHERE = {
    "postgresql": "PostgreSQL's autovacuum makes the space of removed rows reusable; "
    "VACUUM FULL (which locks the table while it rewrites it) gives it back to the OS",
    "mysql": "InnoDB reuses the space of removed rows; OPTIMIZE TABLE (which rebuilds "
    "the table) gives it back to the OS",
    "file": "the file store gives space back as it removes files",
    "redis": "Redis frees the memory of removed keys at once",
    "memory": "the memory store frees what it removes at once",
}


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``15m``, ``90s``, ``2w`` or plain seconds, as a timedelta
    (:class:`typer.BadParameter` for anything else, or zero)."""
    match = _DURATION.fullmatch(text)
    if match is None or float(match[1]) <= 0:
        raise typer.BadParameter(
            f"{text!r} is not a duration: write a positive number with s, m, h, d or w "
            "(for example 30d or 12h), or plain seconds"
        )
    return timedelta(seconds=float(match[1]) * _UNIT[match[2]])


def _duration(text: str | None) -> str | None:
    if text is not None:
        parse_duration(text)
    return text


UrlArg = Annotated[
    str | None, typer.Argument(metavar="URL", help="Store URL (or use --url).", show_default=False)
]


def sweep(
    ctx: typer.Context,
    store_url: UrlArg = None,
    keep_last: Annotated[
        int | None, typer.Option(min=1, help="Each stream keeps its newest N.")
    ] = None,
    max_age: Annotated[
        str | None,
        typer.Option(
            callback=_duration,
            metavar="DURATION",
            help="Remove checkpoints older than this, except each stream's newest.",
        ),
    ] = None,
    idle: Annotated[
        str | None,
        typer.Option(
            callback=_duration,
            metavar="DURATION",
            help="Remove whole streams whose newest checkpoint is older than this.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Report what would go; change nothing.")
    ] = False,
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Remove old checkpoints and idle streams by a retention policy.

    Checkpoints saved while it runs are never removed, and a stream's newest goes
    only with the whole stream (--idle). It also purges expired checkpoints and
    gives freed space back where the backend can.
    """
    from ..models import Retention

    policy = Retention(
        keep_last=keep_last,
        max_age=None if max_age is None else parse_duration(max_age),
        idle=None if idle is None else parse_duration(idle),
    )

    async def body(out: Output, store: BaseCheckpointStore) -> None:
        if not policy.has_rules:
            out.fail("sweep needs at least one of --keep-last, --max-age and --idle", EXIT_USAGE)
        total = (await store.info()).checkpoints
        progress, advance = progress_bar(out, "sweeping", total)
        with progress:
            report = await store.sweep(dry_run=dry_run, policy=policy, progress=advance)
        if out.json:
            rules = {"keep_last": keep_last, "max_age": max_age, "idle": idle}
            out.emit({"policy": rules, **report.model_dump(mode="json")})
            return
        what = (
            f"{count(report.checkpoints_removed, 'checkpoint')} "
            f"({count(report.streams_removed, 'whole idle stream')})"
        )
        if dry_run:
            out.line(f"dry run: would remove {what}; nothing was changed")
        elif report.bytes_reclaimed is None:
            out.line(f"removed {what}")
        else:
            out.line(f"removed {what}, gave back {report.bytes_reclaimed} bytes")

    run_command(ctx, _one_url(ctx, store_url, url), json_, debug, _mode(dry_run), body)


def compact(
    ctx: typer.Context,
    store_url: UrlArg = None,
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Give free space back to the OS (SQLite: a full VACUUM).

    On SQLite this rewrites the whole file: it takes time in proportion to the
    store, needs up to twice its disk space for a moment, and writers wait for
    it. Other backends say what they do with free space instead.
    """

    async def body(out: Output, store: BaseCheckpointStore) -> None:
        reclaimed = await store.compact()
        note = None if reclaimed is not None else _ELSEWHERE.get(store.backend_name)
        if out.json:
            out.emit({"backend": store.backend_name, "bytes_reclaimed": reclaimed, "note": note})
        elif reclaimed is not None:
            out.line(f"compacted: gave back {reclaimed} bytes")
        else:
            out.line(f"nothing to compact: {note or 'this backend has no compaction'}")

    run_command(ctx, _one_url(ctx, store_url, url), json_, debug, Mode.WRITE, body)


def _mode(dry_run: bool) -> Mode:
    return Mode.READ if dry_run else Mode.WRITE


def _one_url(ctx: typer.Context, argument: str | None, option: str | None) -> str | None:
    """The store URL from the argument or ``--url``, not both."""
    if argument is not None and option is not None:
        raise typer.BadParameter("give the store URL once: as the argument or with --url", ctx)
    return argument if argument is not None else option
