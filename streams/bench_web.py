"""The write side of ``agentledger bench --web``: the data the web figures are measured on.

- :func:`fill_runs`: many runs in the live builds of the four projections the runs list reads
  (run-stats, failure-classifications, cost-metrics, working-memory). ``seed_runs`` simulated
  runs (the short story, ~30 entries each, two fleets) are applied by the real engine, as the
  worker applies them (its ``process``, without Kafka in between); then each run's stored
  documents are written again under new run ids through the store contract the worker writes
  with (:class:`~projectors.stores.postgres.PostgresStore`'s transaction), its run-stats times
  moved back by whole days, until there are ``total`` runs. Applying 100,000 runs of ~30
  entries through the engine would take this 2-core machine most of an hour; the copies cost
  seconds, and the runs list reads nothing but these stored documents.
- :func:`big_run`: one simulated run of about ``entries`` entries, published to Kafka and
  projected by the engine into every live build (its page is the one timed).
- :class:`LiveRun`: a published run whose last entries are held back; :meth:`LiveRun.step`
  publishes the next one and projects it, and says when the engine's transaction committed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from infra.settings import Settings
from projectors.base import Projection
from projectors.registry import projection
from projectors.stores import postgres as pg
from projectors.stores import postgres_ops as ops
from schemas.models import LedgerEntry
from schemas.topics import ledger_topic
from streams.bench_engine import records_of
from streams.builds import live_targets
from streams.dlq import KafkaDeadLetterSink
from streams.engine import Engine, Poison
from streams.publisher import AsyncPublisher
from streams.simulate import simulate_runs
from streams.source import drain

LIST_PROJECTIONS = ("run-stats", "failure-classifications", "cost-metrics", "working-memory")
WRITE_BATCH = 2_000


class _NoDeadLetters:
    async def send(self, poison: Sequence[Poison]) -> None:
        raise RuntimeError(f"the web bench dead-lettered {len(poison)} entries")


@dataclass(frozen=True)
class Filled:
    runs: int  # runs in the live builds afterwards
    seed_runs: int  # of them, applied by the engine
    seed_entries: int
    engine_s: float
    copy_s: float


def _moved(doc: dict[str, Any], days: int) -> dict[str, Any]:
    """A run-stats document with its first and last entry ``days`` earlier."""
    out = dict(doc)
    for name in ("first_at", "last_at"):
        if out.get(name):
            out[name] = (datetime.fromisoformat(out[name]) - timedelta(days=days)).isoformat()
    return out


async def fill_runs(
    settings: Settings, fleets: Sequence[str], total: int, seed_runs: int, seed: int = 2990
) -> Filled:
    """``total`` runs in the live builds of :data:`LIST_PROJECTIONS` (see the module's doc)."""
    projections = [projection(name, settings) for name in LIST_PROJECTIONS]
    targets = live_targets(settings.pg_address, projections)
    per_fleet = max(1, seed_runs // len(fleets))
    begin = datetime.now(UTC) - timedelta(days=1) - timedelta(minutes=17 * per_fleet)
    runs = list(simulate_runs(len(fleets), per_fleet, seed, begin=begin))
    entries = [e for run in runs for e in run]
    engine = Engine(targets, settings.pg_address, None, _NoDeadLetters())
    await engine.start()
    t0 = time.monotonic()
    try:
        records = records_of(settings, entries)
        for start in range(0, len(records), WRITE_BATCH):
            await engine.process(records[start : start + WRITE_BATCH])
    finally:
        await engine.close()
    engine_s = time.monotonic() - t0
    builds = {t.projection.name: t.build for t in targets}
    fleet_of = {run[0].run_id: run[0].fleet_id for run in runs}
    copies = max(0, -(-total // len(runs)) - 1)  # copies of each seed run
    t0 = time.monotonic()
    store = pg.PostgresStore(settings.pg_address)
    try:
        made = len(runs)
        for p in projections:
            made = len(runs) + await _copy(
                store, settings, p, builds[p.name], fleet_of, copies, total
            )
    finally:
        await store.close()
    return Filled(made, len(runs), len(entries), engine_s, time.monotonic() - t0)


async def _copy(
    store: pg.PostgresStore,
    settings: Settings,
    p: Projection[Any],
    build: str,
    fleet_of: dict[str, str],
    copies: int,
    total: int,
) -> int:
    """Each stored run of ``p``'s build written again ``copies`` times under new ids (at most
    ``total`` runs in all); how many were written."""
    with ops.connect(settings.pg_address) as conn:
        pg.use_documents(conn)
        stored = [(r, seq, doc) for r, seq, _g, doc in pg.current_documents(conn, p, build)]
    room = total - len(stored)
    # (state, head) of each stored run; run-stats' are made again for each copy (moved times)
    same = {
        run_id: (p.checkpoint_json(state), p.head_json(state))
        for run_id, _seq, doc in stored
        for state in [p.from_doc(doc)]
    }
    writes: list[pg.RunWrite] = []
    written = 0
    for k in range(1, copies + 1):
        for run_id, seq, doc in stored:
            if written >= room:
                break
            state_json, head_json = same[run_id]
            if p.name == "run-stats":
                moved = p.from_doc(_moved(doc, k))
                state_json, head_json = p.checkpoint_json(moved), p.head_json(moved)
            writes.append(
                pg.RunWrite(
                    run_id=f"{run_id}-c{k:03d}",
                    fleet_id=fleet_of[run_id],
                    applied_seq=seq,
                    held=(),
                    gaps=[],
                    state=state_json,
                    head=head_json,
                )
            )
            written += 1
            if len(writes) >= WRITE_BATCH:
                await _write(store, p.name, build, writes)
                writes = []
    if writes:
        await _write(store, p.name, build, writes)
    return written


async def _write(store: pg.PostgresStore, name: str, build: str, writes: list[pg.RunWrite]) -> None:
    async with store.transaction() as tx:
        await tx.write({(name, build): writes}, {})


async def project(settings: Settings, fleets: Sequence[str]) -> None:
    """Apply what the ledger topics hold past the stored positions into every live build."""
    sink = KafkaDeadLetterSink(settings)
    engine = Engine(live_targets(settings.pg_address), settings.pg_address, None, sink)
    await engine.start()
    try:
        topics = [ledger_topic(settings.topic_prefix, f) for f in fleets]
        await drain(engine, settings.kafka_address, topics, batch_size=2_000)
    finally:
        await engine.close()
        await sink.close()


async def big_run(settings: Settings, fleet: str, entries: int, seed: int = 2991) -> str:
    """One simulated run of about ``entries`` entries, published and projected; its id."""
    [run] = list(simulate_runs(1, 1, seed, entries_per_run=entries))
    run = [e.model_copy(update={"fleet_id": fleet}) for e in run]
    async with AsyncPublisher(settings) as publisher:
        await publisher.publish_batch(run)
    await project(settings, [fleet])
    return run[0].run_id


class LiveRun:
    """A run published up to ``held_from`` (its later entries held back) and projected."""

    def __init__(self, settings: Settings, fleet: str, entries: int, held_from: int) -> None:
        self.settings = settings
        self.fleet = fleet
        self.entries = entries
        self.held_from = held_from
        self.withheld: list[LedgerEntry] = []
        self.run_id = ""
        self.publisher = AsyncPublisher(settings)
        self.engine: Engine | None = None
        self.sink = KafkaDeadLetterSink(settings)

    async def start(self, seed: int = 2992) -> str:
        [run] = list(simulate_runs(1, 1, seed, entries_per_run=self.entries))
        run = [e.model_copy(update={"fleet_id": self.fleet}) for e in run]
        self.run_id = run[0].run_id
        self.withheld = [e for e in run if e.sequence_no > self.held_from]
        await self.publisher.start()
        await self.publisher.publish_batch([e for e in run if e.sequence_no <= self.held_from])
        self.engine = Engine(
            live_targets(self.settings.pg_address), self.settings.pg_address, None, self.sink
        )
        await self.engine.start()
        await self._drain()
        return self.run_id

    async def _drain(self) -> None:
        assert self.engine is not None
        topic = ledger_topic(self.settings.topic_prefix, self.fleet)
        await drain(self.engine, self.settings.kafka_address, [topic], batch_size=2_000)

    def left(self) -> int:
        return len(self.withheld)

    async def step(self) -> tuple[float, float]:
        """Publish the next held-back entry and project it: (the wall-clock time when the
        engine's drain returned, its transaction committed; seconds from publish to then)."""
        entry = self.withheld.pop(0)
        t0 = time.perf_counter()
        await self.publisher.publish_batch([entry])
        await self._drain()
        took = time.perf_counter() - t0
        return time.time(), took

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
        await self.sink.close()
        await self.publisher.close()
