"""``agentledger worker``: the faust app that feeds ledger batches to the engine.

faust decides who consumes which partition (one consumer group across worker processes) and
fetches. It does not decide *where* a partition resumes: after every rebalance,
:class:`PositionedConsumer` seeks each assigned partition to the offset after the one
PostgreSQL says was applied. Nor does it carry the records one by one through its streams:
each fetch goes to the engine's loop whole (:mod:`streams.feed`), as faust's per-record path
cost as much as applying them. No acks and no Kafka commits: a non-retriable failure stops the
process, and the stored offsets decide where the next start begins."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import faust
import psycopg
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    NodeNotReadyError,
    RequestTimedOutError,
)
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from mode import Service

from infra.admin import existing_ledger_topics
from infra.errors import DeploymentMismatchError
from infra.local import register_worker
from infra.migrate import migrate_and_claim
from infra.settings import Settings
from infra.topics import TopicLister
from projectors.registry import selected
from schemas.topics import fleet_of_ledger_topic, ledger_topic
from streams import supervisor
from streams.builds import live_targets
from streams.changes import ChangeRelay, stream_projections
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine, SourceRecord, tune_gc
from streams.feed import Feed
from streams.health import (
    KAFKA,
    POSTGRESQL,
    Health,
    Supervision,
    forget,
    out_of_touch,
    report,
    stall,
)
from streams.kafka_logs import hold_back_kafka_floods
from streams.telemetry import telemetry_from_setting

logger = logging.getLogger(__name__)


# How long the broker may hold a fetch that finds no new records. faust fixes it at 1,500 ms.
# aiokafka leaves a partition whose fetched records are not all taken yet out of the next fetch
# request, and sends no other request to that broker until the one in flight returns: the
# partition a run is writing to then waited up to 1.5 s for the fetch of the idle ones
# (measured: a fetch came back empty after 1,005 ms, then 1,698 records 1.6 s old).
FETCH_MAX_WAIT_MS = 20


class ShortFetchConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # read when the consumer starts
        return consumer


class PositionedConsumer(faust_aiokafka.Consumer):
    """After a rebalance, resume each ledger partition where PostgreSQL says, not Kafka."""

    engine: Engine | None = None
    ledger_topics: frozenset[str] = frozenset()
    health: Health | None = None
    feed: Feed | None = None

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
        if self.health is not None:
            self.health.assigned({(tp.topic, tp.partition): o for tp, o in targets.items()})
        logger.info("resumed %d partitions at PostgreSQL positions", len(targets))

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ShortFetchConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:
        """Put each fetch's records on :attr:`feed` as one list (see :mod:`streams.feed`), not
        one by one through faust's conductor and streams; without a feed, faust's own path."""
        feed = self.feed
        if feed is None:
            await super()._drain_messages(fetcher)
            return
        consumer_stopped = self._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                fetched = [message async for _tp, message in self.getmany(timeout=1.0)]
                await self.sleep(0)  # a fetch that came back at once still lets others run
                if fetched:
                    await feed.put(fetched)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                logger.info("the broker stopped the consumer; shutting down")
                return
            raise

    def highwater(self, tp: TP) -> int:
        """The partition's high-water mark, or None while it is not assigned.

        aiokafka asserts the partition is assigned; faust's fetcher asks for every record it
        yields, and a rebalance (a fleet's topic added, a worker joining) can take a partition
        away between the fetch and the question. The assertion then crashed faust's Fetcher
        and left the worker alive and idle (issue 25). A record of a partition taken away is
        harmless here: the engine's stored positions decide what is applied, once.
        """
        try:
            return super().highwater(tp)
        except AssertionError:
            return None  # type: ignore[return-value]


class PositionedTransport(faust_aiokafka.Transport):
    Consumer = PositionedConsumer


def _record(m: Any) -> SourceRecord:
    headers = tuple((k, v) for k, v in (m.headers or ()))
    stamp = int(m.timestamp * 1000) if m.timestamp else None  # faust keeps seconds
    return SourceRecord(m.topic, m.partition, m.offset, m.key, m.value, headers, stamp)


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


def _behind(app: faust.App, health: Health, taken: Mapping[tuple[str, int], int]) -> int:
    """Entries still to come after those taken (highest offset per partition, not yet
    applied) over every assigned ledger partition: the whole backlog, not only the taken
    partitions' (a fleet's runs spread over all of them, so each alone may look caught up)."""
    highwater: dict[tuple[str, int], int | None] = {}
    for topic, partition in health.next_offset:
        try:
            highwater[(topic, partition)] = app.consumer.highwater(TP(topic, partition))
        except Exception:  # not assigned any more (a rebalance under way): no figure
            continue
    return health.behind(highwater, taken)


# Entries still to come (over all assigned partitions) at which the worker counts as behind and
# waits a little for more records to merge into its batch: each batch pays a fixed cost (a
# transaction, each touched run's heads and views), so while records wait, fewer larger batches
# catch up sooner than many small ones; a worker that keeps up sends what came as it comes.
BACKLOG = 100


# Exit codes of the faust process. Any exit the supervisor did not ask for is restarted with
# backoff, except EXIT_RESTART, which asks to be started again at once (onto new topics).
EXIT_FATAL = 70  # a non-retriable failure applying a batch
EXIT_CRASH = 71  # a faust service or agent crashed
EXIT_STALLED = 72  # partitions with lag and nothing applied for worker_stall_s
EXIT_STOP_TIMEOUT = 73  # asked to stop, and not stopped within stop_timeout_s
EXIT_RESTART = 75  # new fleet topics: start again onto them
EXIT_CONFIG = 78  # a setting no restart mends (another deployment's database): not restarted

EXIT_NAMES = {
    EXIT_FATAL: "fatal",
    EXIT_CRASH: "crashed",
    EXIT_STALLED: "stalled",
    EXIT_STOP_TIMEOUT: "stop timed out",
    EXIT_RESTART: "restart requested",
    EXIT_CONFIG: "misconfigured",
}


def _exit(code: int, reason: str) -> NoReturn:
    """End the process now with ``code`` and one clear line (stderr, log, and the exit file the
    supervisor reads). Crash-only: nothing is cleaned up; PostgreSQL's positions make the next
    start exact."""
    reason = " ".join(reason.split())[:500]
    line = f"agentledger worker (pid {os.getpid()}): exit {code}: {reason}"
    with contextlib.suppress(Exception):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    _write_exit_file(reason)
    with contextlib.suppress(Exception):
        logging.shutdown()
    os._exit(code)


def _write_exit_file(reason: str) -> None:
    path = os.environ.get("AGENTLEDGER_WORKER_EXIT_FILE")
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text(reason + "\n")


def _silent(exc: BaseException) -> bool:
    """Whether a Kafka request's failure means no answer (not a refusal the broker sent)."""
    return isinstance(
        exc,
        KafkaConnectionError
        | NodeNotReadyError
        | KafkaTimeoutError
        | RequestTimedOutError
        | TimeoutError
        | OSError,
    )


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _fatal(exc: BaseException | None) -> None:
    """A non-retriable failure: stop the process; the stored offsets decide the restart."""
    logger.critical("non-retriable failure applying a batch; stopping", exc_info=exc)
    _exit(EXIT_FATAL, f"non-retriable failure applying a batch: {_describe(exc)}")


class _Stop:
    """The one way a worker process ends on purpose: an exit code and reason, a graceful faust
    stop, and a deadline thread that ends the process if the stop does not finish in time
    (faust's shutdown can hang on a crashed service; the event loop can be blocked)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.code: int | None = None
        self.reason = ""
        self.worker: faust.Worker | None = None
        self._lock = threading.Lock()

    @property
    def requested(self) -> bool:
        return self.code is not None

    def request(self, code: int, reason: str) -> None:
        """Thread- and signal-safe; the first request wins."""
        with self._lock:
            if self.code is not None:
                return
            self.code, self.reason = code, reason
        logger.warning("stopping: %s", reason)
        deadline = threading.Timer(self.timeout_s, self._overdue)
        deadline.daemon = True
        deadline.start()
        worker = self.worker
        if worker is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: already stopping
                worker.loop.call_soon_threadsafe(worker._schedule_shutdown, signal.SIGTERM)

    def _overdue(self) -> None:
        _exit(
            EXIT_STOP_TIMEOUT,
            f"did not stop within {self.timeout_s:g}s of being asked ({self.reason})",
        )

    def finish(self) -> NoReturn:
        """faust has stopped: exit with the requested code (0 for a signal)."""
        if self.code is None:
            _exit(EXIT_CRASH, "faust stopped by itself")
        if self.code == 0:
            _write_exit_file(self.reason)
            logging.shutdown()
            os._exit(0)
        _exit(self.code, self.reason)


class CrashOnlyWorker(faust.Worker):
    """faust's worker, with SIGTERM/SIGINT bounded by a deadline even while the loop is busy."""

    stop_request: _Stop

    def _install_signal_handlers_unix(self) -> None:
        super()._install_signal_handlers_unix()
        # The loop's handlers run only when the loop is free; these run in the main thread
        # between any two bytecodes, so the deadline starts even during a long fold.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop_request.request(0, f"stopped by {signal.Signals(signum).name}")


def _crash_only() -> None:
    """Any faust service or agent that crashes ends the process (mode would otherwise log it,
    maybe restart an agent, maybe leave the process alive and idle: issue 25)."""
    original = Service.crash

    async def crash(self: Service, reason: BaseException) -> None:
        if STOP.requested:  # crashes while stopping on purpose: the deadline bounds them
            await original(self, reason)
            return
        logger.critical("faust service %s crashed", type(self).__name__, exc_info=reason)
        _exit(EXIT_CRASH, f"faust service {type(self).__name__} crashed: {_describe(reason)}")

    Service.crash = crash  # type: ignore[method-assign]


STOP = _Stop(30.0)


def _slug(spec: str) -> str:
    return "-".join(w.strip() for w in spec.split(",") if w.strip())


def group_of(settings: Settings) -> str:
    """The consumer group of a worker with these settings: one per projection set."""
    spec = settings.worker_projections
    return f"{settings.topic_prefix}-projector" + ("" if spec == "all" else "-" + _slug(spec))


def create_app(settings: Settings, existing: Sequence[str] = ()) -> faust.App:
    """The faust app for these settings; its engine is built when the worker starts.

    It subscribes to the configured fleets' ledger topics and the ``existing`` ones (every
    fleet's on the cluster: :func:`infra.admin.existing_ledger_topics`). A fleet's topic made
    later is found by a scan and the process restarts onto it (``EXIT_RESTART``): faust's own
    resubscription crashed its Fetcher under a backlog and lost topics (issue 25).
    """
    configured = [ledger_topic(settings.topic_prefix, f) for f in settings.fleet_ids]
    topics = sorted(set(configured) | set(existing))
    batch_size = settings.worker_batch_size
    within_s = settings.worker_batch_wait_s
    projections = selected(settings.worker_projections, settings)
    # Workers applying different projections are different consumer groups: each reads it all.
    group = group_of(settings)
    app = faust.App(
        group,
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
    health = Health()
    PositionedConsumer.health = health
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
    # No acks: positions live in PostgreSQL, and records reach the engine through the feed, not
    # faust's stream (whose per-topic "stream idle" checks would then report a healthy worker).
    source = app.topic(*topics, value_type=bytes, acks=False)
    feed = Feed(max_records=2 * batch_size)
    PositionedConsumer.feed = feed
    lister = TopicLister(settings.kafka_address)  # off this loop: see TopicLister
    health_conn: list[psycopg.AsyncConnection[Any]] = []
    supervision = Supervision.from_env()
    started = asyncio.Event()

    @app.agent(source)
    async def project(stream: Any) -> None:
        await engine.start()
        health.answered(KAFKA, POSTGRESQL)  # (the engine read PostgreSQL; Kafka assigned)
        started.set()
        tune_gc()
        # faust's consumer runs in its own thread; with the default 5 ms GIL switch interval a
        # batch being folded holds fetched records back for up to 5 ms at a time.
        sys.setswitchinterval(0.001)
        # Iterating the agent's channel is what subscribes the consumer to the ledger topics
        # (faust's Stream does the same); the records themselves come through the feed.
        aiter(stream.channel)
        behind = partial(_behind, app, health)
        async for messages in feed.batches(batch_size, within_s, behind, BACKLOG):
            try:
                records = [_record(m) for m in messages]
                health.begin()
                await engine.process(records)
                last: dict[tuple[str, int], int] = {}
                for r in records:
                    last[r.tp] = max(last.get(r.tp, -1), r.offset)
                health.applied(last, len(records))
                health.answered(KAFKA, POSTGRESQL)  # (a batch fetched and committed)
                if engine.telemetry.enabled:
                    engine.telemetry.record_lag(
                        _lag(app, ((r.topic, r.partition, r.offset) for r in records))
                    )
            except Exception as exc:
                _fatal(exc)

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
        if not started.is_set() or STOP.requested:
            return
        try:
            names = await lister.names()
        except Exception as exc:
            # (one line: a retried, expected failure while a broker is lost; not a traceback)
            logger.warning(
                "listing topics for new fleets failed (%s); trying again", _describe(exc)
            )
            if not _silent(exc):  # Kafka answered, with a refusal: it is there
                health.answered(KAFKA)
            return
        health.answered(KAFKA)
        new = sorted(
            n
            for n in names
            if fleet_of_ledger_topic(settings.topic_prefix, n) is not None
            and n not in PositionedConsumer.ledger_topics
        )
        # Each incarnation applies for a few seconds at least, however often fleets appear.
        if new and time.monotonic() - health.started >= MIN_UPTIME_S:
            STOP.request(EXIT_RESTART, f"new fleet topics {', '.join(new)}: restarting onto them")

    @app.timer(interval=settings.worker_health_s)  # type: ignore[untyped-decorator]
    async def check_health() -> None:
        if STOP.requested:
            return
        if not started.is_set():  # the engine is starting (Redis views refilled from PostgreSQL)
            waited = time.monotonic() - health.started
            if waited > settings.start_timeout_s + settings.worker_stall_s:
                _exit(EXIT_STALLED, f"stalled: the engine has not started in {waited:.0f}s")
            return
        try:
            assignment = app.consumer.assignment()
        except Exception:  # the consumer is not started yet (or is stopping)
            assignment = set()
        assigned = [tp for tp in assignment if tp.topic in source_topics()]
        highwater = {(tp.topic, tp.partition): app.consumer.highwater(tp) for tp in assigned}
        lag = health.lag(highwater)
        now = time.monotonic()
        why = stall(health, lag, settings.worker_stall_s, now)
        # (at least three of the timers that note answers, however they are set)
        silence_s = max(
            settings.worker_stall_s,
            3 * max(settings.worker_fleet_scan_s, settings.worker_health_s),
        )
        why = why or out_of_touch(health, silence_s, now)
        if why is not None:
            _exit(EXIT_STALLED, f"stalled: {why}")
        if engine.telemetry.enabled:
            engine.telemetry.record_health(lag, health.idle_s(time.monotonic()))
        try:
            if not health_conn:
                health_conn.append(
                    await psycopg.AsyncConnection.connect(
                        settings.pg_address, autocommit=True, connect_timeout=5
                    )
                )
            await report(
                health_conn[0],
                health,
                lag,
                group,
                settings.worker_projections,
                len(PositionedConsumer.ledger_topics),
                supervision,
            )
            health.answered(POSTGRESQL)
        except Exception as exc:  # health is reported, never a reason to stop applying
            logger.warning("writing the health row failed (%s); trying again", _describe(exc))
            if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | OSError):
                health.answered(POSTGRESQL)  # it answered, with an error: it is there
            for conn in health_conn:
                with contextlib.suppress(Exception):
                    await conn.close()
            health_conn.clear()

    def source_topics() -> frozenset[str]:
        return PositionedConsumer.ledger_topics

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
        await lister.close()
        for conn in health_conn:
            with contextlib.suppress(Exception):
                await forget(conn)
                await conn.close()
        engine.telemetry.shutdown()

    return app


# A worker process applies for at least this long before restarting onto new fleet topics.
MIN_UPTIME_S = 5.0


class _Watchdog:
    """A thread that ends the process when its event loop stops beating (blocked): the timers
    that detect stalls run on that loop, so they cannot see it themselves."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.limit_s = 0.0
        # touched every second by this thread, for the supervisor: a process that is frozen
        # as a whole (SIGSTOP, a hang holding the interpreter) cannot end itself
        self.sign_of_life: Path | None = None

    def beat(self) -> None:
        self.last = time.monotonic()

    def start(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.last = time.monotonic()
        named = os.environ.get(supervisor.SIGN_OF_LIFE_ENV)
        self.sign_of_life = Path(named) if named else None
        self._alive()
        thread = threading.Thread(target=self._watch, name="agentledger-watchdog", daemon=True)
        thread.start()

    def _alive(self) -> None:
        if self.sign_of_life is not None:
            with contextlib.suppress(OSError):
                self.sign_of_life.touch()

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            self._alive()
            silent = time.monotonic() - self.last
            if silent > self.limit_s and not STOP.requested:
                _exit(EXIT_STALLED, f"stalled: the event loop has not run for {silent:.0f}s")


WATCHDOG = _Watchdog()


def run_worker(settings: Settings, loglevel: str = "warning") -> NoReturn:
    """Apply migrations, then run the faust worker until SIGTERM/SIGINT, a crash or a stall.

    Crash-only: every way out ends the process with an exit code and one line saying why
    (``EXIT_*``); ``agentledger worker`` (:mod:`streams.supervisor`) starts it again.
    """
    # a crash in C code (a SIGSEGV) leaves every thread's Python stack in the log (names and
    # lines only, no values), where it left nothing to say where it was
    faulthandler.enable()
    try:
        migrate_and_claim(settings.pg_address, settings.topic_prefix)
        topics = asyncio.run(existing_ledger_topics(settings))
    except DeploymentMismatchError as exc:
        _exit(EXIT_CONFIG, str(exc))
    except Exception as exc:
        _exit(EXIT_CRASH, f"could not start: {_describe(exc)}")
    app = create_app(settings, topics)
    supervised = bool(os.environ.get("AGENTLEDGER_WORKER_SUPERVISOR"))
    note = None if supervised else register_worker(settings, settings.worker_projections)
    try:
        execute(
            app,
            loglevel,
            # before the supervisor's SIGKILL
            stop_timeout_s=max(1.0, settings.stop_timeout_s - 2.0),
            watchdog_s=supervisor.watchdog_limit_s(settings),
        )
    finally:
        if note is not None:
            note.unlink(missing_ok=True)


def execute(app: faust.App, loglevel: str, stop_timeout_s: float, watchdog_s: float) -> NoReturn:
    """Run a faust app crash-only: a crashed service ends the process (``EXIT_CRASH``), a
    stop request (a signal, :data:`STOP`) is bounded by ``stop_timeout_s``
    (``EXIT_STOP_TIMEOUT``), an event loop silent for ``watchdog_s`` ends it (``EXIT_STALLED``).
    """
    _crash_only()
    repeats = hold_back_kafka_floods(logging.getLevelNamesMapping().get(loglevel.upper(), 0))
    STOP.timeout_s = stop_timeout_s

    @app.timer(interval=1.0)  # type: ignore[untyped-decorator]
    async def heartbeat() -> None:
        WATCHDOG.beat()
        for name, kind, count in repeats.held_back(time.time()):
            logger.warning(
                "%s: %d more records like %r were held back in the %gs before",
                name,
                count,
                kind,
                repeats.window_s,
            )

    worker = CrashOnlyWorker(app, loglevel=loglevel, override_logging=True)
    worker.stop_request = STOP
    STOP.worker = worker
    WATCHDOG.start(watchdog_s)
    try:
        worker.execute_from_commandline()
    except BaseException as exc:  # faust's exit (SystemExit) or its re-raised crash
        if not STOP.requested and not isinstance(exc, SystemExit):
            _exit(EXIT_CRASH, f"faust ended with {_describe(exc)}")
    STOP.finish()
