"""``agentledger demo``: bring the stack up, publish simulated fleets, read the ledger back."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.table import Table

from infra import local
from infra.roundtrip import postgres_roundtrip, redis_roundtrip
from infra.settings import Settings
from schemas.codec import LedgerCodec
from schemas.models import EntryKind, LedgerEntry
from streams.publisher import AsyncPublisher
from streams.simulate import simulate
from streams.topics import ledger_topic

FLEETS, RUNS, SEED = 2, 14, 2026


def run_demo(settings: Settings, console: Console) -> None:
    local.up(settings, console)
    console.print(f"postgres: {postgres_roundtrip(settings)}; redis: {redis_roundtrip(settings)}")
    # A fresh topic prefix per demo run, so the counts below are this run's alone.
    prefix = f"{settings.topic_prefix}-demo-{int(time.time())}"
    settings = settings.model_copy(update={"topic_prefix": prefix})
    entries = simulate(FLEETS, RUNS, SEED)
    started = time.perf_counter()
    sent = asyncio.run(_publish(settings, entries))
    publish_s = time.perf_counter() - started
    console.print(
        f"published {len(sent)} entries of {FLEETS * RUNS} runs "
        f"to {prefix}.ledger.* in {publish_s:.2f}s"
    )
    read = asyncio.run(_read_back(settings, sorted({e.fleet_id for e in sent}), len(sent)))
    _report(console, sent, read)


async def _publish(settings: Settings, entries: list[LedgerEntry]) -> list[LedgerEntry]:
    async with AsyncPublisher(settings) as publisher:
        return await publisher.publish_batch(entries)


async def _read_back(settings: Settings, fleets: list[str], count: int) -> list[LedgerEntry]:
    topics = [ledger_topic(settings.topic_prefix, f) for f in fleets]
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=settings.kafka_address,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    codec = LedgerCodec()
    values: list[bytes] = []
    await consumer.start()
    try:
        while len(values) < count and (batch := await consumer.getmany(timeout_ms=5000)):
            values.extend(r.value for rs in batch.values() for r in rs if r.value is not None)
    finally:
        await consumer.stop()
    return codec.decode_many(values)


def _report(console: Console, sent: list[LedgerEntry], read: list[LedgerEntry]) -> None:
    same = sorted(e.entry_id for e in read) == sorted(e.entry_id for e in sent)
    console.print(
        f"read back {len(read)} entries from Kafka, decoded: "
        f"{'identical to what was published' if same else 'MISMATCH'}"
    )
    redacted = sum(len(e.redactions) for e in read)
    console.print(
        f"secrets redacted at the publisher: {redacted} "
        f"(in {sum(1 for e in read if e.redactions)} entries)"
    )
    table = Table("fleet", "runs", "entries", "model calls", "outcomes")
    for fleet in sorted({e.fleet_id for e in read}):
        mine = [e for e in read if e.fleet_id == fleet]
        outcomes = Counter(
            e.metadata.get("outcome", "?") for e in mine if e.kind is EntryKind.RUN_FINISHED
        )
        table.add_row(
            fleet,
            str(len({e.run_id for e in mine})),
            str(len(mine)),
            str(sum(1 for e in mine if e.kind is EntryKind.MODEL_CALL)),
            ", ".join(sorted(outcomes)),
        )
    console.print(table)
    if not same:
        raise SystemExit(1)
