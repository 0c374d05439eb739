"""The telemetry tests' shared parts (SPEC S18): the OpenTelemetry SDK with its
in-memory span exporter and metric reader, and one scenario every backend runs.

The SDK is given to each store through ``Telemetry(tracer_provider=,
meter_provider=)``, so tests never touch the process's global providers and run
side by side on xdist workers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from statekeeper import BaseCheckpointStore, Telemetry
from statekeeper.errors import CheckpointNotFound
from statekeeper.record import StoredRecord


@dataclasses.dataclass
class Recorder:
    """An SDK tracer provider and meter provider that keep what they are given."""

    exporter: InMemorySpanExporter = dataclasses.field(default_factory=InMemorySpanExporter)
    reader: InMemoryMetricReader = dataclasses.field(default_factory=InMemoryMetricReader)

    def __post_init__(self) -> None:
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("tests")

    def options(self, **options: Any) -> Telemetry:
        return Telemetry(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options
        )

    def spans(self, operation: str | None = None) -> list[ReadableSpan]:
        found = list(self.exporter.get_finished_spans())
        if operation is None:
            return found
        return [s for s in found if (s.attributes or {}).get("db.operation.name") == operation]

    def points(self, metric: str) -> list[Any]:
        """The data points of ``metric`` (all attribute sets), as collected now."""
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found.extend(m.data.data_points)
        return found

    def count(self, metric: str, **attributes: Any) -> int:
        """The summed count (histograms) or value (counters) of the points whose
        attributes include ``attributes``."""
        total = 0
        for point in self.points(metric):
            if all(point.attributes.get(k) == v for k, v in attributes.items()):
                total += point.count if hasattr(point, "count") else point.value
        return total


def only(spans: Sequence[ReadableSpan]) -> ReadableSpan:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


async def plant_unreadable(store: BaseCheckpointStore, stream: str) -> str:
    """Save a checkpoint, then make its state undecodable behind the store's back
    (the raw-record backdoor); its id."""
    cp = await store.save(stream, {"fine": "for now"})
    await damage(store, cp.id, cp.sequence)
    return cp.id


async def damage(store: BaseCheckpointStore, id: str, sequence: int) -> None:
    """Make checkpoint ``id``'s state undecodable behind the store's back."""
    raw = await store.backdoor_read_raw(id)
    record = StoredRecord.from_bytes(raw, location="test", expect_sequence=sequence)
    junk = dataclasses.replace(record, codec="json", state=b'{"$sk": "no such tag" \xff')
    await store.backdoor_write_raw(id, junk.to_bytes(store.store_id))


SECRET = "do-not-record-this-state-7f3a"


async def scenario(store: BaseCheckpointStore, rec: Recorder, system: str) -> None:
    """Three saves, a read of each kind, a page with a skipped record, a failed load
    and a delete, on an open store made with ``telemetry=rec.options()``; then what
    each span and metric must say."""
    saved = [await store.save("orders", {"step": i, "secret": SECRET}) for i in range(3)]
    latest = await store.get_latest("orders")
    assert latest is not None
    await store.load(saved[0].id)
    bad = await plant_unreadable(store, "orders")
    page = await store.list("orders", limit=10)
    assert [s.id for s in page.skipped] == [bad]
    with pytest.raises(CheckpointNotFound):
        await store.load("no-such-id")
    assert await store.delete(saved[0].id)

    # one span per operation, named and attributed after the conventions
    saves = rec.spans("save")
    assert len(saves) == 4
    for span, cp in zip(saves, saved, strict=False):
        attrs = span.attributes or {}
        assert attrs["db.system.name"] == system
        assert attrs["statekeeper.sequence"] == cp.sequence
        assert attrs["statekeeper.state.bytes"] > 0
        assert attrs["statekeeper.execution"] in ("inline", "worker")
        assert span.name.startswith("save")
        assert span.status.status_code is StatusCode.UNSET
    get = only(rec.spans("get_latest"))
    assert (get.attributes or {})["statekeeper.sequence"] == latest.sequence

    listed = only(rec.spans("list"))
    attrs = listed.attributes or {}
    assert attrs["statekeeper.page.limit"] == 10
    assert attrs["statekeeper.items"] == len(page.items) == 3
    assert attrs["statekeeper.skipped"] == 1
    [event] = [e for e in listed.events if e.name == "statekeeper.skipped"]
    assert (event.attributes or {})["error.type"] == page.skipped[0].error

    failed = [s for s in rec.spans("load") if s.status.status_code is StatusCode.ERROR]
    assert [(s.attributes or {})["error.type"] for s in failed] == ["CheckpointNotFound"]
    assert (only(rec.spans("delete")).attributes or {})["statekeeper.removed"] == 1

    # without record_streams: no stream names, no ids, and never a state
    for span in rec.spans():
        recorded = [*(span.attributes or {}).items()]
        recorded += [kv for e in span.events for kv in (e.attributes or {}).items()]
        assert not any(
            k in ("statekeeper.stream", "statekeeper.checkpoint.id") for k, _ in recorded
        )
        assert not any(
            isinstance(v, str) and (v == "orders" or v in {c.id for c in saved} or SECRET in v)
            for _, v in recorded
        ), (span.name, recorded)

    # metrics that match what was done
    duration = "db.client.operation.duration"
    assert rec.count(duration, **{"db.operation.name": "save", "db.system.name": system}) == 4
    assert rec.count(duration, **{"db.operation.name": "load"}) == 2
    assert (
        rec.count(duration, **{"db.operation.name": "load", "error.type": "CheckpointNotFound"})
        == 1
    )
    assert rec.count("statekeeper.checkpoint.size", **{"db.operation.name": "save"}) == 4
    assert (
        rec.count(
            "statekeeper.skipped_records", **{"statekeeper.skip.reason": "CheckpointDecodeError"}
        )
        == 1
    )
