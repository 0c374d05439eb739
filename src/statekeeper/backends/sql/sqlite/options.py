"""The SQLite store's options: :class:`SqliteOptions`, and the refusal of options
that belong to another dialect, naming the dialect that has them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from ...._url import StoreURL
from ....errors import InvalidOptions, InvalidURL
from ..options import SqlOptions

__all__ = ["SqliteOptions", "refuse_foreign_driver", "refuse_foreign_options"]


class SqliteOptions(SqlOptions):
    """Options of the SQLite store (plus those every SQL store takes).

    ``pool_size`` is the number of reader threads here (default 2; plus one
    writer), and ``busy_timeout`` SQLite's busy timeout. ``schema`` and
    ``connect_args`` (PostgreSQL's and MySQL's) and ``listing_wait``
    (PostgreSQL's) are refused with the name of the dialect that has them.
    """

    #: The dialect, as the shared options' refusal of another dialect's option names it.
    dialect: ClassVar[str] = "SQLite"

    #: Run ``get_latest``, ``load``, ``load_many`` of up to 100 ids and listed pages
    #: of up to 100 items on the event loop's thread, on a connection of their own
    #: that never waits for a lock (a read that would wait goes to a reader thread
    #: instead); ``False`` runs them on the reader threads. Saves, larger pages and
    #: batches, and every other call always run on the store's threads.
    inline_reads: bool = True
    #: Under ``durability="fast"``, run a save, update or delete of one checkpoint
    #: (a state of up to 64 KiB) on the event loop's thread, on a connection of its
    #: own, when the writer thread is idle and the write lock is free (else it goes
    #: to the writer thread, as every write does under ``durability="full"``, whose
    #: COMMIT waits for an fsync); ``False`` sends every write to the writer thread.
    inline_writes: bool = True


#: Options of the other SQL dialects, each with why SQLite has no use for it.
_FOREIGN: dict[str, str] = {
    "listing_wait": (
        "the listing_wait option is PostgreSQL's (its listing horizon); SQLite "
        "listings never wait, so drop it"
    ),
    "schema": (
        "the schema option is PostgreSQL's and MySQL's (the schema or database of the "
        "tables); it is not available on SQLite; use table_prefix"
    ),
}
_FOREIGN["db_schema"] = _FOREIGN["schema"]
_FOREIGN["connect_args"] = (
    "the connect_args option is PostgreSQL's and MySQL's (keyword arguments of the "
    "driver's connect()); SQLite connections are made by statekeeper with the store's "
    "own settings, so drop it (busy_timeout and durability set what it would)"
)


def refuse_foreign_options(names: Iterable[str]) -> None:
    """:class:`InvalidOptions` for the first of ``names`` that is another dialect's
    option (whether or not the shared options type still declares it)."""
    for name in names:
        why = _FOREIGN.get(name)
        if why is not None:
            raise InvalidOptions(why)


def refuse_foreign_driver(url: StoreURL) -> None:
    """:class:`InvalidURL` for ``sqlite+aiosqlite://``: the driver is always stdlib
    ``sqlite3``, run on the store's own threads."""
    if url.driver == "aiosqlite":
        raise InvalidURL(
            f"{url}: statekeeper runs SQLite on the stdlib sqlite3 driver, on threads "
            "of its own, never through aiosqlite; write sqlite:///... (or "
            "sqlite+pysqlite:///...)"
        )
