"""Record bytes to checked values: the one body every read of a record runs.

:func:`verify` splits the frame (:mod:`~statekeeper.record.frame`), parses the header
(:mod:`~statekeeper.record.header`) and holds the record to what the caller expects
(its store id, id and sequence). A failure is a
:class:`~statekeeper.errors.CheckpointDecodeError` naming where the record lives
(computed only then) and whatever id and sequence are known.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statekeeper.errors import CheckpointDecodeError
from statekeeper.record.frame import Malformed, split
from statekeeper.record.header import parse_header

__all__ = ["Where", "verify"]

#: Where a record lives: the text itself, or a function of the sequence giving it
#: (so that a read that succeeds never builds the text).
Where = str | Callable[[int], str]

Verified = tuple[dict[str, Any], bytes, str, float | None]


def verify(
    data: bytes,
    where: Where,
    *,
    expect_store_id: str | None,
    expect_id: str | None,
    expect_sequence: int | None,
) -> Verified:
    """``(header values, state bytes, codec name, ttl)`` of a record that is intact
    and is the one expected, else :class:`CheckpointDecodeError`.

    Checked: the type of ``data``, the frame (magic, prefix, lengths, checksum), the
    header (:func:`statekeeper.record.header.parse_header`), and that the record's store
    id, id and sequence are the expected ones where given. A positional record
    (``"seq": null``) takes ``expect_sequence``.
    """
    if type(data) is not bytes:
        if not isinstance(data, bytearray | memoryview):
            raise _fail(
                f"record is {type(data).__name__}, not bytes", expect_id, where, expect_sequence
            )
        data = bytes(data)
    try:
        head, state = split(data)
        values, store_id, codec, ttl, stored_seq = parse_header(head, expect_sequence)
    except Malformed as exc:
        raise _fail(exc.reason, expect_id, where, expect_sequence) from None
    rid = values["id"]
    if expect_store_id is not None and store_id != expect_store_id:
        raise _fail(f"record belongs to another store ({store_id!r})", rid, where, expect_sequence)
    if expect_id is not None and rid != expect_id:
        raise _fail(f"record says its id is {rid!r}", expect_id, where, expect_sequence)
    if expect_sequence is not None and stored_seq is not None and stored_seq != expect_sequence:
        raise _fail(
            f"record says its sequence is {stored_seq}, "
            f"but it is stored at sequence {expect_sequence}",
            rid,
            where,
            expect_sequence,
        )
    return values, state, codec, ttl


def _fail(
    reason: str, rid: str | None, where: Where, sequence: int | None
) -> CheckpointDecodeError:
    if isinstance(where, str):
        location = where
    else:
        # read_record and read_checkpoint always know the sequence they read at
        location = where(sequence) if sequence is not None else where(0)
    return CheckpointDecodeError(reason, id=rid, location=location, sequence=sequence)
