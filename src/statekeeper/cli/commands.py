"""The ``statekeeper`` commands that run the demo and look inside a store (typer
and rich, from the ``cli`` extra); :mod:`.maintenance` has the ones that check,
repair, copy and clean up. :func:`run` registers both, in the order ``--help``
lists them.

Every command works on any store URL the registry can open, plugins included:
``--url``, else ``$STATEKEEPER_URL``, else ``sqlite:///./statekeeper.db``. The
common options ``--url``, ``--json`` and ``--debug`` may be given before the
command or after it. Commands that only read open the store with
``read_only=True``: they write nothing and never create a store, so a mistyped
URL is ``StoreNotFound`` (exit 1), not a new empty store. With
``$STATEKEEPER_KEYS`` set, every store is opened with ``encryption="env"``
(:meth:`.output.Output.open`). Exit statuses: 0 ok,
1 a problem found in the data or the store, 2 a usage error. See ``docs/cli.md``.

Importing this module imports typer, and no more of statekeeper than ``--help``
needs: rich, pydantic and the backends are imported when a command runs (the
backend for the URL's scheme only). ``import statekeeper`` never imports typer.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import importing, maintenance, rekeying, retention
from .base import DebugOpt, JsonOpt, Mode, StreamArg, UrlOpt, app, run_command
from .hints import command
from .output import (
    EXIT_PROBLEM,
    Output,
    compact_table,
    header_json,
    kv_table,
    plain,
    printable,
    problems_table,
    skipped_json,
    state_json,
    when,
)

if TYPE_CHECKING:
    from .._core.store import BaseCheckpointStore
    from ..models import Checkpoint, Page

__all__ = ["app", "run"]

COUNT_LIMIT = 10_000
#: Columns from which ``ls`` across streams prints a timestamp on one line.
_WIDE = 120


# -- demo ------------------------------------------------------------------------------


def demo(
    ctx: typer.Context,
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
    steps: Annotated[int, typer.Option(min=2, max=100, help="Steps in the job.")] = 10,
    kill_after: Annotated[
        int | None,
        typer.Option(
            help="Kill the job once this step is saved. Default: half way.", show_default=False
        ),
    ] = None,
) -> None:
    """Run a job, SIGKILL it half way, resume it from get_latest.

    The job saves a checkpoint after each step and runs in a real child process.
    Each run uses a new stream named demo-<time>-<random>, so the demo can run again
    and old runs stay for inspection.
    """
    from .demo_render import render_demo

    kill = steps // 2 if kill_after is None else kill_after
    if not 1 <= kill < steps:
        raise typer.BadParameter(
            f"must be from 1 to {steps - 1} (less than --steps)", param_hint="--kill-after"
        )

    async def body(out: Output, store: BaseCheckpointStore) -> int:
        return await render_demo(out, store, steps, kill)

    run_command(ctx, url, json_, debug, Mode.CREATE, body)


# -- info, streams ----------------------------------------------------------------------


def info(
    ctx: typer.Context, url: UrlOpt = None, json_: JsonOpt = False, debug: DebugOpt = False
) -> None:
    """Show the backend, format, store id, counts and high-water mark."""

    async def body(out: Output, store: BaseCheckpointStore) -> None:
        si = await store.info()
        caps = {name: getattr(si.capabilities, name) for name in vars(si.capabilities)}
        encryption = _encryption_json(store)
        if out.json:
            out.emit(
                {
                    "url": out.scrub(si.url),
                    "backend": si.backend,
                    "store_id": si.store_id,
                    "format_version": si.format_version,
                    "checkpoints": si.checkpoints,
                    "streams": si.streams,
                    "high_water_mark": si.high_water_mark,
                    "capabilities": caps,
                    "encryption": encryption,
                    "extra": si.extra,
                }
            )
            return
        rows: list[tuple[str, Any]] = [
            ("backend", si.backend),
            ("url", out.scrub(si.url)),
            ("store id", si.store_id),
            ("format version", si.format_version),
            ("checkpoints", si.checkpoints),
            ("streams", si.streams),
            ("high-water mark", si.high_water_mark),
            ("capabilities", ", ".join(k for k, v in caps.items() if v) or "none"),
            ("encryption", _encryption_text(encryption)),
        ]
        rows += [(str(k), out.scrub(plain(v))) for k, v in si.extra.items()]
        out.say(kv_table("store", rows))

    run_command(ctx, url, json_, debug, Mode.READ, body)


def _encryption_json(store: BaseCheckpointStore) -> dict[str, Any]:
    """Whether ``store`` was opened with encryption, its active key id and whether
    it seals metadata: ids only, never a key."""
    encryption = getattr(store, "_encryption", None)
    if encryption is None:
        return {"enabled": False, "active_key": None, "encrypt_metadata": False}
    return {
        "enabled": True,
        "active_key": encryption.keyring.active,
        "encrypt_metadata": bool(encryption.metadata),
    }


def _encryption_text(encryption: dict[str, Any]) -> str:
    if not encryption["enabled"]:
        return "off (opened without keys)"
    sealed = ", tags and metadata too" if encryption["encrypt_metadata"] else ""
    return f"on, active key {encryption['active_key']!r}{sealed}"


def streams(
    ctx: typer.Context,
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Streams per page.")] = 50,
    after_name: Annotated[
        str | None, typer.Option(help="Start after this stream name (the next page).")
    ] = None,
    count_limit: Annotated[
        int, typer.Option(min=1, help="Stop counting a stream's checkpoints here.")
    ] = COUNT_LIMIT,
) -> None:
    """List streams with their counts and latest checkpoint.

    Exit 1 if a stream on the page has unreadable checkpoints, as ls does.
    """
    from .ops import summarise_stream

    async def body(out: Output, store: BaseCheckpointStore) -> int:
        from rich.text import Text

        names = await store.list_streams()
        if after_name is not None:
            names = [n for n in names if n > after_name]
        page, more = names[:limit], len(names) > limit
        rows = [await summarise_stream(store, name, count_limit) for name in page]
        next_name = page[-1] if more else None
        code = EXIT_PROBLEM if any(r.unreadable for r in rows) else 0
        if out.json:
            out.emit({"streams": [r.as_json() for r in rows], "next_after_name": next_name})
            return code
        # Names never wrap, so that they can be copied: the table is as wide as the
        # longest name needs, and a name with control characters is escaped.
        table = compact_table("stream", "count", "unreadable", "latest created_at (UTC)")
        for r in rows:
            shown = f"{r.checkpoints}" if r.exact else f"{r.checkpoints}+"
            latest = r.latest_created_at or ("unreadable" if not r.latest_readable else "-")
            table.add_row(
                Text(printable(r.name)),
                shown,
                str(r.unreadable),
                Text(latest.replace("T", " ").removesuffix("+00:00")),
            )
        out.say_whole(table)
        if next_name is not None:
            more_args = ["--limit", str(limit)]
            if count_limit != COUNT_LIMIT:
                more_args += ["--count-limit", str(count_limit)]
            hint = command("streams", *more_args, *out.url_args(), f"--after-name={next_name}")
            out.line(f"next page: {hint}")
        return code

    run_command(ctx, url, json_, debug, Mode.READ, body)


# -- ls, show, latest --------------------------------------------------------------------


class Order(StrEnum):
    asc = "asc"
    desc = "desc"


def _parse_tags(values: list[str] | None) -> dict[str, str]:
    tags: dict[str, str] = {}
    for value in values or []:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {value!r}", param_hint="--tag")
        tags[key] = val
    return tags


def ls(
    ctx: typer.Context,
    stream: Annotated[
        str | None,
        typer.Argument(metavar="STREAM", help="Stream to list (default: all streams)."),
    ] = None,
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Checkpoints per page.")] = 20,
    order: Annotated[Order, typer.Option(help="By sequence.")] = Order.desc,
    after: Annotated[str | None, typer.Option(help="Page after this cursor (next_cursor).")] = None,
    before: Annotated[
        str | None, typer.Option(help="Page before this cursor (prev_cursor).")
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE", help="Only checkpoints with tag KEY=VALUE (repeat for more)."
        ),
    ] = None,
    with_state: Annotated[bool, typer.Option(help="Include each state in --json output.")] = False,
) -> None:
    """List checkpoints a page at a time, newest first by default.

    Unreadable checkpoints are left out and shown in their own table (exit 1).
    """
    tags = _parse_tags(tag)

    async def body(out: Output, store: BaseCheckpointStore) -> int:
        page = await store.list(
            stream, limit=limit, order=order.value, after=after, before=before, tags=tags
        )
        if out.json:
            items = []
            for cp in page.items:
                item = header_json(cp)
                if with_state:
                    item["state"] = state_json(store, cp.state)
                items.append(item)
            out.emit(
                {
                    "stream": stream,
                    "order": order.value,
                    "limit": limit,
                    "items": items,
                    "skipped": [skipped_json(s) for s in page.skipped],
                    "next_cursor": page.next_cursor,
                    "prev_cursor": page.prev_cursor,
                    "has_more": page.has_more,
                }
            )
        else:
            _render_page(out, stream, page, order.value, limit, tags)
        return EXIT_PROBLEM if page.skipped else 0

    run_command(ctx, url, json_, debug, Mode.READ, body)


def _render_page(
    out: Output, stream: str | None, page: Page, order: str, limit: int, tags: dict[str, str]
) -> None:
    from rich.text import Text

    title = f"stream {stream!r}" if stream else "all streams"
    # Ids never wrap, so that they can be copied. Across streams a row also needs
    # the stream's name; on a narrow terminal it goes under the id, and the
    # timestamp takes two lines (date, time), so that nothing is folded mid-word.
    stacked = stream is None and out.stdout.width < _WIDE
    if stacked:
        table = compact_table("seq", "id / stream", "created_at (UTC)", "tags", wrap=("tags",))
        # The stream is cut to the width of the ids here, so that the column is
        # exactly as wide as its widest id and the table never has to squeeze it.
        widest = max((len(cp.id) for cp in page.items), default=16)
        table.title = title
    else:
        columns = ("seq", "id", *(() if stream else ("stream",)), "created_at (UTC)", "tags")
        table = compact_table(*columns, title=title, wrap=("stream", "tags"))
    for cp in page.items:
        tag_text = Text(", ".join(f"{k}={v}" for k, v in cp.tags.items()))
        created = when(cp.created_at)
        if stacked:
            name = cp.stream
            cut = "\n".join(name[i : i + widest] for i in range(0, len(name), widest))
            which = Text(cp.id, style="bold") + Text("\n" + cut)
            table.add_row(str(cp.sequence), which, created.replace(" ", "\n"), tag_text)
        else:
            stream_col = () if stream else (Text(cp.stream),)
            table.add_row(str(cp.sequence), Text(cp.id), *stream_col, created, tag_text)
    out.say(table)
    if not page.items:
        out.line("no checkpoints")
    if page.skipped:
        skipped = [skipped_json(e) for e in page.skipped]
        problems_table(out, "unreadable checkpoints (left out of the listing)", skipped)
        out.keys_hint([s["reason"] for s in skipped])
    args = ["--order", order, "--limit", str(limit)]
    args += [f"--tag={k}={v}" for k, v in tags.items()]
    args += out.url_args()
    # A stream that starts with "-" goes after "--", or it would be read as an option.
    dashed = stream is not None and stream.startswith("-")
    lead = [stream] if stream is not None and not dashed else []
    tail = ["--", stream] if stream is not None and dashed else []
    if page.next_cursor:
        hint = command("ls", *lead, *args, "--after", page.next_cursor, *tail)
        out.line(f"next page:     {hint}")
    if page.prev_cursor:
        hint = command("ls", *lead, *args, "--before", page.prev_cursor, *tail)
        out.line(f"previous page: {hint}")


def _show_checkpoint(out: Output, store: BaseCheckpointStore, cp: Checkpoint, **extra: Any) -> None:
    state = state_json(store, cp.state)
    if out.json:
        out.emit({**extra, "checkpoint": {**header_json(cp), "state": state}})
        return
    from rich.json import JSON
    from rich.text import Text

    h = header_json(cp)
    fields = [
        "id",
        "stream",
        "sequence",
        "created_at",
        "updated_at",
        "etag",
        "parent_id",
        "expires_at",
    ]
    rows: list[tuple[str, Any]] = [(k, h[k]) for k in fields]
    rows += [("tags", ", ".join(f"{k}={v}" for k, v in cp.tags.items()) or None)]
    rows += [("metadata", JSON.from_data(cp.metadata).text.plain if cp.metadata else None)]
    out.say(kv_table(f"checkpoint {cp.id}", rows))
    out.say(Text("state", style="bold"))
    out.say(JSON.from_data(state))


def show(
    ctx: typer.Context,
    checkpoint_id: Annotated[str, typer.Argument(metavar="ID", help="Checkpoint id.")],
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show one checkpoint, strictly: its header and its state."""

    async def body(out: Output, store: BaseCheckpointStore) -> None:
        _show_checkpoint(out, store, await store.load(checkpoint_id))

    run_command(ctx, url, json_, debug, Mode.READ, body)


def latest(
    ctx: typer.Context,
    stream: StreamArg,
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show the newest checkpoint of a stream, strictly.

    Exit 1 if it cannot be decoded: it never falls back to an older checkpoint.
    Exit 1 as well if the stream has no checkpoints.
    """

    async def body(out: Output, store: BaseCheckpointStore) -> int:
        from rich.text import Text

        cp = await store.get_latest(stream)
        if cp is None:
            if out.json:
                out.emit({"stream": stream, "checkpoint": None})
            out.stderr.print(Text(f"stream {stream!r} has no live checkpoints", style="red"))
            return EXIT_PROBLEM
        _show_checkpoint(out, store, cp, stream=stream)
        return 0

    run_command(ctx, url, json_, debug, Mode.READ, body)


_COMMANDS = (
    demo,
    info,
    streams,
    ls,
    show,
    latest,
    maintenance.verify,
    maintenance.repair,
    maintenance.copy,
    importing.import_,
    rekeying.rekey,
    maintenance.prune,
    maintenance.purge,
    retention.sweep,
    retention.compact,
)


def _register() -> None:
    if not app.registered_commands:
        for function in _COMMANDS:
            # "import" is a Python keyword, so its function is import_
            app.command(name=function.__name__.rstrip("_").replace("_", "-"))(function)


_register()


def run() -> None:
    """Entry point used by :func:`statekeeper.cli.entry.main`."""
    app(prog_name="statekeeper")
