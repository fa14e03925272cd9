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
