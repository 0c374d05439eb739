"""Damaged records of unknown stream (*orphans*, see :mod:`.survey`) in the pages
of a stream listing read from the indexes.

No stream index holds an orphan, yet it may be any stream's checkpoint, so
``get_latest`` of a stream whose winner is older raises naming it (the newest one,
which ``state`` marks). ``list(stream)`` agrees: every page of every stream
reports each orphan whose sequence lies in the page's range in ``skipped``, with a
reason that says its stream is unknown (:func:`.view.orphan_error`, the body
``get_latest``'s error comes from). A page read from the records
(:func:`.view.view_scan`) has them from its survey; a page read from a stream
index has them merged in here, by sequence, so keyset paging and cursors work as
for any other skipped entry: each orphan is on exactly one page of a walk, and a
page still holds at most ``limit`` entries.

Which records are orphans only a survey of the records tells (O(store)), so a
reader takes one survey per rebuild: the rebuild stores a digest of its orphans
in ``state`` (:func:`orphans_digest`), and a reader keeps the orphans it found
for as long as ``state`` shows the same marker and digest. Each orphan is read
again whenever a page's range holds it, so one deleted since (by id) is left out
and one restored shows as the checkpoint it is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

from ..._core.query import ScanQuery
from ...models import Skipped
from ...record import StoredRecord
from . import layout as fmt

__all__ = ["OrphanKey", "merge_orphans", "orphans_digest", "orphans_key"]

#: What a reader's kept orphans are good for: ``state``'s marker and digest.
OrphanKey = tuple[tuple[int, str], str | None]
Entry = StoredRecord | Skipped


def orphans_digest(orphans: Iterable[tuple[int, str]]) -> str:
    """The digest a rebuild stores in ``state`` (``extra["orphans"]``) of the
    ``(sequence, id)`` of every orphan it kept."""
    h = hashlib.blake2b(digest_size=8)
    for seq, cid in sorted(orphans):
        h.update(b"%d %s\n" % (seq, cid.encode()))
    return h.hexdigest()


def orphans_key(state: fmt.State | None) -> OrphanKey | None:
    """``None`` when ``state`` marks no orphan (a page needs no merge), else the key
    under which a reader keeps the orphans it surveyed."""
    if state is None or state.orphan is None:
        return None
    digest = state.extra.get("orphans")
    return state.orphan, digest if isinstance(digest, str) else None


def merge_orphans(
    page: list[Entry],
    q: ScanQuery,
    orphans: Sequence[tuple[int, str]],
    look: Callable[[int, str], StoredRecord | Skipped | None],
) -> list[Entry]:
    """``page`` (a scan of ``q`` from a stream index, in ``q``'s order) with every
    orphan of ``orphans`` (ascending) in the page's range put in its place:
    beyond ``q.bound``, and up to the page's last entry when the page is full (a
    page that is not full reached the end of the stream, so its range does too).
    ``look`` reads an orphan again: its :class:`Skipped` entry, the record if it is
    readable again (and of this stream, and listed by ``q``), or ``None`` (gone).
    The result is cut to ``q.limit``: what falls off is the next page's."""
    asc = q.order == "asc"
    lo, hi = 0, fmt.MAX_SEQUENCE + 1  # exclusive
    if q.bound is not None:
        lo, hi = (q.bound, hi) if asc else (lo, q.bound)
    if len(page) >= q.limit:
        edge = _seq(page[-1])
        lo, hi = (lo, edge) if asc else (edge, hi)
    listed = {_seq(e) for e in page}
    found: list[Entry] = []
    for seq, cid in orphans:
        if lo < seq < hi and seq not in listed and (entry := look(seq, cid)) is not None:
            found.append(entry)
    if not found:
        return page
    merged = sorted([*page, *found], key=_seq, reverse=not asc)
    return merged[: q.limit]


def _seq(entry: Entry) -> int:
    seq = entry.sequence
    assert seq is not None, "every entry of a stream's scan has its sequence"
    return seq
