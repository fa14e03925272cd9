"""`agentledger worker` processes on the real services: SIGKILLed at random moments, two in one
group, one killed — the projection still equals, row for row, a clean replay from offset 0."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.migrate import migrate
from infra.settings import Settings
from projectors.registry import all_projections
from schemas.codec import LedgerCodec
from streams.admin import create_fleet_topics
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine, Target
from streams.simulate import simulate
from streams.source import drain
from streams.topics import ledger_topic

pytestmark = pytest.mark.integration

FLEETS = ["fleet-01", "fleet-02"]


@dataclass
class Deployment:
    """A private database, topic prefix and Redis prefix: one deployment of the product."""

    settings: Settings
    logs: Path

    def env(self) -> dict[str, str]:
        s = self.settings
        return {
            **os.environ,
            "AGENTLEDGER_KAFKA_BOOTSTRAP": s.kafka_address,
            "AGENTLEDGER_PG_DSN": s.pg_address,
            "AGENTLEDGER_REDIS_URL": s.redis_address,
            "AGENTLEDGER_TOPIC_PREFIX": s.topic_prefix,
            "AGENTLEDGER_REDIS_PREFIX": s.redis_prefix,
            "AGENTLEDGER_FLEETS": ",".join(FLEETS),
            "AGENTLEDGER_WORKER_SESSION_TIMEOUT_S": "6",
            "AGENTLEDGER_WORKER_BATCH_SIZE": "1000",
        }

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        exe = Path(sys.executable).with_name("agentledger")
        with (self.logs / f"{name}.log").open("ab") as log:
            return subprocess.Popen(
                [str(exe), "worker", "--loglevel", "info"],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def applied(self) -> tuple[int, int]:
        """(sum of applied sequence numbers, held entries) over the live build."""
        with psycopg.connect(self.settings.pg_address) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(applied_seq), 0), coalesce(sum(cardinality(held)), 0) "
                "FROM al_run_state s JOIN al_live l USING (projection, build) "
                "WHERE s.projection = 'run-stats'"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def rows(self, build: str | None = None) -> dict[tuple[str, str], Any]:
        """Every projection's rows of the live build (or of ``build``), by (projection, run)."""
        with psycopg.connect(self.settings.pg_address) as conn:
            if build is None:
                rows = conn.execute(
                    "SELECT projection, run_id, fleet_id, applied_seq, held, gaps, state "
                    "FROM al_run_state JOIN al_live USING (projection, build)"
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT projection, run_id, fleet_id, applied_seq, held, gaps, state "
                    "FROM al_run_state WHERE build = %s",
                    (build,),
                ).fetchall()
        return {(r[0], r[1]): r[2:] for r in rows}


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[Deployment]:
    tag = uuid.uuid4().hex[:8]
    db = f"al_test_{tag}"
    with psycopg.connect(services.pg_address, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    dsn = services.pg_address.rsplit("/", 1)[0] + f"/{db}"
    settings = services.model_copy(
        update={
            "pg_dsn": dsn,
            "topic_prefix": f"w{tag}",
            "redis_prefix": f"w{tag}",
            "fleets": ",".join(FLEETS),
        }
    )
    migrate(dsn)
    asyncio.run(create_fleet_topics(settings, FLEETS))
    yield Deployment(settings, tmp_path)
    with psycopg.connect(services.pg_address, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


async def _publish(settings: Settings, count_runs: int, seed: int) -> int:
    from aiokafka import AIOKafkaProducer

    codec = LedgerCodec()
    entries = simulate(len(FLEETS), count_runs, seed)
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_address,
        acks="all",
        linger_ms=20,
        max_batch_size=512 * 1024,
    )
    await producer.start()
    try:
        for e in entries:
            await producer.send(
                ledger_topic(settings.topic_prefix, e.fleet_id),
                codec.encode(e),
                key=e.run_id.encode(),
            )
        await producer.flush()
    finally:
        await producer.stop()
    return len(entries)


def _clean_replay(d: Deployment) -> str:
    """The same topics replayed once, from offset 0, into a fresh build by the engine alone."""
    build = "clean-replay"
    topics = [ledger_topic(d.settings.topic_prefix, f) for f in FLEETS]

    async def run() -> None:
        sink = KafkaDeadLetterSink(d.settings)
        targets = [Target(p, build) for p in all_projections()]
        engine = Engine(targets, d.settings.pg_address, None, sink)
        await engine.start()
        try:
            await drain(engine, d.settings.kafka_address, topics, batch_size=5000)
        finally:
            await engine.close()
            await sink.close()

    asyncio.run(run())
    return build


def _wait_drained(d: Deployment, expected: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if d.applied() == (expected, 0):
            return
        time.sleep(0.5)
    raise AssertionError(f"not drained: {d.applied()} != ({expected}, 0)")


def _wait_resumed(d: Deployment, name: str, timeout_s: float = 60) -> None:
    """Until the worker owns partitions (killing it before would test nothing)."""
    log = d.logs / f"{name}.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and "resumed" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} never got partitions")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill(proc)


def test_sigkill_five_times_equals_clean_replay(deployment: Deployment) -> None:
    d = deployment
    expected = asyncio.run(_publish(d.settings, count_runs=1650, seed=31))  # ~100k entries
    rng = random.Random(7)
    kills = 0
    worker = d.start_worker("w0")
    try:
        while kills < 5:
            _wait_resumed(d, f"w{kills}")
            time.sleep(rng.uniform(0.5, 3.0))  # a random moment while it applies batches
            done, _ = d.applied()
            if done >= expected:
                break
            _kill(worker)
            kills += 1
            worker = d.start_worker(f"w{kills}")
        _wait_drained(d, expected, timeout_s=300)
    finally:
        _stop(worker)
    assert kills == 5, "the worker was killed mid-work five times"
    assert d.rows() == d.rows(_clean_replay(d))


def test_two_workers_then_one_killed(deployment: Deployment) -> None:
    d = deployment
    first = asyncio.run(_publish(d.settings, count_runs=200, seed=32))
    a, b = d.start_worker("a"), d.start_worker("b")
    try:
        _wait_drained(d, first, timeout_s=180)
        _kill(a)
        # Everything published from now on needs b to take over a's partitions.
        second = asyncio.run(_publish(d.settings, count_runs=200, seed=33))
        _wait_drained(d, first + second, timeout_s=180)
    finally:
        _stop(a)
        _stop(b)
    assert b.returncode == 0, "the surviving worker stopped cleanly on SIGTERM"
    assert d.rows() == d.rows(_clean_replay(d))
