"""Redis clients of a deployment: the one place that makes them, with the same timeouts
(PostgreSQL connections are made by the stores, ``projectors.stores``)."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis

from infra.settings import Settings

TIMEOUT_S = 5.0


def redis_client(settings: Settings, timeout_s: float = TIMEOUT_S) -> aioredis.Redis:
    """An asyncio client of the deployment's Redis (close it with ``aclose``)."""
    return aioredis.Redis.from_url(
        settings.redis_address, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )


def redis_sync_client(settings: Settings, timeout_s: float = TIMEOUT_S) -> redis.Redis:
    """A blocking client of the deployment's Redis (close it with ``close``)."""
    return redis.Redis.from_url(
        settings.redis_address, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )
