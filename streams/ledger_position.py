"""Where a run stands on the ledger: the highest sequence number its partition holds.

A publisher that has not seen a run (another process wrote its first entries, or this one
restarted) asks this before numbering the run's next entry itself.

:class:`LedgerPositions` keeps, per partition, the offset range it has read and the highest
sequence number of every run (record key) in it, for its lifetime (a publisher's). A question
reads only what it has not read yet: first the records appended since its last look, then
further back from the start of its range, in growing chunks, until every run asked for is found
or the partition's beginning is reached. So a run still being written is found in the first
chunk; the first run that is not on the ledger costs one pass over its partition, and every later
one (the rest of a 500-file import) only the records written since.

Only each record's run id and sequence number are decoded (the whole Avro body is read, the entry
is not built); an undecodable record, or one whose run id is not its key (dead-lettered
downstream), holds no place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.settings import Settings
from infra.topics import partition_for
from schemas.codec import LedgerCodec
from schemas.errors import LedgerDecodeError
from schemas.topics import ledger_topic

CHUNK = 2000  # the first step back; each next one is twice as long
MAX_KEYS = 2_000_000  # runs remembered over all partitions; past it the index starts again


@dataclass
class _Range:
    """Records [low, high) of one partition have been read; ``last``: key -> highest seq."""

    low: int
    high: int
    last: dict[bytes, int] = field(default_factory=dict)


class LedgerPositions:
    """Where runs stand, remembered over the lifetime of one publisher. Use ``close()``."""

    def __init__(
        self,
        settings: Settings,
        codec: LedgerCodec | None = None,
        chunk: int = CHUNK,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self.settings = settings
        self.codec = codec or LedgerCodec()
        self.chunk = chunk
        self.max_keys = max_keys
        self.records_read = 0  # records fetched and looked at, over the lifetime (for tests)
        self._consumer: AIOKafkaConsumer | None = None
        self._ranges: dict[TopicPartition, _Range] = {}
        self._partitions: dict[str, int] = {}  # topic -> its partition count
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()

    async def last_sequence_nos(self, runs: Iterable[tuple[str, str]]) -> dict[str, int]:
        """The highest sequence_no of each (fleet_id, run_id) on its ledger topic (0: none)."""
        wanted = {run_id: fleet for fleet, run_id in runs}
        if not wanted:
            return {}
        async with self._lock:  # one consumer: questions asked at once take turns
            return await self._ask(wanted)

    async def _ask(self, wanted: dict[str, str]) -> dict[str, int]:
        consumer = await self._started()
        by_tp: dict[TopicPartition, set[bytes]] = {}
        for run_id, fleet in wanted.items():
            topic = ledger_topic(self.settings.topic_prefix, fleet)
            count = await self._partition_count(consumer, topic)
            if not count:
                continue  # no topic: no entries
            tp = TopicPartition(topic, partition_for(run_id.encode(), count))
            by_tp.setdefault(tp, set()).add(run_id.encode())
        found: dict[str, int] = {}
        if by_tp:
            tps = list(by_tp)
            begins = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
            for tp, keys in by_tp.items():
                last = await self._where(consumer, tp, keys, begins[tp], ends[tp])
                found.update((key.decode(), last[key]) for key in keys if key in last)
        if sum(len(r.last) for r in self._ranges.values()) > self.max_keys:
            self._ranges.clear()  # (correct either way: the next question reads afresh)
        return {run_id: found.get(run_id, 0) for run_id in wanted}

    async def _where(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, keys: set[bytes], begin: int, end: int
    ) -> dict[bytes, int]:
        known = self._ranges.get(tp)
        if known is None or end < known.high:  # first look, or the topic was made again
            known = self._ranges[tp] = _Range(end, end)
        if end > known.high:  # what was appended since the last look
            await self._read(consumer, tp, known.high, end, known.last)
            known.high = end
        step = max(self.chunk, known.high - known.low)  # (doubling what is known, each step)
        while known.low > begin and not keys <= known.last.keys():
            low = max(begin, known.low - step)
            await self._read(consumer, tp, low, known.low, known.last)
            known.low = low
            step *= 2
        return known.last

    async def _read(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        low: int,
        high: int,
        last: dict[bytes, int],
    ) -> None:
        """Records [low, high) of ``tp`` folded into ``last`` (key -> highest seq)."""
        if consumer.assignment() != {tp}:
            consumer.assign([tp])
        consumer.resume(tp)
        consumer.seek(tp, low)
        position = low
        decode = self.codec.decode_position
        while position < high:
            batch = await consumer.getmany(tp, timeout_ms=5000, max_records=10_000)
            records = batch.get(tp, [])
            position = await consumer.position(tp)
            for record in records:
                if record.offset >= high or record.key is None:
                    continue
                self.records_read += 1
                try:
                    run_id, seq = decode(record.value or b"")
                except LedgerDecodeError:
                    continue  # poison: the projections dead-letter it, it holds no place
                if run_id.encode() != record.key:
                    continue  # keyed by another run: dead-lettered downstream too
                if seq > last.get(record.key, 0):
                    last[record.key] = seq
        consumer.pause(tp)  # (else its fetcher keeps fetching what is appended meanwhile)

    async def _partition_count(self, consumer: AIOKafkaConsumer, topic: str) -> int:
        if topic not in self._partitions:
            cluster = await consumer._client.fetch_all_metadata()  # (see source.topic_partitions)
            count = len(cluster.partitions_for_topic(topic) or ())
            if not count:
                return 0  # not cached: the topic may be made later
            self._partitions[topic] = count
        return self._partitions[topic]

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.settings.kafka_address,
                enable_auto_commit=False,
                max_partition_fetch_bytes=8 * 1024 * 1024,
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer


async def last_sequence_nos(
    settings: Settings,
    runs: Iterable[tuple[str, str]],
    codec: LedgerCodec | None = None,
    chunk: int = CHUNK,
) -> dict[str, int]:
    """The highest sequence_no of each (fleet_id, run_id) on its ledger topic (0: none yet),
    asked once (a publisher keeps a :class:`LedgerPositions` for its lifetime instead)."""
    positions = LedgerPositions(settings, codec, chunk)
    try:
        return await positions.last_sequence_nos(runs)
    finally:
        await positions.close()
