"""Issue 25's drill: a worker started beside ledger topics it has never seen, with a backlog,
while fleets are created and published to every second and a second worker joins and leaves.

faust's own resubscription crashed its Fetcher here and left the worker alive and idle. The
worker now starts on every fleet that exists and restarts onto new ones; this asserts what a
user needs: no stall (no worker process alive and reporting lag without applying), every
entry applied exactly once, every process either running or ended non-zero and restarted,
and ``verify --all`` equal.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from consumers.views import live_states
from infra.admin import create_fleet_topics
from infra.settings import Settings
from schemas.codec import LedgerCodec
from schemas.models import LedgerEntry
from schemas.topics import ledger_topic
from streams.deployment import PrivateDeployment
from streams.health import read_health
from streams.simulate import simulate_runs
from streams.worker import EXIT_STOP_TIMEOUT

pytestmark = pytest.mark.integration

STALL_S = 15.0  # the workers' stall setting in the drill: a stall would end (and show) in it
DRILL_S = 60


def _runs(fleet: str, count: int, seed: int) -> list[list[LedgerEntry]]:
    runs = simulate_runs(1, count, seed, length_profile="short")
    return [[e.model_copy(update={"fleet_id": fleet}) for e in run] for run in runs]


class _Producer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.codec = LedgerCodec()

    async def start(self) -> None:
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_address, acks="all", linger_ms=5
        )
        await self.producer.start()

    async def send(self, runs: list[list[LedgerEntry]]) -> None:
        for run in runs:
            for e in run:
                await self.producer.send(
                    ledger_topic(self.settings.topic_prefix, e.fleet_id),
                    self.codec.encode(e),
                    key=e.run_id.encode(),
                )
        await self.producer.flush()


@pytest.fixture
def drill(services: Settings, tmp_path: Path) -> Iterator[PrivateDeployment]:
    env = {
        "AGENTLEDGER_WORKER_SESSION_TIMEOUT_S": "6",
        "AGENTLEDGER_WORKER_STALL_S": str(STALL_S),
        "AGENTLEDGER_WORKER_HEALTH_S": "1",
        "AGENTLEDGER_WORKER_FLEET_SCAN_S": "1",
    }
    d = PrivateDeployment(services, "drill", ["fleet-01"], tmp_path, env)
    d.settings = d.settings.model_copy(update={"topic_partitions": 4})
    asyncio.run(d.create())
    yield d
    d.drop()


REPORTS: list[int] = []  # the health rows each sample saw (the check is not vacuous)


def _sample_stalls(d: PrivateDeployment, seen: list[str]) -> None:
    """Any worker reporting lag while it has applied nothing for longer than the stall
    setting is a stall (it should have ended itself and been restarted by then)."""
    rows = read_health(d.settings.pg_address)
    REPORTS.append(sum(1 for w in rows if not w.gone))
    for w in rows:
        if w.gone or w.behind == 0:
            continue
        started = (time.time() - w.started_at.timestamp()) if w.started_at else 0.0
        idle = w.last_applied_s_ago if w.last_applied_s_ago is not None else started
        if idle > STALL_S:
            seen.append(f"{w.worker_id}: {w.behind} behind, idle {idle:.0f}s")


def test_workers_never_stall_while_fleets_appear_and_workers_come_and_go(
    drill: PrivateDeployment,
) -> None:
    d = drill
    producer = _Producer(d.settings)
    runs: list[list[LedgerEntry]] = []
    stalls: list[str] = []

    async def before() -> None:
        # Ten fleets the worker is not told of (AGENTLEDGER_FLEETS names fleet-01), each with
        # a backlog, and a backlog on the configured fleet.
        unseen = [f"unseen-{i:02d}" for i in range(10)]
        await create_fleet_topics(d.settings, unseen)
        d.fleets.extend(unseen)
        await producer.start()
        for i, fleet in enumerate(["fleet-01", *unseen]):
            batch = _runs(fleet, 4, seed=i)
            runs.extend(batch)
            await producer.send(batch)

    a: subprocess.Popen[bytes] | None = None
    b: subprocess.Popen[bytes] | None = None
    began = time.monotonic()

    async def storm() -> None:
        nonlocal a, b, began
        await before()
        a = d.start_worker("a")
        began = time.monotonic()
        for second in range(DRILL_S):
            fleet = f"new-{second:02d}"
            await create_fleet_topics(d.settings, [fleet])
            d.fleets.append(fleet)
            batch = _runs(fleet, 1, seed=1000 + second)
            batch += _runs("fleet-01", 1, seed=2000 + second)  # and to an old fleet
            runs.extend(batch)
            await producer.send(batch)
            await asyncio.to_thread(_sample_stalls, d, stalls)
            if second == 15:
                b = d.start_worker("b")  # a second worker joins...
            if second == 40 and b is not None:
                b.send_signal(signal.SIGTERM)  # ... and leaves
            for proc in (a, b) if second < 40 else (a,):
                assert proc is None or proc.poll() is None, "a supervisor ended by itself"
            await asyncio.sleep(max(0.0, began + second + 1 - time.monotonic()))
        await producer.producer.stop()

    asyncio.run(storm())
    assert a is not None
    # b was asked to leave: it stops cleanly (0), or, when its stop hangs (faust's shutdown
    # can wait on a group join that a restart onto a new fleet's topic began), it ends at its
    # stop timeout with that one line (EXIT_STOP_TIMEOUT): never alive past it
    assert b is not None
    code = b.wait(timeout=d.settings.stop_timeout_s + 10)
    log_b = d.log_of("b").read_text()
    timed_out = code == EXIT_STOP_TIMEOUT and "did not stop within" in log_b
    assert code == 0 or timed_out, log_b[-3000:]

    # Everything applied once: each run's entry count and position equal what was sent.
    want = {run[0].run_id: len(run) for run in runs}
    deadline = time.monotonic() + 120
    while True:
        _sample_stalls(d, stalls)
        found = live_states(d.settings, "run-stats", list(want))
        done = [
            r
            for r, n in want.items()
            if r in found and found[r]["applied_seq"] == n and found[r]["state"]["entries"] == n
        ]
        if len(done) == len(want):
            break
        assert a.poll() is None, d.log_of("a").read_text()[-3000:]
        assert time.monotonic() < deadline, (
            f"{len(done)}/{len(want)} runs applied 120 s after the storm; stalls: {stalls}\n"
            + d.log_of("a").read_text()[-3000:]
        )
        time.sleep(1)
    print(f"all {len(want)} runs of {len(d.fleets)} fleets applied {time.monotonic() - began:.0f}s")

    assert not stalls, stalls
    assert max(REPORTS) >= 2 and sum(1 for n in REPORTS if n) > len(REPORTS) // 2, REPORTS
    logs = d.log_of("a").read_text() + d.log_of("b").read_text()
    ends = [line for line in logs.splitlines() if "agentledger worker (pid" in line]
    assert not [line for line in ends if ": exit 72:" in line], ends  # never stalled
    # Each faust process that ended said why, with a non-zero code, and was started again.
    restarted = [line for line in logs.splitlines() if "starting it again" in line]
    assert all(": exit 0" not in line for line in restarted), restarted
    print(f"{len(restarted)} restarts of the faust processes, e.g. {restarted[:1]}")

    # Every analytics projection caught up too, and each equals a replay.
    cli = [sys.executable, "-m", "infra.main"]
    verify = subprocess.run(
        [*cli, "verify", "--all", "--json"],
        env=d.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    verdicts = json.loads(verify.stdout)
    assert all(v["equal"] for v in verdicts), verdicts
    # Verify saw the fleets made after start-up (AGENTLEDGER_FLEETS still names one).
    assert sum(v["runs"] for v in verdicts if v["projection"] == "run-stats") == len(want)

    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=40) == 0
