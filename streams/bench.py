"""``agentledger bench``: figures measured beside their baselines in the same run.

Runs against the configured services, in a private database (``<db>_bench``), topic prefix and
Redis prefix, with its own background worker, so it never touches live projections.

- hot path: publish -> the run's Redis views reflect the entry, p50/p99, while a steady background
  load is published; beside it the floors measured in the same run: the publisher's Kafka ack
  latency and a Redis round trip.
- replay: entries/s the engine applies reading the topics directly, beside the ceiling of
  consuming and decoding only.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer

from infra.settings import Settings
from projectors.registry import all_projections
from projectors.stores.redis import view_key
from schemas.codec import LedgerCodec
from schemas.models import LedgerEntry
from streams.builds import live_targets
from streams.deployment import PrivateDeployment
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine, Target
from streams.publisher import AsyncPublisher
from streams.simulate import simulate_runs
from streams.source import drain, topic_partitions
from streams.topics import ledger_topic

FLEETS = ["fleet-01", "fleet-02"]


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    baseline_name: str = ""
    baseline: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        assert self.baseline is not None
        return self.value / self.baseline


@dataclass
class BenchReport:
    figures: list[Figure] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> str:
        figures = [asdict(f) | {"ratio": f.ratio} for f in self.figures]
        return json.dumps(
            {"figures": figures, "settings": self.settings, "machine": self.machine}, indent=2
        )


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine_info() -> dict[str, Any]:
    import aiokafka
    import faust

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "faust": faust.__version__,
        "aiokafka": aiokafka.__version__,
    }


async def _redis_rtt(url: str, samples: int) -> list[float]:
    client = aioredis.Redis.from_url(url)
    try:
        out = []
        for _ in range(samples):
            t0 = time.perf_counter()
            await client.ping()
            out.append(time.perf_counter() - t0)
        return out
    finally:
        await client.aclose()


async def hot_path(d: PrivateDeployment, rate: float, seconds: float) -> list[Figure]:
    """Publish at ``rate`` entries/s; time publish -> every hot view reflects each entry."""
    s = d.settings
    hot = [p.name for p in all_projections() if p.hot]
    runs = simulate_runs(len(FLEETS), 100_000, seed=int(time.time()))
    pending: dict[str, list[tuple[int, float]]] = {}
    latencies: list[float] = []
    acks: list[float] = []
    client = aioredis.Redis.from_url(s.redis_address)
    stop = asyncio.Event()

    async def watch() -> None:
        builds = {t.name: t.build for t in live_targets(s.pg_address) if t.name in hot}
        while not stop.is_set() or pending:
            run_ids = list(pending)
            if run_ids:
                pipe = client.pipeline(transaction=False)
                for run_id in run_ids:
                    for p in hot:
                        pipe.hget(view_key(s.redis_prefix, p, builds[p], run_id), "seq")
                seqs = await pipe.execute()
                now = time.perf_counter()
                for i, run_id in enumerate(run_ids):
                    row = seqs[i * len(hot) : (i + 1) * len(hot)]
                    got = [int(x) if x is not None else 0 for x in row]
                    seen = min(got)
                    waiting = pending[run_id]
                    latencies.extend(now - t for seq, t in waiting if seq <= seen)
                    rest = [(seq, t) for seq, t in waiting if seq > seen]
                    if rest:
                        pending[run_id] = rest
                    else:
                        del pending[run_id]
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    try:
        async with AsyncPublisher(s) as publisher:
            # Warm-up: one run through the pipeline before the clock starts.
            for warm in (next(runs), next(runs)):
                await publisher.publish_batch(warm)
                pending[warm[0].run_id] = [(len(warm), time.perf_counter())]
            deadline = time.perf_counter() + 60
            while pending and time.perf_counter() < deadline:
                await asyncio.sleep(0.01)
            latencies.clear()
            interval = 10 / rate  # ten entries per tick
            started = time.perf_counter()
            buffer: list[LedgerEntry] = []
            tick = 0
            while time.perf_counter() - started < seconds:
                while len(buffer) < 10:
                    buffer.extend(next(runs))
                batch, buffer = buffer[:10], buffer[10:]
                t0 = time.perf_counter()
                await publisher.publish_batch(batch)
                acks.append(time.perf_counter() - t0)
                for e in batch:
                    pending.setdefault(e.run_id, []).append((e.sequence_no, t0))
                tick += 1
                delay = started + tick * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
        stop.set()
        await asyncio.wait_for(watcher, 60)
    finally:
        stop.set()
        watcher.cancel()
        await client.aclose()
    rtt = await _redis_rtt(s.redis_address, 1000)
    ms = 1000.0
    return [
        Figure(
            "hot path p50 (publish -> Redis views)",
            _pct(latencies, 0.5) * ms,
            "ms",
            "publisher ack p50",
            _pct(acks, 0.5) * ms,
        ),
        Figure(
            "hot path p99 (publish -> Redis views)",
            _pct(latencies, 0.99) * ms,
            "ms",
            "publisher ack p99",
            _pct(acks, 0.99) * ms,
        ),
        Figure("Redis round trip p99", _pct(rtt, 0.99) * ms, "ms"),
        Figure("hot path entries measured", float(len(latencies)), "entries"),
    ]


async def _publish_raw(d: PrivateDeployment, entries_wanted: int) -> int:
    from aiokafka import AIOKafkaProducer

    codec = LedgerCodec()
    producer = AIOKafkaProducer(
        bootstrap_servers=d.settings.kafka_address,
        acks="all",
        linger_ms=20,
        max_batch_size=1024 * 1024,
        compression_type="zstd",
    )
    await producer.start()
    sent = 0
    try:
        for run in simulate_runs(len(FLEETS), 10_000_000, seed=99):
            for e in run:
                topic = ledger_topic(d.settings.topic_prefix, e.fleet_id)
                await producer.send(topic, codec.encode(e), key=e.run_id.encode())
                sent += 1
            if sent >= entries_wanted:
                break
        await producer.flush()
    finally:
        await producer.stop()
    return sent


async def _consume_decode(d: PrivateDeployment) -> tuple[int, float]:
    codec = LedgerCodec()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=d.settings.kafka_address,
        enable_auto_commit=False,
        max_poll_records=5000,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    try:
        parts = await topic_partitions(
            consumer, [ledger_topic(d.settings.topic_prefix, f) for f in FLEETS]
        )
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        end = await consumer.end_offsets(parts)
        total = sum(end.values())
        seen = 0
        started = time.perf_counter()
        while seen < total:
            batch = await consumer.getmany(timeout_ms=2000, max_records=5000)
            values = [r.value for rs in batch.values() for r in rs if r.value is not None]
            codec.decode_many(values)
            seen += sum(len(rs) for rs in batch.values())
        return seen, time.perf_counter() - started
    finally:
        await consumer.stop()


async def replay(d: PrivateDeployment, entries: int) -> list[Figure]:
    """Ceiling (consume + decode) beside the engine applying every projection from offset 0."""
    await _publish_raw(d, entries)
    n, secs = await _consume_decode(d)
    targets = [Target(t.projection, "bench-replay") for t in live_targets(d.settings.pg_address)]
    sink = KafkaDeadLetterSink(d.settings)
    engine = Engine(targets, d.settings.pg_address, None, sink)
    await engine.start()
    try:
        topics = [ledger_topic(d.settings.topic_prefix, f) for f in FLEETS]
        started = time.perf_counter()
        stats = await drain(engine, d.settings.kafka_address, topics, batch_size=5000)
        elapsed = time.perf_counter() - started
    finally:
        await engine.close()
        await sink.close()
    return [
        Figure(
            "replay into all projections",
            stats.applied / elapsed,
            "entries/s",
            "ceiling: consume + decode only",
            n / secs,
        ),
    ]


async def run_bench(settings: Settings, quick: bool) -> BenchReport:
    rate, seconds, entries = (1000.0, 5.0, 20_000) if quick else (1000.0, 30.0, 200_000)
    report = BenchReport(
        machine=machine_info(),
        settings={
            "quick": quick,
            "hot_path_rate": rate,
            "hot_path_seconds": seconds,
            "replay_entries": entries,
            "projections": [p.name for p in all_projections()],
        },
    )
    d = PrivateDeployment(
        settings,
        "bench",
        FLEETS,
        settings.state_dir / "bench",
        {"AGENTLEDGER_WORKER_BATCH_SIZE": "500"},
    )
    await d.create()
    try:
        d.start_worker("worker")
        await asyncio.to_thread(d.wait_partitions, "worker")
        report.figures += await hot_path(d, rate, seconds)
        for worker in d.workers:
            d.stop_worker(worker)
        report.figures += await replay(d, entries)
    finally:
        d.drop()
    return report
