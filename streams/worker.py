"""``agentledger worker``: the faust app whose agent feeds ledger batches to the engine.

faust decides who consumes which partition (one consumer group across worker processes) and
hands the agent batches of events. It does not decide *where* a partition resumes: after every
rebalance, :class:`PositionedConsumer` seeks each assigned partition to the offset after the one
PostgreSQL says was applied. faust acks a batch even when the handler raised (``take_events``
acks in a ``finally``), so a non-retriable failure stops the process instead of moving on; the
stored offsets decide where the next start begins.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from functools import partial
from typing import Any

import faust
from aiokafka.admin import AIOKafkaAdminClient
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from infra.local import register_worker
from infra.migrate import migrate
from infra.settings import Settings
from projectors.registry import selected
from streams.builds import live_targets
from streams.changes import ChangeRelay, stream_projections
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine, SourceRecord
from streams.telemetry import telemetry_from_setting
from streams.topics import ledger_topic

logger = logging.getLogger(__name__)

EXIT_FATAL = 70


class PositionedConsumer(faust_aiokafka.Consumer):
    """After a rebalance, resume each ledger partition where PostgreSQL says, not Kafka."""

    engine: Engine | None = None
    ledger_topics: frozenset[str] = frozenset()

    async def perform_seek(self) -> None:
        # faust's own seek first: it initialises its ack bookkeeping for the new assignment.
        await super().perform_seek()
        assigned = sorted(tp for tp in self.assignment() if tp.topic in self.ledger_topics)
        if not assigned or self.engine is None:
            return
        stored = await self.engine.positions([(tp.topic, tp.partition) for tp in assigned])
        earliest: Mapping[TP, int] = await self.earliest_offsets(*assigned)
        targets = {
            tp: max(stored[(tp.topic, tp.partition)], earliest.get(tp, 0) or 0) for tp in assigned
        }
        # seek_wait seeks inside faust's consumer thread and updates its read offsets; a plain
        # seek from this loop would race the fetcher.
        await self.seek_wait(targets)
        for tp, offset in targets.items():
            # Without this, faust refuses to commit after a forward seek past Kafka's offset.
            self._committed_offset[tp] = offset or None
            self._acked[tp].clear()
            self._acked_index[tp].clear()
        logger.info("resumed %d partitions at PostgreSQL positions", len(targets))


class PositionedTransport(faust_aiokafka.Transport):
    Consumer = PositionedConsumer


def _record(event: Any) -> SourceRecord:
    m = event.message
    headers = tuple((k, v) for k, v in (m.headers or ()))
    stamp = int(m.timestamp * 1000) if m.timestamp else None  # faust keeps seconds
    return SourceRecord(m.topic, m.partition, m.offset, m.key, m.value, headers, stamp)


def _event_lag(app: faust.App, events: list[Any]) -> int:
    return _lag(app, ((e.message.topic, e.message.partition, e.message.offset) for e in events))


def _lag(app: faust.App, positions: Iterable[tuple[str, int, int]]) -> int:
    """Entries behind the high-water marks of the partitions these (topic, partition, offset)
    positions came from."""
    last: dict[TP, int] = {}
    for topic, partition, offset in positions:
        tp = TP(topic, partition)
        last[tp] = max(last.get(tp, -1), offset)
    lag = 0
    for tp, offset in last.items():
        highwater = app.consumer.highwater(tp)
        if highwater is not None:
            lag += max(0, int(highwater) - offset - 1)
    return lag


BACKLOG = 1000  # entries behind the partitions' high-water marks that make the worker "behind"


async def _batches(
    stream: Any, size: int, within_s: float, lag: Callable[[list[Any]], int]
) -> AsyncIterator[list[Any]]:
    """faust's ``take_events``, merged into full batches while the worker is behind.

    ``take_events`` yields what its per-event feeding collected in one ``within_s`` window:
    under a backlog that is a few dozen events, so every batch touched each run for an entry or
    two and paid the per-run document round trip each time. While the consumer lag is at least
    ``BACKLOG``, windows are merged up to ``size``; otherwise (the steady state of the hot path)
    each window is sent as it comes.
    """
    windows = stream.take_events(size, within=within_s).__aiter__()
    carried: asyncio.Future[list[Any]] | None = None  # a window asked for, not yet come
    try:
        while True:
            try:
                events = await (carried or windows.__anext__())
            except StopAsyncIteration:
                break
            carried = None
            merged = list(events)
            while len(merged) < size and lag(events) >= BACKLOG:
                carried = asyncio.ensure_future(windows.__anext__())
                done, _ = await asyncio.wait({carried}, timeout=within_s * 2)
                if not done:
                    break  # the backlog ran dry: send what is merged, keep waiting after
                try:
                    events = carried.result()
                except StopAsyncIteration:
                    break
                carried = None
                merged.extend(events)
            yield merged
    finally:
        if carried is not None:
            carried.cancel()


def _fatal(exc: BaseException | None) -> None:
    """A non-retriable failure: stop the process; the stored offsets decide the restart."""
    logger.critical("non-retriable failure applying a batch; stopping", exc_info=exc)
    logging.shutdown()
    os._exit(EXIT_FATAL)


def _slug(spec: str) -> str:
    return "-".join(w.strip() for w in spec.split(",") if w.strip())


def create_app(settings: Settings) -> faust.App:
    """The faust app for these settings; its engine is built when the worker starts."""
    topics = [ledger_topic(settings.topic_prefix, f) for f in settings.fleet_ids]
    batch_size = settings.worker_batch_size
    within_s = settings.worker_batch_wait_s
    projections = selected(settings.worker_projections, settings)
    # Workers applying different projections are different consumer groups: each reads it all.
    group = "" if settings.worker_projections == "all" else "-" + _slug(settings.worker_projections)
    app = faust.App(
        f"{settings.topic_prefix}-projector{group}",
        broker=f"kafka://{settings.kafka_address}",
        store="memory://",
        value_serializer="raw",
        key_serializer="raw",
        topic_partitions=settings.topic_partitions,
        topic_allow_declare=False,
        topic_disable_leader=True,
        web_enabled=False,
        broker_commit_every=10_000,
        stream_buffer_maxsize=batch_size * 2,
        # Without a cap, each poll turns everything aiokafka prefetched (up to 1 MiB per
        # partition) into ConsumerRecords at once, and they wait in memory behind the full
        # stream buffer: under a backlog ~4k records per partition (16 partitions: ~67k records,
        # ~80 MB of RSS). Capped, a poll decodes one batch's worth; the rest stays raw bytes.
        broker_max_poll_records=batch_size,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.worker_session_timeout_s,
        broker_heartbeat_interval=3.0,
        datadir=str(settings.state_dir / "faust"),
    )
    app.transport = PositionedTransport(app.conf.broker_consumer, app)
    PositionedConsumer.ledger_topics = frozenset(topics)
    sink = KafkaDeadLetterSink(settings)
    engine = Engine(
        live_targets(settings.pg_address, projections),
        settings.pg_address,
        settings.redis_address,
        sink,
        telemetry=telemetry_from_setting(settings.otel),
        redis_prefix=settings.redis_prefix,
        defer_analytics=True,  # analytics commit while the next batches' hot views are applied
        analytics_interval_s=settings.worker_analytics_interval_s,
        analytics_max_pending=2 * batch_size,
        on_lane_failure=_fatal,
        follow_live=True,  # a rebuild swapped in becomes the build this worker writes
        change_streams=stream_projections(settings),
    )
    relay = ChangeRelay(settings) if settings.change_relay else None
    relay_stop = asyncio.Event()
    PositionedConsumer.engine = engine
    source = app.topic(*topics, value_type=bytes)
    # A fleet's topics created after the worker started are found by the scan below and added
    # to the agent's topic; faust resubscribes after this pause (its default is 45 s).
    conductor: Any = app.topics  # faust's TopicConductor (its pause and flag are not typed)
    conductor._resubscribe_sleep_lock_seconds = 1.0
    fleet_topic = re.compile(
        rf"^{re.escape(settings.topic_prefix)}\.ledger\.[A-Za-z0-9][A-Za-z0-9_-]{{0,99}}$"
    )
    admin: list[AIOKafkaAdminClient] = []

    @app.agent(source)
    async def project(stream: Any) -> None:
        await engine.start()
        started.set()
        # What exists now lives as long as the worker: keep it out of every collection, so a
        # full collection scans only what batches allocate (a long pause is hot-path latency).
        gc.collect()
        gc.freeze()
        # Folds allocate many short-lived containers: at the default 700 allocations a young
        # collection ran ~60 times a second (~1 s of every 25 at 1,000 entries/s); at 50,000
        # it runs ~2 times a second, ~0.15 s of every 25 (measured with gc.callbacks).
        gc.set_threshold(50_000, 20, 10)
        # faust's consumer runs in its own thread; with the default 5 ms GIL switch interval a
        # batch being folded holds fetched records back for up to 5 ms at a time.
        sys.setswitchinterval(0.001)
        behind = partial(_event_lag, app)
        async for events in _batches(stream, batch_size, within_s, behind):
            try:
                records = [_record(e) for e in events]
                await engine.process(records)
                if engine.telemetry.enabled:
                    engine.telemetry.record_lag(
                        _lag(app, ((r.topic, r.partition, r.offset) for r in records))
                    )
            except Exception as exc:
                _fatal(exc)

    started = asyncio.Event()

    @app.timer(interval=settings.worker_view_check_s)  # type: ignore[untyped-decorator]
    async def check_views() -> None:
        # Redis flushed or restarted while no batch arrives: nothing else would notice.
        if not started.is_set():
            return
        try:
            if await engine.check_views():
                logger.warning("Redis had lost views; refilled them from PostgreSQL")
        except Exception:
            logger.exception("checking Redis views failed; trying again at the next tick")

    @app.timer(interval=settings.worker_fleet_scan_s)  # type: ignore[untyped-decorator]
    async def discover_fleets() -> None:
        if not started.is_set():
            return
        try:
            if not admin:
                client = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_address)
                await client.start()
                admin.append(client)
            names = await admin[0].list_topics()
        except Exception:
            logger.warning("listing topics for new fleets failed; trying again", exc_info=True)
            return
        new = sorted(
            n for n in names if fleet_topic.match(n) and n not in PositionedConsumer.ledger_topics
        )
        if new:
            logger.warning("new fleet topics %s: subscribing to them", ", ".join(new))
            # The agent reads a clone of ``source`` (faust clones a channel per actor): every
            # channel that reads ledger topics gets the new ones.
            for channel in [source, *conductor._topics]:
                names_of = getattr(channel, "topics", None)
                if names_of and any(fleet_topic.match(n) for n in names_of):
                    channel.topics = [*names_of, *(n for n in new if n not in names_of)]
            PositionedConsumer.ledger_topics = PositionedConsumer.ledger_topics | frozenset(new)
            conductor._flag_changes()

    @app.task  # type: ignore[untyped-decorator]
    async def relay_changes() -> None:
        # The outbox to the change streams; one worker's relay holds the lock, others wait.
        if relay is None or not engine.change_streams:
            return
        try:
            await relay.run(relay_stop)
        except Exception as exc:
            _fatal(exc)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def close(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        relay_stop.set()
        await engine.close()
        await sink.close()
        for client in admin:
            await client.close()
        engine.telemetry.shutdown()

    return app


def run_worker(settings: Settings, loglevel: str = "warning") -> None:
    """Apply migrations, then run the faust worker until SIGTERM/SIGINT."""
    migrate(settings.pg_address)
    app = create_app(settings)
    note = register_worker(settings, settings.worker_projections)
    try:
        worker = faust.Worker(app, loglevel=loglevel, override_logging=True)
        worker.execute_from_commandline()
    finally:
        note.unlink(missing_ok=True)
