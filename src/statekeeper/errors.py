"""The exceptions statekeeper raises.

Every error derives from one root, so ``except StatekeeperError`` catches all of
them. Where a builtin is what callers already catch, the error inherits it too.

::

    StatekeeperError
    ├── CheckpointNotFound (KeyError)          no live checkpoint has that id
    ├── CheckpointDecodeError                  a stored record cannot be read or decoded
    │   ├── RecordNotEncrypted                 plaintext in a store opened with encryption
    │   └── RecordUndecryptable                unknown key, or a tag that fails (S16)
    ├── CheckpointEncodeError (ValueError)     state this store could never load
    ├── PreconditionFailed                     etag mismatch, or the id already exists
    ├── ConcurrentModificationError            writers kept disturbing a read (retryable)
    ├── InvalidQuery (ValueError)              bad stream, id, limit, order or tags
    │   └── InvalidCursor                      forged, foreign or mismatched cursor
    ├── InvalidURL (ValueError)                a store URL that cannot be parsed
    ├── InvalidOptions (ValueError)            unknown or invalid backend options
    ├── BackendNotFound (LookupError)          no backend is installed for a scheme
    ├── StoreFormatError                       not a store, or an unsupported format
    ├── StoreNotFound (LookupError)            ``create=False`` and there is no store there
    ├── ReadOnlyStore                          a write on a store opened ``read_only=True``
    ├── DurabilityUnavailable                  the backend cannot give the durability asked for
    ├── StoreClosed                            the store is not open
    └── BackendError                           the storage failed; ``.orig`` keeps the cause
        ├── StoreTimeout                       a lock or busy timeout ran out (retryable)
        └── OutcomeUnknown                     a write's reply was lost; ``.id`` (retryable)

Messages say what happened, to what, and what to do about it. Errors that wrap a
driver or OS error keep it in ``.orig`` and are raised ``from`` it.

``retryable`` says whether simply calling again may succeed. It is ``True`` for
:class:`ConcurrentModificationError`, :class:`StoreTimeout` and
:class:`OutcomeUnknown` always, and for a :class:`BackendError` whose cause is
transient: the connection was refused, reset or lost, the server is starting up or
shutting down, too many connections, a serialization failure or deadlock. It is
``False`` for everything else: retrying the same call would fail the same way.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BackendNotFound",
    "CheckpointDecodeError",
    "CheckpointEncodeError",
    "CheckpointNotFound",
    "ConcurrentModificationError",
    "DurabilityUnavailable",
    "InvalidCursor",
    "InvalidOptions",
    "InvalidQuery",
    "InvalidURL",
    "OutcomeUnknown",
    "PreconditionFailed",
    "ReadOnlyStore",
    "RecordNotEncrypted",
    "RecordUndecryptable",
    "StatekeeperError",
    "StoreClosed",
    "StoreFormatError",
    "StoreNotFound",
    "StoreTimeout",
]


class StatekeeperError(Exception):
    """Root of every error statekeeper raises."""

    #: Whether simply retrying the same call may succeed.
    retryable: bool = False


class CheckpointNotFound(StatekeeperError, KeyError):
    """No live checkpoint has the requested id (it never existed, was deleted or expired)."""

    def __init__(self, checkpoint_id: str) -> None:
        self.id = checkpoint_id
        super().__init__(f"no live checkpoint with id {checkpoint_id!r}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class CheckpointDecodeError(StatekeeperError):
    """A stored checkpoint exists but cannot be read or decoded.

    ``id`` is the checkpoint id when it is known, ``location`` says where the record
    lives (a path, a row key), and ``reason`` is a human sentence.
    """

    def __init__(
        self,
        reason: str,
        *,
        id: str | None = None,
        location: str | None = None,
        sequence: int | None = None,
    ) -> None:
        self.id = id
        self.location = location
        self.sequence = sequence
        self.reason = reason
        where = []
        if id is not None:
            where.append(f"checkpoint {id!r}")
        if location is not None:
            where.append(f"at {location}")
        prefix = " ".join(where) or "a record"
        super().__init__(f"{prefix} cannot be decoded: {reason}")


class RecordNotEncrypted(CheckpointDecodeError):
    """A record in plaintext in a store opened with encryption (S16): it is never
    read as data. ``statekeeper rekey`` encrypts a store that was plaintext."""


class RecordUndecryptable(CheckpointDecodeError):
    """An encrypted record that does not open: its key id is not in the keyring, or
    its authentication tag fails (altered, or moved from another checkpoint, stream
    or store)."""


class CheckpointEncodeError(StatekeeperError, ValueError):
    """The state (or metadata) cannot be stored, because this store could never load it.

    Nothing was written.
    """


class PreconditionFailed(StatekeeperError):
    """An ``if_match`` etag did not match, or a caller-chosen id is already live."""


class ConcurrentModificationError(StatekeeperError):
    """A concurrent writer kept disturbing a read; retrying the call may succeed."""

    retryable = True


class InvalidQuery(StatekeeperError, ValueError):
    """An argument is out of its documented domain: stream, id, limit, order, tags."""


class InvalidCursor(InvalidQuery):
    """A cursor is malformed, forged, from another store, or from a different query."""


class InvalidURL(StatekeeperError, ValueError):
    """A store URL cannot be parsed."""


class InvalidOptions(StatekeeperError, ValueError):
    """Backend options are unknown or invalid."""


class BackendNotFound(StatekeeperError, LookupError):
    """No backend is registered or installed for a URL scheme."""


class StoreFormatError(StatekeeperError):
    """The target is not a statekeeper store, or uses a format version this code can't read."""


class StoreNotFound(StatekeeperError, LookupError):
    """There is no store at the URL and ``create=False`` (or ``read_only=True``) forbade
    making one. Nothing was created: no directory, no file, no table."""


class ReadOnlyStore(StatekeeperError):
    """A write (save, update, delete, prune, purge, repair) on a store opened with
    ``read_only=True``. Nothing was written."""


class DurabilityUnavailable(StatekeeperError):
    """The backend cannot give the ``durability`` that was asked for (for example a
    server configured to lose acknowledged writes). A plugin's own error for this
    subclasses it."""


class StoreClosed(StatekeeperError):
    """The store is not open (never opened, or already closed)."""


class BackendError(StatekeeperError):
    """The storage failed (OS error, driver error). ``orig`` keeps the underlying exception.

    ``retryable`` is ``True`` when the cause is transient (the connection was refused,
    reset or lost before the call could have written anything, the server is starting
    up or shutting down, it has too many connections): calling again once the server
    is back may succeed. A write whose outcome is unknown raises
    :class:`OutcomeUnknown` instead.
    """

    def __init__(
        self, message: str, *, orig: BaseException | None = None, retryable: bool | None = None
    ) -> None:
        self.orig = orig
        if retryable is not None:
            self.retryable = retryable
        super().__init__(message)


class StoreTimeout(BackendError):
    """A lock wait, busy timeout or statement timeout ran out."""

    retryable = True


class OutcomeUnknown(BackendError):
    """The connection was lost after a write was sent and before its reply came back,
    and the store could not find out whether the write was applied.

    ``id`` names the checkpoint the write was for. Retrying is safe: a ``save`` with
    ``id=`` that id raises :class:`PreconditionFailed` if the first one was applied
    (``load(id)`` shows it); an ``update`` with ``if_match=`` the etag read before it
    raises :class:`PreconditionFailed` if the first one was applied; a ``delete``
    returns ``False`` if the first one was applied. A save whose outcome the store
    could find out (it looks its id up on a fresh connection) never raises this: it
    returns the header, or raises a retryable :class:`BackendError` saying that
    nothing was saved.
    """

    retryable = True

    def __init__(self, message: str, *, id: str, orig: BaseException | None = None) -> None:
        self.id = id
        super().__init__(message, orig=orig)
