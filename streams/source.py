"""Reading ledger topics directly (no consumer group): for replays, rebuilds and tests.

``drain`` starts each partition at the engine's stored position and feeds batches to it until
every partition reaches the end offset it had when the drain began.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.engine import BatchStats, Engine, SourceRecord


def to_source(record: Any) -> SourceRecord:
    return SourceRecord(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        headers=tuple(record.headers or ()),
    )


async def topic_partitions(
    consumer: AIOKafkaConsumer, topics: Sequence[str]
) -> list[TopicPartition]:
    """Every partition of these topics that exist. (``partitions_for_topic`` only knows topics
    the consumer subscribed to, so this asks for full metadata.)"""
    cluster = await consumer._client.fetch_all_metadata()
    return [
        TopicPartition(t, p) for t in topics for p in sorted(cluster.partitions_for_topic(t) or ())
    ]


async def read_all(bootstrap: str, topics: Sequence[str]) -> list[SourceRecord]:
    """Every record of these topics, from the beginning to the current end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = await topic_partitions(consumer, topics)
        if not partitions:
            return []
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        return [r async for r in _until_end(consumer, partitions, 10_000)]
    finally:
        await consumer.stop()


async def _until_end(
    consumer: AIOKafkaConsumer, partitions: list[TopicPartition], max_records: int
) -> Any:
    end = await consumer.end_offsets(partitions)
    remaining = {tp for tp in partitions if await consumer.position(tp) < end[tp]}
    while remaining:
        batch = await consumer.getmany(*remaining, timeout_ms=5000, max_records=max_records)
        for tp, records in batch.items():
            for record in records:
                if record.offset < end[tp]:
                    yield to_source(record)
            if await consumer.position(tp) >= end[tp]:
                remaining.discard(tp)


async def drain(
    engine: Engine, bootstrap: str, topics: Sequence[str], batch_size: int = 2000
) -> BatchStats:
    """Apply everything up to the current end of ``topics``, starting at the stored positions."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_poll_records=batch_size,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    total = BatchStats()
    await consumer.start()
    try:
        partitions = await topic_partitions(consumer, topics)
        if not partitions:
            return total
        consumer.assign(partitions)
        starts = await engine.positions([(tp.topic, tp.partition) for tp in partitions])
        for tp in partitions:
            consumer.seek(tp, max(starts[(tp.topic, tp.partition)], 0))
        batch: list[SourceRecord] = []
        async for record in _until_end(consumer, partitions, batch_size):
            batch.append(record)
            if len(batch) >= batch_size:
                _add(total, await engine.process(batch))
                batch = []
        _add(total, await engine.process(batch))
    finally:
        await consumer.stop()
    return total


def _add(total: BatchStats, stats: BatchStats) -> None:
    for name in vars(total):
        setattr(total, name, getattr(total, name) + getattr(stats, name))
