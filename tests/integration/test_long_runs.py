"""A 3,000-entry run through the real engine: rows written once, batch writes that do not grow.

The run arrives as a live one does, a few entries per batch, and every projection applies it
against the real PostgreSQL and Redis. What the engine hands PostgreSQL per batch is observed
(``Engine.write_observer``, called after each commit with the batch's run writes).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson
import psycopg
import pytest

from infra.settings import Settings
from projectors.base import fold_all
from projectors.context_manifests import ContextBudget
from projectors.registry import all_projections
from projectors.stores import postgres as pg
from projectors.stores.postgres import use_documents
from schemas.topics import ledger_topic
from streams.engine import CHECKPOINT_RATIO, Engine, SourceRecord, Target
from streams.simulate import simulate_runs
from tests.integration.engine_support import CODEC, current_states, make_env
from tests.integration.test_hostile_worker import _adversarial

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LENGTH = 3_000
BATCH = 10


class _Refuse:
    async def send(self, poison: Any) -> None:
        raise AssertionError(f"dead-lettered: {[p.message for p in poison]}")


async def test_a_long_run_writes_each_row_once_and_batches_that_do_not_grow(
    services: Settings,
) -> None:
    env = await make_env(services, fleets=("fleet-01",))
    [run] = list(simulate_runs(1, 1, 2026, entries_per_run=LENGTH))
    assert len(run) >= LENGTH
    topic = ledger_topic(env.settings.topic_prefix, "fleet-01")
    records = [
        SourceRecord(topic, 0, i, e.run_id.encode(), CODEC.encode(e)) for i, e in enumerate(run)
    ]
    projections = all_projections()
    engine = Engine(
        [Target(p, env.build) for p in projections],
        env.settings.pg_address,
        env.settings.redis_address,
        _Refuse(),
        redis_prefix=env.redis_prefix,
    )
    checkpoint_min = engine.checkpoint_min_bytes

    def batch_bytes(first: int) -> int:
        """The bytes of the entries of the batch that starts at ``first``."""
        return sum(len(r.value or b"") for r in records[first : first + BATCH])

    batches: list[tuple[int, dict[pg.BuildKey, list[pg.RunWrite]]]] = []
    at = 0
    engine.write_observer = lambda writes: batches.append((at, writes))
    await engine.start()
    try:
        for at in range(0, len(records), BATCH):
            await engine.process(records[at : at + BATCH])
    finally:
        await engine.close()

    for p in projections:
        mine = [(first, w[(p.name, env.build)]) for first, w in batches if (p.name, env.build) in w]
        history = Counter((h.kind, h.key) for _, ws in mine for w in ws for h in w.history)
        tail = Counter(seq for _, ws in mine for w in ws for seq in w.tail)
        assert not [k for k, n in history.items() if n > 1], f"{p.name}: a history row twice"
        assert not [k for k, n in tail.items() if n > 1], f"{p.name}: an entry in the tail twice"

        # A batch writes its head (bounded by configuration), its new entries (the tail) and
        # its new history rows: per entry, entries 2,300-3,000 cost what entries 1,000-1,700
        # did (a state document rewritten every batch would cost ~2x as much there, and ~4x
        # against entries 300-1,000).
        def per_entry(lo: int, hi: int, writes: list[Any] = mine) -> float:
            total = sum(
                len(w.head or b"")
                + sum(map(len, w.tail.values()))
                + sum(len(orjson.dumps(h.doc)) for h in w.history)
                for first, ws in writes
                if lo <= first < hi
                for w in ws
            )
            return total / (hi - lo)

        early, late = per_entry(1000, 1700), per_entry(LENGTH - 700, LENGTH)
        assert late <= 1.5 * early, f"{p.name}: {early:.0f} -> {late:.0f} B per entry"

        # Checkpoints (the whole state) add about 1/CHECKPOINT_RATIO of what the tails cost,
        # besides the first (the run's first batch) and the last (when it ended): one is
        # written once the tail since the previous holds CHECKPOINT_RATIO times its bytes (the
        # state may have grown meanwhile, up to its bound: the last term).
        # A state no larger than its batch's entries is written whole instead of their tail
        # (run-stats' few hundred bytes, every batch): such a checkpoint stands for a tail.
        made = [(first, len(w.state)) for first, ws in mine for w in ws if w.state is not None]
        checkpoints = [n for _, n in made]
        assert len(checkpoints) >= 2, f"{p.name}: a checkpoint at the start and at the end"
        tails = sum(sum(map(len, w.tail.values())) for _, ws in mine for w in ws)
        between = sum(n for first, n in made[1:-1] if n > batch_bytes(first))
        bound = 1.5 * tails / CHECKPOINT_RATIO + checkpoint_min + 2 * max(checkpoints)
        assert between <= bound, (p.name, between, tails, checkpoints[:12])
        # and with them, a run writes in checkpoints and tails at most what its entries hold
        # and about 1/CHECKPOINT_RATIO more (what the tail alone would write, and its share)
        accepted = sum(
            len(r.value or b"") for r, e in zip(records, run, strict=True) if p.accepts(e)
        )
        written = sum(checkpoints[1:-1]) + tails
        most = (1 + 1.5 / CHECKPOINT_RATIO) * accepted + checkpoint_min + 2 * max(checkpoints)
        assert written <= most, (p.name, written, accepted, checkpoints[:12])
        assert [w.state is not None for w in mine[-1][1]] == [True], "the ended run checkpoints"

    # The whole state readers get is the fold of the run, and so is each Redis view's head.
    for p in projections:
        state = fold_all(p, run)
        assert state is not None
        stored = current_states(env.settings.pg_address, p, env.build)[run[0].run_id]
        assert stored == (len(run), orjson.loads(p.to_json(state))), p.name


class _Drop:
    async def send(self, poison: Any) -> None:  # poison is the hostile tests' subject
        return None


async def test_cold_loads_fold_checkpoint_and_tail_to_what_a_kept_state_gives(
    services: Settings,
) -> None:
    """Every batch loading its runs cold (checkpoint, then the tail folded on), in small
    batches, gives every projection the same heads and whole states as kept states in big
    batches: over long runs, and over hostile records whose flips leave runs begun by entries
    a projection does not fold, gaps held, duplicates."""
    env = await make_env(services, fleets=("fleet-01", "fleet-02"))
    rng = random.Random(15)
    good = [e for run in simulate_runs(2, 2, 16, entries_per_run=400) for e in run]
    victims = [e for run in simulate_runs(2, 10, 17) for e in run]
    records: list[tuple[str, bytes | None, bytes | None]] = [
        (e.fleet_id, e.run_id.encode(), CODEC.encode(e)) for e in good
    ]
    for record in _adversarial(rng, victims, 1_500)[:-3]:  # not the ~1 MiB ones
        records.insert(rng.randrange(len(records) + 1), record)
    offsets: dict[str, int] = {}
    source = []
    for fleet, key, value in records:
        topic = ledger_topic(env.settings.topic_prefix, fleet)
        offsets[topic] = offsets.get(topic, -1) + 1
        source.append(SourceRecord(topic, 0, offsets[topic], key, value))
    projections = all_projections()
    for build, batch, cache in ((f"{env.build}c", 23, 0), (f"{env.build}k", 500, 256)):
        engine = Engine(
            [Target(p, build) for p in projections],
            env.settings.pg_address,
            None,
            _Drop(),
            state_cache_runs=cache,
        )
        await engine.start()
        try:
            for at in range(0, len(source), batch):
                await engine.process(source[at : at + batch])
        finally:
            await engine.close()
    with psycopg.connect(env.settings.pg_address) as conn:
        use_documents(conn)
        for p in projections:
            heads: list[dict[str, Any]] = [
                dict(
                    conn.execute(
                        "SELECT run_id, head FROM al_run_state WHERE projection = %s "
                        "AND build = %s",
                        (p.name, build),
                    ).fetchall()
                )
                for build in (f"{env.build}c", f"{env.build}k")
            ]
            assert heads[0] == heads[1], p.name
            assert len(heads[0]) >= 20, p.name
    cold = {
        p.name: current_states(env.settings.pg_address, p, f"{env.build}c") for p in projections
    }
    kept = {
        p.name: current_states(env.settings.pg_address, p, f"{env.build}k") for p in projections
    }
    assert cold == kept


ROW_BOUND = 256 * 1024
FILES = 3_000  # the run that creates its files one diff at a time


def _creating_files(files: int) -> list[Any]:
    """A run that creates ``files`` files of long paths, one diff an entry (a generator)."""
    import uuid

    from schemas.factory import EntryBuilder, diff
    from schemas.models import DiffFile, EntryKind, FileChangeStatus, FileClassification

    builder = EntryBuilder(str(uuid.UUID(int=2028, version=4)), fleet_id="fleet-01")
    builder.add(EntryKind.RUN_STARTED)
    base = diff(False)
    for i in range(files):
        made = DiffFile(
            path=f"services/generated/client_sdk/resources/v2/endpoints/module_{i:05d}.py",
            status=FileChangeStatus.ADDED,
            lines_added=12,
            lines_deleted=0,
            classification=FileClassification.SOURCE,
        )
        builder.add(EntryKind.DIFF_OBSERVATION, (base.model_copy(update={"files": (made,)}),))
    return builder.entries


async def test_no_row_of_a_10000_entry_run_grows_past_256_kib(services: Settings) -> None:
    """Issue 25: what grows with a run (the evidence index of every entry id, ...) leaves its
    checkpoint in pages, so no row of a 10,000-entry run is over 256 KiB; every batch loads
    the run cold (its checkpoint joined from its pages, then its tail), and what readers get
    is still the fold of the whole run."""
    env = await make_env(services, fleets=("fleet-01",))
    [run] = list(simulate_runs(1, 1, 2027, entries_per_run=10_000))
    assert len(run) >= 10_000
    # and runs of 300 whose context window is full (a ~450 KiB context-manifests checkpoint),
    # and one that creates 3,000 files one diff at a time (working memory listed every path
    # in each of its snapshot rows: 123 MB of rows; its checkpoints held them all)
    short = list(simulate_runs(1, 3, 25, entries_per_run=300))
    files = _creating_files(FILES)
    topic = ledger_topic(env.settings.topic_prefix, "fleet-01")
    records = [
        SourceRecord(topic, 0, i, e.run_id.encode(), CODEC.encode(e))
        for i, e in enumerate([*(e for r in short for e in r), *files, *run])
    ]
    projections = all_projections()
    # as a worker applies it (states kept between batches), then the last batches cold
    for first, last, cache in ((0, len(records) - 400, 256), (len(records) - 400, None, 0)):
        engine = Engine(
            [Target(p, env.build) for p in projections],
            env.settings.pg_address,
            None,
            _Refuse(),
            state_cache_runs=cache,
        )
        await engine.start()
        try:
            for at in range(first, last or len(records), 200):
                await engine.process(records[at : min(at + 200, last or len(records))])
        finally:
            await engine.close()
    with psycopg.connect(env.settings.pg_address) as conn:
        # a row's size: the bytes of what it holds (its documents as JSON text, payloads)
        sizes = {
            "al_run_state": "octet_length(state::text) + coalesce(octet_length(head::text), 0)",
            "al_state_pages": "octet_length(page::text)",
            "al_history": "octet_length(doc::text)",
            "al_tail": "octet_length(payload)",
        }
        # (but the files run's next turn, below: its bound is the item limit's)
        largest = {
            table: conn.execute(
                f"SELECT max({size}), count(*) FROM {table} WHERE build = %s "
                "AND NOT (projection = 'context-manifests' AND run_id = %s)",
                (env.build, files[0].run_id),
            ).fetchone()
            for table, size in sizes.items()
        }
        [[turn_items, turn_row]] = conn.execute(
            "SELECT jsonb_array_length(head->'next_turn'->'items'), "
            f"{sizes['al_run_state']} FROM al_run_state "
            "WHERE build = %s AND projection = 'context-manifests' AND run_id = %s",
            (env.build, files[0].run_id),
        ).fetchall()
        paged = conn.execute(
            "SELECT projection, pages FROM al_run_state WHERE build = %s AND pages > 0",
            (env.build,),
        ).fetchall()
        [[snapshots, snapshot_bytes]] = conn.execute(
            "SELECT count(*), sum(octet_length(doc::text)) FROM al_history "
            "WHERE build = %s AND projection = 'working-memory' AND run_id = %s",
            (env.build, files[0].run_id),
        ).fetchall()
    print(f"\nlargest rows (bytes, rows) at {len(run)} entries: {largest}; paged: {paged}")
    assert {name for name, _n in paged} >= {"working-memory", "context-manifests"}
    # (the long run, the short ones, and the files run: its memory's file lists are paged)
    assert len([name for name, _n in paged if name == "context-manifests"]) == 2 + len(short)
    for table, found in largest.items():
        assert found is not None
        assert found[0] is None or found[0] <= ROW_BOUND, (table, found)
    # Its next turn: 3,000 small items fit the token budget (an 840 KB head); the item limit
    # keeps 512 (~600 B of JSON each: a bound of its own, not the run's length)
    assert turn_items == ContextBudget().max_items and turn_row < 400_000, (turn_items, turn_row)
    # a snapshot a file, each listing at most the 100 changed last (~7.5 KB of these long
    # paths, where each listed every file created so far: ~1,500 paths, ~117 KB, on average)
    assert snapshots >= FILES and snapshot_bytes < 10_000 * snapshots, (snapshots, snapshot_bytes)
    for p in projections:
        stored = current_states(env.settings.pg_address, p, env.build)
        for r in (run, *short, files):
            state = fold_all(p, r)
            assert state is not None
            assert stored[r[0].run_id] == (len(r), orjson.loads(p.to_json(state))), p.name
