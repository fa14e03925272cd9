"""Change streams and subscribers on the real stack (issue 18).

Each test runs a private deployment (own database, topics, Redis prefix) with real worker
processes, whose relay sends the change outbox to ``<prefix>.changes.<projection>``.
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import avro.io
import avro.schema
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.examples.budget_guard import BudgetGuard, Crossing
from consumers.examples.mirror import CostMirror
from consumers.subscribe import Subscriber, changes
from infra.settings import Settings
from projectors.cost_metrics import CostMetricsProjection, shown_state
from projectors.pricing import LayeredPrices, PriceTable
from projectors.registry import NAMES
from projectors.stores.postgres import use_documents
from schemas.changes import CHANGE_CATALOG, ProjectionChange, from_record
from schemas.models import LedgerEntry
from schemas.topics import change_topic
from streams.changes import ensure_change_topics
from streams.deployment import PrivateDeployment
from streams.publisher import AsyncPublisher
from streams.rebuild import Start, create_build, swap
from streams.simulate import simulate_runs

pytestmark = pytest.mark.integration

FLEETS = ["fleet-01", "fleet-02"]
Runs = list[list[LedgerEntry]]
# From the beginning after this many runs of real lengths (40: 11,802 entries in CI); the
# issue's 100k entries is `AGENTLEDGER_TEST_CHANGE_RUNS=270` (105,746 entries).
RUNS = int(os.environ.get("AGENTLEDGER_TEST_CHANGE_RUNS", "20"))


class Deployment(PrivateDeployment):
    def live(self, name: str) -> str | None:
        with psycopg.connect(self.settings.pg_address) as conn:
            row = conn.execute(
                "SELECT build FROM al_live WHERE projection = %s", (name,)
            ).fetchone()
        return None if row is None else str(row[0])

    def heads(self, name: str) -> dict[str, tuple[int, Any]]:
        """run_id -> (applied_seq, head) of the live build: what readers are served."""
        with psycopg.connect(self.settings.pg_address) as conn:
            use_documents(conn)
            rows = conn.execute(
                "SELECT s.run_id, s.applied_seq, coalesce(s.head, s.state) FROM al_run_state s "
                "JOIN al_live l USING (projection, build) WHERE s.projection = %s",
                (name,),
            ).fetchall()
        return {r: (int(seq), doc) for r, seq, doc in rows}

    def outbox(self) -> int:
        with psycopg.connect(self.settings.pg_address) as conn:
            row = conn.execute("SELECT count(*) FROM al_changes").fetchone()
        assert row is not None
        return int(row[0])

    def wait_applied(
        self, runs: Runs, names: tuple[str, ...] = NAMES, timeout_s: float = 180
    ) -> None:
        """Every run applied to its end by these projections, and the outbox sent."""
        want = {run[0].run_id: len(run) for run in runs}
        deadline = time.monotonic() + timeout_s
        while True:
            behind = []
            for n in names:
                heads = self.heads(n)
                if any(heads.get(r, (0, None))[0] < seq for r, seq in want.items()):
                    behind.append(n)
            if not behind and self.outbox() == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not applied in time: {behind}; outbox holds {self.outbox()} changes"
                )
            time.sleep(0.3)


@pytest.fixture
def deployment(services: Settings, tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(services, "changes", FLEETS, tmp_path, {"AGENTLEDGER_WORKER_BATCH_SIZE": "500"})
    asyncio.run(d.create())
    asyncio.run(ensure_change_topics(d.settings))
    yield d
    d.drop()


def _runs(count: int, seed: int) -> Runs:
    return list(simulate_runs(len(FLEETS), count // len(FLEETS), seed, length_profile="real"))


async def _publish(settings: Settings, runs: Runs, pause_s: float = 0.0, chunk: int = 0) -> None:
    async with AsyncPublisher(settings) as publisher:
        if not chunk:
            for run in runs:
                await publisher.publish_batch(run)
            return
        # interleaved, a chunk of every run at a time: runs change many times while followed
        longest = max(len(r) for r in runs)
        for start in range(0, longest, chunk):
            for run in runs:
                if run[start : start + chunk]:
                    await publisher.publish_batch(run[start : start + chunk])
            await asyncio.sleep(pause_s)


def _as_pg(change: ProjectionChange) -> tuple[int, Any]:
    return change.applied_seq, change.state


async def _snapshot(settings: Settings, name: str, **options: Any) -> dict[str, ProjectionChange]:
    """The current state a subscriber from the beginning receives, by run."""
    got: dict[str, ProjectionChange] = {}
    async with Subscriber(settings, name, start="beginning", idle_timeout_s=3, **options) as sub:
        async for change in sub:
            if change.kind == "STATE":
                assert change.run_id not in got, "a run's current state came twice"
                got[change.run_id or ""] = change
            if sub.caught_up.is_set() and not sub.buffered:
                break
    return got


def test_from_the_beginning_every_runs_current_state_equals_postgresql(
    deployment: Deployment,
) -> None:
    d = deployment
    runs = _runs(RUNS, seed=181)
    asyncio.run(_publish(d.settings, runs))
    worker = d.start_worker("w")
    try:
        d.wait_applied(runs, timeout_s=max(180, sum(map(len, runs)) / 200))
    finally:
        d.stop_worker(worker)
    for name in NAMES:
        got = asyncio.run(_snapshot(d.settings, name))
        assert {r: _as_pg(c) for r, c in got.items()} == d.heads(name), name
        live = d.live(name)
        assert {c.build for c in got.values()} == {live}
        assert all(c.projection == name and c.projection_version > 0 for c in got.values())
        # every change names its fleet, and the publisher's trace of the last entry applied
        fleets = {run[0].run_id: run[0].fleet_id for run in runs}
        assert all(c.fleet_id == fleets[r] for r, c in got.items() if r in fleets)
        assert all(c.traceparent and c.traceparent.startswith("00-") for c in got.values())
    # the fleet filter
    mine = asyncio.run(_snapshot(d.settings, "cost-metrics", fleet="fleet-02"))
    assert mine and {c.fleet_id for c in mine.values()} == {"fleet-02"}
    assert set(mine) == {r[0].run_id for r in runs if r[0].fleet_id == "fleet-02"}
    # the sync iterator and the CLI's JSON lines see the same
    synced = {
        c.run_id: _as_pg(c)
        for c in changes(d.settings, "failure-classifications", start="beginning", idle_timeout_s=2)
        if c.kind == "STATE"
    }
    assert synced == d.heads("failure-classifications")
    # the CLI: one JSON object per change, and a line of words for a person
    command = [sys.executable, "-m", "infra.main", "subscribe", "cost-metrics"]
    out = subprocess.run(
        [*command, "--from-beginning", "--json", "--idle-exit", "2"],
        env=d.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    assert {x["run_id"]: (x["applied_seq"], x["state"]) for x in lines} == {
        run: (seq, shown_state(state)) for run, (seq, state) in d.heads("cost-metrics").items()
    }  # its sums as every output shows them
    words = subprocess.run(
        [*command, "--from-beginning", "--fleet", "fleet-01", "--idle-exit", "2"],
        env=d.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert len(words) == len([r for r in runs if r[0].fleet_id == "fleet-01"])
    assert all("(fleet fleet-01) at seq" in w and " calls" in w for w in words)


def test_a_standard_avro_consumer_decodes_the_stream(deployment: Deployment) -> None:
    """kafka + Apache ``avro`` + the schema file in schemas/: nothing of ours."""
    d = deployment
    runs = _runs(4, seed=182)
    asyncio.run(_publish(d.settings, runs))
    worker = d.start_worker("w")
    try:
        d.wait_applied(runs)
    finally:
        d.stop_worker(worker)
    path = Path(__file__).parents[2] / "schemas" / "avsc" / "projection_change.v1.avsc"
    schema = avro.schema.parse(path.read_text())
    fingerprint = CHANGE_CATALOG.by_version(1).fingerprint

    async def read_all() -> list[dict[str, Any]]:
        topic = change_topic(d.settings.topic_prefix, "cost-metrics")
        consumer = AIOKafkaConsumer(
            bootstrap_servers=d.settings.kafka_address,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await consumer.start()
        out: list[dict[str, Any]] = []
        try:
            parts = [TopicPartition(topic, p) for p in range(d.settings.topic_partitions)]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            ends = await consumer.end_offsets(parts)
            while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
                got = await consumer.getmany(timeout_ms=1000)
                for records in got.values():
                    for r in records:
                        assert r.value[:2] == b"\xc3\x01" and r.value[2:10] == fingerprint
                        decoder = avro.io.BinaryDecoder(io.BytesIO(r.value[10:]))
                        out.append(cast(dict[str, Any], avro.io.DatumReader(schema).read(decoder)))
        finally:
            await consumer.stop()
        return out

    records = asyncio.run(read_all())
    latest: dict[str, dict[str, Any]] = {}
    for record in sorted(records, key=lambda r: r["change_id"]):
        latest[record["run_id"]] = record
    heads = d.heads("cost-metrics")
    assert {
        r: (rec["applied_seq"], json.loads(rec["state_json"])) for r, rec in latest.items()
    } == heads
    assert from_record(next(iter(latest.values()))).kind == "STATE"


def test_a_live_subscriber_sees_each_change_once_in_order_while_the_worker_is_killed(
    deployment: Deployment,
) -> None:
    d = deployment
    runs = _runs(24, seed=183)
    seen: list[ProjectionChange] = []
    ready = threading.Event()
    done = threading.Event()

    async def follow() -> None:
        async with Subscriber(d.settings, "cost-metrics", start="now", idle_timeout_s=2) as sub:
            ready.set()
            while not done.is_set():  # until the test is done and nothing came for 2 s
                async for change in sub:
                    seen.append(change)

    follower = threading.Thread(target=lambda: asyncio.run(follow()))
    follower.start()
    ready.wait(30)
    publisher = threading.Thread(
        target=lambda: asyncio.run(_publish(d.settings, runs, pause_s=0.4, chunk=25))
    )
    publisher.start()
    kills = 0
    worker = d.start_worker("w0")
    while publisher.is_alive() or kills < 5:
        time.sleep(2.5)
        if kills < 5:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kills += 1
            worker = d.start_worker(f"w{kills}")
    publisher.join()
    try:
        d.wait_applied(runs, names=("cost-metrics",))
        time.sleep(3)  # what the relay sent last reaches the subscriber
    finally:
        done.set()
        d.stop_worker(worker)
    follower.join(60)
    # publishing after the last change stops the follower at its next batch
    states = [c for c in seen if c.kind == "STATE"]
    ids = [c.change_id for c in states]
    assert len(ids) == len(set(ids)), "a change was seen twice"
    by_run: dict[str, list[ProjectionChange]] = {}
    for c in states:
        by_run.setdefault(c.run_id or "", []).append(c)
    for run_id, mine in by_run.items():
        order = [(c.applied_seq, c.held) for c in mine]
        assert order == sorted(set(order)), f"{run_id}: changes out of order or repeated"
        assert [c.change_id for c in mine] == sorted(c.change_id for c in mine)
    heads = d.heads("cost-metrics")
    assert {r: _as_pg(cs[-1]) for r, cs in by_run.items()} == heads
    assert len(by_run) == len(runs)
    assert sum(len(cs) for cs in by_run.values()) > 2 * len(runs)  # runs changed many times


def test_a_swap_with_a_changed_price_table_reaches_the_mirror(
    deployment: Deployment, tmp_path: Path
) -> None:
    d = deployment
    runs = _runs(10, seed=184)
    asyncio.run(_publish(d.settings, runs))
    worker = d.start_worker("w")
    mirror = CostMirror(d.settings, d.settings.pg_address, "analyst_costs")
    markers: list[ProjectionChange] = []
    try:
        d.wait_applied(runs, names=("cost-metrics",))
        asyncio.run(mirror.run(idle_timeout_s=2))
        assert _mirrored(d) == _live_costs(d)
        billed = _live_costs(d)
        shipped = json.loads(
            (Path(__file__).parents[2] / "projectors" / "data" / "prices.v1.json").read_text()
        )
        doubled = copy.deepcopy(shipped)
        doubled["version"] = "2026-12-01"
        for periods in doubled["models"].values():
            for period in periods:
                for key in ("input", "cached_input", "output", "reasoning"):
                    if key in period:
                        period[key] = period[key] * 2
        table = tmp_path / "prices.json"
        table.write_text(json.dumps(doubled))
        repriced = CostMetricsProjection(LayeredPrices(PriceTable.load(table)))
        previous = d.live("cost-metrics")

        async def follow_marker() -> None:
            async with Subscriber(d.settings, "cost-metrics", start="now", idle_timeout_s=2) as s:
                while not swapped.is_set():  # until swapped and nothing came for 2 s
                    async for change in s:
                        if change.kind == "BUILD_CHANGED":
                            markers.append(change)

        swapped = threading.Event()
        follower = threading.Thread(target=lambda: asyncio.run(follow_marker()))
        follower.start()
        time.sleep(1)
        build = asyncio.run(create_build(d.settings, repriced, Start()))
        asyncio.run(swap(d.settings, repriced, build))
        d.wait_applied(runs, names=("cost-metrics",))
        # the same mirror, resumed from the positions it stored with its rows
        asyncio.run(mirror.run(idle_timeout_s=2))
        swapped.set()
        follower.join(60)
    finally:
        d.stop_worker(worker)
    live = _live_costs(d)
    assert live != billed
    assert _mirrored(d) == live
    assert {row[0] for row in _mirrored(d).values()} == {build}
    assert len(markers) == 8  # one per partition
    assert {(m.previous_build, m.build) for m in markers} == {(previous, build)}
    assert markers[0].inputs and "2026-12-01" in str(markers[0].inputs.get("price_table"))


def _live_costs(d: Deployment) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(d.settings.pg_address) as conn:
        rows = conn.execute(
            "SELECT s.run_id, s.build, s.applied_seq, (s.head->'totals'->>'cost_usd')::numeric, "
            "(s.head->'totals'->>'calls')::bigint FROM al_run_state s "
            "JOIN al_live l USING (projection, build) WHERE s.projection = 'cost-metrics'"
        ).fetchall()
    return {r: tuple(rest) for r, *rest in rows}


def _mirrored(d: Deployment) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(d.settings.pg_address) as conn:
        rows = conn.execute(
            "SELECT run_id, build, applied_seq, cost_usd, calls FROM analyst_costs"
        ).fetchall()
    return {r: tuple(rest) for r, *rest in rows}


def test_the_budget_guard_reports_a_crossing_once_with_the_cost_that_crossed(
    deployment: Deployment,
) -> None:
    d = deployment
    runs = _runs(8, seed=185)
    found: list[Crossing] = []

    async def guard() -> None:
        async for crossing in BudgetGuard(
            d.settings, start="beginning", idle_timeout_s=4
        ).crossings():
            found.append(crossing)

    asyncio.run(_publish(d.settings, runs))
    worker = d.start_worker("w")
    try:
        d.wait_applied(runs, names=("cost-metrics",))
    finally:
        d.stop_worker(worker)
    asyncio.run(guard())
    heads = d.heads("cost-metrics")
    over = {r for r, (_s, h) in heads.items() if h.get("over_budget")}
    assert over, "the simulator's runs include some over budget"
    assert [c.run_id for c in found] == sorted(
        {c.run_id for c in found}, key=[c.run_id for c in found].index
    )
    assert {c.run_id for c in found} == over
    for c in found:
        assert c.cost_usd > c.budget_usd
