"""The engine on the in-memory store contract: no Kafka, PostgreSQL or Redis.

The same engine code that the integration tests run on real services; here each rule of the
batch (exactly once, held gaps, poison, retries, checkpoints and tails, lost views, a moved live
pointer) is checked in milliseconds. The store contract test class (tests/contract) holds the
in-memory store to PostgreSQL's behaviour.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg
import pytest

from projectors.base import Projection, fold_all, refold
from projectors.registry import all_projections
from projectors.run_stats import RunStatsProjection
from projectors.stores.memory import MemoryStore, MemoryViewStore
from schemas.codec import LedgerCodec
from schemas.factory import EntryBuilder
from schemas.models import EntryKind, LedgerEntry
from schemas.topics import ledger_topic
from streams.engine import Engine, Poison, SourceRecord, Target
from streams.simulate import simulate

CODEC = LedgerCodec()
BUILD = "b1"


class ListSink:
    def __init__(self) -> None:
        self.sent: list[Poison] = []

    async def send(self, poison: Sequence[Poison]) -> None:
        self.sent.extend(poison)


class Topic:
    """A one-partition topic per fleet, offsets counted as Kafka would."""

    def __init__(self) -> None:
        self.next: dict[str, int] = {}

    def records(self, items: Sequence[LedgerEntry | tuple[str, bytes]]) -> list[SourceRecord]:
        out = []
        for item in items:
            if isinstance(item, LedgerEntry):
                fleet, key, value = item.fleet_id, item.run_id.encode(), CODEC.encode(item)
            else:
                fleet, value = item
                key = b"k"
            topic = ledger_topic("t", fleet)
            offset = self.next.get(topic, 0)
            self.next[topic] = offset + 1
            out.append(SourceRecord(topic, 0, offset, key, value))
        return out


def _engine(
    store: MemoryStore,
    views: MemoryViewStore | None = None,
    projections: Sequence[Projection[Any]] | None = None,
    **options: Any,
) -> tuple[Engine, ListSink]:
    sink = ListSink()
    targets = [Target(p, BUILD) for p in (projections or [RunStatsProjection()])]
    return Engine(targets, store, views, sink, max_backoff_s=0.01, **options), sink


async def _reads_are_the_fold(
    store: MemoryStore, projections: Sequence[Projection[Any]], entries: list[LedgerEntry]
) -> None:
    """What a reader gets of the (one) run, per projection, is the pure fold of its entries."""
    run_id = entries[0].run_id
    for projection in projections:
        state = fold_all(projection, entries)
        assert state is not None
        assert orjson.loads(await _whole(store, projection, run_id)) == orjson.loads(
            projection.to_json(state)
        ), projection.name


async def _whole(store: MemoryStore, projection: Projection[Any], run_id: str) -> bytes:
    """A run's whole current state as a reader gets it: its checkpoint, its tail folded on."""
    async with store.transaction() as tx:
        row = (await tx.load_states({(projection.name, BUILD): [run_id]}))[
            (projection.name, BUILD)
        ][run_id]
    state = projection.from_doc(row.state) if row.state else None
    tail = [CODEC.decode(p) for _, p in sorted(row.tail_payloads.items())]
    state = refold(projection, state, tail)
    return projection.to_json(state) if state is not None else b""


def _runs(entries: list[LedgerEntry]) -> dict[str, list[LedgerEntry]]:
    runs: dict[str, list[LedgerEntry]] = {}
    for e in entries:
        runs.setdefault(e.run_id, []).append(e)
    return runs


async def test_every_projection_equals_its_pure_fold_in_any_batching() -> None:
    entries = simulate(2, 6, seed=3)
    projections = all_projections()
    store = MemoryStore()
    engine, sink = _engine(store, projections=projections)
    await engine.start(live=True)
    records = Topic().records(entries)
    rng = random.Random(7)
    at = 0
    while at < len(records):  # batches of random sizes, as the consumer hands them over
        size = rng.randint(1, 40)
        await engine.process(records[at : at + size])
        at += size
    await engine.close()
    assert sink.sent == []
    for run_id, run in _runs(entries).items():
        for projection in projections:
            expected = fold_all(projection, run)
            assert expected is not None
            got = await _whole(store, projection, run_id)
            assert orjson.loads(got) == orjson.loads(projection.to_json(expected)), (
                projection.name,
                run_id,
            )


async def test_redelivery_changes_nothing_and_positions_hold() -> None:
    entries = simulate(1, 3, seed=5)
    store = MemoryStore()
    engine, _ = _engine(store)
    await engine.start(live=True)
    records = Topic().records(entries)
    first = await engine.process(records)
    before = {r: await _whole(store, RunStatsProjection(), r) for r in _runs(entries)}
    again = await engine.process(records)
    assert first.applied == len(entries) and again.applied == 0
    assert again.redelivered == len(entries)
    assert {r: await _whole(store, RunStatsProjection(), r) for r in before} == before
    tp = records[0].tp
    assert await engine.positions([tp]) == {tp: len(records)}


async def test_duplicates_once_and_gaps_held_then_released() -> None:
    b = EntryBuilder("run-gappy")
    run = [b.add(EntryKind.USER_TASK) for _ in range(6)]
    store, views = MemoryStore(), MemoryViewStore()
    engine, _ = _engine(store, views)
    await engine.start(live=True)
    topic = Topic()
    stats = await engine.process(topic.records([run[0], run[1], run[1], run[4], run[5]]))
    assert (stats.applied, stats.duplicates, stats.held) == (2, 1, 2)
    view = await views.read("run-stats", BUILD, "run-gappy")
    assert view is not None and view[0] == 2 and view[1]["gaps"] == [[3, 4]]
    stats = await engine.process(topic.records([run[3], run[2]]))
    assert stats.applied == 4
    state = orjson.loads(await _whole(store, RunStatsProjection(), "run-gappy"))
    assert state["entries"] == 6
    view = await views.read("run-stats", BUILD, "run-gappy")
    assert view is not None and view[0] == 6 and view[1]["gaps"] == []


async def test_poison_is_dead_lettered_with_its_bytes_and_the_rest_applied() -> None:
    entries = simulate(1, 2, seed=9)
    store = MemoryStore()
    engine, sink = _engine(store)
    await engine.start(live=True)
    garbage = b"\x00garbage\xff"
    mixed: list[LedgerEntry | tuple[str, bytes]] = [entries[0], ("fleet-01", garbage)]
    mixed += entries[1:]
    stats = await engine.process(Topic().records(mixed))
    assert stats.applied == len(entries) and stats.dead_lettered == 1
    assert [p.record.value for p in sink.sent] == [garbage]
    assert sink.sent[0].error_class and sink.sent[0].message


async def test_a_failed_commit_is_retried_and_applied_once() -> None:
    entries = simulate(1, 2, seed=11)
    store = MemoryStore()
    engine, _ = _engine(store)
    await engine.start(live=True)
    store.fail_next = psycopg.OperationalError("connection lost")
    stats = await engine.process(Topic().records(entries))
    assert stats.applied == len(entries)
    for run_id, run in _runs(entries).items():
        assert orjson.loads(await _whole(store, RunStatsProjection(), run_id))["entries"] == len(
            run
        )


async def test_a_long_run_checkpoints_and_a_cold_engine_continues_it_exactly() -> None:
    """Tails and checkpoints: a new engine (no cached states) folds the checkpoint and its tail
    and ends where one that kept the state all along ends."""
    entries = simulate(1, 1, seed=13, entries_per_run=400)
    projections = all_projections()
    records = Topic().records(entries)
    kept_store, cold_store = MemoryStore(), MemoryStore()
    kept, _ = _engine(kept_store, projections=projections, checkpoint_min_bytes=4096)
    await kept.start(live=True)
    for at in range(0, len(records), 10):
        await kept.process(records[at : at + 10])
    for at in range(0, len(records), 10):  # a new engine every batch: always cold
        cold, _ = _engine(
            cold_store, projections=projections, checkpoint_min_bytes=4096, state_cache_runs=0
        )
        await cold.process(records[at : at + 10])
    run_id = entries[0].run_id
    for projection in projections:
        assert await _whole(cold_store, projection, run_id) == await _whole(
            kept_store, projection, run_id
        ), projection.name
    assert len(await cold_store.tail("working-memory", BUILD, run_id)) < len(entries)


async def test_a_state_smaller_than_a_batch_is_written_whole_not_as_a_tail() -> None:
    """A batch writes the smaller of the two: run-stats' state (a few hundred bytes) whole each
    batch rather than the batch's entries in its tail (its bytes per entry were 2x at long runs
    what they were at 30 entries); a large state (working memory's) keeps its tail."""
    entries = simulate(1, 1, seed=13, entries_per_run=400)
    records = Topic().records(entries)
    projections = all_projections()
    store = MemoryStore()
    engine, _ = _engine(store, projections=projections)  # (checkpoints from 64 KiB of tail)
    written: list[dict[Any, list[Any]]] = []
    engine.write_observer = written.append
    await engine.start(live=True)
    for at in range(0, len(records), 10):
        await engine.process(records[at : at + 10])
    by_projection: dict[str, list[Any]] = {}
    for batch in written:
        for (name, _build), writes in batch.items():
            by_projection.setdefault(name, []).extend(writes)
    stats, memory = by_projection["run-stats"], by_projection["working-memory"]
    assert len(stats) >= 40
    assert all(w.state is not None and not w.tail for w in stats), "run-stats: whole each batch"
    for w in stats[1:]:
        assert len(w.state) <= 10 * 1024  # (each batch's entries: well over that)
    assert sum(bool(w.tail) for w in memory) > len(memory) // 2, "working memory: its tail"
    await _reads_are_the_fold(store, projections, entries)  # and what a reader gets


async def test_a_state_that_outgrew_a_batch_is_not_serialized_again_each_batch() -> None:
    """Writing a state whole instead of its tail is tried when the last checkpoint was no larger
    than the batch's entries; a state that has since grown past them is serialized, found
    larger and dropped, and not tried again until a batch adds as much (diff-timelines'
    states were serialized 18 times for 3 checkpoints written; in the bench, 441 for 125)."""
    entries = simulate(1, 1, seed=13, entries_per_run=400)
    records = Topic().records(entries)
    projections = all_projections()
    serialized: dict[str, int] = {}
    for projection in projections:
        made = projection.checkpoint_pages

        def counted(state: Any, made: Any = made, name: str = projection.name) -> Any:
            serialized[name] = serialized.get(name, 0) + 1
            return made(state)

        projection.checkpoint_pages = counted  # type: ignore[method-assign]
    store = MemoryStore()
    engine, _ = _engine(store, projections=projections)
    written: dict[str, int] = {}

    def observe(batch: dict[Any, list[Any]]) -> None:
        for (name, _build), writes in batch.items():
            written[name] = written.get(name, 0) + sum(w.state is not None for w in writes)

    engine.write_observer = observe
    await engine.start(live=True)
    for at in range(0, len(records), 10):
        await engine.process(records[at : at + 10])
    for projection in projections:
        name = projection.name
        assert written[name] >= 2, name
        assert serialized[name] <= 2 * written[name], (name, serialized[name], written[name])
    await _reads_are_the_fold(store, projections, entries)  # still the same fold


async def test_views_lost_are_refilled_and_never_move_back() -> None:
    entries = simulate(1, 2, seed=17)
    store, views = MemoryStore(), MemoryViewStore()
    engine, _ = _engine(store, views)
    await engine.start(live=True)
    topic = Topic()
    records = topic.records(entries)
    await engine.process(records[:-1])
    views.flush()  # Redis restarted without persistence
    await engine.process(records[-1:])
    for run_id, run in _runs(entries).items():
        found = await views.read_live("run-stats", run_id)
        assert found is not None and found[0] == len(run)
    assert await engine.check_views() == 0  # nothing lost since


async def test_the_live_worker_follows_a_swapped_build() -> None:
    entries = simulate(1, 2, seed=19)
    store = MemoryStore()
    engine, _ = _engine(store, follow_live=True)
    await engine.start(live=True)
    records = Topic().records(entries)
    await engine.process(records[:5])
    await store.ensure_build("run-stats", "b2", RunStatsProjection().version, live=False)
    await store.set_live("run-stats", "b2")
    await engine.process(records[5:])
    assert engine.targets[0].build == "b2"
    positions = await store.read_positions("run-stats", "b2", [records[0].topic])
    assert positions == {records[0].tp: records[-1].offset}


@pytest.mark.parametrize("seed", [1, 2])
async def test_a_fold_failure_dead_letters_the_entry_and_the_run_goes_on(seed: int) -> None:
    class Fragile(RunStatsProjection):
        def fold(self, state: Any, entry: LedgerEntry) -> Any:
            if entry.sequence_no == 2:
                raise ValueError("this projection cannot take entry 2")
            return super().fold(state, entry)

    entries = simulate(1, 1, seed=seed)
    store = MemoryStore()
    engine, sink = _engine(store, projections=[Fragile()])
    await engine.start(live=True)
    stats = await engine.process(Topic().records(entries))
    assert stats.applied == len(entries)
    assert [p.error_class for p in sink.sent] == ["ProjectionFoldError"]
    state = orjson.loads(await _whole(store, Fragile(), entries[0].run_id))
    assert state["entries"] == len(entries) - 1


async def test_a_conflicting_duplicate_is_dead_lettered_naming_both_and_counted() -> None:
    """Sequence 2 sent again as another entry: a dead letter of its own class naming both
    entry ids, and a count on the run; the same entry sent again is a plain duplicate."""
    b = EntryBuilder("run-c")
    run = [b.add(EntryKind.USER_TASK) for _ in range(4)]
    impostor = run[1].model_copy(update={"entry_id": "run-c-impostor"})
    later = run[2].model_copy(update={"entry_id": "run-c-late-impostor"})
    store = MemoryStore()
    engine, sink = _engine(store)
    await engine.start(live=True)
    topic = Topic()
    # in one batch: 1, 2, the impostor of 2 (known from this batch), 2 again (the same entry)
    await engine.process(topic.records([run[0], run[1], impostor, run[1], run[3]]))
    # later batches: the impostor of 3 while 3 is held? 3 is missing: 4 is held, 3 arrives
    await engine.process(topic.records([run[2]]))
    await engine.process(topic.records([later, run[0]]))  # known from the stored entry ids
    letters = [p for p in sink.sent if p.error_class == "ConflictingDuplicateError"]
    assert len(letters) == 2 and len(sink.sent) == 2
    assert "run-c-impostor" in letters[0].message and "run-c-e2" in letters[0].message
    assert "run-c-late-impostor" in letters[1].message and "run-c-e3" in letters[1].message
    async with store.transaction() as tx:
        row = (await tx.load_states({("run-stats", BUILD): ["run-c"]}))[("run-stats", BUILD)]
    assert row["run-c"].conflicts == 2 and row["run-c"].applied_seq == 4
    state = orjson.loads(await _whole(store, RunStatsProjection(), "run-c"))
    assert state["entries"] == 4  # nothing counted twice


async def test_a_conflict_with_a_held_entry_is_found_too() -> None:
    b = EntryBuilder("run-h")
    run = [b.add(EntryKind.USER_TASK) for _ in range(3)]
    impostor = run[2].model_copy(update={"entry_id": "run-h-impostor"})
    store = MemoryStore()
    engine, sink = _engine(store)
    await engine.start(live=True)
    topic = Topic()
    await engine.process(topic.records([run[0], run[2]]))  # 3 held behind the gap at 2
    await engine.process(topic.records([impostor, run[1]]))
    assert [p.error_class for p in sink.sent] == ["ConflictingDuplicateError"]
    assert "run-h-e3" in sink.sent[0].message


async def test_a_run_id_seen_on_another_fleets_topic_is_dead_lettered_saying_so() -> None:
    """The same run published under a second fleet (an import into two fleets): its entries
    there are dead-lettered naming both topics, not dropped as duplicates in silence."""
    run = simulate(1, 1, seed=13)
    other = [e.model_copy(update={"fleet_id": "fleet-other"}) for e in run]
    store = MemoryStore()
    engine, sink = _engine(store)
    await engine.start(live=True)
    topic = Topic()
    await engine.process(topic.records(run))
    stats = await engine.process(topic.records(other))
    assert stats.dead_lettered == len(other) and stats.applied == 0
    first, second = ledger_topic("t", run[0].fleet_id), ledger_topic("t", "fleet-other")
    assert {p.message for p in sink.sent} == {
        f"the run's entries come from topic {first}, this one from {second}: a run id belongs "
        "to one fleet (publish another fleet's runs under their own ids)"
    }
