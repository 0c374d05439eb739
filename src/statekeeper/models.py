"""The frozen value types that every store returns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "Checkpoint",
    "CheckpointHeader",
    "JSONValue",
    "NewCheckpoint",
    "Page",
    "Problem",
    "RepairReport",
    "Retention",
    "Skipped",
    "SweepReport",
    "VerifyReport",
]

#: Plain JSON: what ``metadata`` values may hold.
JSONValue = Any


def _require_utc(value: datetime | None) -> datetime | None:
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise ValueError("timestamps must be timezone-aware")
    return value


class CheckpointHeader(BaseModel):
    """Everything about a checkpoint except its state.

    ``sequence`` is the store-wide creation order: larger means created later, it is
    never reused, and ``update`` keeps it. Timestamps are timezone-aware UTC with
    microseconds and are informational only; order never comes from them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    stream: str
    sequence: int = Field(ge=1)
    created_at: datetime
    updated_at: datetime
    etag: str
    parent_id: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, JSONValue] = Field(default_factory=dict)
    expires_at: datetime | None = None

    _tz = field_validator("created_at", "updated_at", "expires_at")(_require_utc)

    def header(self) -> CheckpointHeader:
        """This checkpoint's header alone (a ``Checkpoint`` without its state)."""
        if type(self) is CheckpointHeader:
            return self
        return CheckpointHeader.model_validate(
            {name: getattr(self, name) for name in CheckpointHeader.model_fields}
        )


class Checkpoint(CheckpointHeader):
    """A checkpoint with its decoded state."""

    state: Any = None


_HEADER_ORDER = tuple(CheckpointHeader.model_fields)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The read and write paths build their models with pydantic's public ``model_copy``:
# a copy of a template whose every field the update replaces (``model_copy`` copies
# the template's ``__dict__`` and fields set, then applies ``update`` without
# validating it). That is a complete, normal model (every field set, its own
# ``model_fields_set``), built for about half of what ``model_construct`` costs
# (whose loop over the fields is pydantic's Python code), measured in the report of
# issue 23. Validating instead (``model_validate``) costs more and would refuse what
# a trusted construction passes today (a naive timestamp from a user's clock is a
# decode error when read, not a save error). The templates are never handed out;
# their placeholder values never reach a caller, because every field is replaced.
_PLACEHOLDER: dict[str, Any] = {
    "id": "",
    "stream": "",
    "sequence": 1,
    "created_at": _EPOCH,
    "updated_at": _EPOCH,
    "etag": "",
    "parent_id": None,
    "tags": {},
    "metadata": {},
    "expires_at": None,
}
_copy_header = CheckpointHeader.model_construct(set(_HEADER_ORDER), **_PLACEHOLDER).model_copy
_copy_checkpoint = Checkpoint.model_construct(
    set(Checkpoint.model_fields), **_PLACEHOLDER, state=None
).model_copy


def trusted_header(values: dict[str, Any]) -> CheckpointHeader:
    """A header from values already checked field by field, without validating
    them again (pydantic's ``model_copy`` of a template, every field replaced and
    set).

    For the read and write paths; ``values`` must hold exactly the header fields
    (every one of them), with the right types. It is not kept: the header holds
    the same values (the same ``tags`` and ``metadata`` objects), in a dict of its
    own.
    """
    return _copy_header(update=values)


def trusted_checkpoint(values: dict[str, Any], state: Any) -> Checkpoint:
    """A checkpoint from header values already checked field by field (as
    :func:`trusted_header` takes them) and its decoded ``state``, without validating
    them again: what ``checkpoint_with_state(trusted_header(values), state)`` gives,
    without the header in between."""
    if state is None:  # the template's own state: the values are the whole update
        return _copy_checkpoint(update=values)
    return _copy_checkpoint(update={**values, "state": state})


def checkpoint_with_state(header: CheckpointHeader, state: Any) -> Checkpoint:
    """``header`` plus ``state`` as a :class:`Checkpoint`, without re-validation."""
    values = vars(header)
    kind = type(header)
    if kind is not CheckpointHeader and kind is not Checkpoint:  # a subclass's own fields
        values = {name: values[name] for name in _HEADER_ORDER}
    # a Checkpoint's own state is replaced: the update's "state" comes last
    return _copy_checkpoint(update={**values, "state": state})


class Skipped(BaseModel):
    """A record that a tolerant listing left out, and why.

    ``id`` and ``sequence`` are ``None`` when the record is too damaged to tell.
    ``location`` is where it lives (a path, a row key), ``reason`` a human sentence,
    ``error`` the name of the exception class that a strict read would raise.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str | None
    sequence: int | None
    location: str
    reason: str
    error: str


class Page(BaseModel):
    """One page of a tolerant listing.

    ``items`` are in the requested order. ``skipped`` lists every record in the
    page's range that could not be read. ``next_cursor`` feeds ``after=`` and
    ``prev_cursor`` feeds ``before=``; each is ``None`` at its end, and
    ``has_more`` is true exactly when ``next_cursor`` is not ``None``.

    A page covers ``limit`` candidate records; a record that was skipped still uses
    its slot, so a page can hold fewer than ``limit`` items while ``has_more`` is
    true.

    A page listed with ``include_state=False`` holds :class:`CheckpointHeader`
    items, with no ``state`` attribute (the annotation names the common case).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    items: list[Checkpoint] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)
    next_cursor: str | None = None
    prev_cursor: str | None = None
    has_more: bool = False


class Problem(BaseModel):
    """One thing :meth:`~statekeeper.BaseCheckpointStore.verify` found wrong.

    ``kind`` is one of:

    - ``"damaged-record"``: an acknowledged checkpoint whose record cannot be read
      or decoded. It stays until dropped explicitly (``repair(drop_damaged=True)``).
    - ``"index"``: derived metadata (a stream index, an id table, a tag row) that is
      damaged, missing or disagrees with the records. ``repair()`` rebuilds it.
    - ``"state"``: the store's own bookkeeping (high-water mark, counters, format
      record) is damaged or missing. ``repair()`` rebuilds it from the records.
    - ``"foreign"``: something in the store that is not a record of it (a planted
      file, a link, a FIFO); reported, never followed.
    - ``"unchecked"``: a part of the store this backend could not check; a report
      with one is never "all readable".
    - ``"plaintext"``: in a store opened with encryption (S16), a record that is not
      encrypted; it is never read as data (``statekeeper rekey`` encrypts a store
      that was plaintext).
    - ``"undecryptable"``: an encrypted record under a key the keyring lacks, or
      whose authentication fails (altered, or moved from elsewhere).
    - ``"retired-key"``: a readable record under a key of the ring that is not the
      active one. A notice, not damage: ``ok`` stays true; ``statekeeper rekey``
      moves it to the active key.
    - ``"orphan"``: reported by ``statekeeper verify`` (not by ``verify()``, which
      knows no adapter's layout): a LangGraph pending-writes record whose
      checkpoint is gone; ``statekeeper repair`` removes it.

    ``location`` says where (a path, a row key), ``reason`` is a human sentence.
    ``id``, ``sequence`` and ``stream`` are set where they are known.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    location: str
    reason: str
    id: str | None = None
    sequence: int | None = None
    stream: str | None = None

    @property
    def is_notice(self) -> bool:
        """Whether this is a notice (``"retired-key"``): reported, but the store is
        sound, so it leaves :attr:`VerifyReport.ok` true."""
        return self.kind in _NOTICES


#: Problem kinds that are notices: reported, but the store is sound.
_NOTICES = frozenset({"retired-key"})


class VerifyReport(BaseModel):
    """What :meth:`~statekeeper.BaseCheckpointStore.verify` checked and found.

    ``ok`` is true only when every record, index and table was checked
    (``complete``) and nothing was wrong (no ``problems``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    records: int
    streams: int
    high_water_mark: int | None = None
    complete: bool
    problems: list[Problem] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True only if every check ran (``complete``) and found no problem (a
        ``"retired-key"`` notice is not one)."""
        return self.complete and all(p.is_notice for p in self.problems)


class RepairReport(BaseModel):
    """What :meth:`~statekeeper.BaseCheckpointStore.repair` did.

    ``rebuilt`` counts what was rebuilt from the records (for example
    ``{"stream_indexes": 3, "id_table": 1}``); ``actions`` says it in sentences.
    ``damaged`` lists the acknowledged checkpoints that are still damaged (kept,
    and still reported by strict reads), ``dropped`` those removed because
    ``drop_damaged=True`` was passed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    records: int
    rebuilt: dict[str, int] = Field(default_factory=dict)
    actions: list[str] = Field(default_factory=list)
    damaged: list[Problem] = Field(default_factory=list)
    dropped: list[Problem] = Field(default_factory=list)


class NewCheckpoint(BaseModel):
    """One item of :meth:`~statekeeper.BaseCheckpointStore.save_many`: the arguments
    of one ``save``. The store validates and encodes every item before it writes
    any, so a bad item fails the whole batch with nothing written. Fields are
    strict (no coercion): ``ttl=True`` is an error, not one second."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, strict=True
    )

    stream: str
    state: Any = None
    tags: dict[str, str] | None = None
    metadata: dict[str, Any] | None = None
    parent_id: str | None = None
    ttl: float | timedelta | None = None
    id: str | None = None


class Retention(BaseModel):
    """A retention policy (SPEC S17): what :meth:`~statekeeper.BaseCheckpointStore.sweep`
    removes, and how often it runs on its own. Every field is optional; a field
    left ``None`` is no rule.

    - ``keep_last=N`` (an int >= 1): each stream keeps its newest ``N`` checkpoints.
    - ``max_age``: a checkpoint last written (``updated_at``) longer ago than this
      goes, except its stream's newest, which no rule but ``idle`` removes.
    - ``idle``: a stream whose newest checkpoint was last written longer ago than
      this goes entirely.
    - ``sweep_every``: while the store is open, a sweep runs in the background at
      this interval (without it nothing runs on its own). A store opened
      ``read_only=True`` refuses it.

    Durations are seconds (int or float) or a :class:`~datetime.timedelta`, and
    must be positive. Ages are measured with the store's clock (``clock=``).
    Frozen; bad values raise ``pydantic.ValidationError`` (as
    :class:`~statekeeper.errors.InvalidOptions` when passed to ``open_store``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    keep_last: int | None = None
    max_age: timedelta | None = None
    idle: timedelta | None = None
    sweep_every: timedelta | None = None

    @field_validator("keep_last", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"keep_last must be an int >= 1 (or None), got {value!r}")
        return value

    @field_validator("max_age", "idle", "sweep_every", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
            raise ValueError(
                f"a duration must be seconds (int or float) or a timedelta, got {value!r}"
            )
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
        if not seconds > 0 or seconds == float("inf"):
            raise ValueError(f"a duration must be positive and finite, got {value!r}")
        return value if isinstance(value, timedelta) else timedelta(seconds=seconds)

    @property
    def has_rules(self) -> bool:
        """Whether any of ``keep_last``, ``max_age`` and ``idle`` is set (a sweep
        with none of them only purges expired records and returns space)."""
        return any(rule is not None for rule in (self.keep_last, self.max_age, self.idle))


class SweepReport(BaseModel):
    """What one :meth:`~statekeeper.BaseCheckpointStore.sweep` did (or, with
    ``dry_run``, would do).

    ``checkpoints_removed`` counts the checkpoints this sweep removed itself (one
    another sweep removed first is not counted), ``streams_removed`` the streams
    it removed entirely as idle; both count what would go on a dry run.
    ``bytes_reclaimed`` is the space given back where the backend can tell
    (SQLite: freed pages; the file store: the removed files), else ``None``.
    ``seconds`` is how long the sweep took.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    streams_removed: int = Field(ge=0)
    checkpoints_removed: int = Field(ge=0)
    bytes_reclaimed: int | None = None
    seconds: float = Field(ge=0)
    dry_run: bool
