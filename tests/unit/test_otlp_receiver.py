"""The OTLP receiver's answers when publishing fails (a fake publisher; the mapping is real):
a retryable failure loses no span, a refusal is said as one."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from infra.settings import Settings
from schemas.errors import LedgerValidationError
from streams.otlp import Receiver, app
from streams.publisher import BrokerUnavailableError
from tests.packs import SHARED

SAMPLE = SHARED / "samples" / "otel-genai" / "genai-interlingua-openllmetry-0.62.3-otlp.json"


class _Book:
    def __init__(self) -> None:
        self.last: dict[str, int] = {}


class _Publisher:
    """Fails its first ``publish_batch`` calls with ``failures``, then records what it sends."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.book = _Book()
        self.sent: list[Any] = []

    async def resume(self, runs: object) -> None:
        return None

    async def publish_batch(self, entries: list[Any]) -> list[Any]:
        if self.failures:
            raise self.failures.pop(0)
        self.sent += entries
        for e in entries:
            self.book.last[e.run_id] = max(self.book.last.get(e.run_id, 0), e.sequence_no)
        return entries


async def _post(receiver: Receiver, body: bytes) -> tuple[int, str]:
    async with TestClient(TestServer(app(receiver))) as client:
        answer = await client.post(
            "/v1/traces", data=body, headers={"Content-Type": "application/json"}
        )
        return answer.status, await answer.text()


async def test_kafka_down_is_503_and_the_retry_publishes_every_span() -> None:
    """Before: the spans were marked done before publishing, so the sender's retry of a 503
    was answered 200 with nothing sent: the spans were lost, with a log warning."""
    body = json.dumps(json.loads(SAMPLE.read_text())).encode()
    receiver = Receiver(Settings(), "fleet-01")
    fake = _Publisher([BrokerUnavailableError("Kafka did not answer")])
    receiver.publisher = fake  # type: ignore[assignment]
    status, _ = await _post(receiver, body)
    assert status == 503 and fake.sent == []
    status, _ = await _post(receiver, body)  # the exporter's retry
    assert status == 200 and fake.sent, "the retry published the spans"
    again = len(fake.sent)
    status, _ = await _post(receiver, body)  # the same export a third time: nothing new
    assert status == 200 and len(fake.sent) == again


async def test_spans_the_contract_refuses_are_a_400_the_sender_does_not_retry() -> None:
    body = json.dumps(json.loads(SAMPLE.read_text())).encode()
    receiver = Receiver(Settings(), "fleet-01")
    receiver.publisher = _Publisher([LedgerValidationError("run_id", "bad")])  # type: ignore[assignment]
    status, text = await _post(receiver, body)
    assert status == 400 and text.startswith("refused: ") and "run_id" in text


async def test_a_span_the_contract_refuses_leaves_the_rest_of_its_export_published() -> None:
    """Found trying the product: a negative token count in one span gave a 500 (a pydantic
    traceback in the receiver's log), and OTLP exporters do not retry a 500: the valid spans of
    the same export were lost too. Now that span is left out, named in OTLP's partial success."""
    import copy

    doc = json.loads(SAMPLE.read_text())
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    bad = copy.deepcopy(spans[0])
    bad["spanId"] = "0badc0ffee000001"
    for attribute in bad["attributes"]:
        if attribute["key"] == "gen_ai.usage.input_tokens":
            attribute["value"] = {"intValue": "-5"}
    spans.append(bad)
    receiver = Receiver(Settings(), "fleet-01")
    fake = _Publisher([])
    receiver.publisher = fake  # type: ignore[assignment]
    status, text = await _post(receiver, json.dumps(doc).encode())
    assert status == 200, text
    partial = json.loads(text)["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "span 0badc0ffee000001" in partial["errorMessage"]
    assert "-5" not in partial["errorMessage"]  # the reason, not the value
    assert [e.kind.value for e in fake.sent].count("MODEL_CALL") == 1  # the good span's call


def test_a_failed_model_call_without_usage_is_a_call_of_unknown_usage() -> None:
    """Found trying the product: a chat span that failed (a 429) and reported no usage was not
    recorded at all, so the run's failed calls and its call count left it out."""
    from schemas.models import EntryKind, ModelCallStatus, ModelUsagePart
    from streams.importers.otel import Span, runs_from_spans

    start = 1_765_000_000 * 10**9  # (2025-12-06)

    def span(span_id: str, error: bool, **attributes: Any) -> Span:
        return Span("t1", span_id, None, "chat", start, start + 10**9, attributes, error)

    failed = span("a1", True, **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"})
    quiet = span("a2", False, **{"gen_ai.operation.name": "chat"})  # no usage, no error: nothing
    [run] = runs_from_spans([failed, quiet], "fleet-01")
    calls = [p for e in run.entries if e.kind is EntryKind.MODEL_CALL for p in e.parts]
    assert len(calls) == 1 and isinstance(calls[0], ModelUsagePart)
    assert calls[0].status is ModelCallStatus.ERROR
    assert {"input_tokens", "output_tokens"} <= set(calls[0].unknown_fields)
