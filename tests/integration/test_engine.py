"""The engine on the real broker, PostgreSQL and Redis: exactly-once effect, order, poison,
outages."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections import defaultdict
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis
from rich.console import Console

from infra.services import PostgresService
from infra.settings import Settings
from projectors.cost_metrics import CostMetricsProjection
from projectors.run_stats import RunStats, RunStatsProjection
from schemas.catalog import AVSC_DIR, CATALOG
from schemas.codec import LedgerCodec
from schemas.factory import EntryBuilder
from schemas.models import EntryKind, LedgerEntry, to_avro
from schemas.topics import ledger_topic
from streams.dlq import KafkaDeadLetterSink, read_dead_letters, redrive
from streams.engine import Engine, SourceRecord, Target
from streams.simulate import simulate
from streams.source import drain, read_all
from tests.integration.engine_support import (
    CODEC,
    Env,
    make_env,
    produce_raw,
    redis_views,
    run_rows,
    same_views,
)

pytestmark = pytest.mark.integration


def _by_run(entries: list[LedgerEntry]) -> dict[str, list[LedgerEntry]]:
    runs: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in entries:
        runs[e.run_id].append(e)
    return runs


def _assert_exact(rows: dict[str, dict[str, object]], entries: list[LedgerEntry]) -> None:
    runs = _by_run(entries)
    assert rows.keys() == runs.keys()
    for run_id, run in runs.items():
        row = rows[run_id]
        state = row["state"]
        assert isinstance(state, dict)
        assert row["applied_seq"] == len(run) and row["held"] == []
        assert state["entries"] == len(run) and state["last_sequence_no"] == len(run)


async def test_every_entry_once_and_redelivery_changes_nothing(services: Settings) -> None:
    env = await make_env(services)
    entries = simulate(1, 20, seed=21)
    await produce_raw(env, entries)
    async with env.engine() as engine:
        stats = await drain(engine, env.settings.kafka_address, env.topics, batch_size=500)
        assert stats.applied == len(entries) and stats.duplicates == 0
        before = run_rows(env)
        _assert_exact(before, entries)

        again = await engine.process(await read_all(env.settings.kafka_address, env.topics))
        assert again.applied == 0 and again.redelivered == len(entries)
        assert run_rows(env) == before
        assert same_views(before, await redis_views(env, list(before)))


async def test_duplicates_once_gaps_held_then_filled(services: Settings) -> None:
    env = await make_env(services)
    b = EntryBuilder("run-gappy")
    run = [b.add(EntryKind.USER_TASK) for _ in range(6)]
    await produce_raw(env, [run[0], run[1], run[1], run[4], run[5]])
    async with env.engine() as engine:
        await drain(engine, env.settings.kafka_address, env.topics)
        row = run_rows(env)["run-gappy"]
        assert row["applied_seq"] == 2 and row["held"] == [5, 6] and row["gaps"] == [[3, 4]]
        seq, view = (await redis_views(env, ["run-gappy"]))["run-gappy"]
        assert seq == 2 and view["gaps"] == [[3, 4]], "visibly incomplete in Redis too"

        await produce_raw(env, [run[3], run[2], run[2]])
        stats = await drain(engine, env.settings.kafka_address, env.topics)
        assert stats.applied == 4 and stats.duplicates == 1
        row = run_rows(env)["run-gappy"]
        assert row["applied_seq"] == 6 and row["held"] == [] and row["gaps"] == []
        assert row["state"]["entries"] == 6


async def test_poison_dead_lettered_with_reason_and_good_ones_applied(services: Settings) -> None:
    env = await make_env(services)
    good = simulate(1, 3, seed=5)
    valid = CODEC.encode(good[0])
    poison = [
        b"\x00garbage",
        valid[:-7],
        b"\xc3\x01" + b"\x00" * 8 + valid[10:],
        b"not avro at all",
    ]
    mixed: list[LedgerEntry | bytes] = []
    for i, entry in enumerate(good):
        mixed.append(entry)
        if i % 20 == 0:
            mixed.append(poison[(i // 20) % len(poison)])
    await produce_raw(env, mixed)
    async with env.engine() as engine:
        stats = await drain(engine, env.settings.kafka_address, env.topics, batch_size=100)
    n_poison = len(mixed) - len(good)
    assert stats.applied == len(good) and stats.dead_lettered == n_poison
    _assert_exact(run_rows(env), good)

    letters = await read_dead_letters(env.settings, env.fleets)
    assert len(letters) == n_poison
    assert {bytes(d.value) for d in letters} <= set(poison)
    assert all(d.error_class == "LedgerDecodeError" and d.message for d in letters)
    assert all(d.source_topic == env.topics[0] and d.source_offset >= 0 for d in letters)
    report = await redrive(env.settings, env.fleets)
    assert report.redriven == 0 and len(report.still_bad) == n_poison


async def test_postgres_down_for_ten_seconds(services: Settings) -> None:
    if services.pg_external:
        pytest.skip("needs the local PostgreSQL this project runs (it stops and starts it)")
    env = await make_env(services)
    entries = simulate(1, 60, seed=8)
    await produce_raw(env, entries)
    postgres = PostgresService(services, Console(quiet=True))

    async def outage() -> None:
        await asyncio.sleep(0.3)
        await asyncio.to_thread(postgres.down)
        await asyncio.sleep(10)
        await asyncio.to_thread(postgres.up)

    async with env.engine() as engine:
        blackout = asyncio.create_task(outage())
        await drain(engine, env.settings.kafka_address, env.topics, batch_size=50)
        await blackout
        await drain(engine, env.settings.kafka_address, env.topics, batch_size=50)
    _assert_exact(run_rows(env), entries)


async def test_redis_flushed_mid_run_views_come_back(services: Settings) -> None:
    env = await make_env(services)
    entries = simulate(1, 20, seed=13)
    half = len(entries) // 2
    await produce_raw(env, entries[:half])
    async with env.engine() as engine:
        await drain(engine, env.settings.kafka_address, env.topics)
        client = aioredis.Redis.from_url(env.settings.redis_address)
        await client.flushdb()
        await client.aclose()
        await produce_raw(env, entries[half:])
        await drain(engine, env.settings.kafka_address, env.topics)
    rows = run_rows(env)
    _assert_exact(rows, entries)
    assert same_views(rows, await redis_views(env, list(rows)))


async def test_redrive_after_the_fix_applies_once(services: Settings) -> None:
    """Entries written with a schema this deployment does not know yet are dead-lettered; once
    the new version is in the catalog, redrive sends them back and they are applied, once."""
    env = await make_env(services)
    now = CATALOG.current.version
    current = json.loads((AVSC_DIR / f"ledger_entry.v{now}.avsc").read_text())
    ahead_schema = copy.deepcopy(current)
    ahead_schema["fields"].append(
        {"name": "priority", "type": "int", "default": 0, "doc": "test field"}
    )
    newer = CATALOG.with_version(ahead_schema, now + 1)
    writer_v2 = LedgerCodec(newer, writer_version=now + 1)
    run = simulate(1, 1, seed=3)
    ahead = [writer_v2.encode_record(to_avro(e) | {"priority": 1}) for e in run[5:]]
    await produce_raw(env, [*run[:5], *ahead], key=run[0].run_id.encode())
    async with env.engine() as engine:
        stats = await drain(engine, env.settings.kafka_address, env.topics)
    assert stats.dead_lettered == len(run) - 5
    assert run_rows(env)[run[0].run_id]["applied_seq"] == 5

    fixed = LedgerCodec(newer, reader_version=now)
    report = await redrive(env.settings, env.fleets, codec=fixed)
    assert report.redriven == len(run) - 5 and not report.still_bad
    again = await redrive(env.settings, env.fleets, codec=fixed)
    assert again.redriven == 0 and again.already == len(run) - 5

    sink = KafkaDeadLetterSink(env.settings)
    engine = Engine([env.target()], env.settings.pg_address, None, sink, codec=fixed)
    await engine.start()
    try:
        await drain(engine, env.settings.kafka_address, env.topics)
    finally:
        await engine.close()
        await sink.close()
    _assert_exact(run_rows(env), run)


class _FragileStats(RunStatsProjection):
    """run-stats with a bug: its fold raises on every COMPACTION entry."""

    name = "fragile-stats"

    def fold(self, state: RunStats, entry: LedgerEntry) -> RunStats:
        if entry.kind is EntryKind.COMPACTION:
            raise ValueError("cannot handle compactions")
        return super().fold(state, entry)


async def test_a_fold_that_raises_dead_letters_the_entry_and_moves_on(services: Settings) -> None:
    env = await make_env(services)
    entries = simulate(1, 14, seed=77)
    compactions = [e for e in entries if e.kind is EntryKind.COMPACTION]
    assert compactions
    await produce_raw(env, entries)
    sink = KafkaDeadLetterSink(env.settings)
    engine = Engine([Target(_FragileStats(), env.build)], env.settings.pg_address, None, sink)
    await engine.start()
    try:
        stats = await drain(engine, env.settings.kafka_address, env.topics, batch_size=100)
    finally:
        await engine.close()
        await sink.close()
    assert stats.applied == len(entries) and stats.dead_lettered == len(compactions)
    with psycopg.connect(env.settings.pg_address) as conn:
        rows: dict[str, dict[str, int]] = dict(
            conn.execute(
                "SELECT run_id, coalesce(head, state) FROM al_run_state "
                "WHERE projection = 'fragile-stats' "
                "AND build = %s",
                (env.build,),
            ).fetchall()
        )
    by_run = _by_run(entries)
    for run_id, run in by_run.items():
        skipped = sum(1 for e in run if e.kind is EntryKind.COMPACTION)
        assert rows[run_id]["entries"] == len(run) - skipped, "every other entry was applied"
    letters = await read_dead_letters(env.settings, env.fleets)
    assert len(letters) == len(compactions)
    assert all(
        d.error_class == "ProjectionFoldError"
        and "COMPACTION" not in d.message
        and "cannot handle compactions" in d.message
        for d in letters
    )


def _records(env: Env, entries: list[LedgerEntry], first_offset: int) -> list[SourceRecord]:
    prefix = env.settings.topic_prefix
    return [
        SourceRecord(
            ledger_topic(prefix, e.fleet_id),
            0,
            first_offset + i,
            e.run_id.encode(),
            CODEC.encode(e),
        )
        for i, e in enumerate(entries)
    ]


class _CountingRunStats(RunStatsProjection):
    def __init__(self) -> None:
        self.parsed = 0

    def from_doc(self, doc: dict[str, Any]) -> RunStats:
        self.parsed += 1
        return super().from_doc(doc)


async def test_kept_states_skip_reparsing_and_another_writer_invalidates_them(
    services: Settings,
) -> None:
    """The engine keeps each run's committed state in memory instead of re-reading its document;
    when another writer moved the run on in between, it reads the document again."""
    env = await make_env(services)
    b = EntryBuilder("run-kept")
    run = [b.add(EntryKind.USER_TASK) for _ in range(9)]
    mine, theirs = _CountingRunStats(), _CountingRunStats()
    sink = KafkaDeadLetterSink(env.settings)
    a = Engine([Target(mine, env.build)], env.settings.pg_address, None, sink)
    other = Engine([Target(theirs, env.build)], env.settings.pg_address, None, sink)
    try:
        await a.start()
        await other.start()
        await a.process(_records(env, run[0:3], 0))
        await a.process(_records(env, run[3:5], 3))
        assert mine.parsed == 0, "the second batch folds onto the kept state"
        await other.process(_records(env, run[5:7], 5))  # moves the run on behind a's back
        assert theirs.parsed == 1
        await a.process(_records(env, run[7:9], 7))
        assert mine.parsed == 1, "a's kept state is stale: the stored document is read"
        row = run_rows(env)["run-kept"]
        assert row["applied_seq"] == 9 and row["state"]["entries"] == 9
    finally:
        await a.close()
        await other.close()
        await sink.close()


def _two_lanes(env: Env, sink: KafkaDeadLetterSink, **options: Any) -> Engine:
    """run-stats (hot) and cost-metrics (analytics, deferred) on the env's build."""
    targets = [Target(RunStatsProjection(), env.build), Target(CostMetricsProjection(), env.build)]
    return Engine(targets, env.settings.pg_address, None, sink, defer_analytics=True, **options)


def _analytics_positions(env: Env) -> dict[str, tuple[int, list[int]]]:
    """cost-metrics' (applied_seq, held) of every run of the env's build."""
    with psycopg.connect(env.settings.pg_address) as conn:
        rows = conn.execute(
            "SELECT run_id, applied_seq, held FROM al_run_state "
            "WHERE projection = 'cost-metrics' AND build = %s",
            (env.build,),
        ).fetchall()
    return {run_id: (seq, list(held)) for run_id, seq, held in rows}


async def test_deferred_analytics_coalesce_small_batches_and_apply_everything_once(
    services: Settings,
) -> None:
    """With defer_analytics, each batch's hot targets commit at once; the batches that arrive
    while an analytics commit runs (or within the interval after it) go together in the next."""
    env = await make_env(services)
    entries = simulate(1, 4, seed=23)
    records = _records(env, entries, 0)
    sink = KafkaDeadLetterSink(env.settings)
    engine = _two_lanes(env, sink, analytics_interval_s=0.3)
    lanes: list[tuple[str, int]] = []
    phase = engine._phase

    async def counted(lane: str, targets: Any, batch: Any, *args: Any) -> None:
        lanes.append((lane, len(batch)))
        await phase(lane, targets, batch, *args)

    engine._phase = counted  # type: ignore[method-assign, assignment]
    try:
        await engine.start()
        size = len(records) // 5 + 1
        for start in range(0, len(records), size):
            await engine.process(records[start : start + size])
        await engine.flush()
    finally:
        await engine.close()
        await sink.close()
    hot = [n for lane, n in lanes if lane == "hot"]
    analytics = [n for lane, n in lanes if lane == "analytics"]
    assert len(hot) == 5 and sum(hot) == len(records)
    assert len(analytics) == 2, analytics  # the first batch, then the four that waited
    assert sum(analytics) == len(records)
    assert _analytics_positions(env) == {r: (len(run), []) for r, run in _by_run(entries).items()}


class _WatchedCosts(CostMetricsProjection):
    """cost-metrics that notes, at each fold, whether a hot phase was running, and says it
    folded (``folded``)."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: Engine | None = None
        self.beside_hot: list[bool] = []
        self.folded = asyncio.Event()

    def fold(self, state: Any, entry: LedgerEntry) -> Any:
        assert self.engine is not None
        self.beside_hot.append(not self.engine._hot_idle.is_set())
        self.folded.set()
        return super().fold(state, entry)


@pytest.mark.parametrize("beside_hot", [True, False])
async def test_a_backlog_folds_analytics_while_the_hot_phase_waits_on_postgresql(
    services: Settings, beside_hot: bool
) -> None:
    """An analytics batch of at least ``analytics_beside_hot`` records folds while the next
    batch's hot phase waits on PostgreSQL (here: its write waits until an analytics fold came,
    at most 0.5 s); a smaller one waits for the hot phase to end. Either way every entry is
    applied once."""
    env = await make_env(services)
    entries = simulate(1, 4, seed=31)
    records = _records(env, entries, 0)
    sink = KafkaDeadLetterSink(env.settings)
    costs = _WatchedCosts()
    targets = [Target(RunStatsProjection(), env.build), Target(costs, env.build)]
    threshold = 1 if beside_hot else len(records) + 1
    engine = Engine(
        targets,
        env.settings.pg_address,
        None,
        sink,
        defer_analytics=True,
        analytics_beside_hot=threshold,
    )
    costs.engine = engine
    waited: list[bool] = []  # per hot write: whether it waited out the 0.5 s
    transaction = engine.store.transaction

    @contextlib.asynccontextmanager
    async def watched(lane: str = "hot") -> Any:
        async with transaction(lane) as tx:
            if lane == "hot":
                write = tx.write

                async def slow_write(*args: Any) -> None:
                    try:
                        await asyncio.wait_for(costs.folded.wait(), 0.5)
                        waited.append(False)
                    except TimeoutError:
                        waited.append(True)
                    costs.folded.clear()
                    await write(*args)

                tx.write = slow_write  # type: ignore[method-assign, assignment]
            yield tx

    engine.store.transaction = watched  # type: ignore[method-assign]
    try:
        await engine.start()
        half = len(records) // 2
        await engine.process(records[:half])
        await engine.process(records[half:])
        await engine.flush()
    finally:
        await engine.close()
        await sink.close()
    assert len(waited) == 2 and waited[0]  # the first batch: no analytics yet to fold
    if beside_hot:
        assert not waited[1] and any(costs.beside_hot)
    else:
        assert waited[1] and not any(costs.beside_hot)
    assert _analytics_positions(env) == {r: (len(run), []) for r, run in _by_run(entries).items()}


async def test_a_failed_analytics_commit_keeps_its_records_ahead_of_newer_ones(
    services: Settings,
) -> None:
    """The analytics lane fails on its first commit: the records it held stay pending ahead of
    the batches that came meanwhile, so the next flush applies everything, in order, once."""
    env = await make_env(services)
    entries = simulate(1, 3, seed=29)
    records = _records(env, entries, 0)
    sink = KafkaDeadLetterSink(env.settings)
    failures: list[BaseException | None] = []
    engine = _two_lanes(env, sink, analytics_interval_s=0.2, on_lane_failure=failures.append)
    phase = engine._phase
    broken = [True]

    async def failing_once(lane: str, targets: Any, batch: Any, *args: Any) -> None:
        if lane == "analytics" and broken[0]:
            await asyncio.sleep(0.5)  # the next batch arrives while this commit runs (a hot
            # phase on a loaded 2-core machine can take longer than 50 ms)
            broken[0] = False
            raise RuntimeError("analytics commit failed")
        await phase(lane, targets, batch, *args)

    engine._phase = failing_once  # type: ignore[method-assign, assignment]
    half = len(records) // 2
    try:
        await engine.start()
        await engine.process(records[:half])
        await engine.process(records[half:])
        with pytest.raises(RuntimeError, match="analytics commit failed"):
            await engine.flush()
        assert len(failures) == 1 and isinstance(failures[0], RuntimeError)
        await engine.flush()  # the records of the failed commit first, then the newer ones
    finally:
        await engine.close()
        await sink.close()
    assert _analytics_positions(env) == {r: (len(run), []) for r, run in _by_run(entries).items()}
