"""The options of a PostgreSQL store."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from ..options import SqlOptions

__all__ = ["PostgresOptions"]


class PostgresOptions(SqlOptions):
    """Options of a PostgreSQL store: those of every SQL dialect, and ``listing_wait``."""

    dialect: ClassVar[str] = "PostgreSQL"

    #: Seconds a listing of every stream (``list(None, ...)``) waits, at most, for
    #: this store's saves still in flight below a committed save it would show (the
    #: listing horizon, ``docs/sql-backend.md``); if they are still in flight then,
    #: it raises :class:`~statekeeper.errors.StoreTimeout` (retryable) rather than
    #: return a page that would look complete without them (``0``: raise at once).
    #: Transactions of other applications never make it wait. Listings of one
    #: stream, ``get_latest`` and ``load`` never wait.
    listing_wait: float = Field(default=0.1, ge=0, le=60)
