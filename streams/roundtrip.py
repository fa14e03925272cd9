"""Round trips through each service: the smoke checks behind the demo and the tests."""

from __future__ import annotations

import uuid

from aiokafka import AIOKafkaProducer

from infra import databases
from infra.clients import redis_sync_client
from infra.errors import InfraError
from infra.settings import Settings
from infra.topics import TopicSpec, ensure_topics
from streams.source import read_all


async def kafka_roundtrip(settings: Settings, topic: str, count: int) -> int:
    """Produce ``count`` records to a fresh topic, read them back, check order and content."""
    await ensure_topics(settings.kafka_address, [TopicSpec(topic, 1, settings.topic_replication)])
    payloads = [f"record-{i}-{uuid.uuid4()}".encode() for i in range(count)]
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_address, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        for i, payload in enumerate(payloads):
            await producer.send(topic, payload, key=str(i % 7).encode())
        await producer.flush()
    finally:
        await producer.stop()
    records = await read_all(settings.kafka_address, [topic])
    got = [r.value for r in records if r.value is not None]
    if got != payloads:
        raise InfraError(
            f"kafka round trip on {topic}: sent {count}, read {len(got)} or out of order"
        )
    return len(got)


def postgres_roundtrip(settings: Settings) -> str:
    token = str(uuid.uuid4())
    row = databases.roundtrip(settings.pg_address, token)
    if row is None or row[0] != token:
        raise InfraError("postgres round trip returned something else")
    return str(row[1]).split(",")[0]


def redis_roundtrip(settings: Settings) -> str:
    key = f"agentledger:roundtrip:{uuid.uuid4()}"
    client = redis_sync_client(settings)
    try:
        client.set(key, "ok", ex=60)
        value = client.get(key)
        client.delete(key)
        info = client.info("server")
    finally:
        client.close()
    if value != b"ok":
        raise InfraError("redis round trip returned something else")
    return f"Redis {info['redis_version']}"
