"""Writes whose reply a lost connection hid: what the store does to find out.

A server store's write is sent, and then the connection may break before the reply
comes back (a restart, an idle kill, a network fault): the write may or may not
have been applied. Nothing here re-sends a write. Instead:

- a save (or a batch) already has its ids and etags before it is sent, so the store
  looks them up on a fresh connection: found with the etags it sent, the save was
  applied and its headers are returned; none of them found and the server ended
  the connection itself (``57P01``/``57P02``: the statement was aborted with it),
  nothing was saved and a retryable :class:`~statekeeper.errors.BackendError` says
  so; otherwise (not found yet, the lookup failed, the batch half there)
  :class:`~statekeeper.errors.OutcomeUnknown` names the id;
- an update is looked up the same way: the record with the new etag means it was
  applied;
- a delete cannot be told apart from another's delete: ``OutcomeUnknown``.

``OutcomeUnknown`` is retryable: a save retried with the same id raises
``PreconditionFailed`` if the first was applied, an update retried with
``if_match`` the etag read before it does too, and a delete returns ``False``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

from ...errors import BackendError, OutcomeUnknown, StatekeeperError
from ...models import CheckpointHeader
from ...record import NewRecord, StoredRecord
from .faults import connection_fault

__all__ = ["deleting", "lost_reply", "saving", "updating"]

T = TypeVar("T")
Lookup = Callable[[list[str]], Awaitable[dict[str, StoredRecord]]]
# the server ended the connection itself: a statement in flight was aborted
_ABORTED = {"57P01", "57P02"}


def lost_reply(exc: BaseException) -> bool:
    """Whether ``exc`` (a translated error) is a connection lost with a write in flight."""
    return isinstance(exc, BackendError) and connection_fault(exc) == "lost"


def _aborted(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) in _ABORTED or getattr(orig, "pgcode", None) in _ABORTED


def _unknown(what: str, id: str, exc: BaseException, why: str) -> OutcomeUnknown:
    return OutcomeUnknown(
        f"{what} {id!r}: the connection was lost before the reply ({exc}); {why}. "
        f"Retry with the same id: a save raises PreconditionFailed, an update with "
        "if_match raises PreconditionFailed and a delete returns False if the first "
        "was applied",
        id=id,
        orig=getattr(exc, "orig", None),
    )


async def resolve_save(
    ids: Sequence[str], etags: Sequence[str], exc: BaseException, lookup: Lookup
) -> list[StoredRecord]:
    """The records of a save whose reply was lost, as stored, if it was applied;
    raises otherwise (see the module docstring). ``exc`` is the translated error of
    the save."""
    what = "saving checkpoint" if len(ids) == 1 else "saving the batch with checkpoint"
    try:
        found = await lookup(list(ids))
    except StatekeeperError as again:
        raise _unknown(what, ids[0], exc, f"looking it up failed too ({again})") from exc
    ours = [
        rec
        for i, e in zip(ids, etags, strict=True)
        if (rec := found.get(i)) and rec.header.etag == e
    ]
    if len(ours) == len(ids):
        return ours
    if not ours and not any(i in found for i in ids) and _aborted(exc):
        raise BackendError(
            f"{what} {ids[0]!r}: the server ended the connection ({exc}) and nothing was "
            "saved; retry once the server is back",
            orig=getattr(exc, "orig", None),
            retryable=True,
        ) from exc
    raise _unknown(what, ids[0], exc, "it is not found yet, but may still be applied") from exc


async def resolve_update(
    id: str, etag: str, exc: BaseException, lookup: Lookup
) -> CheckpointHeader:
    """The header of an update whose reply was lost, if the record has its new
    ``etag``; :class:`OutcomeUnknown` otherwise."""
    try:
        found = (await lookup([id])).get(id)
    except StatekeeperError as again:
        raise _unknown(
            "updating checkpoint", id, exc, f"looking it up failed too ({again})"
        ) from exc
    if found is not None and found.header.etag == etag:
        return found.header
    raise _unknown("updating checkpoint", id, exc, "it does not show the update yet") from exc


def resolve_delete(id: str, exc: BaseException) -> OutcomeUnknown:
    """A delete whose reply was lost: whether it or another's removed ``id`` cannot
    be told."""
    return _unknown("deleting checkpoint", id, exc, "whether it was applied cannot be told")


async def saving(
    call: Awaitable[list[StoredRecord]],
    records: Sequence[NewRecord],
    get_many: Callable[[list[str], datetime], Awaitable[dict[str, StoredRecord]]],
) -> list[StoredRecord]:
    """Await the translated ``call`` that saves ``records`` and gives them back as
    stored; if its reply was lost, look them up with ``get_many`` (:func:`resolve_save`)."""
    try:
        return await call
    except BackendError as exc:
        if not lost_reply(exc):
            raise
        ids, etags = [r.id for r in records], [r.etag for r in records]
        now = records[0].now
        return await resolve_save(ids, etags, exc, lambda ids: get_many(ids, now))


async def updating(
    call: Awaitable[CheckpointHeader], id: str, etag: str, lookup: Lookup
) -> CheckpointHeader:
    """Await an update's translated ``call``; if its reply was lost, :func:`resolve_update`."""
    try:
        return await call
    except BackendError as exc:
        if not lost_reply(exc):
            raise
        return await resolve_update(id, etag, exc, lookup)


async def deleting(call: Awaitable[T], id: str) -> T:
    """Await a delete's translated ``call``; if its reply was lost, :func:`resolve_delete`."""
    try:
        return await call
    except BackendError as exc:
        if lost_reply(exc):
            raise resolve_delete(id, exc) from exc
        raise
