"""The store id a SQL store's records carry, against the one its meta row names.

Every record names the store it was written by (``"store"`` in its header), and
records are the truth (SPEC S3a): a meta row is derived data. So when the meta row
``store_id`` names an id that no readable record carries while the records agree
on one, the meta row is the damage, not the records. Reading the records as
"belonging to another store" instead would make ``verify`` blame them and
``repair(drop_damaged=True)`` delete every acknowledged checkpoint.

:func:`store_id_on_record` decides, on every open (see
:func:`.derived.probe_meta`). The common case costs one indexed read of the
newest row: its header names the meta row's id. Only when it does not (the meta row
is damaged, or the newest row holds a record that is not this store's) does it read
every row, verifying each record's checksum, and count the ids they carry.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ....errors import CheckpointDecodeError
from ....record import MAGIC, StoredRecord
from ..dialects import Session
from ..schema import Statements

__all__ = ["STORE_ID", "StoreIdVerdict", "header_store", "store_id_on_record"]

#: The form of a store id (a meta row that does not match it is unreadable).
STORE_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")

#: Rows per page of the full walk.
_PAGE = 500


def header_store(data: Any) -> str | None:
    """The ``"store"`` a record's header names, unverified; ``None`` if it has none."""
    if not isinstance(data, bytes | bytearray | memoryview):
        return None
    data = bytes(data)
    try:
        end = data.index(b"\n")
        hlen = int(data[len(MAGIC) : end].split()[0])
        store = json.loads(data[end + 1 : end + 1 + hlen])["store"]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return store if isinstance(store, str) and STORE_ID.fullmatch(store) else None


def _verified_store(data: Any, seq: int, where: str) -> str | None:
    """The store a record names, if its checksum and position check out."""
    try:
        StoredRecord.from_bytes(data, location=where, expect_sequence=seq)
    except CheckpointDecodeError:
        return None
    return header_store(data)


@dataclass(frozen=True)
class StoreIdVerdict:
    """The store id to read the records with, and why, if it is not the meta row's."""

    store_id: str | None  # None: no readable record names one, and the meta row is unusable
    #: Why the meta row is damaged (``None``: it is right, or there is nothing to say).
    damage: str | None = None


def _count(s: Session, st: Statements, where: str) -> tuple[Counter[str], dict[str, int]]:
    """Readable records per store id, and the newest sequence of each."""
    counts: Counter[str] = Counter()
    newest: dict[str, int] = {}
    after = 0
    while True:
        rows = s.rows(st.rows_after, {"after": after, "limit": _PAGE})
        for seq, _, _, _, blob in rows:
            store = _verified_store(blob, int(seq), where)
            if store is not None:
                counts[store] += 1
                newest[store] = max(newest.get(store, 0), int(seq))
        if len(rows) < _PAGE:
            return counts, newest
        after = int(rows[-1][0])


def store_id_on_record(s: Session, st: Statements, where: str, claimed: str) -> StoreIdVerdict:
    """Which store id the records say this store has, given the meta row's ``claimed``
    (``""`` if the row is missing or unreadable).

    - The newest row's header names ``claimed``, or some readable record does: the
      meta row is right (records naming another id are damaged records, which the
      listings report).
    - No record is readable: the meta row stands if it is readable.
    - Otherwise the records name other ids: the one most readable records carry
      (the newest of those, on a tie) is the store's, and the meta row is damaged.
    """
    valid = bool(STORE_ID.fullmatch(claimed))
    if valid:
        row = s.first(st.newest_records, {"limit": 1})
        if row is None or header_store(row[1]) == claimed:
            return StoreIdVerdict(claimed)
    counts, newest = _count(s, st, where)
    if (valid and claimed in counts) or not counts:
        return StoreIdVerdict(claimed if valid else None)
    best = max(counts, key=lambda sid: (counts[sid], newest[sid]))
    total = sum(counts.values())
    if len(counts) == 1:
        agree = f"every readable record ({total}) names {best!r}"
    else:
        agree = (
            f"the readable records name {len(counts)} store ids and none is the meta "
            f"row's; {counts[best]} of {total} name {best!r}, which is read as the store's "
            "(the others are reported as damaged records)"
        )
    if valid:
        said = f"the store_id row says {claimed!r}, but {agree}"
    else:
        said = f"the store_id row is missing or unreadable; {agree}"
    return StoreIdVerdict(best, f"{said}; the records are the truth")
