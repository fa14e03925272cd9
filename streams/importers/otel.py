"""OpenTelemetry GenAI spans as ledger entries: the mapping the OTLP receiver and
``agentledger import otel`` share (pure; I/O in :mod:`streams.otlp`).

Spans come as OTLP (protobuf or JSON, ``resourceSpans``) or as a list of ReadableSpan-style JSON
objects. A trace is a run (``otel-<trace id>``), unless ``run_attribute`` names a span or
resource attribute whose value is the run id. Recognised usage attributes:

* OTel GenAI semantic conventions: ``gen_ai.usage.input_tokens`` / ``output_tokens``, with
  ``gen_ai.request.model`` / ``gen_ai.response.model``, ``gen_ai.response.id``,
  ``gen_ai.system`` / ``gen_ai.provider.name``;
* OpenLLMetry: ``gen_ai.usage.prompt_tokens`` / ``completion_tokens``,
  ``gen_ai.usage.cache_read.input_tokens`` (or ``cache_read_input_tokens``),
  ``gen_ai.usage.reasoning_tokens``;
* OpenInference: ``llm.token_count.prompt`` / ``completion`` /
  ``prompt_details.cache_read`` / ``completion_details.reasoning``, ``llm.model_name``,
  ``llm.system`` / ``llm.provider``.

**Usage is taken once**, from the span that made the call: a span whose descendant (in the
same batch or an earlier one) carries usage adds nothing (Vercel-style parents repeat their
child's usage; they use ``ai.usage.*``, which is never read). A span's duration is its call's
latency, known here. Tool spans (``gen_ai.operation.name`` ``execute_tool``, ``gen_ai.tool.name``
or OpenInference kind ``TOOL``) are a tool call and its result, failed when the span's status is
an error, the result's summary then holding its exceptions and status message.

**A trace's root span ends its run** (``RUN_FINISHED``, after the batch's other entries): status
OK is ``SUCCEEDED``, ERROR ``FAILED`` (its exception and status message first, as an
``ERROR_EVENT``), UNSET (the default) ``UNKNOWN``: it ended, how is not said. A run whose root
span has not arrived stays open; a run named by ``run_attribute`` may span several traces, so
no root span ends it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.models import (
    EntryKind,
    LedgerEntry,
    ModelCallStatus,
    ModelUsagePart,
    RunStatus,
    TextPart,
    ToolResultPart,
    ToolResultStatus,
    UsageField,
)
from streams.importers.base import (
    ImportedRun,
    ImportFormatError,
    Summary,
    discover_files,
    exit_error,
    load_json,
    obj,
    stable_id,
)

FORMAT = "otel"


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    error: bool
    ok: bool = False  # status OK (set by the application); neither: UNSET, the default
    status_message: str = ""
    exceptions: tuple[str, ...] = ()  # its ``exception`` events, each ``type: message``


# -- decoding -------------------------------------------------------------------------------


def spans_from_otlp_json(doc: Any) -> list[Span]:
    """OTLP/JSON (``resourceSpans``) or a list of ReadableSpan-style objects."""
    if isinstance(doc, list):
        return [s for s in (_readable(d) for d in doc) if s is not None]
    out: list[Span] = []
    for rs in obj(doc).get("resourceSpans") or obj(doc).get("resource_spans") or []:
        resource = _attrs(obj(obj(rs).get("resource")).get("attributes"))
        for ss in obj(rs).get("scopeSpans") or obj(rs).get("scope_spans") or []:
            for raw in obj(ss).get("spans") or []:
                s = obj(raw)
                status = obj(s.get("status"))
                code = status.get("code")
                out.append(
                    Span(
                        trace_id=_hex_id(s.get("traceId") or s.get("trace_id")),
                        span_id=_hex_id(s.get("spanId") or s.get("span_id")),
                        parent_span_id=_hex_id(s.get("parentSpanId") or s.get("parent_span_id"))
                        or None,
                        name=str(s.get("name") or "span"),
                        start_ns=int(
                            s.get("startTimeUnixNano") or s.get("start_time_unix_nano") or 0
                        ),
                        end_ns=int(s.get("endTimeUnixNano") or s.get("end_time_unix_nano") or 0),
                        attributes={**resource, **_attrs(s.get("attributes"))},
                        error=code in (2, "STATUS_CODE_ERROR", "ERROR"),
                        ok=code in (1, "STATUS_CODE_OK", "OK"),
                        status_message=str(status.get("message") or ""),
                        exceptions=_exceptions(
                            (obj(e).get("name"), _attrs(obj(e).get("attributes")))
                            for e in s.get("events") or []
                        ),
                    )
                )
    return out


def spans_from_otlp_proto(data: bytes) -> list[Span]:
    """An OTLP/HTTP protobuf ``ExportTraceServiceRequest``."""
    from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    request.ParseFromString(data)
    out: list[Span] = []
    for rs in request.resource_spans:
        resource = _attrs(MessageToDict(rs.resource).get("attributes"))
        for ss in rs.scope_spans:
            for s in ss.spans:
                attributes = _attrs(MessageToDict(s).get("attributes"))
                out.append(
                    Span(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex() or None,
                        name=s.name or "span",
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={**resource, **attributes},
                        error=s.status.code == 2,
                        ok=s.status.code == 1,
                        status_message=s.status.message,
                        exceptions=_exceptions(
                            (e.name, _attrs(MessageToDict(e).get("attributes"))) for e in s.events
                        ),
                    )
                )
    return out


def _readable(d: Any) -> Span | None:
    doc = obj(d)
    context = obj(doc.get("spanContext"))
    if not context.get("traceId"):
        return None
    status = obj(doc.get("status"))
    return Span(
        trace_id=str(context["traceId"]),
        span_id=str(context.get("spanId") or ""),
        # the JS SDK 1.x wrote parentSpanId, 2.x writes parentSpanContext.spanId (read alone,
        # every 2.x span was a root and ended the run, the last end winning; found by a review)
        parent_span_id=_parent_of(doc),
        name=str(doc.get("name") or "span"),
        start_ns=_hr_ns(doc.get("startTime")),
        end_ns=_hr_ns(doc.get("endTime")),
        attributes=obj(doc.get("attributes")),
        error=status.get("code") == 2,
        ok=status.get("code") == 1,
        status_message=str(status.get("message") or ""),
        exceptions=_exceptions(
            (obj(e).get("name"), obj(obj(e).get("attributes"))) for e in doc.get("events") or []
        ),
    )


def _parent_of(doc: Mapping[str, Any]) -> str | None:
    parent = doc.get("parentSpanId") or obj(doc.get("parentSpanContext")).get("spanId")
    return str(parent) if parent else None


def _exceptions(events: Iterable[tuple[Any, Mapping[str, Any]]]) -> tuple[str, ...]:
    """The ``exception`` events' ``exception.type: exception.message`` (OTel's exception
    conventions; the stack trace is left out)."""
    out: list[str] = []
    for name, attributes in events:
        if name != "exception":
            continue
        kind, message = attributes.get("exception.type"), attributes.get("exception.message")
        text = ": ".join(str(x) for x in (kind, message) if x not in (None, ""))
        if text:
            out.append(text)
    return tuple(out)


def error_text(span: Span) -> str:
    """What a failed span says of its error: its exceptions and its status message, each once
    (the Python SDK writes the same ``Type: message`` in both)."""
    said = [*span.exceptions, span.status_message]
    return "\n".join(dict.fromkeys(t.strip() for t in said if t.strip()))


def _hr_ns(value: Any) -> int:
    """An OTel JS HrTime ([seconds, nanos]) or a number of milliseconds, in nanoseconds."""
    if isinstance(value, list) and len(value) == 2:
        return int(value[0]) * 1_000_000_000 + int(value[1])
    if isinstance(value, int | float):
        return int(value * 1_000_000)
    return 0


def _hex_id(value: Any) -> str:
    return str(value or "").lower()


def _attrs(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        entry = obj(item)
        value = obj(entry.get("value"))
        for kind in ("stringValue", "intValue", "doubleValue", "boolValue"):
            if kind in value:
                raw = value[kind]
                out[str(entry.get("key"))] = int(raw) if kind == "intValue" else raw
                break
    return out


# -- mapping --------------------------------------------------------------------------------

_INPUT = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
_OUTPUT = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.token_count.completion",
)
_CACHED = (
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
    "llm.token_count.prompt_details.cache_read",
)
_REASONING = (
    "gen_ai.usage.reasoning_tokens",
    "gen_ai.usage.reasoning.output_tokens",
    "llm.token_count.completion_details.reasoning",
)


def _first_int(attributes: Mapping[str, Any], keys: Iterable[str]) -> int | None:
    for key in keys:
        value = attributes.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            return int(value)
    return None


def has_usage(span: Span) -> bool:
    a = span.attributes
    return _first_int(a, _INPUT) is not None or _first_int(a, _OUTPUT) is not None


# the GenAI conventions' operations of one model call (OpenLLMetry's llm.request.type alike)
_CALL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "completion"})


def failed_call(span: Span) -> bool:
    """A model call that failed and reported no usage (a 429, a timeout): a call, of unknown
    usage, with its error status (found trying the product: such a span was not recorded)."""
    a = span.attributes
    operation = a.get("gen_ai.operation.name") or a.get("llm.request.type")
    return span.error and operation in _CALL_OPERATIONS


def is_tool(span: Span) -> bool:
    a = span.attributes
    return (
        a.get("gen_ai.operation.name") == "execute_tool"
        or "gen_ai.tool.name" in a
        or a.get("openinference.span.kind") == "TOOL"
    )


# How far up a span with usage makes its ancestors' usage a repeat of its own (a loop of
# parents must end somewhere).
USAGE_HOPS = 1000


@dataclass
class TraceBook:
    """What the mapping remembers across batches: spans with usage and each span's parent (to
    take usage once), and the spans already turned into entries."""

    parents: dict[str, str] = field(default_factory=dict)
    with_usage: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    # spans the mapping refused (a value the contract refuses, e.g. a negative token count):
    # "span <id>: <field>: <why>", no value quoted; the caller says so and empties it
    refused: list[str] = field(default_factory=list)
    # each span with a span with usage below it: the fewest hops up from one (1 to USAGE_HOPS),
    # kept up to date as spans arrive (see learn)
    usage_below: dict[str, int] = field(default_factory=dict)

    def learn(self, spans: list[Span]) -> None:
        """Take in a batch's parents and usage, and update ``usage_below`` from the spans they
        change only. (Walking up from every span with usage ever seen, in every batch, made a
        receiver's export cost grow with all the spans it had received: 16,000 exports of one
        span took 35 s, each slower than the one before.) The same spans as that walk found,
        but for a span sent again naming another parent: what its first parent was given stays
        (the walk followed the latest parent only)."""
        for s in spans:
            if s.parent_span_id:
                self.parents[s.span_id] = s.parent_span_id
            if has_usage(s):
                self.with_usage.add(s.span_id)
        # Breadth first from the batch's spans, nearest first, so a span's distance is settled
        # once per batch: those with usage at 0, the others at the distance they already have.
        level: list[str] = []
        later: dict[int, list[str]] = {}
        for s in spans:
            if s.span_id in self.with_usage:
                level.append(s.span_id)
            elif s.span_id in self.usage_below:
                later.setdefault(self.usage_below[s.span_id], []).append(s.span_id)
        for hops in range(USAGE_HOPS):
            level += later.pop(hops, [])
            following: list[str] = []
            for span_id in level:
                if hops and self.usage_below.get(span_id, hops) < hops:
                    continue  # (reached again nearer: taken from there)
                parent = self.parents.get(span_id)
                if parent is None or self.usage_below.get(parent, USAGE_HOPS + 1) <= hops + 1:
                    continue
                self.usage_below[parent] = hops + 1
                if parent not in self.with_usage:  # (one with usage went on from 0 already)
                    following.append(parent)
            level = following
            if not level and not later:
                break


def runs_from_spans(
    spans: list[Span],
    fleet_id: str,
    book: TraceBook | None = None,
    run_attribute: str | None = None,
) -> list[ImportedRun]:
    """Entries for spans not seen before, grouped by run, each run's numbered from 1 (the
    caller renumbers after what the ledger holds)."""
    book = book or TraceBook()
    book.learn(spans)
    has_usage_below = book.usage_below
    runs: dict[str, ImportedRun] = {}
    ends: list[tuple[ImportedRun, Span]] = []
    for s in sorted(spans, key=lambda x: (x.start_ns, x.span_id)):
        if s.span_id in book.done:
            continue
        book.done.add(s.span_id)
        run_id = run_of(s, run_attribute)
        run = runs.get(run_id)
        if run is None:
            run = runs[run_id] = ImportedRun(run_id, fleet_id, s.trace_id, FORMAT)
        at = datetime.fromtimestamp(s.start_ns / 1e9, UTC)
        with _refusing(book, s):  # one span the contract refuses is left out, not its export
            if (has_usage(s) or failed_call(s)) and s.span_id not in has_usage_below:
                _model_call(run, s, at)
            elif is_tool(s):
                _tool(run, s, at)
        if ends_its_run(s, run_attribute):
            ends.append((run, s))
    ended: set[str] = set()
    for run, s in ends:  # after the batch's other entries: the root span ends last
        if run.run_id in ended:
            continue  # (one end for a run: a second root span of its trace is no second end)
        ended.add(run.run_id)
        with _refusing(book, s):
            _end(run, s)
    return [run for run in runs.values() if run.entries]


def run_of(span: Span, run_attribute: str | None = None) -> str:
    """The run a span is in: its trace, or the value of ``run_attribute`` where it has one."""
    a = span.attributes
    run_key = str(a.get(run_attribute)) if run_attribute and run_attribute in a else None
    return stable_id("otel", run_key or span.trace_id)


def ends_its_run(span: Span, run_attribute: str | None = None) -> bool:
    """A trace's root span (no parent) that ended ends the trace's run: its children ended
    before it. A run named by ``run_attribute`` may hold several traces (a conversation's
    turns), so no root span ends it; neither does a span with no end time."""
    named = run_attribute is not None and run_attribute in span.attributes
    return span.parent_span_id is None and not named and span.end_ns > 0


@contextmanager
def _refusing(book: TraceBook, s: Span) -> Iterator[None]:
    try:
        yield
    except ValidationError as exc:
        errors = exc.errors()
        where = ".".join(str(x) for x in errors[0]["loc"]) if errors else "?"
        why = errors[0]["msg"] if errors else "invalid"
        book.refused.append(f"span {s.span_id}: {where}: {why}")
    except ValueError as exc:
        book.refused.append(f"span {s.span_id}: {type(exc).__name__}")


_END_KINDS = frozenset({EntryKind.RUN_STARTED, EntryKind.ERROR_EVENT, EntryKind.RUN_FINISHED})


def ended_only(run: ImportedRun) -> bool:
    """The run's entries are its root span's end and nothing else: a trace with no call or
    tool, unless the ledger holds the run already (its earlier spans came before)."""
    return all(e.kind in _END_KINDS for e in run.entries)


def _model_call(run: ImportedRun, s: Span, at: datetime) -> None:
    a = s.attributes
    tokens_in, out = _first_int(a, _INPUT), _first_int(a, _OUTPUT)
    cached, reasoning = _first_int(a, _CACHED), _first_int(a, _REASONING)
    unknown: list[UsageField] = []
    if tokens_in is None:
        unknown.append("input_tokens")
    if out is None:
        unknown.append("output_tokens")
    if cached is None:
        unknown.append("cached_input_tokens")
    if reasoning is None:
        unknown.append("reasoning_tokens")
    latency = (s.end_ns - s.start_ns) // 1_000_000 if s.end_ns >= s.start_ns > 0 else None
    if latency is None:
        unknown.append("latency_ms")
    model = str(
        a.get("gen_ai.response.model")
        or a.get("gen_ai.request.model")
        or a.get("llm.model_name")
        or "unknown"
    )
    provider = str(
        a.get("gen_ai.provider.name")
        or a.get("gen_ai.system")
        or a.get("llm.provider")
        or a.get("llm.system")
        or "unknown"
    )
    raw = {k: v for k, v in a.items() if k.startswith(("gen_ai.usage.", "llm.token_count."))}
    response_id = a.get("gen_ai.response.id")
    part = ModelUsagePart(
        provider=provider,
        model=model,
        purpose=str(a.get("gen_ai.operation.name") or "chat"),
        provider_response_id=str(response_id) if response_id else None,
        input_tokens=tokens_in or 0,
        cached_input_tokens=min(cached or 0, tokens_in or 0),
        output_tokens=out or 0,
        reasoning_tokens=min(reasoning or 0, out or 0),
        latency_ms=latency or 0,
        status=ModelCallStatus.ERROR if s.error else ModelCallStatus.OK,
        raw_usage_json=json.dumps(raw),
        unknown_fields=tuple(unknown),
    )
    _start(run, at)
    run.add(
        EntryKind.MODEL_CALL, at, f"span-{s.span_id}", [part], metadata={"otel.span": s.name[:200]}
    )


def _tool(run: ImportedRun, s: Span, at: datetime) -> None:
    a = s.attributes
    name = str(a.get("gen_ai.tool.name") or a.get("tool.name") or s.name)
    call_id = str(a.get("gen_ai.tool.call.id") or f"span-{s.span_id}")
    _start(run, at)
    run.request(
        at,
        f"span-{s.span_id}",
        call_id,
        name,
        a.get("gen_ai.tool.call.arguments") or a.get("input.value") or "",
        finished_at=datetime.fromtimestamp(s.end_ns / 1e9, UTC) if s.end_ns >= s.start_ns else None,
    )
    output = str(a.get("gen_ai.tool.call.result") or a.get("output.value") or "")
    error = error_text(s) if s.error else ""
    result = ToolResultPart(  # a failed tool's error is its result, as every importer keeps it
        tool_call_id=call_id,
        status=ToolResultStatus.FAILED if s.error else ToolResultStatus.SUCCEEDED,
        timed_out=False,
        summary="\n".join(t for t in (output, error) if t),  # (long: artifact store)
    )
    end = datetime.fromtimestamp(s.end_ns / 1e9, UTC) if s.end_ns else at
    run.add(
        EntryKind.TOOL_CALL_RESULT, end, f"span-{s.span_id}-result", [result], tool_call_id=call_id
    )


def _end(run: ImportedRun, s: Span) -> None:
    """The run's end, as every importer writes it: ``RUN_FINISHED`` with the root span's
    outcome (OK: succeeded; ERROR: failed, its error first as an ``ERROR_EVENT``; UNSET, the
    default: it ended, how is not said, so ``UNKNOWN``, never a made-up success)."""
    at = datetime.fromtimestamp(s.end_ns / 1e9, UTC)
    _start(run, datetime.fromtimestamp(s.start_ns / 1e9, UTC))
    status = RunStatus.FAILED if s.error else RunStatus.SUCCEEDED if s.ok else RunStatus.UNKNOWN
    text = error_text(s) if s.error else ""
    if text:
        run.add(EntryKind.ERROR_EVENT, at, f"span-{s.span_id}-error", [exit_error(text)])
    run.add(
        EntryKind.RUN_FINISHED,
        at,
        f"span-{s.span_id}-end",
        [TextPart(text=f"finished: {status.value}")],
        run_status=status,
        metadata={"otel.span": s.name[:200]},
    )


def _start(run: ImportedRun, at: datetime) -> None:
    if not run.entries:
        run.add(EntryKind.RUN_STARTED, at, "start", [TextPart(text="run from OpenTelemetry spans")])


def renumbered(run: ImportedRun, after: int, first_known: bool) -> list[LedgerEntry]:
    """A batch's entries numbered after the ``after`` entries the ledger holds (a run seen
    before needs no second RUN_STARTED)."""
    entries = [e for e in run.entries if not (first_known and e.kind is EntryKind.RUN_STARTED)]
    return [e.model_copy(update={"sequence_no": after + i}) for i, e in enumerate(entries, 1)]


class OtelFiles:
    """``agentledger import otel FILE...``: OTLP/JSON exports or ReadableSpan lists on disk."""

    FORMAT = FORMAT

    @staticmethod
    def discover(paths: Iterable[Path]) -> list[Path]:
        return discover_files(paths, ".json")

    @staticmethod
    def import_file(
        path: Path, fleet_id: str, settled: bool = False
    ) -> tuple[list[ImportedRun], Summary]:
        doc = load_json(path, "an OpenTelemetry export")
        spans = spans_from_otlp_json(doc)
        if not spans:
            raise ImportFormatError(f"{path}: no spans (OTLP/JSON resourceSpans or a span list)")
        summary = Summary(str(path))
        runs = [r for r in runs_from_spans(spans, fleet_id) if not ended_only(r)]
        for run in runs:
            for e in run.entries:
                for p in e.parts:
                    if isinstance(p, ModelUsagePart):
                        summary.calls += 1
                        summary.input_tokens += p.input_tokens
                        summary.output_tokens += p.output_tokens
        summary.runs, summary.entries = len(runs), sum(len(r.entries) for r in runs)
        kept = {r.run_id for r in runs}
        left = len(spans) - sum(
            1
            for s in spans
            if has_usage(s)
            or failed_call(s)
            or is_tool(s)
            or (ends_its_run(s) and run_of(s) in kept)
        )
        if left:  # (a count of 0 is no skip)
            summary.skipped["spans without usage or a tool"] = left
        return runs, summary
