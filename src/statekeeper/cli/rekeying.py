"""``statekeeper rekey``: every record of a store under the active key of
``$STATEKEEPER_KEYS``, in place (SPEC §4, S16).

The work is :func:`statekeeper._core.rekey.rekey_store`; this module checks that
there are keys and that the store may be written, shows a progress bar and
reports. Records under a retired key are re-encrypted, plaintext records are
encrypted; ids, sequences, etags, timestamps, expiry and order stay. Resumable: a
run killed half way and run again does only what is left, and counts what the
first run did as already current. Exit 1 when a record could not be opened (each
is listed, and stays as it was); 2 without keys or for a read-only store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import ReadOnlyStore, StatekeeperError, StoreNotFound
from .base import DebugOpt, JsonOpt, Mode, UrlOpt, no_store, progress_bar, run_async, setup
from .hints import command
from .output import (
    EXIT_INTERRUPTED,
    EXIT_PROBLEM,
    EXIT_USAGE,
    KEYS_ENV,
    Output,
    count,
    problems_table,
    skipped_json,
    url_names,
)

if TYPE_CHECKING:
    from .._core.rekey import RekeyReport
    from .._core.store import BaseCheckpointStore

__all__ = ["rekey", "rekey_json"]


def rekey(
    ctx: typer.Context,
    url: UrlOpt = None,
    encrypt_plaintext: Annotated[
        bool,
        typer.Option(
            "--encrypt-plaintext",
            help="Also encrypt plaintext records that lie below an encrypted one "
            "(by default they are reported, not encrypted: no migration leaves them).",
        ),
    ] = False,
    json_: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Encrypt every record under the active key of $STATEKEEPER_KEYS.

    Re-encrypts the records under retired keys and encrypts a plaintext store, in
    place: ids, sequences, etags, timestamps, expiry and order stay. A plaintext
    record below an encrypted one in sequence order (which no interrupted run
    leaves, so it may be planted) is reported and left as it is, unless
    --encrypt-plaintext. Needs
    STATEKEEPER_KEYS='id:base64key,...', the active key first, then every retired
    key the store still holds. A store whose newest record seals its tags and
    metadata keeps doing so (?encrypt_metadata=true|false in the URL chooses).
    Safe to re-run, and resumable after a crash. Never creates a store. Exit 1 if
    a record could not be opened (each is listed and stays as it was).
    """
    out, g = setup(ctx, json_, debug)
    code = 0
    examined = 0
    with out.guard():
        target = out.resolve_url(url or g.url)
        store = out.open(target, **Mode.WRITE.options())
        if not out.encrypted:
            out.fail(
                f"rekey needs the keys: set {KEYS_ENV}='id:base64key[,id:base64key...]', "
                "the key to encrypt under first (the active one), then every retired key "
                "the store still holds; nothing was changed",
                EXIT_USAGE,
                kind="KeysNotSet",
            )
        if store.options.read_only:
            out.fail(
                f"the store at {out.scrub(store.describe())} is opened read-only (read_only in "
                "its URL), and rekey rewrites records in place: drop read_only from the URL; "
                "nothing was changed",
                EXIT_USAGE,
                kind="ReadOnlyStore",
            )
        out.store_url = out.scrub(store.describe())

        def advance_by(n: int) -> None:
            nonlocal examined
            examined += n

        async def main() -> int:
            from .._core.rekey import rekey_store

            total, sealed_metadata = await _survey(out, target)
            rekeyed = store
            if sealed_metadata and not url_names(target, "encrypt_metadata"):
                # keep the store's setting: never move sealed tags and metadata into
                # the clear because the command line was not told about them
                rekeyed = out.open(target, encrypt_metadata=True, **Mode.WRITE.options())
            progress, advance = progress_bar(out, "rekeying", total)

            def step(n: int) -> None:
                advance_by(n)
                advance(n)

            with progress:
                try:
                    report = await rekey_store(
                        rekeyed, progress=step, encrypt_plaintext=encrypt_plaintext or None
                    )
                except ReadOnlyStore as exc:
                    out.fail(f"the store cannot be written, so nothing was rekeyed: {exc}")
            _print(out, report)
            return 0 if report.ok else EXIT_PROBLEM

        try:
            code = run_async(main()) or 0
        except KeyboardInterrupt:
            again = command("rekey", *out.url_args())
            out.fail(
                f"interrupted after {count(examined, 'record')} examined. Each record is "
                "rewritten whole, under the active key or not at all; run the same command "
                f"again to continue (what is done counts as already current): {again}",
                EXIT_INTERRUPTED,
                kind="KeyboardInterrupt",
                examined=examined,
            )
    if code:
        raise typer.Exit(code)


async def _survey(out: Output, url: str) -> tuple[int | None, bool]:
    """The store's checkpoints, for the progress bar (``None`` if that cannot be
    said), and whether its newest record seals its tags and metadata, read from the
    store opened read-only and without the keys (a plaintext store opens so too).
    A store that is not there is an error: nothing is created."""
    from .._core.query import ScanQuery
    from ..encryption.envelope import Sealer
    from ..record import StoredRecord

    try:
        counter: BaseCheckpointStore = out.open(url, keys=False, **Mode.READ.options())
    except StatekeeperError:
        return None, False  # rekey_store opens it itself and says what is wrong
    try:
        await counter.open()
    except StoreNotFound as exc:
        raise no_store(out, counter, "rekey", Mode.WRITE) from exc
    except StatekeeperError:
        return None, False  # rekey_store opens it itself and says what is wrong
    try:
        total = (await counter.info()).checkpoints
        newest = await counter._scan(ScanQuery(None, "desc", None, 1, {}, counter.now(), True))
        sealed = any(
            isinstance(r, StoredRecord) and Sealer.carries_metadata(r.state) for r in newest
        )
        return total, sealed
    except StatekeeperError:
        return None, False
    finally:
        await counter.close()


def rekey_json(report: RekeyReport) -> dict[str, Any]:
    """The ``--json`` document of ``rekey`` (after ``url``)."""
    return {
        "active_key": report.active,
        "examined": report.examined,
        "rekeyed": report.rekeyed,
        "were_plaintext": report.encrypted,
        "already_current": report.current,
        "changed_concurrently": report.changed,
        "failed": [skipped_json(s) for s in report.failed],
        "ok": report.ok,
    }


def _print(out: Output, report: RekeyReport) -> None:
    if out.json:
        out.emit(rekey_json(report))
        return
    from .._core.integrity import damaged_problem

    failed = [damaged_problem(s).model_dump(mode="json") for s in report.failed]
    problems_table(out, "not rekeyed (left as they were)", failed)
    summary = (
        f"examined {count(report.examined, 'record')}: rekeyed {report.rekeyed} under key "
        f"{report.active!r} ({report.encrypted} of them were plaintext), already current "
        f"{report.current}, changed concurrently {report.changed}, failed {len(report.failed)}"
    )
    if report.ok:
        out.line(f"{summary}; every record is under the active key", "green")
        return
    out.line(summary, "bold red")
    out.line(
        f"a record that cannot be opened stays as it was: if it is under a key that is not "
        f"in {KEYS_ENV}, add that key after the active one and run this again: "
        f"{command('rekey', *out.url_args())}"
    )
