"""Agent Framework checkpoints as store records: where they go, and their bytes.

:class:`CheckpointCodec` maps a workflow name to a stream (``"<namespace>:<name>"``)
and a checkpoint id to a store id (``"<namespace>:<id>"``); a name or an id that
does not fit the store's rules is hashed (stream ``"<namespace>#<sha256>"``, id
``"<namespace>.<sha256>"``). It encodes a checkpoint exactly as the framework's own
``FileCheckpointStorage`` does (``encode_checkpoint_value`` of
``WorkflowCheckpoint.to_dict()``, as JSON, stored verbatim with ``codec="raw"``),
refusing what it could not decode back under the storage's allowlist, and decodes
records back, checking that a record is the checkpoint asked for. The framework's
encoder comes from :func:`framework_encoding`, the adapter's one use of a private
module of agent-framework-core.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NamedTuple

from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException

from ..._core.validate import ID_PATTERN, MAX_STREAM_LEN
from ...codec import Codec
from ...models import CheckpointHeader, NewCheckpoint

#: Where agent-framework-core keeps the checkpoint encoder of FileCheckpointStorage.
PRIVATE_ENCODING = "agent_framework._workflows._checkpoint_encoding"


def framework_encoding() -> tuple[Callable[[Any], Any], Callable[..., Any]]:
    """agent-framework-core's ``encode_checkpoint_value`` and
    ``decode_checkpoint_value``: the encoder and decoder its ``FileCheckpointStorage``
    uses, so that our records are the framework's own format under its allowlist.

    The framework does not export them (checked up to agent-framework-core 1.23,
    whose public ``agent_framework`` names only ``register_checkpoint_type`` of that
    module), so this is the one place the adapter reaches into a private module.
    If that module moves or changes shape, this raises ``ImportError`` saying what is
    missing and from which version, when the adapter is imported, never a wrong
    encoding at a save (``tests/integrations/test_agent_framework_private.py``
    pins the shape). The extra pins agent-framework-core <2.
    """
    try:
        module = importlib.import_module(PRIVATE_ENCODING)
    except ImportError as exc:
        raise ImportError(_changed(f"{PRIVATE_ENCODING} cannot be imported ({exc})")) from exc
    encode = getattr(module, "encode_checkpoint_value", None)
    decode = getattr(module, "decode_checkpoint_value", None)
    if not callable(encode) or not callable(decode):
        raise ImportError(
            _changed(f"{PRIVATE_ENCODING} has no encode_checkpoint_value/decode_checkpoint_value")
        )
    try:
        takes_allowlist = "allowed_types" in inspect.signature(decode).parameters
    except (TypeError, ValueError):  # no signature to read: not the function we know
        takes_allowlist = False
    if not takes_allowlist:
        raise ImportError(
            _changed(f"{PRIVATE_ENCODING}.decode_checkpoint_value takes no allowed_types=")
        )
    return encode, decode


def _changed(what: str) -> str:
    try:
        version = importlib.metadata.version("agent-framework-core")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return (
        f"statekeeper's Agent Framework storage needs the checkpoint encoding of "
        f"agent-framework-core's FileCheckpointStorage, which that package does not "
        f"export: {what} in agent-framework-core {version}. Install the version "
        f"statekeeper supports (pip install 'statekeeper[agent-framework]') or a "
        f"statekeeper release that supports this one"
    )


encode_checkpoint_value, decode_checkpoint_value = framework_encoding()

#: ``"format"`` of every record this adapter writes: the framework's JSON.
FORMAT: Final = "agent-framework/json"
#: The one metadata key of a record this adapter writes; its value holds what the
#: adapter reads back: ``format``, ``checkpoint_id`` and ``workflow_name``.
META_KEY: Final = "agent_framework"


def checkpoint_fields(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the adapter wrote in a record's metadata (``format``, ``checkpoint_id``,
    ``workflow_name``): under :data:`META_KEY`, or at the top level in records written
    before it moved there (which also hold ``timestamp``,
    ``previous_checkpoint_id`` and ``iteration_count``, read by nothing)."""
    nested = metadata.get(META_KEY)
    return nested if isinstance(nested, dict) else metadata


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


class Record(NamedTuple):
    """One checkpoint as a store record: the arguments of its ``store.save``."""

    stream: str
    state: bytes
    id: str
    parent_id: str | None
    metadata: dict[str, Any]


#: The framework's JSON, compact, as FileCheckpointStorage's content (one encoder:
#: json.dumps with these options builds a new one per call).
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
#: Plain JSON of exact types, which the framework's encoder gives back unchanged
#: (unless a dict has one of its reserved keys, see _framework_json).
_is_plain = Codec().is_plain
#: The framework's reserved keys as its JSON writes them: every pickled value is
#: ``{"__pickled__": ..., "__type__": ...}``, and a dict of the caller's with either
#: key is pickled whole. A string holding the text gives a false alarm (only a
#: slower path), never a miss: a quote inside a JSON string is escaped.
_PICKLED: Final = b'"__pickled__"'
_TYPED: Final = b'"__type__"'


def _framework_json(fields: dict[str, Any]) -> bytes:
    """``encode_checkpoint_value(fields)`` as compact UTF-8 JSON.

    Fields that are plain JSON (:data:`_is_plain`) are written as they are: the
    framework's encoder would copy them unchanged (exact ``str``, ``int``,
    ``float``, ``bool``, ``None``, lists, dicts with distinct ``str`` keys), unless
    a dict among them has a reserved key, which the bytes show; then, as for any
    other value, the framework's encoder does the whole.
    """
    if _is_plain(fields):
        data = _dumps(fields).encode("utf-8")
        if _PICKLED not in data and _TYPED not in data:
            return data
    return _dumps(encode_checkpoint_value(fields)).encode("utf-8")


class CheckpointCodec:
    """The mapping and encoding of one storage (its ``namespace`` and allowlist)."""

    def __init__(self, namespace: str, allowed_types: Iterable[str] | None) -> None:
        self.namespace = namespace
        self._allowed_types: frozenset[str] = frozenset(allowed_types or ())

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
        loaded back under this storage's allowlist (see :meth:`record`).
        """
        return NewCheckpoint(**self.record(checkpoint)._asdict())

    def record(self, checkpoint: WorkflowCheckpoint) -> Record:
        """What :meth:`encode` gives, as a plain tuple (what ``save`` passes on).

        Raises ``WorkflowCheckpointException`` for a checkpoint that could not be
        loaded back under this storage's allowlist: when the bytes hold a pickled
        value, by decoding them as ``load`` would (nothing is written).
        """
        if not isinstance(checkpoint, WorkflowCheckpoint):
            raise WorkflowCheckpointException(
                f"expected a WorkflowCheckpoint, got {type(checkpoint).__name__}"
            )
        cid = checkpoint.checkpoint_id
        try:
            data = _framework_json(checkpoint.to_dict())
            # Symmetry: refuse now what load would refuse later (nothing is written).
            # Without a pickled value the framework's JSON is decoded without a
            # refusal (no type to allow), so only bytes with one are decoded here.
            if _PICKLED in data:
                self.decode(data, cid)
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
        return Record(
            stream=self.stream_for(checkpoint.workflow_name),
            state=data,
            id=self.store_id_for(cid),
            parent_id=None if previous is None else self.store_id_for(previous),
            # One key whose value is a mapping: the SQL backends index top-level
            # scalar metadata for list(metadata=...) filters, a row per key, and the
            # adapter filters on none (it reads a workflow's stream). Only what the
            # adapter reads back; the rest of the checkpoint is in the state.
            metadata={
                META_KEY: {
                    "format": FORMAT,
                    "checkpoint_id": cid,
                    "workflow_name": checkpoint.workflow_name,
                }
            },
        )

    def decode(self, data: object, cid: str) -> WorkflowCheckpoint:
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
        return self.decode_value(value, cid)

    def decode_value(self, value: object, cid: str) -> WorkflowCheckpoint:
        """The framework's JSON value, parsed -> a fresh ``WorkflowCheckpoint`` (strict)."""
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

    def checked(
        self, header: CheckpointHeader, state: object, cid: str | None
    ) -> WorkflowCheckpoint:
        """Decode a record read by store id, checking it is the checkpoint asked for."""
        meta = checkpoint_fields(header.metadata)
        expected = meta.get("checkpoint_id") if cid is None else cid
        if meta.get("format") != FORMAT or meta.get("checkpoint_id") != expected:
            raise WorkflowCheckpointException(
                f"store record {header.id!r} is not the Agent Framework checkpoint "
                f"{expected!r} (metadata {header.metadata!r})"
            )
        checkpoint = self.decode(state, str(expected))
        if checkpoint.checkpoint_id != expected:
            raise WorkflowCheckpointException(
                f"store record {header.id!r} holds checkpoint {checkpoint.checkpoint_id!r}, "
                f"not {expected!r}"
            )
        return checkpoint
