"""Where a run stands on the ledger: the highest sequence number its partition holds.

A publisher that has not seen a run (another process wrote its first entries, or this one
restarted) asks this before numbering the run's next entry itself. The run's partition is read
backwards in chunks from its end, so a run still being written is found in the first chunk; a
run that has no entries costs one pass over the partition.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.settings import Settings
from schemas.codec import LedgerCodec
from schemas.errors import LedgerDecodeError
from streams.topics import ledger_topic, partition_for

CHUNK = 2000


async def last_sequence_nos(
    settings: Settings,
    runs: Iterable[tuple[str, str]],
    codec: LedgerCodec | None = None,
    chunk: int = CHUNK,
) -> dict[str, int]:
    """The highest sequence_no of each (fleet_id, run_id) on its ledger topic (0: none yet)."""
    codec = codec or LedgerCodec()
    wanted = {run_id: fleet for fleet, run_id in runs}
    found: dict[str, int] = {}
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_address, enable_auto_commit=False)
    await consumer.start()
    try:
        by_tp: dict[TopicPartition, set[bytes]] = {}
        cluster = await consumer._client.fetch_all_metadata()  # (see source.topic_partitions)
        for run_id, fleet in wanted.items():
            topic = ledger_topic(settings.topic_prefix, fleet)
            partitions = cluster.partitions_for_topic(topic)
            if not partitions:
                continue  # no topic: no entries
            tp = TopicPartition(topic, partition_for(run_id.encode(), len(partitions)))
            by_tp.setdefault(tp, set()).add(run_id.encode())
        for tp, keys in by_tp.items():
            consumer.assign([tp])
            begin = (await consumer.beginning_offsets([tp]))[tp]
            high = (await consumer.end_offsets([tp]))[tp]
            remaining = set(keys)
            while remaining and high > begin:
                low = max(begin, high - chunk)
                consumer.seek(tp, low)
                seen: dict[bytes, int] = {}
                while await consumer.position(tp) < high:
                    batch = await consumer.getmany(tp, timeout_ms=5000, max_records=chunk)
                    for record in batch.get(tp, []):
                        if record.offset >= high or record.key not in remaining:
                            continue
                        try:
                            seq = codec.decode(record.value or b"").sequence_no
                        except LedgerDecodeError:
                            continue  # poison: the projections dead-letter it, it holds no place
                        seen[record.key] = max(seen.get(record.key, 0), seq)
                for key, seq in seen.items():
                    found[key.decode()] = seq
                remaining -= seen.keys()
                high = low
    finally:
        await consumer.stop()
    return {run_id: found.get(run_id, 0) for run_id in wanted}
