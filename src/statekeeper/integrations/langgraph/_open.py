"""Opening a ``StatekeeperSaver`` from a store URL, in LangGraph's own idiom.

LangGraph's savers open from a connection string, as a sync or an async context
manager (``with SqliteSaver.from_conn_string(...)``, ``async with
AsyncSqliteSaver.from_conn_string(...)``). :class:`SaverContext` is both, so one
``StatekeeperSaver.from_conn_string(url)`` serves either use:

- ``async with``: the store is opened on the running loop and closed on exit; the
  saver's async calls run on that loop with no thread hop.
- ``with``: the store is opened behind the blocking facade
  (:mod:`statekeeper.sync`), whose own thread runs it, and closed on exit; the
  saver's sync methods block the calling thread, its async ones may be awaited
  from any loop.

The store is always opened with ``codec="raw"`` (LangGraph's serializer makes the
bytes), so passing another codec is refused before anything is opened. The saver
is made by the factory the saver class passes in, so this module does not import
the saver; so is its background sweep (``ttl={"sweep_interval_minutes": m}``),
which the context starts once the saver is made and stops before the store
closes.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from statekeeper.errors import InvalidOptions

from .._background import BackgroundSweep

if TYPE_CHECKING:
    from statekeeper._core.store import BaseCheckpointStore
    from statekeeper.sync import SyncCheckpointStore

S = TypeVar("S")
#: Makes the saver over an opened store (async, or the blocking facade).
SaverFactory = Callable[["BaseCheckpointStore[Any] | SyncCheckpointStore"], S]
#: Makes the background sweep of a saver just made.
SweepFactory = Callable[[S], BackgroundSweep[Any]]


def raw_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``codec="raw"``; another codec is refused with the reason."""
    codec = options.get("codec", "raw")
    if codec != "raw":
        raise InvalidOptions(
            f"StatekeeperSaver stores LangGraph's own bytes and opens its store with "
            f"codec='raw'; codec={codec!r} was given: leave the codec option out"
        )
    return {**options, "codec": "raw"}


def open_sync(url: str, options: dict[str, Any]) -> SyncCheckpointStore:
    """The blocking facade over the store at ``url``, opened (``codec="raw"``)."""
    from statekeeper import sync

    facade = sync.open_store(url, **raw_options(options))
    facade.open()
    return facade


class SaverContext(Generic[S]):
    """What ``StatekeeperSaver.from_conn_string`` returns: a context manager, sync
    and async, that opens the store, yields a saver over it (``make(store)``) and
    closes the store on exit, whether the block raised or not. Each ``with`` opens a
    store of its own; the object may be entered once at a time. With ``sweeping``,
    the saver's background sweep runs from entry to exit: started once the saver
    is made, stopped (and waited for) before the store closes."""

    def __init__(
        self,
        url: str,
        make: SaverFactory[S],
        options: dict[str, Any],
        sweeping: SweepFactory[S] | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"from_conn_string takes a store URL, got {url!r}")
        self._url = url
        self._saver = make
        self._sweeping = sweeping
        self._options = raw_options(options)
        self._store: BaseCheckpointStore[Any] | None = None
        self._facade: SyncCheckpointStore | None = None
        self._sweep: BackgroundSweep[Any] | None = None

    def _busy(self) -> None:
        if self._store is not None or self._facade is not None:
            raise RuntimeError("this from_conn_string context is already entered")

    async def __aenter__(self) -> S:
        from statekeeper import open_store

        self._busy()
        store = open_store(self._url, **self._options)
        await store.open()
        try:
            saver = self._saver(store)
            if self._sweeping is not None:
                self._sweep = self._sweeping(saver)
                self._sweep.start()
        except BaseException:
            await store.close()
            raise
        self._store = store
        return saver

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        store, self._store = self._store, None
        sweep, self._sweep = self._sweep, None
        if store is not None:
            try:
                if sweep is not None:
                    await sweep.stop()
            finally:
                await store.close()

    def __enter__(self) -> S:
        self._busy()
        facade = open_sync(self._url, self._options)
        try:
            saver = self._saver(facade)
            if self._sweeping is not None:
                self._sweep = self._sweeping(saver)
                self._sweep.start_on(facade.loop[0])
        except BaseException:
            facade.close()
            raise
        self._facade = facade
        return saver

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        facade, self._facade = self._facade, None
        sweep, self._sweep = self._sweep, None
        if facade is not None:
            try:
                if sweep is not None:
                    sweep.stop_on(facade.loop[0])
            finally:
                facade.close()
