"""The Agent Framework storage's store, opened lazily on the event loop that uses it.

Agent Framework builds storages synchronously and never closes them, so
:class:`LazyStore` opens the store on the first call, once, under a lock, on the
event loop of that call, and stays bound to that loop. When that loop has been
closed (successive ``asyncio.run`` calls), a store it opened is reopened on the
new loop; a call from another loop while the first one runs raises
``RuntimeError``. A store passed in open stays the caller's to close.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from ..._core.store import BaseCheckpointStore

logger = logging.getLogger("statekeeper.integrations.agent_framework")


class LazyStore:
    """``store``, opened by :meth:`ready` on first use and closed by :meth:`aclose`
    if this opened it."""

    def __init__(self, store: BaseCheckpointStore) -> None:
        self.store = store
        # Guarded by a thread lock because the claiming loop may change (successive
        # asyncio.run calls); the asyncio lock serializes the opening on that loop.
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open_lock: asyncio.Lock | None = None
        self._owns_store = False
        self._stale = False

    async def ready(self) -> BaseCheckpointStore:
        """The open store: opened on the first call, once, on the calling loop."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self.store.is_open and not self._stale:
            return self.store
        lock = self._claim(loop)
        async with lock:
            if self._stale:
                self._stale = False
                try:
                    # The handle belongs to a dead loop: release what can be released.
                    await self.store.close()
                except Exception:
                    logger.debug("closing a store left on a closed event loop", exc_info=True)
            if not self.store.is_open:
                await self.store.open()
                self._owns_store = True
        return self.store

    def _claim(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        with self._guard:
            if self._loop is not loop or self._open_lock is None:
                old = self._loop
                if old is not None and not old.is_closed():
                    raise RuntimeError(
                        f"this StatekeeperCheckpointStorage over {self.store.describe()} is "
                        "bound to another running event loop; use one storage per loop"
                    )
                if old is not None and self.store.is_open:
                    if not self._owns_store:
                        raise RuntimeError(
                            f"{self.store.describe()} was opened by the caller on an event "
                            "loop that is now closed; open it again, or pass an unopened "
                            "store or a URL so that the storage manages it"
                        )
                    self._stale = True
                self._loop = loop
                self._open_lock = asyncio.Lock()
            return self._open_lock

    async def aclose(self) -> None:
        """Close the store if this opened it (a store passed in open stays open).
        Idempotent; a later :meth:`ready` opens the store again."""
        with self._guard:
            owns = self._owns_store
            dead_loop = self._loop is not None and self._loop.is_closed()
            self._owns_store = False
            self._stale = False
            self._loop = None
            self._open_lock = None
        if not owns:
            return
        if not dead_loop:
            await self.store.close()
            return
        try:
            await self.store.close()
        except Exception:
            # Connections of a finished loop can only be dropped, not closed.
            logger.debug("closing a store left on a closed event loop", exc_info=True)
