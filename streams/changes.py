"""The change relay: the outbox ``al_changes`` to the change streams, exactly once, in order.

**Why a transactional outbox and Kafka transactions.** A change must appear in its stream if
and only if PostgreSQL committed it. Producing from the worker's batch transaction cannot give
that: Kafka and PostgreSQL do not commit together, so a crash between the two commits would lose
or invent a change. Instead the batch transaction itself writes each changed key's new head to
``al_changes`` (so the row exists exactly when the change committed), and this relay sends the
rows in id order, then deletes them. Along one run, ids grow in commit order: a run's writers
serialize on its partition's offset rows, and a swap locks those too.

What is left is the relay's own crash: after Kafka has the records but before PostgreSQL
deleted their rows. The relay therefore sends each batch inside a Kafka transaction, with each
record's outbox id in a header, and records per change-topic partition the offset after its
last deleted batch (``al_change_relay``). A restarted relay (one ``transactional_id``) first
fences any earlier incarnation, whose open transaction Kafka then aborts, reads every partition
from that offset with ``read_committed``, and deletes the rows it finds there: those were sent.
Everything else is sent again. A plain idempotent producer would dedupe retries only within one
producer session, and could not stop a relay that lost its database lock from still writing;
transactions fence it. One relay runs at a time (a PostgreSQL advisory lock); every worker
starts one, the others wait.

Readers of the streams read with ``isolation.level=read_committed`` (the SDK does), so a batch
aborted by a crash is never seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from infra.errors import is_retriable
from infra.settings import Settings
from infra.topics import change_topic_specs, ensure_topics, partition_for
from projectors.registry import selected
from projectors.stores import outbox
from projectors.stores.outbox import OutboxRow
from projectors.stores.postgres import from_jsonb_text, use_documents
from schemas.changes import ChangeCodec, ChangeKind, ProjectionChange, change_key
from schemas.topics import change_schema_topic, change_topic, projection_of_change_topic

logger = logging.getLogger(__name__)

CHANGE_ID_HEADER = "agentledger-change-id"
_KINDS: dict[str, ChangeKind] = {"state": "STATE", "removed": "REMOVED", "build": "BUILD_CHANGED"}


def stream_projections(settings: Settings) -> list[str]:
    """The projections whose changes are streamed (``AGENTLEDGER_CHANGE_STREAMS``)."""
    spec = settings.change_streams.strip()
    if spec in ("", "none"):
        return []
    return [p.name for p in selected(spec, settings)]


async def ensure_change_topics(settings: Settings) -> list[str]:
    """Create the change topics of the streamed projections and the schema topic."""
    return await ensure_topics(
        settings.kafka_address,
        change_topic_specs(
            settings.topic_prefix,
            stream_projections(settings),
            settings.topic_partitions,
            settings.topic_replication,
        ),
    )


@dataclass
class RelayStats:
    sent: int = 0
    batches: int = 0
    recovered: int = 0  # rows found already sent at a restart (deleted, not sent again)


class ChangeRelay:
    """Sends the outbox to the change topics; :meth:`run` until ``stop`` is set."""

    def __init__(
        self,
        settings: Settings,
        codec: ChangeCodec | None = None,
        batch: int | None = None,
        idle_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self.codec = codec or ChangeCodec()
        self.batch = batch or settings.change_relay_batch
        self.idle_s = idle_s
        self.stats = RelayStats()
        self.active = asyncio.Event()  # holds the lock and has recovered
        self._builds: dict[tuple[str, str], tuple[int, Any]] = {}
        self._partitions: dict[str, int] = {}

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self._session(stop)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                logger.warning("change relay: %s; starting again in 1 s", exc)
            self.active.clear()
            await _wait(stop, 1.0)

    async def _session(self, stop: asyncio.Event) -> None:
        dsn = self.settings.pg_address
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as lock:
            while not stop.is_set():
                if await outbox.try_relay_lock(lock):
                    break
                await _wait(stop, 1.0)  # another relay has it
            if stop.is_set():
                return
            await ensure_change_topics(self.settings)
            producer = AIOKafkaProducer(
                bootstrap_servers=self.settings.kafka_address,
                transactional_id=f"{self.settings.topic_prefix}.changes-relay",
                enable_idempotence=True,
                acks="all",
                compression_type="zstd",
                linger_ms=5,
                request_timeout_ms=15000,
            )
            await producer.start()  # init_transactions: fences an earlier incarnation
            try:
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    use_documents(conn)
                    await self._register_schema(producer)
                    await self._recover(conn)
                    await outbox.listen(conn)
                    self.active.set()
                    await self._relay(conn, lock, producer, stop)
            finally:
                with contextlib.suppress(Exception):
                    await producer.stop()

    async def _relay(
        self,
        conn: psycopg.AsyncConnection[Any],
        lock: psycopg.AsyncConnection[Any],
        producer: AIOKafkaProducer,
        stop: asyncio.Event,
    ) -> None:
        while not stop.is_set():
            rows = await outbox.pending_changes(conn, self.batch)
            if rows:
                await outbox.ping(lock)  # the lock's session is still ours
                await self._send(conn, producer, rows)
                continue
            async for _ in conn.notifies(timeout=self.idle_s, stop_after=1):
                pass

    async def _send(
        self,
        conn: psycopg.AsyncConnection[Any],
        producer: AIOKafkaProducer,
        rows: Sequence[OutboxRow],
    ) -> None:
        changes = [await self._change(conn, row) for row in rows]
        placed: list[tuple[str, int, ProjectionChange]] = []
        for change in changes:
            topic = change_topic(self.settings.topic_prefix, change.projection)
            count = await self._partition_count(producer, topic)
            if change.kind == "BUILD_CHANGED":  # every partition's readers see the marker
                placed.extend((topic, p, change) for p in range(count))
            else:
                placed.append((topic, partition_for(change_key(change, 0), count), change))
        async with producer.transaction():
            futures = [
                await producer.send(
                    topic,
                    self.codec.encode(change),
                    key=change_key(change, partition),
                    partition=partition,
                    headers=[(CHANGE_ID_HEADER, str(change.change_id).encode())],
                )
                for topic, partition, change in placed
            ]
            sent = await asyncio.gather(*futures)
        ends: dict[tuple[str, int], int] = {}
        for meta in sent:
            key = (meta.topic, meta.partition)
            ends[key] = max(ends.get(key, 0), meta.offset + 1)
        async with conn.transaction():
            await outbox.delete_changes(conn, [c.change_id for c in changes])
            await outbox.save_checked(conn, ends)
        self.stats.sent += len(changes)
        self.stats.batches += 1

    async def _change(self, conn: psycopg.AsyncConnection[Any], row: OutboxRow) -> ProjectionChange:
        (cid, projection, build, kind, run_id, fleet_id, seq, held, doc, tp, previous, at) = row
        version, inputs = await self._build(conn, projection, build)
        return ProjectionChange(
            change_id=cid,
            kind=_KINDS[kind],
            projection=projection,
            build=build,
            projection_version=version,
            committed_at=at,
            fleet_id=fleet_id,
            run_id=run_id,
            applied_seq=seq or 0,
            held=held or 0,
            # the head's JSON text as the batch wrote it (NULs as jsonb takes them, undone)
            state_json=from_jsonb_text(doc.encode()).decode() if kind == "state" and doc else None,
            previous_build=previous,
            inputs=inputs if kind == "build" else None,
            traceparent=tp,
        )

    async def _build(
        self, conn: psycopg.AsyncConnection[Any], projection: str, build: str
    ) -> tuple[int, Any]:
        found = self._builds.get((projection, build))
        if found is None:
            found = await outbox.build_version(conn, projection, build) or (0, None)
            self._builds[(projection, build)] = found
        return found

    async def _partition_count(self, producer: AIOKafkaProducer, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            parts = await producer.partitions_for(topic)
            count = self._partitions[topic] = len(parts)
        return count

    async def _register_schema(self, producer: AIOKafkaProducer) -> None:
        """The writer schema under its fingerprint, for readers that do not know it."""
        writer = self.codec.writer
        async with producer.transaction():
            await producer.send_and_wait(
                change_schema_topic(self.settings.topic_prefix),
                writer.schema_json.encode(),
                key=writer.fingerprint.hex().encode(),
            )

    async def _recover(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Delete the rows an earlier relay sent but did not delete (found in the topics from
        each partition's checked offset), then note every partition's end as checked."""
        rows = await outbox.relay_checked(conn)
        waiting = await outbox.waiting_projections(conn)
        # every topic this or another relay may have sent to: what is streamed now, what the
        # outbox still holds, and what a relay recorded (settings may differ between workers)
        prefix = self.settings.topic_prefix
        topics = sorted(
            {change_topic(prefix, p) for p in self._streamed()}
            | {change_topic(prefix, p) for p in waiting}
            | {str(t) for t, _p, _o in rows}
        )
        await ensure_topics(
            self.settings.kafka_address,
            [
                spec
                for spec in change_topic_specs(
                    prefix,
                    [projection_of_change_topic(prefix, t) or t for t in topics],
                    self.settings.topic_partitions,
                    self.settings.topic_replication,
                )
                if spec.name in topics
            ],
        )
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_address,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            parts = [
                TopicPartition(t, p)
                for t in topics
                for p in sorted(consumer.partitions_for_topic(t) or await _parts(consumer, t))
            ]
            checked = {TopicPartition(t, p): int(o) for t, p, o in rows}
            consumer.assign(parts)
            ends = await consumer.end_offsets(parts)
            found: list[int] = []
            for tp in parts:
                start = checked.get(tp, 0)  # never recorded: from its beginning
                if start >= ends[tp]:
                    continue
                consumer.seek(tp, start)
                while await consumer.position(tp) < ends[tp]:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    for record in batch.get(tp, []):
                        for name, value in record.headers:
                            if name == CHANGE_ID_HEADER:
                                found.append(int(value))
            async with conn.transaction():
                if found:
                    deleted = await outbox.delete_changes(conn, found)
                    self.stats.recovered += deleted
                    logger.warning(
                        "change relay: %d changes were sent before a restart; not sent again",
                        deleted,
                    )
                checked_now = {(tp.topic, tp.partition): ends[tp] for tp in parts}
                await outbox.save_checked(conn, checked_now)
        finally:
            await consumer.stop()

    def _streamed(self) -> list[str]:
        return stream_projections(self.settings)


async def _parts(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()
    return consumer.partitions_for_topic(topic) or set()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
