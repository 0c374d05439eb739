"""The one finalizer for a store collected unclosed.

A store's threads wait on their queues forever, each holding what it owns (a
connection, file descriptors, the saves in a ``-wal`` file), so a store that is
garbage-collected without ``close()`` must still let them go. :func:`when_collected`
registers the release (it must neither await nor block: it may run on any thread,
during garbage collection); :meth:`~weakref.finalize.detach` cancels it when the
store closes normally. The release must not hold a reference to the store itself,
or it would keep it alive.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

__all__ = ["when_collected"]


def when_collected(owner: object, release: Callable[[], object]) -> weakref.finalize[[], object]:
    """Call ``release()`` once ``owner`` is collected (or at interpreter exit), unless
    the returned handle is detached first."""
    return weakref.finalize(owner, release)
