"""Rotation and migration (``statekeeper rekey``): every record under the active key.

:func:`rekey_store` walks a store's records in sequence order, straight from the backend,
and rewrites each one that is plaintext, under a retired key, or sealed with the
other ``encrypt_metadata`` setting: opened (the tag checked), sealed under the
active key with a fresh nonce, and written back by the backend's ``_update`` with
its own etag, timestamps and position, as a compare-and-set on its etag. Nothing
else changes: ids, sequences, etags, order, expiry.

It is resumable by construction: a record already under the active key is left
alone, so a run killed half way (SIGKILL) and run again does only the rest, and
each record is rewritten atomically by its backend. A record that a writer changed
meanwhile was written under the active key by that writer, and is counted as such.
A record that cannot be opened (damaged, unknown key) stays as it is and is
reported; expired records are not rewritten (``purge_expired`` reclaims them).
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from ..cursor import MAX_POSITION
from ..encryption.envelope import inner_codec, key_id_of
from ..errors import CheckpointDecodeError, CheckpointNotFound, InvalidOptions, PreconditionFailed
from ..models import Problem, Skipped, VerifyReport
from ..record import StoredRecord, Update, header_values
from ..telemetry._switch import traced
from .primitives import StorePrimitives
from .query import ScanQuery
from .sealing import Encryption, SealedPrimitives
from .validate import skipped_from

__all__ = [
    "PAGE",
    "RekeyReport",
    "Rekeyable",
    "rekey_records",
    "rekey_store",
    "retired_key_problems",
    "with_key_notices",
]

#: Records read per scan of the walk.
PAGE = 200


@dataclass
class RekeyReport:
    """What :func:`rekey_records` did: records ``examined``, ``rekeyed`` (of which
    ``encrypted`` were plaintext), ``current`` (already under the active key),
    ``changed`` (rewritten by a concurrent writer meanwhile) and ``failed`` (records
    that do not open, left as they are)."""

    active: str
    examined: int = 0
    rekeyed: int = 0
    encrypted: int = 0
    current: int = 0
    changed: int = 0
    failed: builtins.list[Skipped] = field(default_factory=builtins.list)

    @property
    def ok(self) -> bool:
        """Whether every live record is now under the active key."""
        return not self.failed


class Rekeyable(Protocol):
    """What :func:`rekey_store` uses of a store (a ``BaseCheckpointStore``)."""

    _encryption: Encryption | None
    _sealed: SealedPrimitives | None

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def now(self) -> datetime: ...


@traced("rekey")  # S18
async def rekey_store(
    store: Rekeyable,
    progress: Callable[[int], None] | None = None,
    *,
    encrypt_plaintext: bool | None = None,
) -> RekeyReport:
    """Open ``store`` (unopened, built with ``encryption=``; a plaintext store
    opens too), rewrite every record that is not under the active key, and close
    it. ``progress`` is called with the number of records examined since its last
    call. ``encrypt_plaintext`` says which plaintext records are encrypted (see
    :func:`rekey_records`). Raises :class:`~statekeeper.errors.InvalidOptions` for a
    store built without encryption."""
    encryption = store._encryption
    if encryption is None:
        raise InvalidOptions(
            "rekey needs the keys: open the store with encryption= (set STATEKEEPER_KEYS "
            "for the command line, the active key first)"
        )
    encryption.rekeying = True
    try:
        await store.open()
    finally:
        encryption.rekeying = False
    try:
        assert store._sealed is not None, "an open encrypted store has sealed primitives"
        return await rekey_records(store._sealed, store.now, progress, encrypt_plaintext)
    finally:
        await store.close()


async def rekey_records(
    sealed: SealedPrimitives,
    now: Callable[[], datetime],
    progress: Callable[[int], None] | None = None,
    encrypt_plaintext: bool | None = None,
) -> RekeyReport:
    """Rewrite every live record of an open store whose ``sealed`` primitives are
    given that is not sealed under the active key; see the module docstring.

    Which plaintext records are encrypted: all with ``encrypt_plaintext=True``,
    none with ``False``. By default (``None``) those that a migration explains: all
    of them in a store with no encrypted record, and, in a store that has some,
    those after its last encrypted record in sequence order, which is what a
    migration interrupted part way leaves (the walk goes in that order). A plaintext
    record below an encrypted one was not written by a store being migrated (it may
    be planted): it is left as it is and reported in ``failed``, so that a rotation
    never makes it look authentic. A first pass over the records finds the last
    encrypted one (nothing is decrypted).
    """
    inner = sealed.inner
    sealer = sealed.sealer
    active = sealer.keyring.active
    report = RekeyReport(active)
    # plaintext records below this sequence are left alone (0: none is)
    if encrypt_plaintext is None:
        plaintext_from = await _last_sealed(inner, now)
    else:
        plaintext_from = 0 if encrypt_plaintext else MAX_POSITION + 1
    async for batch in _walk(inner, now):
        for entry in batch:
            report.examined += 1
            if isinstance(entry, Skipped):
                report.failed.append(entry)
            elif plaintext_from and entry.sequence < plaintext_from and _plaintext(entry):
                report.failed.append(_unexplained(sealed, entry, plaintext_from))
            else:
                await _reseal(sealed, inner, entry, active, report)
        if progress is not None:
            progress(len(batch))
    return report


def _plaintext(record: StoredRecord) -> bool:
    return inner_codec(record.codec) is None


async def _last_sealed(inner: StorePrimitives, now: Callable[[], datetime]) -> int:
    """The sequence of the last live encrypted record (0: none)."""
    last = 0
    async for batch in _walk(inner, now):
        for entry in batch:
            if isinstance(entry, StoredRecord) and not _plaintext(entry):
                last = entry.sequence
    return last


async def _walk(
    inner: StorePrimitives, now: Callable[[], datetime]
) -> AsyncIterator[builtins.list[StoredRecord | Skipped]]:
    """Every live record of the backend ``inner``, as stored, in sequence order, a
    scan of :data:`PAGE` at a time."""
    bound: int | None = None
    while batch := await inner._scan(ScanQuery(None, "asc", bound, PAGE, {}, now(), True)):
        yield batch
        bound = batch[-1].sequence


def _unexplained(sealed: SealedPrimitives, record: StoredRecord, first: int) -> Skipped:
    """The report of a plaintext record that no migration explains."""
    if first > MAX_POSITION:
        why = "a plaintext record, left as it is (encrypt_plaintext is off)"
    else:
        why = (
            f"a plaintext record below an encrypted one (at sequence {first}): no "
            "migration leaves that, so it may be planted; left as it is. "
            "Delete it if you did not write it, or pass --encrypt-plaintext to encrypt it"
        )
    return Skipped(
        id=record.id,
        sequence=record.sequence,
        location=sealed.where(record.id),
        reason=why,
        error="RecordNotEncrypted",
    )


async def _reseal(
    sealed: SealedPrimitives,
    inner: StorePrimitives,
    record: StoredRecord,
    active: str,
    report: RekeyReport,
) -> None:
    sealer = sealed.sealer
    plaintext = _plaintext(record)
    carried = not plaintext and sealer.carries_metadata(record.state)
    if (
        not plaintext
        and key_id_of(record.codec, record.state) == active
        and carried == sealer.seals_metadata
    ):
        report.current += 1
        return
    try:
        opened = record if plaintext else sealed.open_record(record)
    except CheckpointDecodeError as exc:
        report.failed.append(skipped_from(exc, record.id, record.sequence))
        return
    values = header_values(opened)
    codec, envelope = sealer.seal(
        values["id"],
        values["stream"],
        opened.codec,
        opened.state,
        values["tags"],
        values["metadata"],
    )
    edits = sealed.edits_for(None, carried, values["tags"], values["metadata"])
    try:
        await inner._update(
            Update(
                id=values["id"],
                state=envelope,
                codec=codec,
                now=values["updated_at"],
                etag=values["etag"],
                if_match=values["etag"],
                edits=edits,
            )
        )
    except (PreconditionFailed, CheckpointNotFound):
        report.changed += 1  # its writer sealed it under the active key, or deleted it
        return
    report.rekeyed += 1
    report.encrypted += plaintext


async def retired_key_problems(
    sealed: SealedPrimitives, now: Callable[[], datetime]
) -> builtins.list[Problem]:
    """One ``"retired-key"`` problem per live record sealed under a key of the ring
    that is not the active one (readable; ``statekeeper rekey`` moves it). Nothing
    is decrypted: the envelope names its key. Plaintext and undecryptable records
    are the walk's (``"plaintext"``, ``"undecryptable"``)."""
    sealer, inner = sealed.sealer, sealed.inner
    active = sealer.keyring.active
    found: builtins.list[Problem] = []
    async for batch in _walk(inner, now):
        for entry in batch:
            if isinstance(entry, StoredRecord):
                kid = key_id_of(entry.codec, entry.state)
                if kid is not None and kid != active and kid in sealer.keyring:
                    found.append(
                        Problem(
                            kind="retired-key",
                            location=sealed.where(entry.id),
                            reason=f"sealed under the retired key {kid!r}, not the active "
                            f"{active!r}; 'statekeeper rekey' re-encrypts it",
                            id=entry.id,
                            sequence=entry.sequence,
                            stream=entry.stream,
                        )
                    )
    return found


async def with_key_notices(
    report: VerifyReport,
    sealed: SealedPrimitives | None,
    now: Callable[[], datetime],
) -> VerifyReport:
    """``report`` with the ``"retired-key"`` notices of an encrypted store (whose
    ``sealed`` primitives are given) added."""
    if sealed is None:
        return report
    notices = await retired_key_problems(sealed, now)
    if not notices:
        return report
    return report.model_copy(update={"problems": [*report.problems, *notices]})
