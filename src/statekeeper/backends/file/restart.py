"""Restart recovery of the file backend: after a machine restart (the boot id in
``state`` is not this boot's), a power cut may have lost index writes that were
never flushed, so every record above the sync mark is indexed again and index
entries whose record did not survive are dropped. Run by a writable open, under
the write lock (see :mod:`.opening`)."""

from __future__ import annotations

from collections.abc import Iterator

from ...errors import CheckpointDecodeError
from ...record import StoredRecord
from . import layout as fmt
from .core import RecordProblem, Txn
from .io import read_exact
from .rebuild import index_names
from .recovery import Recovery
from .stream_index import IndexDamaged

__all__ = ["recover_restart"]


def records_above(
    recovery: Recovery, lo: int, hi: int
) -> Iterator[tuple[int, str, StoredRecord | None]]:
    """``(seq, id, record)`` of every record file with ``lo < seq <= hi``, in
    sequence order; ``record`` is ``None`` for a damaged one."""
    records = recovery.core.fd("records")
    first, last = fmt.bucket_of(lo + 1), fmt.bucket_of(hi)
    buckets = sorted(
        b
        for b in map(fmt.parse_bucket_name, recovery.core.io.listdir(records))
        if b is not None and first <= b <= last
    )
    for bucket in buckets:
        bfd = recovery.core.open_dir(records, fmt.bucket_name(bucket), create=False)
        if bfd is None:
            continue
        try:
            names = sorted(
                (p, n) for n in recovery.core.io.listdir(bfd) if (p := fmt.parse_record_name(n))
            )
            for (seq, cid), name in names:
                if not lo < seq <= hi or fmt.bucket_of(seq) != bucket:
                    continue
                try:
                    data = recovery.core.read_file(bfd, name)
                    if data is not None:
                        yield seq, cid, recovery.core.decode(data, seq, cid)
                except (RecordProblem, CheckpointDecodeError):
                    yield seq, cid, None
        finally:
            recovery.core.io.close(bfd)


def recover_restart(recovery: Recovery, tx: Txn, boot: str | None) -> None:
    """After a machine restart, index again every record above the sync mark (a
    power cut may have lost unflushed index writes) and drop index entries whose
    record did not survive. A damaged record there that no index names raises
    :class:`IndexDamaged`, so the caller rebuilds (which finds its stream)."""
    lo = tx.state.synced
    hwm = max(tx.state.hwm, recovery.rebuild.max_on_disk())
    # No write is in flight (the lock is held, and the machine restarted): a
    # temp file above the mark is a save or group commit cut short.
    recovery.rebuild.remove_temps(lo + 1, None)
    found: dict[str, list[StoredRecord]] = {}
    present: set[int] = set()
    damaged: list[tuple[int, str]] = []
    for seq, cid, record in records_above(recovery, lo, hwm):
        present.add(seq)
        if record is None:
            damaged.append((seq, cid))
        else:
            found.setdefault(fmt.stream_file_name(record.stream), []).append(record)
    for sfile in set(found) | dirty_names(recovery):
        recs = found.get(sfile, [])
        merge_tail(recovery, tx, sfile, recs[0].stream if recs else None, lo, recs, present)
    for seq, cid in damaged:
        if recovery.rebuild.stream_of(seq, cid) is None:
            raise IndexDamaged(f"damaged record {seq} is in no stream index")
    used = tx.state.ids_used
    with recovery.core.open_ids(write=True) as ids:
        for pos, key, seq in list(ids.entries()):
            if lo < seq <= hwm and seq not in present:
                ids.tombstone(pos, key, seq)
        for recs in found.values():
            for record in recs:
                used += ids.insert(fmt.id_key(record.id), record.sequence)
        for seq, cid in damaged:
            used += ids.insert(fmt.id_key(cid), seq)
        if recovery.core.durable:
            ids.sync()
    tx.commit(hwm=hwm, synced=hwm, boot=boot, ids_used=used)
    tx.sync()
    recovery.core.io.ftruncate(recovery.core.fd("dirty"), 0)
    recovery.core.dirty_noted = frozenset()


def dirty_names(recovery: Recovery) -> set[str]:
    dirty_fd = recovery.core.fd("dirty")
    size = recovery.core.io.fstat(dirty_fd).st_size
    text = read_exact(recovery.core.io, dirty_fd, size, 0).decode("ascii", "replace")
    return index_names(text)


def merge_tail(
    recovery: Recovery,
    tx: Txn,
    sfile: str,
    stream: str | None,
    lo: int,
    records: list[StoredRecord],
    present: set[int],
) -> None:
    idx = recovery.core.open_index(sfile, write=True)  # damaged: the caller rebuilds
    if idx is None:
        if stream is None:
            return
        recovery.rebuild.create_index(tx, sfile, stream)
        idx = recovery.core.open_index(sfile, write=True)
        assert idx is not None
    with idx:
        idx.repair_tail()
        # Walk back to the last slot at or below the sync mark: everything after
        # it was written without an fsync and may be torn (a power cut), so it is
        # read leniently and rebuilt from the records.
        start, tail = idx.count, []
        while start > 0:
            slot = idx.read_lenient(start - 1)
            if slot is not None and slot.seq <= lo:
                break
            start -= 1
            if slot is not None:
                tail.append(slot)
        tail.reverse()
        garbage = len(tail) < idx.count - start
        keep = [s for s in tail if s.seq in present]
        doomed = [s for s in keep if not s.live]
        have = {s.seq for s in keep}
        keep += [
            fmt.Slot(r.sequence, r.id, fmt.to_micros(r.header.expires_at))
            for r in records
            if r.sequence not in have
        ]
        keep.sort(key=lambda s: s.seq)
        if keep != tail or garbage:
            idx.truncate(start)
            for slot in keep:
                idx.append(slot)
        recovery.rebuild.unlink_records(doomed)
        if recovery.core.durable:
            idx.sync()
