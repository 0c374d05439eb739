"""The byte frame of a record: a prefix line with both lengths and the checksum.

::

    SK1 <header_len> <state_len> <crc32 hex>\\n<header bytes><state bytes>

:func:`join` builds it; :func:`split` checks it (magic, prefix spelling, lengths,
checksum) and gives back the header and state bytes, or raises :class:`Malformed`
with the reason. The frame knows nothing of what the two parts hold.
"""

from __future__ import annotations

import re
import zlib

__all__ = ["MAGIC", "Malformed", "join", "split"]

MAGIC = b"SK1 "
_MAX_PREFIX = 64
# strict: decimal lengths without signs or spaces, lowercase hex, so no two spellings
# of a prefix mean the same thing and every flipped byte is caught
_PREFIX = re.compile(rb"SK1 (0|[1-9][0-9]{0,11}) (0|[1-9][0-9]{0,11}) ([0-9a-f]{8})\n")


class Malformed(Exception):
    """Why record bytes cannot be read; the caller adds where and which record."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def join(head: bytes, state: bytes) -> bytes:
    """The framed record: prefix, then ``head``, then ``state``."""
    crc = zlib.crc32(state, zlib.crc32(head))
    return b"%s%d %d %08x\n" % (MAGIC, len(head), len(state), crc) + head + state


def split(data: bytes) -> tuple[bytes, bytes]:
    """The header and state bytes of a framed record, checked, or :class:`Malformed`.

    ``data`` must be ``bytes`` (a caller with a ``bytearray`` or ``memoryview``
    converts it first).
    """
    prefix = _PREFIX.match(data, 0, _MAX_PREFIX)
    if prefix is None:
        if not data.startswith(MAGIC):
            raise Malformed("not a statekeeper record (bad magic)")
        raise Malformed("malformed record prefix")
    head_len, state_len, crc = prefix.groups()
    start = prefix.end()
    hlen = int(head_len)
    if len(data) - start != hlen + int(state_len):
        raise Malformed(
            f"record is {len(data) - start} bytes long but its prefix says "
            f"{hlen + int(state_len)} (torn or truncated write)"
        )
    head, state = data[start : start + hlen], data[start + hlen :]
    if zlib.crc32(state, zlib.crc32(head)) != int(crc, 16):
        raise Malformed("checksum mismatch (the record is corrupt)")
    return head, state
