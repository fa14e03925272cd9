"""OpenTelemetry for the engine: a span per batch (linked to each publisher ``traceparent``) and
per store write; counters with low-cardinality attributes only (projection, step, never a run id
or a path). ``AGENTLEDGER_OTEL=none`` (default) makes every call a no-op; ``console`` prints,
``otlp`` exports over OTLP/HTTP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, TraceFlags

if TYPE_CHECKING:
    from streams.engine import BatchStats, SourceRecord

MAX_LINKS = 32


def _parse_traceparent(value: bytes) -> SpanContext | None:
    try:
        _, trace_id, span_id, flags = value.decode().split("-")
        return SpanContext(
            int(trace_id, 16),
            int(span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(int(flags, 16)),
        )
    except (ValueError, UnicodeDecodeError):
        return None


class Telemetry:
    """Tracer and meter, or no-ops."""

    def __init__(self, tracer: trace.Tracer | None, meter: metrics.Meter | None) -> None:
        self.tracer = tracer
        self.meter = meter
        self._counters: dict[str, Any] = {}
        self._batch_seconds = (
            meter.create_histogram("agentledger.batch.duration", unit="s") if meter else None
        )
        self._lag = meter.create_gauge("agentledger.consumer.lag") if meter else None
        # Worker health (issue 25): lag per assigned partition, seconds since the last batch.
        self._partition_lag = (
            meter.create_gauge("agentledger.worker.partition_lag", unit="{entry}")
            if meter
            else None
        )
        self._idle = (
            meter.create_gauge("agentledger.worker.last_applied_age", unit="s") if meter else None
        )
        self._providers: tuple[Any, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.meter is not None or self.tracer is not None

    @classmethod
    def disabled(cls) -> Telemetry:
        return cls(None, None)

    @classmethod
    def console(cls, service: str = "agentledger-worker") -> Telemetry:
        return cls._with(ConsoleSpanExporter(), ConsoleMetricExporter(), service)

    @classmethod
    def otlp(cls, service: str = "agentledger-worker") -> Telemetry:
        """OTLP over HTTP; endpoint and headers from the standard ``OTEL_EXPORTER_OTLP_*``."""
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return cls._with(OTLPSpanExporter(), OTLPMetricExporter(), service)

    @classmethod
    def _with(cls, spans: Any, metrics_exporter: Any, service: str) -> Telemetry:
        resource = Resource.create({"service.name": service})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(spans))
        reader = PeriodicExportingMetricReader(metrics_exporter, 10_000)
        meter_provider = MeterProvider(metric_readers=[reader], resource=resource)
        telemetry = cls(provider.get_tracer(service), meter_provider.get_meter(service))
        telemetry._providers = (provider, meter_provider)
        return telemetry

    def shutdown(self) -> None:
        """Flush and stop exporters (a no-op when disabled)."""
        for provider in self._providers:
            provider.shutdown()

    @contextlib.contextmanager
    def batch_span(self, records: Sequence[SourceRecord]) -> Iterator[Span]:
        if self.tracer is None:
            yield trace.INVALID_SPAN
            return
        links = []
        for r in records[:MAX_LINKS]:
            header = dict(r.headers).get("traceparent")
            ctx = _parse_traceparent(header) if header else None
            if ctx is not None:
                links.append(Link(ctx))
        with self.tracer.start_as_current_span("agentledger.batch", links=links) as span:
            yield span

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Span]:
        if self.tracer is None:
            yield NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
            return
        with self.tracer.start_as_current_span(f"agentledger.{name}", attributes=attributes) as s:
            yield s

    def count(self, name: str, value: int, **attributes: str) -> None:
        if self.meter is None or not value:
            return
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters[name] = self.meter.create_counter(f"agentledger.{name}")
        counter.add(value, attributes)

    def record_batch(self, stats: BatchStats, seconds: float) -> None:
        if self.meter is None:
            return
        self.count("entries.applied", stats.applied)
        self.count("entries.duplicates", stats.duplicates)
        self.count("entries.redelivered", stats.redelivered)
        self.count("entries.held", stats.held)
        self.count("entries.dead_lettered", stats.dead_lettered)
        assert self._batch_seconds is not None
        self._batch_seconds.record(seconds)

    def record_lag(self, lag: int) -> None:
        if self._lag is not None:
            self._lag.set(lag)

    def record_health(self, lag: Mapping[tuple[str, int], int], idle_s: float) -> None:
        """Each assigned partition's lag (topic and partition as attributes: bounded by the
        fleets' partitions) and the age of the last applied batch."""
        if self._partition_lag is not None:
            for (topic, partition), n in lag.items():
                self._partition_lag.set(n, {"topic": topic, "partition": partition})
        if self._idle is not None:
            self._idle.set(idle_s)


def telemetry_from_setting(mode: str) -> Telemetry:
    if mode == "console":
        return Telemetry.console()
    if mode == "otlp":
        return Telemetry.otlp()
    if mode in ("", "none"):
        return Telemetry.disabled()
    raise ValueError(f"AGENTLEDGER_OTEL={mode!r}: use none, console or otlp")
