"""The options of a PostgreSQL store."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..options import SqlOptions

__all__ = ["PostgresOptions"]


class PostgresOptions(SqlOptions):
    """Options of a PostgreSQL store: those of every SQL dialect, ``listing_wait`` and
    ``pooler``."""

    dialect: ClassVar[str] = "PostgreSQL"

    #: Seconds a listing of every stream (``list(None, ...)``) waits, at most, for
    #: this store's saves still in flight below a committed save it would show (the
    #: listing horizon, ``docs/sql-backend.md``); if they are still in flight then,
    #: it raises :class:`~statekeeper.errors.StoreTimeout` (retryable) rather than
    #: return a page that would look complete without them (``0``: raise at once).
    #: Transactions of other applications never make it wait. Listings of one
    #: stream, ``get_latest`` and ``load`` never wait.
    listing_wait: float = Field(default=0.1, ge=0, le=60)
    #: ``"transaction"`` when the URL names a connection pooler that hands server
    #: connections to its clients per transaction (PgBouncer ``pool_mode =
    #: transaction``, pgcat, Supavisor, RDS Proxy): every statement then runs in a
    #: transaction, none is prepared under a name, and the session settings and the
    #: migration lock are the transaction's (``docs/sql-backend.md``, Poolers).
    #: ``"none"`` (the default) is a direct connection; an open that finds its
    #: session settings dropped on the way refuses, naming this option.
    pooler: Literal["none", "transaction"] = "none"
