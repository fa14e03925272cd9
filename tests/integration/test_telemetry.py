"""The publisher's traceparent continues into the engine's batch span; counters use
low-cardinality attributes only."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infra.settings import Settings
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine
from streams.publisher import AsyncPublisher
from streams.simulate import simulate
from streams.source import drain
from streams.telemetry import Telemetry
from tests.integration.engine_support import make_env

pytestmark = pytest.mark.integration


async def test_batch_spans_link_to_publisher_traces_and_counters_count(
    services: Settings,
) -> None:
    env = await make_env(services)
    entries = simulate(1, 3, seed=17)
    async with AsyncPublisher(env.settings) as publisher:
        sent = await publisher.publish_batch(entries)

    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(tracer_provider.get_tracer("t"), meter_provider.get_meter("t"))
    sink = KafkaDeadLetterSink(env.settings)
    engine = Engine(
        [env.target()],
        env.settings.pg_address,
        env.settings.redis_address,
        sink,
        telemetry=telemetry,
        redis_prefix=env.redis_prefix,
    )
    await engine.start()
    try:
        await drain(engine, env.settings.kafka_address, env.topics)
    finally:
        await engine.close()
        await sink.close()

    finished = spans.get_finished_spans()
    names = {s.name for s in finished}
    assert {
        "agentledger.batch",
        "agentledger.decode",
        "agentledger.postgres.write",
        "agentledger.redis.write",
    } <= names
    linked = {
        format(link.context.trace_id, "032x")
        for s in finished
        if s.name == "agentledger.batch"
        for link in s.links
    }
    assert linked & {e.trace_id for e in sent}, "batch spans continue the publishers' traces"

    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    applied = sum(
        p.value for p in points["agentledger.entries.applied"] if isinstance(p, NumberDataPoint)
    )
    assert applied == len(entries)
    run_ids = {e.run_id for e in entries}
    for series in points.values():
        for p in series:
            assert not (set(map(str, (p.attributes or {}).values())) & run_ids)
