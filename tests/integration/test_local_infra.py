"""``infra up|down|status`` on an isolated local stack (own state folder and ports)."""

from __future__ import annotations

import asyncio
import random
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from rich.console import Console

from infra import local
from infra.errors import PortInUseError
from infra.process import is_alive, port_free
from infra.settings import Settings, load_settings
from infra.topics import TopicSpec, ensure_topics
from streams.source import read_all

pytestmark = pytest.mark.integration


_taken: set[int] = set()


def _free_port() -> int:
    """A free port below the ephemeral range, so no outgoing connection grabs it meanwhile."""
    rng = random.Random()
    while True:
        port = rng.randrange(20000, 32000)
        if port not in _taken and port_free(port):
            _taken.add(port)
            return port


@pytest.fixture
def isolated(tmp_path: Path) -> Iterator[Settings]:
    shared = load_settings()
    settings = load_settings(
        state_dir=tmp_path / "state",
        kafka_libs_dir=shared.resolved_kafka_libs,
        kafka_bootstrap=None,
        pg_dsn=None,
        redis_url=None,
        kafka_port=_free_port(),
        kafka_controller_port=_free_port(),
        pg_port=_free_port(),
        redis_port=_free_port(),
        kafka_heap_mb=512,
    )
    yield settings
    local.down(settings, Console(quiet=True))


async def _produce(settings: Settings, topic: str, values: list[bytes]) -> None:
    await ensure_topics(settings.kafka_address, [TopicSpec(topic, 1)])
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_address, acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()


def test_up_is_idempotent_and_down_keeps_data(isolated: Settings) -> None:
    console = Console(quiet=True)
    first = local.up(isolated, console)
    assert [(s.name, s.running) for s in first] == [
        ("kafka", True),
        ("postgres", True),
        ("redis", True),
    ]
    pids = [s.pid for s in first]

    second = local.up(isolated, console)
    assert [s.pid for s in second] == pids

    topic = f"test.keep.{uuid.uuid4().hex[:8]}"
    values = [f"v{i}".encode() for i in range(20)]
    asyncio.run(_produce(isolated, topic, values))
    with psycopg.connect(isolated.pg_address, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (42)")

    local.down(isolated, console)
    assert not any(is_alive(pid) for pid in pids if pid is not None)
    assert not any(s.running for s in local.status(isolated, console))

    third = local.up(isolated, console)
    assert all(s.running for s in third)
    records = asyncio.run(read_all(isolated.kafka_address, [topic]))
    assert [r.value for r in records] == values
    with psycopg.connect(isolated.pg_address) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [(42,)]


def test_port_in_use_names_the_port(isolated: Settings) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", isolated.redis_port))
        blocker.listen()
        settings = isolated.model_copy(
            update={"kafka_bootstrap": "127.0.0.1:1", "pg_dsn": "postgresql://x@127.0.0.1:1/x"}
        )
        with pytest.raises(PortInUseError, match=str(isolated.redis_port)):
            local.up(settings, Console(quiet=True))
