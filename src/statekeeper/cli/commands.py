"""The ``statekeeper`` command line (typer and rich, from the ``cli`` extra).

Every command works on any store URL the registry can open, plugins included:
``--url``, else ``$STATEKEEPER_URL``, else ``sqlite:///./statekeeper.db``. The
common options ``--url``, ``--json`` and ``--debug`` may be given before the
command or after it. Exit statuses: 0 ok, 1 a problem found in the data or the
store, 2 a usage error. See ``docs/cli.md``.

Importing this module imports typer and rich; ``import statekeeper`` never does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from .._protocol import BaseCheckpointStore
from ..models import Checkpoint, Page
from .output import (
    EXIT_PROBLEM,
    Output,
    compact_table,
    count,
    header_json,
    kv_table,
    plain,
    problems_table,
    skipped_json,
    state_json,
    when,
)

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = ["app", "run"]

app = typer.Typer(
    name="statekeeper",
    help="Inspect, verify and copy statekeeper checkpoint stores, and run the demo.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


# -- common options -------------------------------------------------------------------

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        "-u",
        help="Store URL. Default: $STATEKEEPER_URL, then sqlite:///./statekeeper.db.",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document with stable keys.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")]


@dataclass(frozen=True)
class _Globals:
    url: str | None = None
    json: bool = False
    debug: bool = False


@app.callback()
def _main(
    ctx: typer.Context, url: UrlOpt = None, json_: JsonOpt = False, debug: DebugOpt = False
) -> None:
    """statekeeper: durable checkpoints. Exit status 0 ok, 1 problem found, 2 usage error."""
    ctx.obj = _Globals(url, json_, debug)


def _setup(ctx: typer.Context, json_: bool, debug: bool) -> tuple[Output, _Globals]:
    root = ctx.find_root().obj
    g = root if isinstance(root, _Globals) else _Globals()
    return Output(json=json_ or g.json, debug=debug or g.debug), g


def _run(
    ctx: typer.Context,
    url: str | None,
    json_: bool,
    debug: bool,
    body: Callable[[Output, BaseCheckpointStore], Awaitable[int | None]],
) -> None:
    """Open the store for one command, run ``body`` in one event loop, exit with its status."""
    out, g = _setup(ctx, json_, debug)
    code: int | None = None
    with out.guard():
        store = out.open(out.resolve_url(url or g.url))

        async def main() -> int | None:
            async with store:
                out.store_url = out.scrub(store.describe())
                return await body(out, store)

        code = asyncio.run(main())
    if code:
        raise typer.Exit(code)


def _progress(out: Output, label: str, total: int | None) -> tuple[Progress, Callable[[int], None]]:
    """A progress bar on stderr (none with ``--json``) and its advance function."""
    # Imported here: rich.progress is a fifth of the command line's start-up time.
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=out.stderr,
        disable=out.json,
        transient=False,
    )
    task = progress.add_task(label, total=total)
    return progress, lambda n: progress.advance(task, n)


# -- demo ------------------------------------------------------------------------------


@app.command()
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

    _run(ctx, url, json_, debug, body)


# -- info, streams ----------------------------------------------------------------------


@app.command()
def info(
    ctx: typer.Context, url: UrlOpt = None, json_: JsonOpt = False, debug: DebugOpt = False
) -> None:
    """Show the backend, format, store id, counts and high-water mark."""

    async def body(out: Output, store: BaseCheckpointStore) -> None:
        si = await store.info()
        caps = {name: getattr(si.capabilities, name) for name in vars(si.capabilities)}
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
        ]
        rows += [(str(k), out.scrub(plain(v))) for k, v in si.extra.items()]
        out.say(kv_table("store", rows))

    _run(ctx, url, json_, debug, body)


@app.command()
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
    ] = 10_000,
) -> None:
    """List streams with their counts and latest checkpoint."""
    from .ops import summarise_stream

    async def body(out: Output, store: BaseCheckpointStore) -> None:
        names = await store.list_streams()
        if after_name is not None:
            names = [n for n in names if n > after_name]
        page, more = names[:limit], len(names) > limit
        rows = [await summarise_stream(store, name, count_limit) for name in page]
        next_name = page[-1] if more else None
        if out.json:
            out.emit({"streams": [r.as_json() for r in rows], "next_after_name": next_name})
            return
        table = compact_table(
            "stream", "count", "unreadable", "latest created_at (UTC)", wrap=("stream",)
        )
        for r in rows:
            shown = f"{r.checkpoints}" if r.exact else f"{r.checkpoints}+"
            latest = r.latest_created_at or ("unreadable" if not r.latest_readable else "-")
            table.add_row(
                Text(r.name),
                shown,
                str(r.unreadable),
                Text(latest.replace("T", " ").removesuffix("+00:00")),
            )
        out.say(table)
        if next_name is not None:
            out.line(f"next page: statekeeper streams --after-name {next_name!r}")

    _run(ctx, url, json_, debug, body)


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


@app.command("ls")
def ls(
    ctx: typer.Context,
    stream: Annotated[
        str | None,
        typer.Argument(help="Stream to list (default: all streams)."),
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
        typer.Option(help="Only checkpoints with tag KEY=VALUE (repeat for more)."),
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

    _run(ctx, url, json_, debug, body)


def _render_page(
    out: Output, stream: str | None, page: Page, order: str, limit: int, tags: dict[str, str]
) -> None:
    columns = ("seq", "id", *(() if stream else ("stream",)), "created_at (UTC)", "tags")
    title = f"stream {stream!r}" if stream else "all streams"
    # created_at may wrap (date / time) so that the stream column keeps some room
    table = compact_table(
        *columns, title=title, wrap=("stream", "tags", *(() if stream else columns[3:4]))
    )
    for cp in page.items:
        tag_text = ", ".join(f"{k}={v}" for k, v in cp.tags.items())
        stream_col = () if stream else (Text(cp.stream),)
        table.add_row(
            str(cp.sequence),
            Text(cp.id),
            *stream_col,
            when(cp.created_at),
            Text(tag_text),
        )
    out.say(table)
    if not page.items:
        out.line("no checkpoints")
    if page.skipped:
        skipped = [skipped_json(e) for e in page.skipped]
        problems_table(out, "unreadable checkpoints (left out of the listing)", skipped)
    base = (
        "statekeeper ls" + (f" {stream!r}" if stream else "") + f" --order {order} --limit {limit}"
    )
    base += "".join(f" --tag {k}={v}" for k, v in tags.items())
    if page.next_cursor:
        out.line(f"next page:     {base} --after {page.next_cursor}")
    if page.prev_cursor:
        out.line(f"previous page: {base} --before {page.prev_cursor}")


def _show_checkpoint(out: Output, store: BaseCheckpointStore, cp: Checkpoint, **extra: Any) -> None:
    state = state_json(store, cp.state)
    if out.json:
        out.emit({**extra, "checkpoint": {**header_json(cp), "state": state}})
        return
    from rich.json import JSON

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


@app.command()
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

    _run(ctx, url, json_, debug, body)


@app.command()
def latest(
    ctx: typer.Context,
    stream: Annotated[str, typer.Argument(help="Stream name.")],
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show the newest checkpoint of a stream, strictly.

    Exit 1 if it cannot be decoded: it never falls back to an older checkpoint.
    Exit 1 as well if the stream has no checkpoints.
    """

    async def body(out: Output, store: BaseCheckpointStore) -> int:
        cp = await store.get_latest(stream)
        if cp is None:
            if out.json:
                out.emit({"stream": stream, "checkpoint": None})
            out.stderr.print(Text(f"stream {stream!r} has no live checkpoints", style="red"))
            return EXIT_PROBLEM
        _show_checkpoint(out, store, cp, stream=stream)
        return 0

    _run(ctx, url, json_, debug, body)


# -- verify, copy -------------------------------------------------------------------------


@app.command()
def verify(
    ctx: typer.Context, url: UrlOpt = None, json_: JsonOpt = False, debug: DebugOpt = False
) -> None:
    """Read every checkpoint; exit 1 if any is corrupt or undecodable.

    Three reads: a tolerant list of the whole store, a strict load of each
    checkpoint, and a strict get_latest of each stream.
    """
    from .ops import verify_store

    async def body(out: Output, store: BaseCheckpointStore) -> int:
        total = (await store.info()).checkpoints
        progress, advance = _progress(out, "verifying", total)
        with progress:
            result = await verify_store(store, advance)
        problems = [p.as_json() for p in result.problems]
        if out.json:
            out.emit(
                {
                    "checked": result.checked,
                    "streams": result.streams,
                    "ok": not problems,
                    "problems": problems,
                }
            )
        else:
            problems_table(out, "corrupt or undecodable checkpoints", problems)
            verdict = "all readable" if not problems else f"{len(problems)} unreadable"
            out.line(
                f"checked {count(result.checked, 'checkpoint')} in "
                f"{count(result.streams, 'stream')}: {verdict}",
                "green" if not problems else "bold red",
            )
        return EXIT_PROBLEM if problems else 0

    _run(ctx, url, json_, debug, body)


@app.command()
def copy(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(metavar="SRC", help="Store URL to copy from.")],
    destination: Annotated[str, typer.Argument(metavar="DST", help="Store URL to copy into.")],
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Copy every checkpoint of store SRC into store DST, in order.

    Safe to re-run.
    Ids, streams, timestamps, etags, parent links, tags, metadata and expiry are kept;
    relative order is kept. Checkpoints already in DST (same id, stream and etag) are
    skipped; a different one with the same id is reported as a conflict (exit 1).
    """
    from .ops import copy_store

    out, _ = _setup(ctx, json_, debug)
    code = 0
    with out.guard():
        src, dst = out.open(source), out.open(destination)

        async def main() -> int:
            async with src, dst:
                total = (await src.info()).checkpoints
                progress, advance = _progress(out, "copying", total)
                with progress:
                    result = await copy_store(src, dst, advance)
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
                out.line(
                    f"copied {result.copied}, already present {result.already_present}, "
                    f"not copied {len(problems)} (of {result.seen} in the source)",
                    "green" if not problems else "bold red",
                )
            return EXIT_PROBLEM if problems else 0

        code = asyncio.run(main())
    if code:
        raise typer.Exit(code)


# -- prune, purge -------------------------------------------------------------------------


@app.command()
def prune(
    ctx: typer.Context,
    stream: Annotated[str, typer.Argument(help="Stream name.")],
    keep_last: Annotated[
        int, typer.Option(min=0, help="How many of the newest to keep (0: none).")
    ],
    url: UrlOpt = None,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Delete all but the newest N checkpoints of a stream."""

    async def body(out: Output, store: BaseCheckpointStore) -> None:
        removed = await store.prune(stream, keep_last=keep_last)
        if out.json:
            out.emit({"stream": stream, "keep_last": keep_last, "removed": removed})
        else:
            out.line(f"removed {removed} checkpoints from {stream!r}, kept the newest {keep_last}")

    _run(ctx, url, json_, debug, body)


@app.command()
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

    _run(ctx, url, json_, debug, body)


def run() -> None:
    """Entry point used by :func:`statekeeper.cli.entry.main`."""
    app(prog_name="statekeeper")
