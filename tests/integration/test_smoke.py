"""Smoke: real round trips through the provisioned Kafka, PostgreSQL and Redis."""

from __future__ import annotations

import uuid

import pytest

from infra.settings import Settings
from streams.roundtrip import kafka_roundtrip, postgres_roundtrip, redis_roundtrip

pytestmark = pytest.mark.integration


async def test_kafka_thousand_records_in_order(services: Settings) -> None:
    topic = f"test.smoke.{uuid.uuid4().hex[:12]}"
    assert await kafka_roundtrip(services, topic, 1000) == 1000


def test_postgres_roundtrip(services: Settings) -> None:
    assert postgres_roundtrip(services).startswith("PostgreSQL")


def test_redis_roundtrip(services: Settings) -> None:
    assert redis_roundtrip(services).startswith("Redis")
