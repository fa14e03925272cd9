"""Idempotent set-up of what the pipeline needs on the broker."""

from __future__ import annotations

import asyncio

from infra.settings import Settings
from streams.topics import check_fleet_id, ensure_topics, fleet_topic_specs


async def create_fleet_topics(settings: Settings, fleets: list[str]) -> list[str]:
    """Create each fleet's ledger and dead-letter topics; return the names newly created."""
    specs = [
        spec
        for fleet in fleets
        for spec in fleet_topic_specs(
            settings.topic_prefix,
            check_fleet_id(fleet),
            settings.topic_partitions,
            settings.topic_replication,
        )
    ]
    return await ensure_topics(settings.kafka_address, specs)


def create_fleet_topics_sync(settings: Settings, fleets: list[str]) -> list[str]:
    return asyncio.run(create_fleet_topics(settings, fleets))
