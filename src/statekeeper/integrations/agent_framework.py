"""Microsoft Agent Framework's ``CheckpointStorage`` over a statekeeper store.

``StatekeeperCheckpointStorage(store)`` implements the ``CheckpointStorage``
protocol of ``agent-framework-core`` 1.x (``save``, ``load``, ``list_checkpoints``,
``list_checkpoint_ids``, ``delete``, ``get_latest``) on any statekeeper backend::

    storage = StatekeeperCheckpointStorage("sqlite:///checkpoints.db")
    workflow = WorkflowBuilder(start_executor=start, checkpoint_storage=storage).build()

**Mapping.** A workflow name is a stream (``"af:<workflow_name>"``) and a
checkpoint is one record of it. The checkpoint id maps to the store id
``"af:<checkpoint_id>"``; an id (or a workflow name) that does not fit the store's
rules is hashed (``"af.<sha256>"``, stream ``"af#<sha256>"``), and the original is
kept in the record's metadata. ``namespace=`` replaces ``"af"``, so several
storages can share one store without seeing each other.

**Encoding.** A checkpoint is encoded exactly as the framework's own
``FileCheckpointStorage`` encodes it (``encode_checkpoint_value`` of
``WorkflowCheckpoint.to_dict()``, as JSON) and those UTF-8 bytes are stored
verbatim with ``codec="raw"``: statekeeper adds no second encoding.

**Strict, flat-cost latest.** :meth:`~StatekeeperCheckpointStorage.get_latest` is
one ``store.get_latest`` on the workflow's stream and one decode, whatever the
number of checkpoints. The newest checkpoint is the one with the highest store
sequence (the order of the saves), not the latest ``timestamp``; if it cannot be
read or decoded, ``get_latest`` raises ``WorkflowCheckpointException`` and never
returns an older one.

**Lifecycle.** Agent Framework builds storages synchronously and never closes
them, so the store is opened lazily: on the first call, once, under a lock, on the
event loop of that call, and it stays bound to that loop. Pass a URL or an unopened
store (opened on first use and closed by :meth:`~StatekeeperCheckpointStorage.aclose`)
or an open store (which stays yours to close).

**Concurrency.** Safe for concurrent tasks on one event loop. Calls from another
event loop while the first one is running raise ``RuntimeError``; when the first
loop has been closed (successive ``asyncio.run`` calls), a store this storage
opened is reopened on the new loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Final, Self

from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException

# The encoder FileCheckpointStorage uses is not re-exported by agent_framework; using
# it (not a copy) is what keeps our records in the framework's own format and its
# allowlist policy. The extra pins agent-framework-core <2.
from agent_framework._workflows._checkpoint_encoding import (
    decode_checkpoint_value,
    encode_checkpoint_value,
)

from .._protocol import BaseCheckpointStore
from .._registry import open_store
from .._validate import ID_PATTERN, MAX_STREAM_LEN
from ..errors import (
    CheckpointDecodeError,
    CheckpointEncodeError,
    CheckpointNotFound,
    InvalidOptions,
    PreconditionFailed,
)
from ..models import CheckpointHeader, NewCheckpoint

__all__ = ["FORMAT", "StatekeeperCheckpointStorage"]

logger = logging.getLogger(__name__)

#: ``metadata["format"]`` of every record this adapter writes: the framework's JSON.
FORMAT: Final = "agent-framework/json"

_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,32}")
#: Re-saving a live checkpoint id races deletes; a few rounds settle it.
_SAVE_ROUNDS = 5
_PAGE = 1000


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _fits_stream(name: str) -> bool:
    if "\x00" in name or len(name) > MAX_STREAM_LEN:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    """

    def __init__(
        self,
        store: BaseCheckpointStore | str,
        *,
        allowed_checkpoint_types: Iterable[str] | None = None,
        namespace: str = "af",
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
        #: The statekeeper store underneath.
        self.store = store
        self.namespace = namespace
        self._allowed_types: frozenset[str] = frozenset(allowed_checkpoint_types or ())
        # Lifecycle state, guarded by a thread lock because the claiming loop may
        # change (successive asyncio.run calls); the asyncio lock serializes the
        # opening on the claiming loop.
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open_lock: asyncio.Lock | None = None
        self._owns_store = False
        self._stale = False

    # -- lifecycle ----------------------------------------------------------------------

    async def _ready(self) -> BaseCheckpointStore:
        """The open store: opened on the first call, once, on the calling loop."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self.store.is_open and not self._stale:
            return self.store
        lock = self._claim(loop)
        async with lock:
            if self._stale:
                self._stale = False
                try:
                    # The handle belongs to a dead loop: release what can be released.
                    await self.store.close()
                except Exception:
                    logger.debug("closing a store left on a closed event loop", exc_info=True)
            if not self.store.is_open:
                await self.store.open()
                self._owns_store = True
        return self.store

    def _claim(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        with self._guard:
            if self._loop is not loop or self._open_lock is None:
                old = self._loop
                if old is not None and not old.is_closed():
                    raise RuntimeError(
                        f"this StatekeeperCheckpointStorage over {self.store.describe()} is "
                        "bound to another running event loop; use one storage per loop"
                    )
                if old is not None and self.store.is_open:
                    if not self._owns_store:
                        raise RuntimeError(
                            f"{self.store.describe()} was opened by the caller on an event "
                            "loop that is now closed; open it again, or pass an unopened "
                            "store or a URL so that the storage manages it"
                        )
                    self._stale = True
                self._loop = loop
                self._open_lock = asyncio.Lock()
            return self._open_lock

    async def aclose(self) -> None:
        """Close the store if this storage opened it (a store passed in open stays
        open). Idempotent; a later call opens the store again."""
        with self._guard:
            owns = self._owns_store
            dead_loop = self._loop is not None and self._loop.is_closed()
            self._owns_store = False
            self._stale = False
            self._loop = None
            self._open_lock = None
        if not owns:
            return
        if not dead_loop:
            await self.store.close()
            return
        try:
            await self.store.close()
        except Exception:
            # Connections of a finished loop can only be dropped, not closed.
            logger.debug("closing a store left on a closed event loop", exc_info=True)

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

    # -- mapping --------------------------------------------------------------------------

    def stream_for(self, workflow_name: str) -> str:
        """The store stream holding the checkpoints of ``workflow_name``."""
        if not isinstance(workflow_name, str):
            raise WorkflowCheckpointException(
                f"workflow_name must be a string, got {workflow_name!r}"
            )
        direct = f"{self.namespace}:{workflow_name}"
        return direct if _fits_stream(direct) else f"{self.namespace}#{_sha256(workflow_name)}"

    def store_id_for(self, checkpoint_id: str) -> str:
        """The store id of ``checkpoint_id``: ``<namespace>:<id>`` when that is a valid
        store id, else ``<namespace>.<sha256 of the id>`` (the two never collide)."""
        if not isinstance(checkpoint_id, str):
            raise WorkflowCheckpointException(
                f"checkpoint_id must be a string, got {checkpoint_id!r}"
            )
        direct = f"{self.namespace}:{checkpoint_id}"
        if ID_PATTERN.fullmatch(direct):
            return direct
        return f"{self.namespace}.{_sha256(checkpoint_id)}"

    # -- encoding -------------------------------------------------------------------------

    def encode(self, checkpoint: WorkflowCheckpoint) -> NewCheckpoint:
        """The store record of ``checkpoint``: the framework's JSON encoding as bytes.

        Raises ``WorkflowCheckpointException`` for a checkpoint that could not be
        loaded back under this storage's allowlist (checked by decoding the bytes).
        """
        if not isinstance(checkpoint, WorkflowCheckpoint):
            raise WorkflowCheckpointException(
                f"expected a WorkflowCheckpoint, got {type(checkpoint).__name__}"
            )
        cid = checkpoint.checkpoint_id
        try:
            encoded = encode_checkpoint_value(checkpoint.to_dict())
            data = json.dumps(encoded, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            # Symmetry: refuse now what load would refuse later (nothing is written).
            self._decode(data, cid)
        except WorkflowCheckpointException as exc:
            raise WorkflowCheckpointException(
                f"checkpoint {cid!r} cannot be restored under this storage's allowed "
                f"types; refusing to save it: {exc}"
            ) from exc
        except Exception as exc:
            raise WorkflowCheckpointException(
                f"checkpoint {cid!r} cannot be encoded; refusing to save it: {exc}"
            ) from exc
        previous = checkpoint.previous_checkpoint_id
        return NewCheckpoint(
            stream=self.stream_for(checkpoint.workflow_name),
            state=data,
            id=self.store_id_for(cid),
            parent_id=None if previous is None else self.store_id_for(previous),
            metadata={
                "format": FORMAT,
                "checkpoint_id": cid,
                "workflow_name": checkpoint.workflow_name,
                "timestamp": checkpoint.timestamp,
                "previous_checkpoint_id": previous,
                "iteration_count": checkpoint.iteration_count,
            },
        )

    def _decode(self, data: object, cid: str) -> WorkflowCheckpoint:
        """Bytes as stored -> a fresh ``WorkflowCheckpoint`` (strict)."""
        if not isinstance(data, bytes):
            raise WorkflowCheckpointException(
                f"checkpoint {cid!r} is not an Agent Framework checkpoint "
                f"(its state is {type(data).__name__}, not bytes)"
            )
        try:
            value = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise WorkflowCheckpointException(
                f"checkpoint {cid!r} is not valid UTF-8 JSON and cannot be loaded: {exc}"
            ) from exc
        if not isinstance(value, dict):
            raise WorkflowCheckpointException(
                f"checkpoint {cid!r} is not a JSON object and cannot be loaded"
            )
        try:
            decoded = decode_checkpoint_value(value, allowed_types=self._allowed_types)
        except RecursionError as exc:
            raise WorkflowCheckpointException(
                f"checkpoint {cid!r} is nested too deeply to decode"
            ) from exc
        if not isinstance(decoded, dict):
            raise WorkflowCheckpointException(f"checkpoint {cid!r} did not decode to a mapping")
        return WorkflowCheckpoint.from_dict(decoded)

    def _checked(
        self, header: CheckpointHeader, state: object, cid: str | None
    ) -> WorkflowCheckpoint:
        """Decode a record read by store id, checking it is the checkpoint asked for."""
        meta = header.metadata
        expected = meta.get("checkpoint_id") if cid is None else cid
        if meta.get("format") != FORMAT or meta.get("checkpoint_id") != expected:
            raise WorkflowCheckpointException(
                f"store record {header.id!r} is not the Agent Framework checkpoint "
                f"{expected!r} (metadata {meta!r})"
            )
        checkpoint = self._decode(state, str(expected))
        if checkpoint.checkpoint_id != expected:
            raise WorkflowCheckpointException(
                f"store record {header.id!r} holds checkpoint {checkpoint.checkpoint_id!r}, "
                f"not {expected!r}"
            )
        return checkpoint

    # -- the CheckpointStorage protocol ------------------------------------------------

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Store a snapshot of ``checkpoint`` and return its ``checkpoint_id``.

        A new id is appended to its workflow's stream (the newest). Re-saving a live
        id replaces the stored content and keeps its position; a live id saved
        under another workflow name raises. Refuses (nothing written) what ``load``
        would refuse.
        """
        item = self.encode(checkpoint)
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
                        f"{current.metadata.get('workflow_name')!r}; delete it before "
                        f"saving it under {checkpoint.workflow_name!r}"
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
        return self._checked(record, record.state, checkpoint_id)

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
                if item.metadata.get("workflow_name") != workflow_name:
                    continue  # another name hashed to this stream (never in practice)
                try:
                    checkpoints.append(self._checked(item, item.state, None))
                except WorkflowCheckpointException as exc:
                    logger.warning(
                        "skipping undecodable checkpoint %s of workflow %r: %s",
                        item.metadata.get("checkpoint_id", item.id),
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
                cid = item.metadata.get("checkpoint_id")
                if item.metadata.get("workflow_name") == workflow_name and isinstance(cid, str):
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
        if record.metadata.get("workflow_name") != workflow_name:
            raise WorkflowCheckpointException(
                f"the newest record of workflow {workflow_name!r}'s stream belongs to "
                f"workflow {record.metadata.get('workflow_name')!r}"
            )
        try:
            return self._checked(record, record.state, None)
        except WorkflowCheckpointException as exc:
            raise WorkflowCheckpointException(
                f"the newest checkpoint of workflow {workflow_name!r} cannot be decoded: "
                f"{exc}; refusing to return an older one"
            ) from exc
