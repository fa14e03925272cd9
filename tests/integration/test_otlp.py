"""`agentledger otlp` on a real stack: a real OpenTelemetry SDK exporter (OTLP/HTTP protobuf)
and the samples' OTLP/JSON files become runs with the right usage; a parent span that repeats
its child's usage adds nothing; a bad body is a 400 and nothing is sent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode, set_span_in_context

from consumers.views import live_states
from infra.settings import Settings
from schemas.topics import ledger_topic
from streams.deployment import PrivateDeployment
from streams.importers.base import stable_id
from tests.packs import SHARED

pytestmark = pytest.mark.integration

SAMPLES = SHARED / "samples" / "otel-genai"
FLEET = "otel"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"the receiver did not listen on {port}")


def _cost(d: PrivateDeployment, run_id: str, calls: int, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = live_states(d.settings, "cost-metrics", [run_id]).get(run_id)
        if found is not None and found["state"]["totals"]["calls"] >= calls:
            return dict(found["state"])
        time.sleep(0.3)
    pytest.fail(f"{run_id}: {calls} calls not projected within {timeout_s}s")


def _post(port: int, body: bytes, content_type: str) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces",
        data=body,
        headers={"Content-Type": content_type},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_spans_from_a_real_sdk_exporter_and_the_samples_become_runs(
    services: Settings, tmp_path: Path
) -> None:
    d = PrivateDeployment(services, "otlp", [FLEET], tmp_path / "logs")
    asyncio.run(d.create())
    port = _free_port()
    try:
        d.start_worker("w")
        d.wait_partitions("w")
        d.start_process("otlp", ["-m", "infra.main", "otlp", "--port", str(port), "--fleet", FLEET])
        _wait_port(port)

        provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("agentledger-test")
        usage: dict[str, str | int] = {
            "gen_ai.usage.input_tokens": 1200,
            "gen_ai.usage.output_tokens": 80,
        }
        with tracer.start_as_current_span("invoke_agent support", attributes=usage) as root:
            # the agent span repeats its call's usage (as some instrumentations aggregate)
            trace_id = format(root.get_span_context().trace_id, "032x")
            chat: dict[str, str | int] = {
                **usage,
                "gen_ai.operation.name": "chat",
                "gen_ai.system": "openai",
                "gen_ai.request.model": "gpt-4o-mini",
                "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
                "gen_ai.response.id": "chatcmpl-otel-1",
                "gen_ai.usage.cache_read.input_tokens": 1000,
            }
            with tracer.start_as_current_span("chat gpt-4o-mini", attributes=chat):
                time.sleep(0.05)
            tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup_order"}
            with tracer.start_as_current_span("execute_tool lookup_order", attributes=tool):
                pass
        assert provider.force_flush(30_000)
        provider.shutdown()

        run_id = stable_id("otel", trace_id)
        state = _cost(d, run_id, 1)
        time.sleep(1.0)  # the parent span has been exported too: it must have added nothing
        state = _cost(d, run_id, 1)
        t = state["totals"]
        assert (t["calls"], t["input_tokens"], t["output_tokens"]) == (1, 1200, 80)
        assert t["cached_input_tokens"] == 1000 and t["latency_calls"] == 1
        assert t["latency_ms_sum"] >= 50  # the span's duration: latency is known here
        # RUN_STARTED, the call, the tool's request and result; the parent span made no call,
        # it is the trace's root: the run's end (status UNSET: ended, how is not said)
        stats = live_states(d.settings, "run-stats", [run_id])[run_id]
        assert stats["applied_seq"] == 5 and stats["state"]["status"] == "UNKNOWN"

        for name in (
            "genai-interlingua-openllmetry-0.62.3-otlp.json",
            "genai-interlingua-openinference-openai-0.1.58-otlp.json",
        ):
            doc = json.loads((SAMPLES / name).read_text())
            status, _ = _post(port, json.dumps(doc).encode(), "application/json")
            assert status == 200, name
            trace = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"].lower()
            t = _cost(d, stable_id("otel", trace), 1)["totals"]
            assert (t["input_tokens"], t["output_tokens"]) == (412, 27), name
            assert (t["cached_input_tokens"], t["reasoning_tokens"]) == (256, 8), name

        status, body = _post(port, b"\x00not protobuf", "application/x-protobuf")
        assert status == 400 and b"not an OTLP trace export" in body
    finally:
        d.drop()


SECRET = "ghp_" + "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4"[:36]


class AgentGaveUpError(RuntimeError):
    pass


def _stats(d: PrivateDeployment, run_id: str, entries: int, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = live_states(d.settings, "run-stats", [run_id]).get(run_id)
        if found is not None and found["applied_seq"] >= entries:
            return found["state"]
        time.sleep(0.3)
    pytest.fail(f"{run_id}: {entries} entries not projected within {timeout_s}s")


def _timeline(d: PrivateDeployment, run_id: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "infra.main", "timeline", run_id, "--json"],
        env=d.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_root_span_that_ended_ends_its_run_and_a_missing_one_leaves_it_open(
    services: Settings, tmp_path: Path
) -> None:
    """Found trying the product: a run received over OTLP stayed RUNNING forever after its
    invoke_agent span ended. A real SDK exporter: an agent that fails (an exception with a
    secret in it) ends FAILED with its error redacted on the ledger; one whose root span is
    set OK ends SUCCEEDED; one whose root span never ended (never exported) stays open."""
    d = PrivateDeployment(services, "otlpend", [FLEET], tmp_path / "logs")
    asyncio.run(d.create())
    port = _free_port()
    try:
        d.start_worker("w")
        d.wait_partitions("w")
        d.start_process("otlp", ["-m", "infra.main", "otlp", "--port", str(port), "--fleet", FLEET])
        _wait_port(port)
        provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("agentledger-test")
        chat: dict[str, str | int] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.input_tokens": 100,
            "gen_ai.usage.output_tokens": 10,
        }
        agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support"}
        tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup_order"}

        # the SDK records the exception as an event and sets status ERROR with its text
        with (
            pytest.raises(AgentGaveUpError),
            tracer.start_as_current_span("invoke_agent support", attributes=agent) as root,
        ):
            failed = format(root.get_span_context().trace_id, "032x")
            with tracer.start_as_current_span("chat gpt-4o-mini", attributes=chat):
                pass
            with (
                contextlib.suppress(LookupError),
                tracer.start_as_current_span("execute_tool lookup_order", attributes=tool),
            ):
                raise LookupError(f"order 42 not found (api key {SECRET})")
            raise AgentGaveUpError(f"no answer after 3 tries; token {SECRET} refused")
        with tracer.start_as_current_span("invoke_agent support", attributes=agent) as root:
            succeeded = format(root.get_span_context().trace_id, "032x")
            with tracer.start_as_current_span("chat gpt-4o-mini", attributes=chat):
                pass
            root.set_status(Status(StatusCode.OK))
        open_root = tracer.start_span("invoke_agent support", attributes=agent)  # never ended
        still_open = format(open_root.get_span_context().trace_id, "032x")
        with tracer.start_as_current_span(
            "chat gpt-4o-mini", attributes=chat, context=set_span_in_context(open_root)
        ):
            pass
        assert provider.force_flush(30_000)

        # RUN_STARTED, the call, the tool's request and result, the error, RUN_FINISHED
        ended = _stats(d, stable_id("otel", failed), 6)
        assert ended["status"] == "FAILED" and ended["by_kind"]["ERROR_EVENT"] == 1
        timeline = _timeline(d, stable_id("otel", failed))
        assert "AgentGaveUpError: no answer after 3 tries" in timeline
        assert "LookupError: order 42 not found (api key [REDACTED:" in timeline  # the tool's
        assert SECRET not in timeline and "[REDACTED:" in timeline
        assert _stats(d, stable_id("otel", succeeded), 3)["status"] == "SUCCEEDED"
        stats = _stats(d, stable_id("otel", still_open), 2)
        assert stats["status"] is None and "RUN_FINISHED" not in stats["by_kind"]
        provider.shutdown()
    finally:
        d.drop()


async def _records_on(settings: Settings, fleet: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_address)
    await consumer.start()
    try:
        topic = ledger_topic(settings.topic_prefix, fleet)
        tps = [TopicPartition(topic, p) for p in range(settings.topic_partitions)]
        return sum((await consumer.end_offsets(tps)).values())
    finally:
        await consumer.stop()


def test_a_run_in_another_fleet_is_refused_over_otlp_and_the_rest_published(
    services: Settings, tmp_path: Path
) -> None:
    """Found by a user trial: `publish` and `import` refuse a run that is on the ledger in
    another fleet; a receiver of another fleet took its spans (and every worker then
    dead-lettered them). Now the receiver names the run's fleet in OTLP's partial success and
    sends nothing of it; the export's other run goes to its fleet."""
    other = "otel-b"
    d = PrivateDeployment(services, "otlpfleet", [FLEET, other], tmp_path / "logs")
    asyncio.run(d.create())
    port, port_b = _free_port(), _free_port()
    try:
        d.start_worker("w")
        d.wait_partitions("w")
        for name, at, fleet in (("otlp", port, FLEET), ("otlp-b", port_b, other)):
            args = ["-m", "infra.main", "otlp", "--port", str(at), "--fleet", fleet]
            d.start_process(name, args)
            _wait_port(at)
        doc = json.loads((SAMPLES / "genai-interlingua-openllmetry-0.62.3-otlp.json").read_text())
        status, _ = _post(port, json.dumps(doc).encode(), "application/json")
        assert status == 200
        run_id = stable_id("otel", doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"])
        _stats(d, run_id, 3)  # in the live run-stats build: RUN_STARTED, the call, the end

        new = json.loads(
            (SAMPLES / "genai-interlingua-openinference-openai-0.1.58-otlp.json").read_text()
        )
        both = {"resourceSpans": doc["resourceSpans"] + new["resourceSpans"]}
        status, body = _post(port_b, json.dumps(both).encode(), "application/json")
        assert status == 200, body
        partial = json.loads(body)["partialSuccess"]
        assert partial["rejectedSpans"] == "2"
        assert (
            f"run {run_id} is on the ledger in fleet {FLEET}, not {other}"
            in (partial["errorMessage"])
        )
        new_run = stable_id("otel", new["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"])
        assert _stats(d, new_run, 3)["status"] == "SUCCEEDED"
        # the other fleet's topic holds the new run's three entries, none of the refused run's
        assert asyncio.run(_records_on(d.settings, other)) == 3
        assert live_states(d.settings, "run-stats", [run_id])[run_id]["state"]["entries"] == 3
    finally:
        d.drop()
