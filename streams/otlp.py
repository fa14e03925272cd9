"""``agentledger otlp``: an OTLP/HTTP receiver turning OpenTelemetry GenAI spans into ledger
entries (``POST /v1/traces``, protobuf or JSON; port 4318 by default, as OTLP/HTTP's).

The mapping is :mod:`streams.importers.otel` (pure); this is its edge: decode a request, map the
new spans with a book that remembers earlier batches (so a parent span sent after its child adds
no usage again), number each run's entries after what the ledger holds, publish, answer. A
request that cannot be decoded is answered 400 with the reason and nothing is sent. Spans left
out (a value the contract refuses; a run that is on the ledger in another fleet, by the rule
``import`` and ``publish`` follow) are named in OTLP's ``partialSuccess``, the rest published.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from infra.settings import Settings
from schemas.errors import AgentLedgerError, LedgerValidationError
from streams.importers.otel import (
    Span,
    TraceBook,
    ended_only,
    renumbered,
    run_of,
    runs_from_spans,
    spans_from_otlp_json,
    spans_from_otlp_proto,
)
from streams.publisher import AsyncPublisher
from streams.run_fleets import RunFleets, elsewhere_text

log = logging.getLogger(__name__)
PROTOBUF = "application/x-protobuf"


class Receiver:
    def __init__(self, settings: Settings, fleet_id: str, run_attribute: str | None = None):
        self.settings = settings
        self.fleet_id = fleet_id
        self.run_attribute = run_attribute
        self.book = TraceBook()
        self.publisher = AsyncPublisher(settings)
        self.fleets = RunFleets(settings)
        self._unanswered_said_until = 0.0  # (the warning that fleets go unchecked: once a window)
        self.lock = asyncio.Lock()
        self.entries = 0

    async def start(self) -> None:
        await self.publisher.start()

    async def close(self) -> None:
        await self.publisher.close()
        self.fleets.close()

    async def _one_fleet_each(self, spans: list[Span]) -> tuple[list[Span], int, list[str]]:
        """The spans whose run may go to this receiver's fleet, how many are not, and why: a
        run on the ledger in another fleet belongs to that one (``RunFleets``, the rule of
        ``import`` and ``publish``): its entries sent here would all be dead-lettered by the
        workers while the sender was told they were taken (found by a user trial)."""
        runs = {s.span_id: run_of(s, self.run_attribute) for s in spans}
        asked = [(run_id, self.fleet_id) for run_id in sorted(set(runs.values()))]
        clashes = await asyncio.to_thread(self.fleets.elsewhere, asked)
        if self.fleets.unanswered and time.monotonic() >= self._unanswered_said_until:
            # once per window without PostgreSQL, not once per export (found by a review)
            self._unanswered_said_until = time.monotonic() + self.fleets.RETRY_S
            log.warning(
                "otlp: PostgreSQL did not answer: the runs' fleets on the ledger are not "
                "checked for the next %gs (a worker dead-letters entries of a run from another "
                "fleet)",
                self.fleets.RETRY_S,
            )
        if not clashes:
            return spans, 0, []
        away = {run_id for run_id, _there, _here in clashes}
        kept = [s for s in spans if runs[s.span_id] not in away]
        why = []
        for run_id, there, here in clashes:
            count = sum(1 for r in runs.values() if r == run_id)
            why.append(
                f"{elsewhere_text(run_id, there, here)}: its {count} spans not published (send "
                f"them to a receiver of fleet {there}: agentledger otlp --fleet {there})"
            )
        return kept, len(spans) - len(kept), why

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        proto = request.content_type == PROTOBUF
        try:
            spans = spans_from_otlp_proto(body) if proto else spans_from_otlp_json(json.loads(body))
        except Exception as exc:  # any undecodable body: the sender is told, nothing is sent
            return web.Response(status=400, text=f"not an OTLP trace export: {type(exc).__name__}")
        async with self.lock:
            spans, rejected, refused = await self._one_fleet_each(spans)
            new = {s.span_id for s in spans} - self.book.done  # (not a copy of all it has seen)
            runs = runs_from_spans(spans, self.fleet_id, self.book, self.run_attribute)
            rejected += len(self.book.refused)
            refused += self.book.refused
            self.book.refused = []
            if refused:  # the others of the export go on (a 500 made the exporter drop them)
                log.warning("otlp: %d spans refused: %s", rejected, "; ".join(refused[:5]))
            published = 0
            try:
                await self.publisher.resume({(r.fleet_id, r.run_id) for r in runs})
                for run in runs:
                    last = self.publisher.book.last.get(run.run_id, 0)
                    if not last and ended_only(run):  # a trace with no call or tool: no run
                        continue
                    entries = renumbered(run, last, first_known=last > 0)
                    if entries:
                        await self.publisher.publish_batch(entries)
                        self.entries += len(entries)
                        published += 1
            except LedgerValidationError as exc:  # the spans break the contract: not retryable
                log.error("otlp: spans refused, not published: %s", exc)
                return web.Response(status=400, text=f"refused: {exc}")
            except AgentLedgerError as exc:
                if not published:  # nothing of this export went out: its retry maps it again
                    self.book.done -= new
                    log.warning("otlp: not published (the sender retries): %s", exc)
                else:
                    log.error(
                        "otlp: %d of %d runs of an export published, then: %s (the others' "
                        "spans are not published)",
                        published,
                        len(runs),
                        exc,
                    )
                return web.Response(status=503, text=str(exc))
        # OTLP's partial success: the sender is told what was left out and why
        message = "; ".join(refused[:20])
        if proto:
            answer = ExportTraceServiceResponse()
            if refused:
                answer.partial_success.CopyFrom(
                    ExportTracePartialSuccess(rejected_spans=rejected, error_message=message)
                )
            return web.Response(body=answer.SerializeToString(), content_type=PROTOBUF)
        if refused:
            return web.json_response(
                {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}}
            )
        return web.json_response({})


def app(receiver: Receiver) -> web.Application:
    application = web.Application(client_max_size=16 * 1024 * 1024)
    application.router.add_post("/v1/traces", receiver.traces)
    return application


async def serve(
    settings: Settings,
    fleet_id: str,
    host: str = "127.0.0.1",
    port: int = 4318,
    run_attribute: str | None = None,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the receiver until ``stop`` is set (or forever)."""
    receiver = Receiver(settings, fleet_id, run_attribute)
    await receiver.start()
    runner = web.AppRunner(app(receiver), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    if ready is not None:
        ready.set()
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await runner.cleanup()
        await receiver.close()
