"""Idempotent set-up of what the pipeline needs on the broker."""

from __future__ import annotations

import asyncio

from infra.settings import Settings
from infra.topics import ensure_topics, fleet_topic_specs, listed_topics, retried
from schemas.topics import (
    check_fleet_id,
    dead_letter_topic,
    fleets_among,
    ledger_topic,
    projection_of_change_topic,
)


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


async def delete_fleet_topics(settings: Settings, fleets: list[str]) -> None:
    """Delete each fleet's ledger and dead-letter topics (private deployments' clean-up)."""
    from aiokafka.admin import AIOKafkaAdminClient

    names = [
        name
        for fleet in fleets
        for name in (
            ledger_topic(settings.topic_prefix, fleet),
            dead_letter_topic(settings.topic_prefix, fleet),
        )
    ]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_address)
    await admin.start()
    try:
        existing = set(await retried(admin.list_topics))
        gone = [n for n in names if n in existing]
        if gone:
            await admin.delete_topics(gone)
    finally:
        await admin.close()


def create_fleet_topics_sync(settings: Settings, fleets: list[str]) -> list[str]:
    return asyncio.run(create_fleet_topics(settings, fleets))


async def delete_change_topics(settings: Settings) -> None:
    """Delete the deployment's change topics (``<prefix>.changes.*``; private deployments)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_address)
    await admin.start()
    try:
        prefix = settings.topic_prefix
        listed = await retried(admin.list_topics)
        gone = [n for n in listed if projection_of_change_topic(prefix, n) is not None]
        if gone:
            await admin.delete_topics(gone)
    finally:
        await admin.close()


async def existing_fleets(settings: Settings) -> list[str]:
    """The fleets whose ledger topics exist on the cluster (see :func:`fleets_among`)."""
    return fleets_among(settings.topic_prefix, await listed_topics(settings.kafka_address))


def existing_fleets_now(settings: Settings, timeout_s: float = 10.0) -> list[str]:
    """:func:`existing_fleets` from synchronous code (a command line's check), bounded."""
    return asyncio.run(asyncio.wait_for(existing_fleets(settings), timeout_s))


async def existing_ledger_topics(settings: Settings) -> list[str]:
    """The ledger topics of :func:`existing_fleets`, sorted."""
    return [ledger_topic(settings.topic_prefix, f) for f in await existing_fleets(settings)]
