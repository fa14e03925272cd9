"""Helpers for engine tests: an isolated topic prefix and build, raw producing, table snapshots."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from infra.admin import create_fleet_topics
from infra.migrate import migrate
from infra.settings import Settings
from projectors import registry
from projectors.base import Projection
from projectors.run_stats import RunStatsProjection
from projectors.stores.postgres import current_documents, use_documents
from projectors.stores.redis import RedisViewStore
from schemas.codec import LedgerCodec
from schemas.models import LedgerEntry
from schemas.topics import ledger_topic
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine, Target

CODEC = LedgerCodec()


@dataclass
class Env:
    settings: Settings
    build: str
    fleets: list[str]

    @property
    def topics(self) -> list[str]:
        return [ledger_topic(self.settings.topic_prefix, f) for f in self.fleets]

    def target(self) -> Target:
        return Target(RunStatsProjection(), self.build)

    @asynccontextmanager
    async def engine(self) -> AsyncIterator[Engine]:
        sink = KafkaDeadLetterSink(self.settings)
        engine = Engine(
            [self.target()],
            self.settings.pg_address,
            self.settings.redis_address,
            sink,
            redis_prefix=self.redis_prefix,
        )
        await engine.start()
        try:
            yield engine
        finally:
            await engine.close()
            await sink.close()

    @property
    def redis_prefix(self) -> str:
        return f"t{self.build}"


async def make_env(services: Settings, fleets: Sequence[str] = ("fleet-01", "fleet-a")) -> Env:
    """Topics for ``fleets`` (by default simulate's first fleet and the one `EntryBuilder`
    writes for) under a fresh prefix: the worker refuses an entry on another fleet's topic."""
    tag = uuid.uuid4().hex[:8]
    settings = services.model_copy(update={"topic_prefix": f"e{tag}"})
    migrate(settings.pg_address)
    await create_fleet_topics(settings, list(fleets))
    return Env(settings, f"b{tag}", list(fleets))


async def produce_raw(
    env: Env, items: Sequence[LedgerEntry | bytes], fleet: str | None = None, key: bytes = b"k"
) -> None:
    """Send entries (encoded here, no publisher checks; to their fleet's topic unless ``fleet``
    is given) or raw bytes (to ``fleet``, by default the first one), in this order."""
    producer = AIOKafkaProducer(bootstrap_servers=env.settings.kafka_address, acks="all")
    await producer.start()
    try:
        raw_topic = ledger_topic(env.settings.topic_prefix, fleet or env.fleets[0])
        for item in items:
            if isinstance(item, LedgerEntry):
                topic = ledger_topic(env.settings.topic_prefix, fleet or item.fleet_id)
                await producer.send(topic, CODEC.encode(item), key=item.run_id.encode())
            else:
                await producer.send(raw_topic, item, key=key)
        await producer.flush()
    finally:
        await producer.stop()


def run_rows(env: Env) -> dict[str, dict[str, Any]]:
    """The build's run rows, as plain values (for row-by-row comparison)."""
    with psycopg.connect(env.settings.pg_address) as conn:
        rows = conn.execute(
            "SELECT run_id, applied_seq, held, gaps, coalesce(head, state) FROM al_run_state "
            "WHERE projection = 'run-stats' AND build = %s",
            (env.build,),
        ).fetchall()
    return {
        r: {"applied_seq": s, "held": list(h), "gaps": g, "state": st} for r, s, h, g, st in rows
    }


async def redis_views(env: Env, run_ids: Sequence[str]) -> dict[str, tuple[int, Any]]:
    client = aioredis.Redis.from_url(env.settings.redis_address)
    store = RedisViewStore(client, env.redis_prefix)
    try:
        found = {}
        for run_id in run_ids:
            view = await store.read("run-stats", env.build, run_id)
            if view is not None:
                found[run_id] = view
        return found
    finally:
        await client.aclose()


def same_views(rows: dict[str, dict[str, Any]], views: dict[str, tuple[int, Any]]) -> bool:
    expected = {r: (v["applied_seq"], json.loads(json.dumps(v["state"]))) for r, v in rows.items()}
    got = {r: (seq, doc["state"]) for r, (seq, doc) in views.items()}
    return got == expected


def current_states(
    dsn: str, projection: str | Projection[Any], build: str | None = None
) -> dict[str, tuple[int, Any]]:
    """run_id -> (applied_seq, whole current state document) of a build (the live one by
    default): each run's checkpoint with its tail folded on, as readers see it."""
    folded = registry.projection(projection) if isinstance(projection, str) else projection
    with psycopg.connect(dsn) as conn:
        use_documents(conn)
        if build is None:
            row = conn.execute(
                "SELECT build FROM al_live WHERE projection = %s", (folded.name,)
            ).fetchone()
            if row is None:
                return {}
            build = str(row[0])
        return {r: (s, d) for r, s, _g, d in current_documents(conn, folded, build)}
