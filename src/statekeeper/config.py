"""Options every backend takes, and the capabilities a backend declares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import InvalidOptions
from .models import Retention
from .telemetry._options import Telemetry

__all__ = ["Capabilities", "StoreOptions", "validate_options"]


class StoreOptions(BaseModel):
    """Options that every backend accepts. Backends subclass this model.

    The model is frozen and forbids unknown fields: an option that no backend reads
    is an error, never silently ignored. Values may come from URL query parameters
    (strings), which are converted where the conversion is unambiguous.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    #: Classes (or ``"module:Qualname"`` strings) the codec may encode and decode
    #: beyond the built-in safe types. Anything else is refused both ways (S5, S11).
    allowed_types: tuple[type | str, ...] = ()
    #: ``"full"``: an acknowledged save survives power loss (fsync, synchronous=FULL).
    #: ``"fast"``: it survives a process crash but may be lost on power loss.
    durability: Literal["full", "fast"] = "full"
    #: Codec limits; see :class:`statekeeper.codec.CodecLimits`.
    max_depth: int = Field(default=100, ge=1, le=10_000)
    max_bytes: int = Field(default=16 * 1024 * 1024, ge=64)
    max_int_digits: int = Field(default=4300, ge=1)
    allow_nan: bool = False
    #: How new states are encoded: ``"json"`` (JSON plus tagged values, the
    #: default) or ``"raw"`` (``bytes`` stored verbatim; see
    #: :mod:`statekeeper.rawcodec`). Records name their codec, so either store
    #: reads records of both.
    codec: Literal["json", "raw"] = "json"
    #: ``False``: opening a store that does not exist raises
    #: :class:`~statekeeper.errors.StoreNotFound` and creates nothing.
    create: bool = True
    #: ``True``: the store writes nothing (not even a repair, a migration or a lock
    #: file where the backend can avoid it); every write method raises
    #: :class:`~statekeeper.errors.ReadOnlyStore`. Implies ``create=False``.
    read_only: bool = False
    #: Encryption at rest (S16): a :class:`~statekeeper.encryption.Keyring`, a
    #: :class:`~statekeeper.encryption.KeyProvider`, ``"env"`` (the keys in
    #: ``STATEKEEPER_KEYS``) or ``"<provider>[:<argument>]"`` of the
    #: ``statekeeper.keys`` entry points. ``None``: states are stored in plaintext.
    encryption: Any = None
    #: With ``encryption``: seal tags and metadata too (filters on them then raise
    #: :class:`~statekeeper.errors.InvalidQuery`).
    encrypt_metadata: bool = False
    #: A retention policy (S17): what :meth:`~statekeeper.BaseCheckpointStore.sweep`
    #: removes, and with ``sweep_every`` a background sweep while the store is
    #: open. ``None``: nothing is removed unless ``sweep(policy=...)`` says so.
    retention: Retention | None = None
    #: OpenTelemetry spans and metrics (S18): ``True`` or a
    #: :class:`~statekeeper.telemetry.Telemetry`. ``False`` (the default) leaves it
    #: to :func:`statekeeper.telemetry.enable`. Needs the ``otel`` extra.
    telemetry: bool | Telemetry = False

    @field_validator("encryption")
    @classmethod
    def _encryption_kind(cls, value: Any) -> Any:
        from .encryption.keys import KeyProvider, Keyring

        if value is None or isinstance(value, str | Keyring | KeyProvider):
            return value
        raise ValueError(
            f"encryption must be a Keyring, a KeyProvider or a provider name such as "
            f"'env', got {type(value).__name__}"
        )

    @model_validator(mode="before")
    @classmethod
    def _read_only_implies_no_create(cls, values: Any) -> Any:
        if isinstance(values, dict) and _truthy(values.get("read_only")):
            if "create" in values and _truthy(values["create"]):
                raise ValueError("read_only=True implies create=False; do not pass create=True")
            values = {**values, "create": False}
        return values

    @model_validator(mode="after")
    def _read_only_never_sweeps(self) -> StoreOptions:
        # A background sweep writes; a read-only store writes nothing, so the two
        # together are a contradiction, refused rather than silently never run.
        if self.read_only and self.retention is not None and self.retention.sweep_every:
            raise ValueError(
                "retention with sweep_every would sweep (write to) a store opened "
                "read_only=True; drop sweep_every or open it writable"
            )
        return self

    @field_validator("allowed_types", mode="before")
    @classmethod
    def _split_types(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, type):
            return (value,)
        return value


def _truthy(value: Any) -> bool:
    """The boolean meaning of an option value that may be a URL query string."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def validate_options(model: type[StoreOptions], values: dict[str, Any]) -> StoreOptions:
    """Build ``model`` from ``values``, turning validation errors into :class:`InvalidOptions`."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'options'}: {err['msg']}"
            for err in exc.errors()
        )
        allowed = ", ".join(
            sorted(field.alias or name for name, field in model.model_fields.items())
        )
        raise InvalidOptions(
            f"invalid options for {model.__name__}: {problems} (accepted options: {allowed})"
        ) from exc


@dataclass(frozen=True)
class Capabilities:
    """What a backend guarantees, declared by the backend and never guessed.

    The conformance kit skips the tests of a capability a backend does not declare.
    """

    #: Data survives closing and reopening the store (and a process restart).
    persistent: bool = False
    #: Several processes on one host may share the store.
    cross_process: bool = False
    #: Several hosts may share the store.
    cross_host: bool = False
    #: With ``durability="full"`` an acknowledged save survives power loss.
    power_loss_durable: bool = False
    #: ``ttl=`` is supported (saves may expire): the backend's reads hide expired
    #: records and it overrides ``_purge_expired``. Off unless declared, as every
    #: capability is: a backend that never said so is never assumed to expire
    #: records, and ``save(ttl=...)`` on it is refused rather than kept forever.
    ttl: bool = False
    #: The store implements the raw-record backdoor used by the conformance kit
    #: (:meth:`BaseCheckpointStore.backdoor_read_raw` / ``backdoor_write_raw``).
    raw_access: bool = False
    #: ``save_many`` is atomic (all or nothing, also after a crash) and takes one
    #: commit: the backend overrides ``_insert_many``.
    atomic_batches: bool = False
    #: ``_scan`` applies ``ScanQuery.metadata`` itself (from an index). Otherwise
    #: the base class filters by scanning, which costs O(records scanned).
    metadata_filter: bool = False
