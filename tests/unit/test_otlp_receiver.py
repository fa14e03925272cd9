"""The OTLP receiver's answers when publishing fails (a fake publisher and a fake fleet check;
the mapping is real): a retryable failure loses no span, a refusal is said as one; a run's end;
a failed tool's error; a run of another fleet refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
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


class _Fleets:
    """RunFleets' answer without PostgreSQL: the runs the ledger holds in other fleets."""

    def __init__(self, on_ledger: dict[str, str] | None = None) -> None:
        self.on_ledger = on_ledger or {}
        self.unanswered = False
        self.asked: list[list[tuple[str, str]]] = []

    def elsewhere(self, runs: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
        self.asked.append(list(runs))
        return [(r, self.on_ledger[r], f) for r, f in runs if self.on_ledger.get(r, f) != f]

    def close(self) -> None:
        return None


def _receiver(
    failures: list[Exception] | None = None, on_ledger: dict[str, str] | None = None
) -> tuple[Receiver, _Publisher]:
    receiver = Receiver(Settings(), "fleet-01")
    fake = _Publisher(failures or [])
    receiver.publisher = fake  # type: ignore[assignment]
    receiver.fleets = _Fleets(on_ledger)  # type: ignore[assignment]
    return receiver, fake


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
    receiver, fake = _receiver([BrokerUnavailableError("Kafka did not answer")])
    status, _ = await _post(receiver, body)
    assert status == 503 and fake.sent == []
    status, _ = await _post(receiver, body)  # the exporter's retry
    assert status == 200 and fake.sent, "the retry published the spans"
    again = len(fake.sent)
    status, _ = await _post(receiver, body)  # the same export a third time: nothing new
    assert status == 200 and len(fake.sent) == again


async def test_spans_the_contract_refuses_are_a_400_the_sender_does_not_retry() -> None:
    body = json.dumps(json.loads(SAMPLE.read_text())).encode()
    receiver, _ = _receiver([LedgerValidationError("run_id", "bad")])
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
    receiver, fake = _receiver()
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


# -- a run's end: its trace's root span ------------------------------------------------------

START = 1_765_000_000 * 10**9  # (2025-12-06)
SECRET = "ghp_" + "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4"[:36]


def _span(span_id: str, parent: str | None, end_s: int, **fields: Any) -> Any:
    from streams.importers.otel import Span

    attributes = fields.pop("attributes", {})
    fields.setdefault("error", False)
    return Span("t1", span_id, parent, span_id, START, START + end_s * 10**9, attributes, **fields)


_CHAT = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 10}
_AGENT = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support"}


@pytest.mark.parametrize(
    ("status", "ended"),
    [({"ok": True}, "SUCCEEDED"), ({"error": True}, "FAILED"), ({"error": False}, "UNKNOWN")],
)
def test_a_root_span_that_ended_ends_its_run(status: dict[str, bool], ended: str) -> None:
    """Found trying the product: a run received over OTLP stayed RUNNING forever after its
    root (invoke_agent) span ended, OK or ERROR. Now the root span's end is the run's
    RUN_FINISHED, after the batch's other entries (the root starts first), at its end time;
    UNSET (the default status) says the run ended but not how: UNKNOWN, not a success."""
    from schemas.models import EntryKind
    from streams.importers.otel import runs_from_spans

    fields = {"error": False, **status}
    root = _span("root", None, 9, attributes=_AGENT, **fields)
    [run] = runs_from_spans([root, _span("chat", "root", 2, attributes=_CHAT, error=False)], "f")
    kinds = [e.kind for e in run.entries]
    assert kinds[:2] == [EntryKind.RUN_STARTED, EntryKind.MODEL_CALL]
    assert kinds[-1] is EntryKind.RUN_FINISHED and kinds.count(EntryKind.RUN_FINISHED) == 1
    finished = run.entries[-1]
    assert finished.run_status is not None and finished.run_status.value == ended
    assert finished.occurred_at.timestamp() == (START + 9 * 10**9) / 1e9


def test_a_failed_root_span_ends_its_run_failed_with_its_error_redacted() -> None:
    """ERROR: the run failed, its exception and status message kept (each once) as the error
    that ended it, in an ERROR_EVENT before RUN_FINISHED (as mini-swe-agent's), classed by the
    importers' one rule; the publisher's redaction (the one detector) takes the secret out."""
    from schemas.models import EntryKind, ErrorPart
    from streams.importers.otel import runs_from_spans
    from streams.redaction import redact_entry

    said = f"RateLimitError: token {SECRET} over its quota"
    root = _span(
        "root", None, 5, attributes=_AGENT, error=True, status_message=said, exceptions=(said,)
    )
    [run] = runs_from_spans([root], "f")
    error, finished = run.entries[-2:]
    assert error.kind is EntryKind.ERROR_EVENT and finished.run_status is not None
    assert finished.run_status.value == "FAILED"
    [part] = error.parts
    assert isinstance(part, ErrorPart) and part.category == "provider"
    assert part.message == said  # the exception and the status message say it once
    [redacted] = redact_entry(error).parts
    assert isinstance(redacted, ErrorPart) and SECRET not in redacted.message
    assert "[REDACTED:" in redacted.message and redacted.message.endswith("over its quota")


def test_a_run_whose_root_span_has_not_arrived_stays_open_and_ends_when_it_does() -> None:
    """Unknown is never a made-up end: the children alone leave the run open; the root span
    in a later export ends it (the receiver's book remembers the batches before)."""
    from schemas.models import EntryKind
    from streams.importers.otel import TraceBook, ended_only, runs_from_spans

    book = TraceBook()
    [run] = runs_from_spans([_span("chat", "root", 2, attributes=_CHAT, error=False)], "f", book)
    assert EntryKind.RUN_FINISHED not in [e.kind for e in run.entries]
    [later] = runs_from_spans([_span("root", None, 9, attributes=_AGENT, ok=True)], "f", book)
    assert [e.kind for e in later.entries][-1] is EntryKind.RUN_FINISHED and ended_only(later)
    # a span with a parent never ends a run, nor a root span without an end time
    assert runs_from_spans([_span("x", "y", 3, attributes=_AGENT, ok=True)], "f") == []
    assert (
        runs_from_spans([_span("r", None, -START // 10**9, attributes=_AGENT, ok=True)], "f") == []
    )


def test_a_js_sdk_2_span_list_has_one_root_and_its_run_one_end() -> None:
    """Found by a review: the OpenTelemetry JS SDK 2.x writes a span's parent as
    parentSpanContext.spanId (1.x: parentSpanId); read as 1.x, every span was a root and ended
    the run, the last end winning (a successful run shown UNKNOWN)."""
    from schemas.models import EntryKind
    from streams.importers.otel import runs_from_spans, spans_from_otlp_json

    def readable(span_id: str, parent: str | None, **doc: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "spanContext": {"traceId": "ab" * 16, "spanId": span_id},
            "name": doc.pop("name", span_id),
            "startTime": [1_765_000_000, 0],
            "endTime": [1_765_000_009, 0],
            **doc,
        }
        if parent is not None:
            out["parentSpanContext"] = {"traceId": "ab" * 16, "spanId": parent}
        return out

    spans = spans_from_otlp_json(
        [
            readable("c1", "r1", attributes=_CHAT),
            readable("t1", "r1", attributes={"gen_ai.operation.name": "execute_tool"}),
            readable("r1", None, attributes=_AGENT, status={"code": 1}),
        ]
    )
    assert [s.parent_span_id for s in spans] == ["r1", "r1", None]
    [run] = runs_from_spans(spans, "f")
    ends = [e for e in run.entries if e.kind is EntryKind.RUN_FINISHED]
    assert len(ends) == 1 and ends[0].run_status is not None
    assert ends[0].run_status.value == "SUCCEEDED"


def test_a_run_named_by_an_attribute_is_not_ended_by_a_root_span() -> None:
    """Such a run may hold several traces (a conversation's turns): the first turn's root span
    is not the run's end."""
    from schemas.models import EntryKind
    from streams.importers.otel import runs_from_spans

    named = {**_CHAT, "session.id": "s-1"}
    spans = [_span("root", None, 9, attributes=named, ok=True)]
    [run] = runs_from_spans(spans, "f", run_attribute="session.id")
    assert EntryKind.RUN_FINISHED not in [e.kind for e in run.entries]


async def test_the_receiver_ends_a_run_the_ledger_holds_and_makes_no_run_of_an_end_alone() -> None:
    """Over the receiver: a root span whose run's calls came in an earlier export is the run's
    end, numbered after them; a trace whose root span is all there is (no call, no tool) is
    no run, as before."""

    def export(*spans: dict[str, Any]) -> bytes:
        return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}).encode()

    def span(span_id: str, parent: str, code: int, attrs: dict[str, Any]) -> dict[str, Any]:
        return {
            "traceId": "0af7651916cd43dd8448eb211c80319c",
            "spanId": span_id,
            "parentSpanId": parent,
            "name": span_id,
            "startTimeUnixNano": str(START),
            "endTimeUnixNano": str(START + 10**9),
            "attributes": [{"key": k, "value": {"stringValue": str(v)}} for k, v in attrs.items()],
            "status": {"code": code},
        }

    receiver, fake = _receiver()
    status, _ = await _post(receiver, export(span("c1", "a1", 0, _CHAT)))
    assert status == 200 and [e.kind.value for e in fake.sent] == ["RUN_STARTED", "MODEL_CALL"]
    status, _ = await _post(receiver, export(span("a1", "", 1, _AGENT)))
    assert status == 200
    assert [(e.kind.value, e.sequence_no) for e in fake.sent[2:]] == [("RUN_FINISHED", 3)]
    assert fake.sent[-1].run_status is not None and fake.sent[-1].run_status.value == "SUCCEEDED"

    alone = span("b1", "", 1, _AGENT) | {"traceId": "1af7651916cd43dd8448eb211c80319c"}
    status, _ = await _post(receiver, export(alone))
    assert status == 200 and len(fake.sent) == 3


def test_a_failed_tool_span_keeps_its_exception_in_the_result() -> None:
    """Found trying the product: a tool span that failed kept only FAILED, its exception
    (events ``exception``: exception.type, exception.message) and status description lost.
    Now they are the result's text (each once), as every importer keeps a failed tool's error,
    and redacted on the same path as every other text."""
    from schemas.models import ToolResultPart, ToolResultStatus
    from streams.importers.otel import runs_from_spans
    from streams.redaction import redact_entry

    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup_order"}
    said = f"KeyError: order 42 not found (api key {SECRET})"
    span = _span(
        "tool", "root", 2, attributes=tool, error=True, exceptions=(said,), status_message=said
    )
    [run] = runs_from_spans([span], "f")
    [part] = run.entries[-1].parts
    assert isinstance(part, ToolResultPart) and part.status is ToolResultStatus.FAILED
    assert part.summary == said
    [redacted] = redact_entry(run.entries[-1]).parts
    assert isinstance(redacted, ToolResultPart) and SECRET not in redacted.summary
    assert redacted.summary.startswith("KeyError: order 42 not found") and "[REDACTED:" in (
        redacted.summary
    )
    # its output and its error both; a tool that succeeded keeps its output alone
    output = {**tool, "gen_ai.tool.call.result": "partial"}
    both = _span(
        "t2", "root", 2, attributes=output, error=True, status_message="TimeoutError: 30 s"
    )
    [run] = runs_from_spans([both], "f")
    [part] = run.entries[-1].parts
    assert isinstance(part, ToolResultPart) and part.summary == "partial\nTimeoutError: 30 s"


def test_exception_events_are_decoded_from_every_span_form() -> None:
    """OTLP/JSON (attribute lists), OTLP protobuf and ReadableSpan-style JSON (attribute
    objects) give the same exception text and status message."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

    from streams.importers.otel import spans_from_otlp_json, spans_from_otlp_proto

    def kv(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    said = {"exception.type": "E", "exception.message": "m"}
    event = {"name": "exception", "attributes": [kv(k, v) for k, v in said.items()]}
    otlp = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "aa",
                                "spanId": "bb",
                                "status": {"code": 2, "message": "E: m"},
                                "events": [{"name": "other"}, event],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    [from_json] = spans_from_otlp_json(otlp)
    readable = {
        "spanContext": {"traceId": "aa", "spanId": "bb"},
        "status": {"code": 2, "message": "E: m"},
        "events": [{"name": "exception", "attributes": said}],
    }
    [from_list] = spans_from_otlp_json([readable])
    proto = Span(
        trace_id=b"\xaa",
        span_id=b"\xbb",
        status=Status(code=Status.STATUS_CODE_ERROR, message="E: m"),
        events=[
            Span.Event(
                name="exception",
                attributes=[
                    KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in said.items()
                ],
            )
        ],
    )
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[proto])])]
    )
    [from_proto] = spans_from_otlp_proto(request.SerializeToString())
    for span in (from_json, from_list, from_proto):
        assert (span.error, span.exceptions, span.status_message) == (True, ("E: m",), "E: m")


async def test_a_run_on_the_ledger_in_another_fleet_is_refused_and_the_rest_published() -> None:
    """Found by a user trial: `publish` and `import` refuse a run already in another fleet,
    the OTLP receiver took it (every worker then dead-lettered its entries while the exporter
    was told they were taken). Now its spans are left out, the reason in OTLP's partial
    success (JSON and protobuf), by the same rule (RunFleets); the other runs are published,
    and the same export sent again is refused again (not taken as already sent)."""
    from google.protobuf.json_format import ParseDict  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    from streams.importers.base import stable_id
    from streams.importers.otel import spans_from_otlp_json

    theirs_doc = json.loads(SAMPLE.read_text())
    ours_doc = json.loads(
        (SAMPLE.parent / "genai-interlingua-openinference-openai-0.1.58-otlp.json").read_text()
    )
    theirs = spans_from_otlp_json(theirs_doc)
    run_id = stable_id("otel", theirs[0].trace_id)
    ours = stable_id("otel", spans_from_otlp_json(ours_doc)[0].trace_id)
    body = json.dumps(
        {"resourceSpans": theirs_doc["resourceSpans"] + ours_doc["resourceSpans"]}
    ).encode()
    receiver, fake = _receiver(on_ledger={run_id: "fleet-02"})
    for _ in range(2):  # the same export again: refused again, nothing more sent
        status, text = await _post(receiver, body)
        assert status == 200, text
        partial = json.loads(text)["partialSuccess"]
        assert partial["rejectedSpans"] == str(len(theirs)) == "2"
        assert (
            f"run {run_id} is on the ledger in fleet fleet-02, not fleet-01: a run belongs to "
            "one fleet: its 2 spans not published (send them to a receiver of fleet fleet-02: "
            "agentledger otlp --fleet fleet-02)"
        ) == partial["errorMessage"]
        assert {e.run_id for e in fake.sent} == {ours}
        assert [e.kind.value for e in fake.sent].count("MODEL_CALL") == 1  # once
    fleets = receiver.fleets
    assert isinstance(fleets, _Fleets)
    assert fleets.asked[0] == sorted([(run_id, "fleet-01"), (ours, "fleet-01")])

    # protobuf: the same reason in ExportTraceServiceResponse.partial_success
    request = ParseDict(_proto_shaped(theirs_doc), ExportTraceServiceRequest())
    async with TestClient(TestServer(app(receiver))) as client:
        answer = await client.post(
            "/v1/traces",
            data=request.SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert answer.status == 200
        said = ExportTraceServiceResponse.FromString(await answer.read())
    assert said.partial_success.rejected_spans == 2
    assert f"run {run_id} is on the ledger in fleet fleet-02" in said.partial_success.error_message


def _proto_shaped(doc: Any) -> Any:
    """OTLP/JSON's hex ids as protobuf JSON's base64 bytes (ParseDict reads the latter)."""
    import base64

    if isinstance(doc, list):
        return [_proto_shaped(x) for x in doc]
    if not isinstance(doc, dict):
        return doc
    out = {}
    for key, value in doc.items():
        if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
            out[key] = base64.b64encode(bytes.fromhex(value)).decode()
        else:
            out[key] = _proto_shaped(value)
    return out


async def test_an_export_whose_runs_are_of_this_fleet_answers_no_partial_success() -> None:
    receiver, fake = _receiver(on_ledger={"otel:someone-else": "fleet-02"})
    status, text = await _post(receiver, json.dumps(json.loads(SAMPLE.read_text())).encode())
    assert (status, json.loads(text)) == (200, {}) and fake.sent
