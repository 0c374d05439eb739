"""Telemetry (SPEC S18) on the Redis plugin: it inherits the spans and metrics of
``BaseCheckpointStore``, so ``telemetry=`` works here as on the built-in stores."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from statekeeper_redis import RedisCheckpointStore

from statekeeper import Telemetry
from statekeeper.errors import CheckpointNotFound


@pytest.mark.asyncio
async def test_spans_and_metrics_on_redis(
    make_store: Callable[..., RedisCheckpointStore], redis_url: str
) -> None:
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    tracer = tracer_provider.get_tracer("tests")
    async with make_store(telemetry=telemetry) as store:
        with tracer.start_as_current_span("caller") as caller:
            saved = [await store.save("orders", {"step": i}) for i in range(3)]
            await store.get_latest("orders")
            page = await store.list("orders")
            with pytest.raises(CheckpointNotFound):
                await store.load("no-such-id")
    spans = exporter.get_finished_spans()
    ours = [s for s in spans if s.name != "caller"]
    assert [(s.attributes or {})["db.operation.name"] for s in ours] == [
        *["save"] * 3,
        "get_latest",
        "list",
        "load",
    ]
    where = urlsplit(redis_url)
    for span in ours:
        attrs = span.attributes or {}
        assert span.parent is not None
        assert span.parent.span_id == caller.get_span_context().span_id
        assert attrs["db.system.name"] == "redis"
        assert attrs["server.address"] == where.hostname
        assert "statekeeper.stream" not in attrs
    for span, cp in zip(ours, saved, strict=False):
        assert (span.attributes or {})["statekeeper.sequence"] == cp.sequence
    assert (ours[4].attributes or {})["statekeeper.items"] == len(page.items) == 3
    assert ours[5].status.status_code is StatusCode.ERROR
    assert (ours[5].attributes or {})["error.type"] == "CheckpointNotFound"

    data = reader.get_metrics_data()
    assert data is not None
    counts = {
        point.attributes["db.operation.name"]: point.count
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "db.client.operation.duration"
        for point in metric.data.data_points
    }
    assert counts == {"save": 3, "get_latest": 1, "list": 1, "load": 1}


@pytest.mark.asyncio
async def test_pool_connections_by_state_on_redis(
    make_store: Callable[..., RedisCheckpointStore],
) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    async with make_store(telemetry=telemetry) as store:
        await store.save("orders", {"step": 1})
        await store.get_latest("orders")
        data = reader.get_metrics_data()
    assert data is not None
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "db.client.connection.count"
        for point in metric.data.data_points
    ]
    by_state = {
        (
            p.attributes["db.client.connection.pool.name"],
            p.attributes["db.client.connection.state"],
        ): (p.value)
        for p in points
    }
    # quiet: every connection the store used is back in the pool, idle
    assert by_state[("redis", "used")] == 0
    assert by_state[("redis", "idle")] >= 1
    for point in points:
        assert point.attributes["db.system.name"] == "redis"
    # the client's pool does not queue callers, so no waiting count is reported
    assert not [
        metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "db.client.connection.pending_requests" and metric.data.data_points
    ]


@pytest.mark.asyncio
async def test_a_closed_redis_store_reports_no_pool(
    make_store: Callable[..., RedisCheckpointStore],
) -> None:
    store = make_store()
    async with store:
        assert [u.pool for u in store._pool_usage()] == ["redis"]
    assert store._pool_usage() == []
