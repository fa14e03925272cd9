"""Topic names and idempotent creation.

Ledger topics: one per fleet, ``<prefix>.ledger.<fleet>``, keyed by run id so a run's entries keep
their order inside one partition, kept forever (``retention.ms=-1``), compressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import InvalidReplicationFactorError, KafkaError, for_code
from aiokafka.partitioner import murmur2

from infra.errors import InfraError
from schemas.topics import (
    change_schema_topic,
    change_topic,
    dead_letter_topic,
    ledger_topic,
)

TOPIC_ALREADY_EXISTS = 36
METADATA_WAIT_S = 10.0  # how long ensure_topics waits for the metadata to list new topics
# How long an admin call is tried again while Kafka calls its error retriable: a request sent
# to a broker just lost fails (NodeNotReadyError) until the controller fences it, ~10 s (found
# on a 3-broker cluster: `topics list`, `dlq list` and `verify --all` failed in those seconds).
ADMIN_RETRY_S = 30.0

T = TypeVar("T")


class TopicSettingError(InfraError):
    """The cluster cannot make a topic as configured (e.g. more replicas than brokers)."""


async def retried(call: Callable[[], Awaitable[T]], within_s: float = ADMIN_RETRY_S) -> T:
    """``call()``, made again while it fails with an error Kafka calls retriable, for up to
    ``within_s`` (then that error)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    delay = 0.2
    while True:
        try:
            return await call()
        except KafkaError as exc:
            if not exc.retriable or loop.time() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


LEDGER_TOPIC_CONFIG: Mapping[str, str] = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "compression.type": "zstd",
    "cleanup.policy": "delete",
}


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner (murmur2 of the key), as producers place keyed records."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication: int = 1
    config: Mapping[str, str] = field(default_factory=dict)


async def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec]) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    wanted = list(specs)
    if not wanted:
        return []
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        response = await retried(  # (again after a retriable error: made ones already exist)
            lambda: admin.create_topics(
                [
                    NewTopic(s.name, s.partitions, s.replication, topic_configs=dict(s.config))
                    for s in wanted
                ]
            )
        )
        # The controller answers before every broker's metadata lists a new topic: a publish
        # right after `topics create` could be told the topic does not exist. Return once the
        # metadata lists them all (bounded; the publisher's own check decides after that).
        names = {s.name for s in wanted}
        deadline = asyncio.get_running_loop().time() + METADATA_WAIT_S
        while not names <= set(await retried(admin.list_topics)):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
    created = []
    for topic, code, *rest in response.topic_errors:
        if code == 0:
            created.append(topic)
        elif code != TOPIC_ALREADY_EXISTS:
            message = rest[0] if rest else ""
            if code == InvalidReplicationFactorError.errno:
                replicas = {s.name: s.replication for s in wanted}.get(topic)
                raise TopicSettingError(
                    f"creating topic {topic}: {message} (AGENTLEDGER_TOPIC_REPLICATION is "
                    f"{replicas}: at most the cluster's brokers)"
                )
            raise for_code(code)(f"creating topic {topic}: {message}")
    return created


DEAD_LETTER_TOPIC_CONFIG: Mapping[str, str] = {
    "retention.ms": "-1",
    "compression.type": "zstd",
    "cleanup.policy": "delete",
}


def durable(config: Mapping[str, str], replication: int) -> dict[str, str]:
    """``config`` with ``min.insync.replicas=2`` where there are 3 replicas or more: the
    publisher sends with ``acks=all``, and all is the in-sync replicas, which Kafka lets shrink
    to 1 by default, so an acknowledged entry of the ledger (kept forever, the only truth) could
    live on one broker. With 2, a partition with one replica in sync refuses sends
    (NotEnoughReplicasError, said by publish) rather than keep them once. Found by a user trial
    on a 3-broker cluster: the topics inherited the broker's setting, Kafka's default 1."""
    return {**config, "min.insync.replicas": "2"} if replication >= 3 else dict(config)


def fleet_topic_specs(
    prefix: str, fleet_id: str, partitions: int, replication: int
) -> list[TopicSpec]:
    """A fleet's ledger topic and its dead-letter topic."""
    return [
        TopicSpec(
            ledger_topic(prefix, fleet_id),
            partitions,
            replication,
            durable(LEDGER_TOPIC_CONFIG, replication),
        ),
        TopicSpec(
            dead_letter_topic(prefix, fleet_id),
            partitions,
            replication,
            durable(DEAD_LETTER_TOPIC_CONFIG, replication),
        ),
    ]


# Change streams (issue 18): one compacted topic per projection, across fleets (a record names
# its fleet), keyed per run, so compaction keeps every run's latest state; and one compacted
# topic where the relay registers each writer schema by fingerprint (readers of an older schema
# resolve a newer writer through it).
CHANGE_TOPIC_CONFIG: Mapping[str, str] = {
    "cleanup.policy": "compact",
    "compression.type": "zstd",
    "retention.ms": "-1",
}


def change_topic_specs(
    prefix: str, projections: Iterable[str], partitions: int, replication: int
) -> list[TopicSpec]:
    """The change topics of these projections and the schema topic."""
    specs = [
        TopicSpec(change_topic(prefix, p), partitions, replication, CHANGE_TOPIC_CONFIG)
        for p in projections
    ]
    specs.append(TopicSpec(change_schema_topic(prefix), 1, replication, CHANGE_TOPIC_CONFIG))
    return specs


class TopicLister:
    """Lists the cluster's topics on a thread and event loop of its own.

    A full metadata answer is decoded in Python: ~60 ms for a cluster of 500 topics on this
    machine. On the caller's event loop that would hold up every other task for as long (a
    worker's hot batches every few seconds); on a thread of its own the caller's loop gets the
    interpreter back at every switch interval. One admin client, kept across calls."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._admin: AIOKafkaAdminClient | None = None

    async def _names(self) -> list[str]:
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=15000)
            await admin.start()
            self._admin = admin
        try:
            return list(await self._admin.list_topics())
        except Exception:
            admin, self._admin = self._admin, None  # a new client next time
            await admin.close()
            raise

    async def names(self) -> list[str]:
        """Every topic the cluster has."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="agentledger-topics", daemon=True
            )
            thread.start()
            self._loop, self._thread = loop, thread
        future = asyncio.run_coroutine_threadsafe(self._names(), self._loop)
        return await asyncio.wrap_future(future)

    async def close(self) -> None:
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        admin, self._admin = self._admin, None
        if admin is not None:
            closing = asyncio.run_coroutine_threadsafe(admin.close(), loop)
            with contextlib.suppress(Exception):  # best effort: the thread goes either way
                await asyncio.wait_for(asyncio.wrap_future(closing), 5)
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 5)
        if not thread.is_alive():
            loop.close()


async def listed_topics(bootstrap: str) -> list[str]:
    """Every topic the cluster has."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        return list(await retried(admin.list_topics))
    finally:
        await admin.close()
