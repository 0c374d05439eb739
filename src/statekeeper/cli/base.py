"""What every command shares: the typer app, the common options, how a command
opens its store (read-only, writable, or allowed to create it) and runs it, and
how a usage error becomes one JSON document under ``--json``.

Importing this module imports typer; rich and the store machinery are imported when
a command runs. ``import statekeeper`` never imports either.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from ..errors import StoreFormatError, StoreNotFound
from .hints import command as hint_command
from .hints import found_instead
from .output import EXIT_PROBLEM, KEYS_ENV, CliError, Output

try:  # typer >= 0.20 carries its own copy of click
    from typer._click.exceptions import BadParameter, ClickException
except ImportError:  # pragma: no cover - older typer, on click itself
    from click.exceptions import BadParameter, ClickException  # type: ignore[assignment, no-redef, import-not-found, unused-ignore]

if TYPE_CHECKING:
    from rich.progress import Progress

    from .._core.store import BaseCheckpointStore

__all__ = [
    "DebugOpt",
    "Globals",
    "JsonOpt",
    "Mode",
    "StreamArg",
    "UrlOpt",
    "app",
    "no_store",
    "opened",
    "plaintext_refused",
    "progress_bar",
    "run_async",
    "run_command",
    "setup",
]


class Mode(Enum):
    """How a command opens its store."""

    #: ``read_only=True``: writes nothing, creates nothing (StoreNotFound if absent).
    READ = "read"
    #: ``create=False``: may change the store, never creates one.
    WRITE = "write"
    #: the backend's default: creates the store if it is not there.
    CREATE = "create"

    def options(self) -> dict[str, Any]:
        if self is Mode.READ:
            return {"read_only": True}
        if self is Mode.WRITE:
            return {"create": False}
        return {}


def _wants_json(args: list[str]) -> bool:
    return "--json" in args[: args.index("--")] if "--" in args else "--json" in args


def _tidy(exc: ClickException) -> None:
    # typer coerces values through pydantic, whose message for a ValueError raised
    # by a validator starts with "Value error, "; the user never wrote a validator.
    if isinstance(exc, BadParameter) and exc.message.startswith("Value error, "):
        exc.message = exc.message.removeprefix("Value error, ")


class _Group(TyperGroup):
    """The root command: with ``--json``, a usage error (bad option value, unknown
    option, missing argument) prints ``{"error": ...}`` on stdout too, so that a
    script always gets one JSON document. typer still explains it on stderr."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Any = None,
        **extra: Any,
    ) -> Any:
        as_json = _wants_json(args)  # before parsing, which consumes ``args``
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except ClickException as exc:
            _usage_error(exc, as_json)
            raise
        ctx.meta["statekeeper.json"] = as_json
        return ctx

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ClickException as exc:
            _usage_error(exc, bool(ctx.meta.get("statekeeper.json")))
            raise


def _usage_error(exc: ClickException, as_json: bool) -> None:
    _tidy(exc)
    if as_json:
        Output(json=True).emit(
            {
                "error": {
                    "type": type(exc).__name__,
                    "message": " ".join(exc.format_message().split()),
                    "exit_code": exc.exit_code,
                }
            }
        )


app = typer.Typer(
    name="statekeeper",
    cls=_Group,
    help="Inspect, verify, repair and copy statekeeper checkpoint stores, and run the demo.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

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
#: typer's usage line shows it as {STREAM} (required) or [STREAM] (optional).
StreamArg = Annotated[str, typer.Argument(metavar="STREAM", help="Stream name.")]


@dataclass(frozen=True)
class Globals:
    url: str | None = None
    json: bool = False
    debug: bool = False


@app.callback()
def _main(
    ctx: typer.Context, url: UrlOpt = None, json_: JsonOpt = False, debug: DebugOpt = False
) -> None:
    """statekeeper: durable checkpoints. Exit status 0 ok, 1 problem found, 2 usage error."""
    ctx.obj = Globals(url, json_, debug)


def setup(ctx: typer.Context, json_: bool, debug: bool) -> tuple[Output, Globals]:
    root = ctx.find_root().obj
    g = root if isinstance(root, Globals) else Globals()
    return Output(json=json_ or g.json, debug=debug or g.debug), g


def run_command(
    ctx: typer.Context,
    url: str | None,
    json_: bool,
    debug: bool,
    mode: Mode,
    body: Callable[[Output, BaseCheckpointStore], Awaitable[int | None]],
) -> None:
    """Open the store for one command as ``mode`` says, run ``body`` in one event
    loop, and exit with its status."""
    out, g = setup(ctx, json_, debug)
    code: int | None = None
    with out.guard():
        store = out.open(out.resolve_url(url or g.url), **mode.options())

        async def main() -> int | None:
            async with opened(out, store, ctx.info_name or "", mode):
                out.store_url = out.scrub(store.describe())
                return await body(out, store)

        code = run_async(main())
    if code:
        raise typer.Exit(code)


def run_async(main: Coroutine[Any, Any, int | None]) -> int | None:
    """Run a command's coroutine in a new event loop and return its exit status
    (asyncio is imported here, not for ``--help``)."""
    import asyncio

    return asyncio.run(main)


@asynccontextmanager
async def opened(
    out: Output, store: BaseCheckpointStore, command: str, mode: Mode, role: str = "store"
) -> AsyncIterator[BaseCheckpointStore]:
    """``async with store``, with a missing store explained in the command line's
    words (``--url``, ``$STATEKEEPER_URL``, ``statekeeper demo``), not the API's."""
    try:
        await store.open()
    except StoreNotFound as exc:
        raise no_store(out, store, command, mode, role) from exc
    except StoreFormatError as exc:
        raise plaintext_refused(out, store, exc, role) or exc from exc
    async with store:
        yield store


def plaintext_refused(
    out: Output,
    store: BaseCheckpointStore,
    exc: StoreFormatError,
    role: str = "store",
    url: str | None = None,
) -> CliError | None:
    """The error for a plaintext store opened with the keys of ``$STATEKEEPER_KEYS``
    (``None`` for any other format error): encrypt it with ``rekey``, or read it
    without the keys."""
    if getattr(store, "_encryption", None) is None or "plaintext records" not in str(exc):
        return None
    where = out.scrub(store.describe())
    message = f"the store at {where}"
    message += f" ({role})" if role != "store" else ""
    message += (
        f" holds plaintext records, and with ${KEYS_ENV} set every command opens stores "
        "with encryption, which never reads plaintext. "
    )
    url_args = ["--url", out.safe_url(url)] if url is not None else out.url_args()
    if role == "SRC":
        message += "Copy it as it is with --plaintext-src (DST is still encrypted)"
    elif role == "DST":
        message += "Copy into it as plaintext with --plaintext-dst, or encrypt it first with: "
        message += hint_command("rekey", *url_args)
    else:
        message += f"Encrypt it with: {hint_command('rekey', *url_args)}"
    message += f"; or unset {KEYS_ENV} to read it as plaintext"
    return CliError(message, EXIT_PROBLEM, kind="StoreFormatError")


def no_store(
    out: Output, store: BaseCheckpointStore, command: str, mode: Mode, role: str = "store"
) -> CliError:
    """The error for a command whose ``role`` store (``store``, or ``SRC`` of
    ``copy``) does not exist. Nothing was created; the message says how to name an
    existing store, or how to make one."""
    where = out.scrub(store.describe())
    doing = "only reads" if mode is Mode.READ else "never creates a store"
    instead = found_instead(store.backend_name, getattr(store, "path", None))
    if instead is not None:
        what, bring_in = instead
        message = f"there is no statekeeper store at {where}: {what}"
        if role != "store":
            message += f" ({role})"
        if bring_in is not None:
            message += f"; bring it into a store with: {hint_command(*bring_in)}"
        return CliError(message, EXIT_PROBLEM, kind="StoreNotFound")
    if role != "store":
        message = f"there is no store at {where} ({role}); 'statekeeper {command}' only reads "
        message += f"{role}, so nothing was created. Check {role}"
    elif out.url_source == "default":
        message = (
            f"there is no store at {where}, the default when neither --url nor "
            f"$STATEKEEPER_URL is set; 'statekeeper {command}' {doing}, so nothing was "
            "created. Name a store with --url URL or $STATEKEEPER_URL, or make one here "
            f"with: {hint_command('demo')}"
        )
    else:
        origin = "--url" if out.url_source == "option" else "$STATEKEEPER_URL"
        message = (
            f"there is no store at {where} (from {origin}); 'statekeeper {command}' {doing}, "
            "so nothing was created. Check the URL (--url URL or $STATEKEEPER_URL), or make "
            f"a store there with: {hint_command('demo', *out.url_args())}"
        )
    return CliError(message, EXIT_PROBLEM, kind="StoreNotFound")


def progress_bar(
    out: Output, label: str, total: int | None
) -> tuple[Progress, Callable[[int], None]]:
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
