"""``StatekeeperCheckpointStorage``: the ``CheckpointStorage`` protocol over a store.

The package docstring (:mod:`statekeeper.integrations.agent_framework`) states the
mapping, encoding, lifecycle and concurrency; the mapping and encoding live in
:mod:`._codec`, the lazy opening in :mod:`._lifecycle`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Self

from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException

from ..._core.store import BaseCheckpointStore
from ..._registry import open_store
from ...errors import (
    CheckpointDecodeError,
    CheckpointEncodeError,
    CheckpointNotFound,
    InvalidOptions,
    PreconditionFailed,
)
from ...models import NewCheckpoint, Retention, SweepReport
from .._background import BackgroundSweep
from ._codec import CheckpointCodec, checkpoint_fields
from ._lifecycle import LazyStore
from ._retention import sweep_workflows

__all__ = ["StatekeeperCheckpointStorage"]

logger = logging.getLogger("statekeeper.integrations.agent_framework")

_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,32}")
#: Re-saving a live checkpoint id races deletes; a few rounds settle it.
_SAVE_ROUNDS = 5
_PAGE = 1000


class StatekeeperCheckpointStorage:
    """An Agent Framework ``CheckpointStorage`` over a statekeeper store.

    ``store`` is a store URL or a store built with ``codec="raw"`` (opened or not).
    A URL is opened with ``open_store(url, codec="raw")``. ``allowed_checkpoint_types``
    extends the framework's allowlist of types that may be unpickled, as in
    ``FileCheckpointStorage`` (``"module:qualname"`` strings; types registered with
    ``agent_framework.register_checkpoint_type`` count too).

    Contract:

    - ``save`` snapshots the checkpoint at call time and refuses, with
      ``WorkflowCheckpointException`` and nothing written, a checkpoint that
      ``load`` would refuse (not encodable, a type outside the allowlist, over
      the store's ``max_bytes``). Re-saving a live checkpoint id replaces its
      content and keeps its position.
    - ``load`` and ``get_latest`` are strict: an unreadable or undecodable
      checkpoint raises ``WorkflowCheckpointException``; ``get_latest`` never
      falls back to an older checkpoint. Newest means highest store sequence.
    - ``list_checkpoints`` is tolerant, like the framework's storages: a
      checkpoint that cannot be read or decoded is left out and logged. It
      returns checkpoints oldest first (save order). ``list_checkpoint_ids``
      reads headers only and decodes nothing.
    - Every returned checkpoint is a fresh object owned by the caller.

    Missing checkpoints and decode failures raise ``WorkflowCheckpointException``
    (chained from the statekeeper error); storage failures (``BackendError``,
    ``StoreTimeout``) propagate unchanged.

    Retention: ``retention=statekeeper.Retention(keep_last=, max_age=, idle=,
    sweep_every=)`` bounds this storage's workflows (only its ``namespace``'s
    streams, never the rest of a shared store): ``keep_last=N`` keeps each
    workflow's newest ``N`` checkpoints; ``max_age`` removes checkpoints last
    written longer ago than it, except a workflow's newest; ``idle`` removes a
    workflow whose newest checkpoint was last written longer ago than it, whole.
    Ages come from the store's clock. :meth:`sweep` applies it once;
    ``sweep_every`` sweeps in the background on the event loop the storage runs
    on, from its first call until :meth:`aclose` (or until that loop ends). The
    first background sweep runs ``sweep_every`` after the first call, each next
    one ``sweep_every`` after the previous one ended.
    """

    def __init__(
        self,
        store: BaseCheckpointStore | str,
        *,
        allowed_checkpoint_types: Iterable[str] | None = None,
        namespace: str = "af",
        retention: Retention | None = None,
    ) -> None:
        if isinstance(store, str):
            store = open_store(store, codec="raw")
        if not isinstance(store, BaseCheckpointStore):
            raise TypeError(f"store must be a store URL or a statekeeper store, got {store!r}")
        if store.options.codec != "raw":
            raise InvalidOptions(
                f"{store.describe()} encodes states as {store.options.codec!r}; the Agent "
                "Framework storage stores the framework's own bytes and needs codec='raw' "
                "(open_store(url, codec='raw'), or pass the URL itself)"
            )
        if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"namespace must match [A-Za-z0-9_-]{{1,32}}, got {namespace!r}")
        if retention is not None and not isinstance(retention, Retention):
            raise TypeError(
                f"retention must be a statekeeper.Retention(keep_last=, max_age=, idle=, "
                f"sweep_every=), got {retention!r}"
            )
        #: The retention policy of this storage's workflows (``None``: none).
        self.retention = retention
        self._background: BackgroundSweep[SweepReport] | None = None
        self._background_loop: asyncio.AbstractEventLoop | None = None
        #: The statekeeper store underneath.
        self.store = store
        self.namespace = namespace
        self._codec = CheckpointCodec(namespace, allowed_checkpoint_types)
        self._lazy = LazyStore(store)

    # -- lifecycle ----------------------------------------------------------------------

    async def _ready(self) -> BaseCheckpointStore:
        store = await self._lazy.ready()
        policy = self.retention
        if policy is not None and policy.sweep_every is not None:
            loop = asyncio.get_running_loop()
            if self._background_loop is not loop:  # first call, or a new loop
                self._background = BackgroundSweep(self._sweep_once, policy.sweep_every)
                self._background_loop = loop
                self._background.start()
        return store

    async def aclose(self) -> None:
        """Stop the background sweep (if any; a sweep under way finishes the
        workflow it is on), then close the store if this storage opened it (a
        store passed in open stays open). Idempotent; a later call opens the
        store again."""
        background, self._background = self._background, None
        loop, self._background_loop = self._background_loop, None
        if background is not None and loop is asyncio.get_running_loop():
            await background.stop()
        await self._lazy.aclose()

    # -- retention -----------------------------------------------------------------------

    async def _sweep_once(self, stopping: Callable[[], bool]) -> SweepReport:
        assert self.retention is not None
        store = await self._lazy.ready()
        return await sweep_workflows(store, self.namespace, self.retention, dry_run=False,
                                     stopping=stopping)  # fmt: skip

    async def sweep(self, *, dry_run: bool = False, policy: Retention | None = None) -> SweepReport:
        """Apply the retention policy once (``policy`` if given, else this storage's
        ``retention``) to this storage's workflows, and report what went.

        ``streams_removed`` counts the workflows removed whole (``idle``),
        ``checkpoints_removed`` every checkpoint removed; ``bytes_reclaimed`` is the
        space the store gave back where the backend can tell. ``dry_run=True``
        removes nothing and reports what would go. While it runs, ``get_latest`` of
        a workflow returns its newest checkpoint or ``None``, never an older one,
        and a checkpoint saved after its workflow was read is kept. Raises
        ``ValueError`` with no policy at all.
        """
        chosen = self.retention if policy is None else policy
        if not isinstance(chosen, Retention):
            raise ValueError(
                "sweep() needs a retention policy: pass policy=statekeeper.Retention(...) "
                f"or make the storage with retention=...; got {chosen!r}"
            )
        store = await self._ready()
        return await sweep_workflows(store, self.namespace, chosen, dry_run=dry_run)

    async def __aenter__(self) -> Self:
        await self._ready()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- mapping and encoding (see ._codec) ------------------------------------------

    def stream_for(self, workflow_name: str) -> str:
        """The store stream holding the checkpoints of ``workflow_name``."""
        return self._codec.stream_for(workflow_name)

    def store_id_for(self, checkpoint_id: str) -> str:
        """The store id of ``checkpoint_id``: ``<namespace>:<id>`` when that is a valid
        store id, else ``<namespace>.<sha256 of the id>`` (the two never collide)."""
        return self._codec.store_id_for(checkpoint_id)

    def encode(self, checkpoint: WorkflowCheckpoint) -> NewCheckpoint:
        """The store record of ``checkpoint``: the framework's JSON encoding as bytes.

        Raises ``WorkflowCheckpointException`` for a checkpoint that could not be
        loaded back under this storage's allowlist (checked by decoding the bytes).
        """
        return self._codec.encode(checkpoint)

    # -- the CheckpointStorage protocol ------------------------------------------------

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Store a snapshot of ``checkpoint`` and return its ``checkpoint_id``.

        A new id is appended to its workflow's stream (the newest). Re-saving a live
        id replaces the stored content and keeps its position; a live id saved
        under another workflow name raises. Refuses (nothing written) what ``load``
        would refuse.
        """
        item = self._codec.record(checkpoint)
        store = await self._ready()
        cid = checkpoint.checkpoint_id
        for _ in range(_SAVE_ROUNDS):
            try:
                await store.save(
                    item.stream,
                    item.state,
                    id=item.id,
                    parent_id=item.parent_id,
                    metadata=item.metadata,
                )
                return cid
            except CheckpointEncodeError as exc:
                raise WorkflowCheckpointException(
                    f"checkpoint {cid!r} cannot be stored: {exc}"
                ) from exc
            except PreconditionFailed:
                pass  # the id is live: replace it below
            assert item.id is not None
            try:
                current = await store.load(item.id, include_state=False)
                if current.stream != item.stream:
                    raise WorkflowCheckpointException(
                        f"checkpoint {cid!r} is already saved under workflow "
                        f"{checkpoint_fields(current.metadata).get('workflow_name')!r}; "
                        f"delete it before saving it under {checkpoint.workflow_name!r}"
                    )
                await store.update(
                    item.id,
                    item.state,
                    if_match=current.etag,
                    parent_id=item.parent_id,
                    metadata=item.metadata,
                )
                return cid
            except (CheckpointNotFound, PreconditionFailed):
                continue  # deleted or changed meanwhile: start over
            except CheckpointDecodeError as exc:
                # Replacing it would drop an acknowledged checkpoint that nobody can
                # read any more; that stays an explicit repair decision.
                raise WorkflowCheckpointException(
                    f"checkpoint {cid!r} is already stored but damaged; refusing to "
                    f"overwrite it (see 'statekeeper verify' and 'repair'): {exc}"
                ) from exc
            except CheckpointEncodeError as exc:
                raise WorkflowCheckpointException(
                    f"checkpoint {cid!r} cannot be stored: {exc}"
                ) from exc
        raise WorkflowCheckpointException(
            f"checkpoint {cid!r} kept changing while it was being saved; retry the save"
        )

    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        """The checkpoint ``checkpoint_id``, decoded (strict).

        Raises ``WorkflowCheckpointException`` if there is none or it cannot be
        read or decoded.
        """
        store = await self._ready()
        sid = self.store_id_for(checkpoint_id)
        try:
            record = await store.load(sid)
        except CheckpointNotFound as exc:
            raise WorkflowCheckpointException(
                f"No checkpoint found with ID {checkpoint_id}"
            ) from exc
        except CheckpointDecodeError as exc:
            raise WorkflowCheckpointException(
                f"checkpoint {checkpoint_id!r} cannot be read: {exc}"
            ) from exc
        return self._codec.checked(record, record.state, checkpoint_id)

    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        """Every readable checkpoint of ``workflow_name``, oldest first (save order).

        Tolerant: a checkpoint that cannot be read or decoded is left out and
        logged as a warning (``load`` and ``get_latest`` of it raise). Costs one
        page read per 1,000 checkpoints plus one decode per checkpoint.
        """
        store = await self._ready()
        stream = self.stream_for(workflow_name)
        checkpoints: list[WorkflowCheckpoint] = []
        after: str | None = None
        while True:
            page = await store.list(stream, order="asc", limit=_PAGE, after=after)
            for skipped in page.skipped:
                logger.warning(
                    "skipping unreadable checkpoint %s of workflow %r: %s",
                    skipped.id or skipped.location,
                    workflow_name,
                    skipped.reason,
                )
            for item in page.items:
                fields = checkpoint_fields(item.metadata)
                if fields.get("workflow_name") != workflow_name:
                    continue  # another name hashed to this stream (never in practice)
                try:
                    checkpoints.append(self._codec.checked(item, item.state, None))
                except WorkflowCheckpointException as exc:
                    logger.warning(
                        "skipping undecodable checkpoint %s of workflow %r: %s",
                        fields.get("checkpoint_id", item.id),
                        workflow_name,
                        exc,
                    )
            if page.next_cursor is None:
                return checkpoints
            after = page.next_cursor

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        """The checkpoint ids of ``workflow_name``, oldest first.

        Reads headers only and decodes no state, so it costs far less than
        ``list_checkpoints``; a checkpoint whose state cannot be decoded is still
        listed (``load`` of it raises).
        """
        store = await self._ready()
        stream = self.stream_for(workflow_name)
        ids: list[str] = []
        after: str | None = None
        while True:
            page = await store.list(
                stream, order="asc", limit=_PAGE, after=after, include_state=False
            )
            for item in page.items:
                fields = checkpoint_fields(item.metadata)
                cid = fields.get("checkpoint_id")
                if fields.get("workflow_name") == workflow_name and isinstance(cid, str):
                    ids.append(cid)
            if page.next_cursor is None:
                return ids
            after = page.next_cursor

    async def delete(self, checkpoint_id: str) -> bool:
        """Delete ``checkpoint_id``; ``False`` if there was none."""
        store = await self._ready()
        return await store.delete(self.store_id_for(checkpoint_id))

    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        """The newest checkpoint of ``workflow_name`` by store sequence, or ``None``.

        Strict: if the newest checkpoint cannot be read or decoded this raises
        ``WorkflowCheckpointException``; it never returns an older one. One
        ``store.get_latest`` and one decode, whatever the number of checkpoints.
        """
        store = await self._ready()
        try:
            record = await store.get_latest(self.stream_for(workflow_name))
        except CheckpointDecodeError as exc:
            raise WorkflowCheckpointException(
                f"the newest checkpoint of workflow {workflow_name!r} cannot be read: {exc}; "
                "refusing to return an older one"
            ) from exc
        if record is None:
            return None
        owner = checkpoint_fields(record.metadata).get("workflow_name")
        if owner != workflow_name:
            raise WorkflowCheckpointException(
                f"the newest record of workflow {workflow_name!r}'s stream belongs to "
                f"workflow {owner!r}"
            )
        try:
            return self._codec.checked(record, record.state, None)
        except WorkflowCheckpointException as exc:
            raise WorkflowCheckpointException(
                f"the newest checkpoint of workflow {workflow_name!r} cannot be decoded: "
                f"{exc}; refusing to return an older one"
            ) from exc
