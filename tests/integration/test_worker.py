"""`agentledger worker` processes on the real services: SIGKILLed at random moments, two in one
group, one killed — the projection still equals, row for row, a clean replay from offset 0."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.settings import Settings
from projectors.registry import all_projections
from schemas.codec import LedgerCodec
from schemas.topics import ledger_topic
from streams.deployment import PrivateDeployment
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine, Target
from streams.simulate import simulate
from streams.source import drain
from tests.integration.engine_support import current_states

pytestmark = pytest.mark.integration

FLEETS = ["fleet-01", "fleet-02"]


class Deployment(PrivateDeployment):
    """A private deployment, plus what these tests read of its projections."""

    def applied(self) -> tuple[int, int]:
        """(applied sequence numbers summed over runs, held entries) of the live builds: the
        least advanced projection's, since analytics ones commit a little after hot ones."""
        with psycopg.connect(self.settings.pg_address) as conn:
            rows = conn.execute(
                "SELECT s.projection, coalesce(sum(applied_seq), 0), "
                "coalesce(sum(cardinality(held)), 0) "
                "FROM al_run_state s JOIN al_live l USING (projection, build) "
                "GROUP BY s.projection"
            ).fetchall()
        if len(rows) < len(all_projections()):
            return 0, 0
        return min(int(r[1]) for r in rows), sum(int(r[2]) for r in rows)

    def rows(self, build: str | None = None) -> dict[tuple[str, str], Any]:
        """Every projection's rows of the live build (or of ``build``), by (projection, run)."""
        with psycopg.connect(self.settings.pg_address) as conn:
            if build is None:
                rows = conn.execute(
                    "SELECT projection, run_id, fleet_id, applied_seq, held, gaps "
                    "FROM al_run_state JOIN al_live USING (projection, build)"
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT projection, run_id, fleet_id, applied_seq, held, gaps "
                    "FROM al_run_state WHERE build = %s",
                    (build,),
                ).fetchall()
        whole = {
            name: current_states(self.settings.pg_address, name, build)
            for name in {r[0] for r in rows}
        }
        return {(r[0], r[1]): (*r[2:], whole[r[0]][r[1]][1]) for r in rows}


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[Deployment]:
    worker_env = {
        "AGENTLEDGER_WORKER_SESSION_TIMEOUT_S": "6",
        "AGENTLEDGER_WORKER_BATCH_SIZE": "1000",
    }
    d = Deployment(services, "test", FLEETS, tmp_path, worker_env)
    asyncio.run(d.create())
    yield d
    d.drop()


async def _publish(
    settings: Settings, count_runs: int, seed: int, length_profile: str = "short"
) -> int:
    from aiokafka import AIOKafkaProducer

    codec = LedgerCodec()
    entries = simulate(len(FLEETS), count_runs, seed, length_profile=length_profile)
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


def _assert_same(live: dict[tuple[str, str], Any], clean: dict[tuple[str, str], Any]) -> None:
    """Row for row equal; on a difference, name the (projection, run) keys, not a 100k-row diff."""
    differing = sorted(k for k in live.keys() | clean.keys() if live.get(k) != clean.get(k))
    detail = [(k, _paths(live.get(k), clean.get(k))) for k in differing[:3]]
    assert not differing, f"{len(differing)} rows differ, e.g. {differing[:10]}: {detail}"


def _paths(a: Any, b: Any, at: str = "") -> list[str]:
    """Where two JSON-like values differ: ``path: live != clean`` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            line
            for k in sorted(a.keys() | b.keys())
            for line in _paths(a.get(k), b.get(k), f"{at}.{k}")
        ]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [
            line
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for line in _paths(x, y, f"{at}[{i}]")
        ]
    return [] if a == b else [f"{at}: {str(a)[:160]} != {str(b)[:160]}"]


def _wait_drained(d: Deployment, expected: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if d.applied() == (expected, 0):
            return
        time.sleep(0.5)
    raise AssertionError(f"not drained: {d.applied()} != ({expected}, 0)")


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
    # ~19k entries in runs of real agents' lengths (the longest 1,978 entries). Each kill comes
    # at a random point of its own sixth of the work, read from what the live builds applied, so
    # all five land mid-work however fast the worker is (a kill after a fixed pause missed the
    # work once a faster worker had drained it: 4 kills, not 5)
    expected = asyncio.run(_publish(d.settings, count_runs=30, seed=31, length_profile="real"))
    rng = random.Random(7)
    kills = 0
    worker = d.start_worker("w0")
    try:
        while kills < 5:
            d.wait_partitions(f"w{kills}")
            at = int(expected * (kills + rng.uniform(0.3, 0.9)) / 6)
            deadline = time.monotonic() + 180
            while d.applied()[0] < at:
                assert worker.poll() is None, f"worker w{kills} exited before it was killed"
                assert time.monotonic() < deadline, f"worker w{kills} never applied {at} entries"
                time.sleep(0.05)
            assert d.applied()[0] < expected, "the kill is mid-work"
            _kill(worker)
            kills += 1
            worker = d.start_worker(f"w{kills}")
        _wait_drained(d, expected, timeout_s=300)
    finally:
        _stop(worker)
    _assert_same(d.rows(), d.rows(_clean_replay(d)))


def test_two_workers_then_one_killed(deployment: Deployment) -> None:
    d = deployment
    first = asyncio.run(_publish(d.settings, count_runs=16, seed=32, length_profile="real"))
    a, b = d.start_worker("a"), d.start_worker("b")
    try:
        _wait_drained(d, first, timeout_s=180)
        _kill(a)
        # Everything published from now on needs b to take over a's partitions.
        second = asyncio.run(_publish(d.settings, count_runs=16, seed=33, length_profile="real"))
        _wait_drained(d, first + second, timeout_s=180)
    finally:
        _stop(a)
        _stop(b)
    assert b.returncode == 0, "the surviving worker stopped cleanly on SIGTERM"
    _assert_same(d.rows(), d.rows(_clean_replay(d)))
