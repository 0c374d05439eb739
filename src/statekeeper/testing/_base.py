"""Fixtures, helpers and test types shared by the conformance kit's test groups."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeAlias

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, settings
from pydantic import BaseModel

from .._core.interface import Order
from .._core.store import BaseCheckpointStore
from ..encryption.envelope import Sealer, inner_codec
from ..encryption.providers import resolve_keyring
from ..errors import InvalidQuery
from ..models import Checkpoint, Page
from ..record import StoredRecord
from ._pages import PageBound, checkpoints_in
from .plugin import examples_scale

__all__ = [
    "FakeClock",
    "KitBase",
    "KitColor",
    "KitModel",
    "KitRecord",
    "StoreFactory",
    "assert_same_value",
    "corruptions",
]

#: What a backend's ``store_factory`` fixture returns: ``(**options) -> store``, a new
#: unopened store over the same underlying data on every call.
StoreFactory: TypeAlias = Callable[..., BaseCheckpointStore]

#: A fixed instant for frozen clocks (any instant works; this one has microseconds
#: so that a backend that drops them is caught by the round-trip checks).
EPOCH = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


class FakeClock:
    """A clock for ``clock=``: frozen at ``start`` until :meth:`advance` moves it."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward by ``seconds`` and return the new time."""
        self.now += timedelta(seconds=seconds)
        return self.now


class KitModel(BaseModel):
    """A pydantic model the kit stores to exercise the ``allowed_types`` allowlist."""

    name: str
    count: int


@dataclasses.dataclass(frozen=True)
class KitRecord:
    """A dataclass the kit stores to exercise the ``allowed_types`` allowlist."""

    x: int
    label: str


class KitColor(enum.Enum):
    """An enum the kit stores to exercise the ``allowed_types`` allowlist."""

    RED = 1
    BLUE = 2


#: Every class the kit may put on an allowlist.
KIT_TYPES: tuple[type, ...] = (KitModel, KitRecord, KitColor)


def assert_same_value(actual: Any, expected: Any, path: str = "state") -> None:
    """Assert ``actual == expected`` with the same type at every level.

    Plain ``==`` accepts ``True`` for ``1``, ``1.0`` for ``1`` and a naive-looking
    equal datetime in another offset, all of which a codec must keep apart.
    """
    assert type(actual) is type(expected), (
        f"{path}: expected {type(expected).__name__} {expected!r}, "
        f"got {type(actual).__name__} {actual!r}"
    )
    if isinstance(expected, dict):
        assert set(actual) == set(expected), (
            f"{path}: keys {sorted(map(repr, actual))} != {sorted(map(repr, expected))}"
        )
        for key, value in expected.items():
            assert_same_value(actual[key], value, f"{path}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same_value(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
        if isinstance(expected, datetime):
            assert actual.utcoffset() == expected.utcoffset(), f"{path}: UTC offset changed"


def corruptions(raw: bytes) -> dict[str, bytes]:
    """Damaged versions of a record's stored envelope bytes, by name.

    Each must be detected when read (checksum, length or format), never decoded into
    different valid data.
    """
    middle = len(raw) // 2
    return {
        "truncated": raw[:-1],
        "garbage": b"this is not a statekeeper record \x00\xff",
        "byte_flip": raw[:middle] + bytes([raw[middle] ^ 0x01]) + raw[middle + 1 :],
        "empty": b"",
    }


class KitBase:
    """Fixtures and helpers of :class:`~statekeeper.testing.CheckpointStoreTests`."""

    #: Multiplies the size of the kit's expensive tests (the state machine's
    #: examples). Lower it for a slow backend, raise it for a deep run.
    examples_scale: ClassVar[float] = 1.0
    #: Examples the state machine runs (before scaling).
    state_machine_examples: ClassVar[int] = 25
    #: Steps per state machine example.
    state_machine_steps: ClassVar[int] = 30
    #: Option sets to run the whole kit under, by name: every test (the state
    #: machine too) runs once per set, with the name in its test id, and the set is
    #: passed to ``store_factory`` on every call, under the options the kit passes
    #: itself. Use it to run the kit over each of a backend's read or write paths,
    #: e.g. ``{"inline": {"inline_reads": True}, "worker": {"inline_reads": False}}``.
    #: Empty (the default): every test runs once, with the kit's options only.
    option_sets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: Per option set, by name: multiplies the state machine's examples in that set
    #: only (on top of :attr:`examples_scale`), e.g. ``{"encrypted": 0.4}`` for a slow
    #: server where the other set already covers the backend's statements.
    option_set_examples: ClassVar[Mapping[str, float]] = {}

    _kit_factory: StoreFactory
    _kit_opened: list[BaseCheckpointStore]

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Run each test once per :attr:`option_sets` entry (pytest calls this)."""
        sets = self.option_sets
        if sets and "kit_options" in metafunc.fixturenames:
            names = list(sets)
            metafunc.parametrize("kit_options", [dict(sets[n]) for n in names], ids=names)

    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        """Override in the backend's test class: return ``(**options) -> unopened store``."""
        pytest.fail(
            f"{type(self).__name__} must define a 'store_factory' fixture returning a function "
            "(**options) -> unopened store over the same data on every call; see "
            "statekeeper.testing"
        )

    @pytest.fixture
    def kit_options(self) -> dict[str, Any]:
        """The options of the :attr:`option_sets` entry this test runs under ({} if none)."""
        return {}

    @pytest.fixture
    def kit_factory(self, store_factory: StoreFactory, kit_options: dict[str, Any]) -> StoreFactory:
        """``store_factory`` with this test's option set (:attr:`option_sets`) added to
        every call; the kit builds every store through it."""
        if not kit_options:
            return store_factory

        def make(**options: Any) -> BaseCheckpointStore:
            return store_factory(**{**kit_options, **options})

        return make

    def state_machine_settings(self, config: pytest.Config) -> settings:
        """The Hypothesis settings of the state machine test.

        Built from the size knobs and ``--statekeeper-examples-scale`` on top of the
        active Hypothesis profile; override to change anything else (a database,
        phases), starting from ``super().state_machine_settings(config)``.
        """
        scale = self.examples_scale * examples_scale(config)
        return settings(
            max_examples=max(1, round(self.state_machine_examples * scale)),
            stateful_step_count=self.state_machine_steps,
            deadline=None,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.filter_too_much,
            ],
        )

    def option_set_settings(self, base: settings, kit_options: Mapping[str, Any]) -> settings:
        """``base`` with the examples scaled by :attr:`option_set_examples` for the
        option set ``kit_options`` came from (unchanged when it names none)."""
        names = [n for n, opts in self.option_sets.items() if dict(opts) == dict(kit_options)]
        scale = self.option_set_examples.get(names[0], 1.0) if names else 1.0
        if scale == 1.0:
            return base
        return settings(base, max_examples=max(1, round(base.max_examples * scale)))

    @pytest_asyncio.fixture(loop_scope="function")
    async def store(
        self, kit_factory: StoreFactory, request: pytest.FixtureRequest
    ) -> AsyncIterator[BaseCheckpointStore]:
        """An opened store from ``store_factory`` (with this test's option set); it and
        every store the test opened through :meth:`open_store` or :meth:`reopen` are
        closed at teardown."""
        instance = request.instance
        assert instance is not None, "the conformance kit's tests are methods"
        instance._kit_factory = kit_factory
        instance._kit_opened = []
        try:
            yield await instance.open_store()
        finally:
            for opened in reversed(instance._kit_opened):
                await opened.close()

    async def open_store(self, **options: Any) -> BaseCheckpointStore:
        """Open one more store over the same data, built by ``store_factory(**options)``."""
        made = self._kit_factory(**options)
        assert isinstance(made, BaseCheckpointStore), (
            f"store_factory must return a BaseCheckpointStore, got {type(made).__name__}"
        )
        assert not made.is_open, "store_factory must return an unopened store"
        self._kit_opened.append(made)
        await made.open()
        return made

    async def reopen(self, store: BaseCheckpointStore, **options: Any) -> BaseCheckpointStore:
        """Close ``store`` and open a new instance over the same data (a restart)."""
        await store.close()
        return await self.open_store(**options)

    @staticmethod
    def require_raw_access(store: BaseCheckpointStore) -> None:
        if not store.capabilities.raw_access:
            pytest.skip(
                f"{store.backend_name} does not declare capabilities.raw_access "
                "(the backdoor this test uses to corrupt records)"
            )

    @staticmethod
    def require_ttl(store: BaseCheckpointStore) -> None:
        if not store.capabilities.ttl:
            pytest.skip(f"{store.backend_name} does not declare capabilities.ttl")

    @staticmethod
    def require_atomic_batches(store: BaseCheckpointStore) -> None:
        if not store.capabilities.atomic_batches:
            pytest.skip(
                f"{store.backend_name} does not declare capabilities.atomic_batches "
                "(its save_many may write the items one after another)"
            )

    @staticmethod
    def is_encrypted(store: BaseCheckpointStore) -> bool:
        """Whether ``store`` was built with ``encryption=`` (SPEC S16)."""
        return store.options.encryption is not None

    @staticmethod
    def seals_metadata(store: BaseCheckpointStore) -> bool:
        """Whether ``store`` seals tags and metadata (``encrypt_metadata=True``)."""
        return store.options.encryption is not None and store.options.encrypt_metadata

    @staticmethod
    def require_encryption(store: BaseCheckpointStore) -> None:
        if store.options.encryption is None:
            pytest.skip(
                "an encryption test: this option set is plaintext (name an encrypted "
                "one, statekeeper.testing.encrypted_options(), in option_sets)"
            )

    async def require_metadata_filters(self, store: BaseCheckpointStore) -> None:
        """Skip a test of filters on tags or metadata in a store that seals them
        (``encrypt_metadata=True``), once it checked that such filters are refused
        with :class:`~statekeeper.errors.InvalidQuery` (SPEC S16), never answered."""
        if not self.seals_metadata(store):
            return
        for query in ({"tags": {"k": "v"}}, {"metadata": {"m": 1}}):
            with pytest.raises(InvalidQuery):
                await store.list(None, **query)
        pytest.skip(
            "filters on tags and metadata: this store seals them (encrypt_metadata=True), "
            "and refuses such filters with InvalidQuery (checked)"
        )

    async def filtered_ids(
        self,
        store: BaseCheckpointStore,
        stream: str | None,
        *,
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """The ids ``store.list(stream, tags=, metadata=)`` gives (newest first).

        In a store that seals tags and metadata, that filter must raise
        :class:`~statekeeper.errors.InvalidQuery`; the ids are then those of the
        unfiltered listing whose tags and metadata (opened from their envelopes)
        match, so a test of what a write did to them holds encrypted too."""
        if not self.seals_metadata(store):
            return ids(await store.list(stream, tags=tags, metadata=metadata))
        with pytest.raises(InvalidQuery):
            await store.list(stream, tags=tags, metadata=metadata)
        page = await store.list(stream, include_state=False, limit=1000)
        assert page.next_cursor is None, "filtered_ids reads one page of at most 1000"

        def same(value: Any, wanted: Any) -> bool:
            return type(value) is type(wanted) and value == wanted

        return [
            cp.id
            for cp in page.items
            if all(k in cp.tags and cp.tags[k] == v for k, v in (tags or {}).items())
            and all(
                k in cp.metadata and same(cp.metadata[k], v) for k, v in (metadata or {}).items()
            )
        ]

    @staticmethod
    def sealer_of(store: BaseCheckpointStore) -> Sealer:
        """A sealer with the keys of the opened, encrypted ``store``: it seals and opens
        states as the store does, for the tests that build or read envelopes through
        the backdoor."""
        assert store.options.encryption is not None, "sealer_of needs an encrypted store"
        keyring = resolve_keyring(store.options.encryption)
        return Sealer(keyring, store.store_id, metadata=store.options.encrypt_metadata)

    async def save_undecodable(
        self, store: BaseCheckpointStore, stream: str, **kwargs: Any
    ) -> tuple[BaseCheckpointStore, Checkpoint]:
        """Save a checkpoint whose envelope is valid but whose state cannot be decoded.

        With the backdoor (``raw_access``) the state bytes are replaced by bytes no
        codec reads, inside a well-formed, checksummed envelope (in an encrypted store
        sealed under its key, so the envelope opens and only the codec fails); without
        it the state
        names a class that the store (reopened without an allowlist) refuses. Returns
        the store to go on with (reopened in the second case) and the checkpoint.
        """
        if store.capabilities.raw_access:
            cp = await store.save(stream, {"fine": "for now"}, **kwargs)
            raw = await store.backdoor_read_raw(cp.id)
            record = StoredRecord.from_bytes(raw, location="kit", expect_sequence=cp.sequence)
            junk = b'{"$sk": "no such tag" \xff'
            if self.is_encrypted(store):
                # sealed as the store seals, so it opens and only the codec fails
                codec = inner_codec(record.codec)
                assert codec is not None, f"an encrypted store stored codec {record.codec!r}"
                _, junk = self.sealer_of(store).seal(
                    cp.id, stream, codec, junk, cp.tags, cp.metadata
                )
            unreadable = dataclasses.replace(record, state=junk)
            await store.backdoor_write_raw(cp.id, unreadable.to_bytes(store.store_id))
            return store, cp
        store = await self.reopen(store, allowed_types=[KitModel])
        cp = await store.save(stream, KitModel(name="unknown to the reader", count=1), **kwargs)
        return await self.reopen(store), cp

    @staticmethod
    async def save_steps(
        store: BaseCheckpointStore, stream: str, count: int, start: int = 0, **kwargs: Any
    ) -> list[Checkpoint]:
        """Save ``{"step": i}`` for ``i`` in ``start .. start+count-1``, in order."""
        return [
            await store.save(stream, {"step": i}, **kwargs) for i in range(start, start + count)
        ]

    @staticmethod
    async def walk(
        store: BaseCheckpointStore,
        stream: str | None,
        *,
        limit: int,
        order: Order = "asc",
        tags: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[Page]:
        """Every page of a query, following ``next_cursor`` from the start."""
        query: dict[str, Any] = {"limit": limit, "order": order, "tags": tags}
        if metadata is not None:
            query["metadata"] = metadata
        bound = PageBound(await checkpoints_in(store))
        pages = [await store.list(stream, **query)]
        while pages[-1].next_cursor is not None:
            bound.turn(pages[-1].next_cursor)
            pages.append(await store.list(stream, after=pages[-1].next_cursor, **query))
        return pages


def ids(items: list[Checkpoint] | Page) -> list[str]:
    """The ids of a page's items (or of a list of checkpoints), in order."""
    seq = items.items if isinstance(items, Page) else items
    return [cp.id for cp in seq]
