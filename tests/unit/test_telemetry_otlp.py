"""OTLP export reaches a real HTTP endpoint on loopback; disabled telemetry does nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from streams.telemetry import telemetry_from_setting


class _Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, str, int]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.received.append((self.path, self.headers.get("Content-Type", ""), len(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, int]]]:
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    _Collector.received = []
    yield _Collector.received
    server.shutdown()
    server.server_close()
    thread.join()


def test_otlp_exports_spans_and_metrics(collector: list[tuple[str, str, int]]) -> None:
    telemetry = telemetry_from_setting("otlp")
    with telemetry.span("postgres.write", projection="run-stats"):
        telemetry.count("entries.applied", 3, projection="run-stats")
    telemetry.shutdown()
    paths = {path for path, kind, size in collector if kind == "application/x-protobuf" and size}
    assert {"/v1/traces", "/v1/metrics"} <= paths


def test_disabled_telemetry_is_inert() -> None:
    telemetry = telemetry_from_setting("none")
    assert not telemetry.enabled
    with telemetry.span("x") as span:
        assert not span.is_recording()
    telemetry.count("entries.applied", 5)
    telemetry.shutdown()


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="none, console or otlp"):
        telemetry_from_setting("jaeger")
