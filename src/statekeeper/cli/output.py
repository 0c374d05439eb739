"""What every ``statekeeper`` command shares: where the store URL comes from, how
results are printed (rich for people, one JSON document for scripts), and how an
error becomes one red line and an exit status.

Exit statuses: 0 ok, 1 a problem was found in the data or the store (or nothing
was found where something was asked for), 2 a usage error (bad argument, URL,
option or cursor). Credentials never reach the terminal: every message passes
through :meth:`Output.scrub`, which knows the passwords of the URLs in use.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote, quote_plus

from .._registry import ENV_URL, open_store
from .._url import StoreURL
from ..errors import (
    BackendNotFound,
    CheckpointDecodeError,
    InvalidOptions,
    InvalidQuery,
    InvalidURL,
    StatekeeperError,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from .._core.store import BaseCheckpointStore
    from ..models import CheckpointHeader, Skipped

__all__ = [
    "CHECK_NAMES",
    "DEFAULT_URL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "KEYS_ENV",
    "CliError",
    "Output",
    "compact_table",
    "count",
    "header_json",
    "key_options",
    "kv_table",
    "needs_keys",
    "plain",
    "printable",
    "problems_table",
    "skipped_json",
    "state_json",
    "url_names",
    "when",
]

DEFAULT_URL = "sqlite:///./statekeeper.db"
EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
#: Interrupted (Ctrl-C): 128 + SIGINT, as a shell reports it.
EXIT_INTERRUPTED = 130
#: Set (non-empty), every command opens its stores with ``encryption="env"``, which
#: reads the keys from it (``statekeeper.encryption.ENV_VAR``; named here so that
#: ``--help`` imports nothing of the encryption package).
KEYS_ENV = "STATEKEEPER_KEYS"
#: What a record encrypted in a store opened without keys says (``_core.codecs``).
_WITHOUT_KEYS = "opened without encryption"

#: Errors that mean the command line itself was wrong, not the store.
_USAGE_ERRORS = (InvalidURL, InvalidOptions, BackendNotFound, InvalidQuery)
_URL_PASSWORD = re.compile(r"(//[^/\s:@]*:)[^@/\s]*@")


def _console(*, stderr: bool) -> Console:
    # rich is imported when a command prints, not when --help is asked for.
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


class CliError(Exception):
    """A failure the command already explained: a message, an exit status, the
    ``type`` its ``--json`` error document names, and details for that document."""

    def __init__(
        self, message: str, code: int = EXIT_PROBLEM, kind: str = "CliError", **details: Any
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.kind = kind
        self.details = details


@dataclass
class Output:
    """Printing, URL resolution and error reporting for one command invocation."""

    json: bool = False
    debug: bool = False
    stdout: Console = field(default_factory=lambda: _console(stderr=False))
    stderr: Console = field(default_factory=lambda: _console(stderr=True))
    #: The store URL this command resolved (with its password: never print it).
    url: str | None = None
    #: Where the open store lives, safe to print; every JSON result leads with it.
    store_url: str | None = None
    #: Where :attr:`url` came from: ``"option"``, ``"env"`` or ``"default"``.
    url_source: str | None = None
    #: Whether the stores of this command were opened with encryption
    #: (``$STATEKEEPER_KEYS`` set, or an ``encryption=`` option in the URL).
    encrypted: bool = False
    _secrets: set[str] = field(default_factory=set)

    # -- URLs and stores -------------------------------------------------------------

    def resolve_url(self, url: str | None) -> str:
        """``--url``, then ``$STATEKEEPER_URL``, then the embedded SQLite default."""
        env = os.environ.get(ENV_URL)
        chosen = url or env or DEFAULT_URL
        self.url_source = "option" if url else "env" if env else "default"
        self.remember(chosen)
        self.url = chosen
        return chosen

    def url_args(self) -> list[str]:
        """``--url URL`` for a command printed for the user to run next.

        Left out for the default URL, and for a URL with a password that came
        from ``$STATEKEEPER_URL`` (the shell still has it). A password given with
        ``--url`` is printed as ``***``: never shown, so that hint needs it back.
        """
        if self.url is None or self.url_source == "default":
            return []
        try:
            secret = StoreURL.parse(self.url).password is not None
        except InvalidURL:
            secret = True
        if not secret:
            return ["--url", self.url]  # as typed: it works from where it was typed
        return [] if self.url_source == "env" else ["--url", self.safe_url(self.url)]

    def remember(self, url: str) -> None:
        """Note the password of ``url`` so that no message can print it."""
        try:
            password = StoreURL.parse(url).password
        except InvalidURL:
            return
        if password:
            self._secrets.update({password, quote(password, safe=""), quote_plus(password)})

    def safe_url(self, url: str) -> str:
        """``url`` with its password hidden, fit to print."""
        try:
            return StoreURL.parse(url).render()
        except InvalidURL:
            return self.scrub(url)

    def open(self, url: str, *, keys: bool = True, **options: Any) -> BaseCheckpointStore:
        """An unopened store for ``url`` (the scheme and options are checked now).

        ``options`` are the command's: ``read_only=True`` for commands that only
        read, ``create=False`` for those that change a store but never make one.
        The one rule for encryption (SPEC §4): with ``$STATEKEEPER_KEYS`` set and
        not empty, the store is opened with ``encryption="env"``, else without;
        an ``encryption=`` option in the URL itself wins. ``keys=False`` opens it
        without, whatever the variable says (``rekey`` counts a plaintext store so).
        """
        self.remember(url)
        if keys:
            options = {**key_options(url), **options}
        store = open_store(url, **options)
        if keys:
            named = url_names(url, "encryption") or "encryption" in options
            self.encrypted = self.encrypted or named
        return store

    def scrub(self, text: str) -> str:
        """``text`` with every known password, and anything shaped like one, hidden."""
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return _URL_PASSWORD.sub(r"\1***@", text)

    def keys_hint(self, reasons: list[str]) -> None:
        """After a list of unreadable records: if some are encrypted and this
        command had no keys, say how to give it them."""
        if not self.encrypted and any(needs_keys(r) for r in reasons):
            self.line(f"these records are encrypted: {without_keys_hint()}", "yellow")

    # -- results ---------------------------------------------------------------------

    def emit(self, doc: dict[str, Any]) -> None:
        """Print ``doc`` as the one JSON document of this command (``--json``).

        Results of a command on one store carry that store's safe ``url`` first.
        """
        if self.store_url is not None and "url" not in doc and "error" not in doc:
            doc = {"url": self.store_url, **doc}
        import json

        text = json.dumps(doc, indent=2, ensure_ascii=False, default=_json_default)
        sys.stdout.write(self.scrub(text) + "\n")
        sys.stdout.flush()

    def say(self, *parts: Any) -> None:
        """Print human output (ignored with ``--json``)."""
        if not self.json:
            self.stdout.print(*parts)

    def say_whole(self, table: Table) -> None:
        """Print ``table`` as wide as its widest cell needs, even past the terminal's
        width, so that the columns that do not wrap (names, ids) stay whole and
        copyable; the terminal folds the long lines, the text stays one line."""
        if not self.json:
            from rich.measure import Measurement

            console = self.stdout
            unbounded = console.options.update_width(1 << 16)
            needed = Measurement.get(console, unbounded, table).maximum
            width = console.width
            console.width = max(width, needed)  # print() never goes past it
            try:
                console.print(table)
            finally:
                console.width = width

    def line(self, text: str, style: str | None = None) -> None:
        """Print one line of plain text, never parsed as rich markup."""
        if not self.json:
            from rich.text import Text

            # soft_wrap: a long command line stays one line, for copy and paste
            self.stdout.print(Text(self.scrub(text), style=style or ""), soft_wrap=True)

    def warn(self, text: str) -> None:
        from rich.text import Text

        self.stderr.print(Text(self.scrub(text), style="yellow"))

    # -- errors ----------------------------------------------------------------------

    def fail(self, message: str, code: int = EXIT_PROBLEM, **details: Any) -> NoReturn:
        raise CliError(message, code, **details)

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Turn any exception into one red line and an exit status.

        With ``--debug`` the (scrubbed) traceback is printed first. ``SystemExit``
        passes through, so commands can still exit with a status of their own.
        """
        try:
            yield
        except SystemExit:
            raise
        except KeyboardInterrupt:
            self._report("interrupted", EXIT_INTERRUPTED, "KeyboardInterrupt", {})
        except CliError as exc:
            self._report(exc.message, exc.code, exc.kind, exc.details)
        except StatekeeperError as exc:
            code = EXIT_USAGE if isinstance(exc, _USAGE_ERRORS) else EXIT_PROBLEM
            details: dict[str, Any] = {}
            message = str(exc)
            if isinstance(exc, CheckpointDecodeError):
                details = {"id": exc.id, "location": exc.location, "reason": exc.reason}
                if not self.encrypted and _WITHOUT_KEYS in exc.reason:
                    # the API's advice (encryption=...) in the command line's words
                    message = message.split(f"{_WITHOUT_KEYS}:", 1)[0] + _WITHOUT_KEYS
                    message += f"; {without_keys_hint()}"
            self._report(message, code, type(exc).__name__, details)
        except Exception as exc:
            hint = "" if self.debug else " (run with --debug for the traceback)"
            message = f"unexpected {type(exc).__name__}: {exc}{hint}"
            self._report(message, EXIT_PROBLEM, type(exc).__name__, {})

    def _report(self, message: str, code: int, kind: str, details: dict[str, Any]) -> NoReturn:
        from rich.text import Text

        if self.debug:
            self.stderr.print(Text(self.scrub(traceback.format_exc()), style="dim"))
        # One line, whatever a driver put in its message.
        one_line = " ".join(self.scrub(message).split())
        if self.json:
            error = {"type": kind, "message": one_line, "exit_code": code}
            error.update({k: v for k, v in details.items() if v is not None})
            self.emit({"error": error})
        self.stderr.print(Text(f"error: {one_line}", style="bold red"), soft_wrap=True)
        raise SystemExit(code)


def keys_set() -> bool:
    """Whether ``$STATEKEEPER_KEYS`` is set and not empty."""
    return bool(os.environ.get(KEYS_ENV, "").strip())


def needs_keys(reason: str) -> bool:
    """Whether a record was unreadable because it is encrypted and the store was
    opened without keys."""
    return _WITHOUT_KEYS in reason


def key_options(url: str) -> dict[str, Any]:
    """The options that open the store at ``url`` as SPEC §4 says: ``encryption="env"``
    with ``$STATEKEEPER_KEYS`` set, unless the URL names its own ``encryption``."""
    return {"encryption": "env"} if keys_set() and not url_names(url, "encryption") else {}


def without_keys_hint() -> str:
    return (
        f"set {KEYS_ENV}='id:base64key[,id:base64key...]' (the active key first, then "
        "the retired ones) and run the command again"
    )


def url_names(url: str, option: str) -> bool:
    """Whether the query of ``url`` sets ``option``."""
    try:
        return option in StoreURL.parse(url).query
    except InvalidURL:
        return False  # open_store says what is wrong with it


# -- tables shared by several commands ---------------------------------------------------


def compact_table(*columns: str, title: str | None = None, wrap: tuple[str, ...] = ()) -> Table:
    """A compact table; only the ``wrap`` columns may wrap, so ids stay whole and copyable."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=title, title_justify="left")
    for name in columns:
        wraps = name in wrap
        table.add_column(name, no_wrap=not wraps, overflow="fold", min_width=8 if wraps else None)
    return table


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(name: str) -> str:
    """``name`` fit for one line of a table: a backslash and every character that is
    not printable (newlines, tabs, terminal escapes) escaped as in a Python string
    (``\\\\``, ``\\n``, ``\\x1b``), so that one name is one row and no name passes for
    another. ``--json`` output keeps names as they are."""
    if name.isprintable() and "\\" not in name:
        return name
    return "".join(_ESCAPES.get(c) or (c if c.isprintable() else _escape(c)) for c in name)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def plain(value: Any) -> str:
    if isinstance(value, list | tuple | set):
        return ", ".join(str(v) for v in value)
    return str(value)


def kv_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    from rich.text import Text

    table = compact_table("key", "value", title=title, wrap=("value",))
    table.show_header = False
    for key, value in rows:
        table.add_row(key, Text("-" if value is None else str(value)))
    return table


CHECK_NAMES = {
    "damaged-record": "damaged record",
    "index": "index or id table",
    "state": "store state",
    "foreign": "not a record",
    "unchecked": "not checked",
    "source": "unreadable in the source",
    "destination": "refused by the destination",
    "conflict": "id conflict",
    "plaintext": "plaintext in an encrypted store",
    "undecryptable": "cannot be decrypted",
    "retired-key": "under a retired key",
}


def problems_table(out: Output, title: str, problems: list[dict[str, Any]]) -> None:
    """One card per record: which, where, why. Paths and reasons get the full width."""
    from rich.text import Text

    if not problems:
        return
    table = compact_table("", "", title=title, wrap=("",))
    table.show_header = False
    table.title_style = "bold red"
    for p in problems:
        kind = p.get("kind") or p.get("check") or ""
        check = CHECK_NAMES.get(kind, kind)
        which = p.get("id") or ("(id unknown)" if kind in ("damaged-record", "source") else "")
        if p.get("stream") and not p.get("id"):
            which = f"stream {p['stream']!r}"
        which += f"  ({check})" if check else ""
        label = f"seq {p['sequence']}" if p.get("sequence") else "-"
        table.add_row(label, Text(which.strip(), style="bold"))
        table.add_row("where", Text(out.scrub(p["location"])))
        table.add_row("why", Text(out.scrub(p["reason"])), end_section=True)
    out.say(table)


# -- JSON shapes shared by several commands -------------------------------------------


def when(value: datetime | None) -> str:
    """A timestamp for tables: UTC, to the microsecond."""
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S.%f")


def header_json(header: CheckpointHeader) -> dict[str, Any]:
    """The header fields of a checkpoint as JSON (ISO 8601 UTC timestamps)."""
    return {
        "id": header.id,
        "stream": header.stream,
        "sequence": header.sequence,
        "created_at": header.created_at.isoformat(),
        "updated_at": header.updated_at.isoformat(),
        "etag": header.etag,
        "parent_id": header.parent_id,
        "tags": dict(header.tags),
        "metadata": dict(header.metadata),
        "expires_at": header.expires_at.isoformat() if header.expires_at else None,
    }


def skipped_json(entry: Skipped) -> dict[str, Any]:
    return {
        "id": entry.id,
        "sequence": entry.sequence,
        "location": entry.location,
        "reason": entry.reason,
        "error": entry.error,
    }


#: How many leading bytes of a raw state ``show`` and ``latest`` print in hex.
RAW_PREVIEW = 32


def state_json(store: BaseCheckpointStore, state: Any) -> Any:
    """The state in the JSON codec's form: plain JSON stays itself, other values
    appear as the codec's tagged objects (``{"$sk": "datetime", ...}``). A raw
    state (``bytes`` from a ``codec="raw"`` record) is summarised by its length and
    its first bytes in hex, never dumped whole or base64-encoded."""
    if isinstance(state, bytes):
        return raw_summary(state)
    import json

    return json.loads(store.json_codec.encode(state))


def raw_summary(state: bytes) -> dict[str, Any]:
    """``{"raw_bytes": <length>, "hex": <the first bytes>, "truncated": <bool>}``."""
    return {
        "raw_bytes": len(state),
        "hex": state[:RAW_PREVIEW].hex(),
        "truncated": len(state) > RAW_PREVIEW,
    }


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
