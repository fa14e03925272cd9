"""``agentledger otlp``: an OTLP/HTTP receiver turning OpenTelemetry GenAI spans into ledger
entries (``POST /v1/traces``, protobuf or JSON; port 4318 by default, as OTLP/HTTP's).

The mapping is :mod:`streams.importers.otel` (pure); this is its edge: decode a request, map the
new spans with a book that remembers earlier batches (so a parent span sent after its child adds
no usage again), number each run's entries after what the ledger holds, publish, answer. A
request that cannot be decoded is answered 400 with the reason and nothing is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from infra.settings import Settings
from schemas.errors import AgentLedgerError, LedgerValidationError
from streams.importers.otel import (
    TraceBook,
    ended_only,
    renumbered,
    runs_from_spans,
    spans_from_otlp_json,
    spans_from_otlp_proto,
)
from streams.publisher import AsyncPublisher

log = logging.getLogger(__name__)
PROTOBUF = "application/x-protobuf"


class Receiver:
    def __init__(self, settings: Settings, fleet_id: str, run_attribute: str | None = None):
        self.settings = settings
        self.fleet_id = fleet_id
        self.run_attribute = run_attribute
        self.book = TraceBook()
        self.publisher = AsyncPublisher(settings)
        self.lock = asyncio.Lock()
        self.entries = 0

    async def start(self) -> None:
        await self.publisher.start()

    async def close(self) -> None:
        await self.publisher.close()

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        proto = request.content_type == PROTOBUF
        try:
            spans = spans_from_otlp_proto(body) if proto else spans_from_otlp_json(json.loads(body))
        except Exception as exc:  # any undecodable body: the sender is told, nothing is sent
            return web.Response(status=400, text=f"not an OTLP trace export: {type(exc).__name__}")
        async with self.lock:
            done_before = set(self.book.done)
            runs = runs_from_spans(spans, self.fleet_id, self.book, self.run_attribute)
            refused, self.book.refused = self.book.refused, []
            if refused:  # the others of the export go on (a 500 made the exporter drop them)
                log.warning("otlp: %d spans refused: %s", len(refused), "; ".join(refused[:5]))
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
                    self.book.done = done_before
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
        if proto:
            return web.Response(body=b"", content_type=PROTOBUF)
        if refused:  # OTLP's partial success: the sender is told what was left out and why
            return web.json_response(
                {
                    "partialSuccess": {
                        "rejectedSpans": str(len(refused)),
                        "errorMessage": "; ".join(refused[:20]),
                    }
                }
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
