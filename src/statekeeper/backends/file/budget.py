"""What one read may do on the event loop's thread, and how it says it would block.

Every read of the file backend (``get_latest``, ``load``, ``load_many``, a listed
page and its probe) and a lone save in ``durability="fast"`` is ONE function of the
engine, which takes a :class:`Budget`. The store runs it first right on the event
loop's thread with an inline budget (``inline_reads``); wherever the function would
block (a lock to take, a sleep, a retry, a heal of a crashed writer's journal, a
survey of the records, a record over :data:`INLINE_RECORD_BYTES`, or the budget of
slots and records spent) it calls :meth:`Budget.block`, which raises
:class:`WouldBlock` before anything is written, and the store runs the very same
function again in the worker thread with :data:`WORKER`, whose ``block`` does
nothing: there the function does what it always did. So both paths give the same
answers and errors by construction (``tests/file/test_file_inline_differential.py``
holds them against each other).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "INLINE_DELETED",
    "INLINE_EXTRA_RECORDS",
    "INLINE_EXTRA_SLOTS",
    "INLINE_RECORD_BYTES",
    "INLINE_TAIL_RECORDS",
    "INLINE_TAIL_SLOTS",
    "WORKER",
    "Budget",
    "WouldBlock",
]

#: The most index slots and record files ``get_latest`` looks at inline: a tail of
#: expired checkpoints is walked in the worker, not on the loop.
INLINE_TAIL_SLOTS = 16
INLINE_TAIL_RECORDS = 2
#: What a page scan may pass over inline beyond the page itself: index slots that
#: are deleted, expired or past the reader's cap, and records it reads but does not
#: list (expired, or without the tags asked for). A sparse tag filter or a long run
#: of deleted checkpoints is walked in the worker.
INLINE_EXTRA_SLOTS = 64
INLINE_EXTRA_RECORDS = 16
#: Deleted entries of an id that ``load`` checks inline (one ``lstat`` each).
INLINE_DELETED = 4
#: The largest record file read inline: a bigger one is read in the worker, so a
#: cold read of a large file never stalls the loop.
INLINE_RECORD_BYTES = 1 << 20


class WouldBlock(Exception):
    """An inline call met what only the worker may do: run it again there."""


class Budget:
    """The budget of one call: ``inline`` on the event loop's thread, else the
    worker's (:data:`WORKER`, which never blocks). ``seen`` (inline only) holds the
    bucket directory this call last checked by ``lstat`` (see
    :meth:`.reads.Reader.load`)."""

    __slots__ = ("inline", "seen")

    def __init__(self, *, inline: bool) -> None:
        self.inline = inline
        self.seen: dict[int, int] = {}

    def block(self) -> None:
        """Here the call would block: inline, raise :class:`WouldBlock` (the store
        reruns the call in the worker); in the worker, go on."""
        if self.inline:
            raise WouldBlock


#: The worker's budget: unlimited, and ``block`` does nothing.
WORKER: Final = Budget(inline=False)
