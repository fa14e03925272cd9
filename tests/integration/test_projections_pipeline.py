"""Every registered projection: simulated runs through the real pipeline (publisher, Kafka,
engine, PostgreSQL, Redis) give the same state as folding the same entries in memory."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from infra.settings import Settings
from projectors.base import fold_all
from projectors.context_manifests import ContextManifestsProjection
from projectors.registry import all_projections
from projectors.stores.redis import RedisViewStore
from projectors.working_memory import WorkingMemoryProjection, memory_at
from schemas.models import LedgerEntry
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine, Target
from streams.publisher import AsyncPublisher
from streams.simulate import simulate
from streams.source import drain
from tests.integration.engine_support import current_states, make_env

pytestmark = pytest.mark.integration


def _stored(pg_dsn: str, projection: str, build: str) -> dict[str, dict[str, Any]]:
    return {r: doc for r, (_seq, doc) in current_states(pg_dsn, projection, build).items()}


async def test_pipeline_equals_in_memory_fold(services: Settings) -> None:
    env = await make_env(services, fleets=("fleet-01", "fleet-02"))
    async with AsyncPublisher(env.settings) as publisher:
        sent = await publisher.publish_batch(simulate(2, 14, seed=404))
    runs: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in sent:
        runs[e.run_id].append(e)

    targets = [Target(p, env.build) for p in all_projections()]
    sink = KafkaDeadLetterSink(env.settings)
    engine = Engine(
        targets,
        env.settings.pg_address,
        env.settings.redis_address,
        sink,
        redis_prefix=env.redis_prefix,
    )
    await engine.start()
    try:
        stats = await drain(engine, env.settings.kafka_address, env.topics, batch_size=300)
    finally:
        await engine.close()
        await sink.close()
    assert stats.applied == len(sent) * len(targets)

    client = aioredis.Redis.from_url(env.settings.redis_address)
    views = RedisViewStore(client, env.redis_prefix)
    try:
        for target in targets:
            p = target.projection
            expected = {}
            heads = {}
            for run_id, entries in runs.items():
                state = fold_all(p, entries)
                assert state is not None
                expected[run_id] = json.loads(json.dumps(p.to_doc(state)))
                heads[run_id] = json.loads(p.head_json(state))
            assert _stored(env.settings.pg_address, p.name, env.build) == expected, p.name
            if p.hot:  # Redis serves the head: the state without what grows with the run
                for run_id, doc in heads.items():
                    view = await views.read(p.name, env.build, run_id)
                    assert view is not None and view[0] == len(runs[run_id])
                    assert view[1]["state"] == doc
    finally:
        await client.aclose()


async def test_history_keeps_every_snapshot_and_manifest(services: Settings) -> None:
    env = await make_env(services)
    async with AsyncPublisher(env.settings) as publisher:
        sent = await publisher.publish_batch(simulate(1, 3, seed=405))
    memory, context = WorkingMemoryProjection(), ContextManifestsProjection()
    targets = [Target(memory, env.build), Target(context, env.build)]
    sink = KafkaDeadLetterSink(env.settings)
    engine = Engine(targets, env.settings.pg_address, None, sink)
    await engine.start()
    try:
        await drain(engine, env.settings.kafka_address, env.topics, batch_size=50)
    finally:
        await engine.close()
        await sink.close()
    with psycopg.connect(env.settings.pg_address) as conn:
        rows = conn.execute(
            "SELECT projection, run_id, kind, key, seq, doc FROM al_history WHERE build = %s",
            (env.build,),
        ).fetchall()
    runs: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in sent:
        runs[e.run_id].append(e)
    snapshots = [r for r in rows if r[0] == "working-memory"]
    assert snapshots
    for _, run_id, kind, key, seq, doc in snapshots:
        assert kind == "snapshot"
        expected = memory_at(runs[run_id], seq)
        assert expected is not None and str(expected.snapshot_version) == key
        as_doc = json.loads(json.dumps(memory.to_doc(expected)))
        as_doc.pop("index")
        assert doc == as_doc, "memory --at SEQ is the fold of the run up to SEQ"
    for run_id, entries in runs.items():
        final = fold_all(context, entries)
        assert final is not None
        recorded = {r[3] for r in rows if r[0] == "context-manifests" and r[1] == run_id}
        assert {m.manifest_id for m in final.manifests} <= recorded
        assert len(final.manifests) >= 1
