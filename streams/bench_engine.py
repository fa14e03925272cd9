"""Engine cost per entry in ``agentledger bench``, beside the validated decode of the same entries.

Issue 25's figure: the real :class:`Engine` with all six projections, PostgreSQL and Redis,
applies realistic runs (the simulator, 300 entries a run) interleaved 8 at a time, in batches of
200 records, as a live worker receives them. Measured in the same run on the same entries:

- decode: :meth:`LedgerCodec.decode_each` of every record (Avro to a validated entry), each
  batch's timed just before the engine takes that batch (so both are measured at the same
  moments of the machine's speed);
- engine: the process's CPU time over ``Engine.process`` of every batch (decode included: the
  engine decodes what it applies), per entry;
- folds: the same entries through the six pure folds alone (no stores), per entry, by projection.

The ratio engine / decode is the figure; the folds show how much of it is projection logic and
how much is around it (documents, checkpoints, PostgreSQL and Redis clients).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.settings import Settings
from projectors.base import Projection
from projectors.registry import all_projections
from schemas.codec import LedgerCodec
from schemas.models import LedgerEntry
from schemas.topics import ledger_topic
from streams.bench_long import _NoDeadLetters
from streams.engine import Engine, SourceRecord, Target, tune_gc
from streams.simulate import simulate_runs

RUNS = 40
LENGTH = 300
INTERLEAVE = 8
BATCH = 200
# the batches a worker folds when it keeps up with a live fleet (the hot path's are 20 to 170
# records at 1,000 entries/s): the engine's cost per entry grows as they shrink
SMALL_BATCHES = (20, 50)
PARTITIONS = 8


@dataclass(frozen=True)
class EngineCost:
    entries: int
    decode_us: float  # per entry
    engine_us: float  # per entry, all six projections, stores included
    fold_us: dict[str, float]  # per entry, by projection, no stores
    # per entry, all six projections, stores included, at the SMALL_BATCHES (batch -> µs)
    small_batch_us: dict[int, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.engine_us / self.decode_us


def interleaved(runs: Sequence[list[LedgerEntry]], at_once: int) -> list[LedgerEntry]:
    """Runs ``at_once`` at a time, their entries round-robin (as concurrent agents publish)."""
    out: list[LedgerEntry] = []
    for start in range(0, len(runs), at_once):
        group = [list(r) for r in runs[start : start + at_once]]
        index = 0
        while any(index < len(r) for r in group):
            out += [r[index] for r in group if index < len(r)]
            index += 1
    return out


def records_of(settings: Settings, entries: Sequence[LedgerEntry]) -> list[SourceRecord]:
    """The entries as Kafka records: keyed by run, each run on one of PARTITIONS partitions."""
    from infra.topics import partition_for

    codec = LedgerCodec()
    offsets: dict[tuple[str, int], int] = {}
    out = []
    for e in entries:
        topic = ledger_topic(settings.topic_prefix, e.fleet_id)
        key = e.run_id.encode()
        partition = partition_for(key, PARTITIONS)
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        out.append(SourceRecord(topic, partition, offset, key, codec.encode(e), (), None))
    return out


def _cpu() -> float:
    return time.process_time()


def fold_costs(entries: Sequence[LedgerEntry], batch: int = BATCH) -> dict[str, float]:
    """CPU µs per entry of each projection's pure fold (and finish once per run per batch)."""
    out = {}
    for projection in all_projections():
        out[projection.name] = _fold_cost(projection, entries, batch)
    return out


def _fold_cost(projection: Projection[Any], entries: Sequence[LedgerEntry], batch: int) -> float:
    states: dict[str, Any] = {}
    t0 = _cpu()
    for start in range(0, len(entries), batch):
        touched = set()
        for e in entries[start : start + batch]:
            state = states.get(e.run_id)
            if state is None:
                state = projection.initial(e)
            if projection.accepts(e):
                state = projection.fold(state, e)
            states[e.run_id] = state
            touched.add(e.run_id)
        for run_id in touched:
            states[run_id] = projection.finish(states[run_id])
            projection.head_json(states[run_id])
    return (_cpu() - t0) / len(entries) * 1e6


async def engine_cost(
    settings: Settings,
    records: Sequence[SourceRecord],
    batch: int,
    build: str = "enginecost",
    decode_beside: list[float] | None = None,
) -> float:
    """CPU µs per entry of the real engine, all projections, PostgreSQL and Redis (into builds
    named ``build``: each measurement its own, so none finds the records applied). With
    ``decode_beside``, each batch's validated decode is timed just before the engine takes the
    batch and its CPU seconds appended: a baseline measured at the same moments, so the ratio
    does not move with the machine's speed (a decode timed apart, best of three, swung 57 to 97 µs
    an entry between runs while the interleaved ratio stayed at 5.00 to 5.05x)."""
    targets = [Target(p, build) for p in all_projections()]
    engine = Engine(
        targets,
        settings.pg_address,
        settings.redis_address,
        _NoDeadLetters(),
        redis_prefix=settings.redis_prefix,
    )
    await engine.start()
    tune_gc()  # as the worker runs
    codec = LedgerCodec()
    cpu = 0.0
    try:
        for start in range(0, len(records), batch):
            chunk = records[start : start + batch]
            if decode_beside is not None:
                t0 = _cpu()
                codec.decode_each([r.value or b"" for r in chunk])
                decode_beside.append(_cpu() - t0)
            t0 = _cpu()
            await engine.process(chunk)
            cpu += _cpu() - t0
    finally:
        await engine.close()
    return cpu / len(records) * 1e6


def realistic_entries(runs: int = RUNS, length: int = LENGTH, seed: int = 25) -> list[LedgerEntry]:
    return interleaved(list(simulate_runs(1, runs, seed, entries_per_run=length)), INTERLEAVE)


async def measure(settings: Settings, runs: int = RUNS, batch: int = BATCH) -> EngineCost:
    tune_gc()  # decode, folds and engine measured under the worker's collector settings
    entries = realistic_entries(runs)
    records = records_of(settings, entries)
    folds = fold_costs(entries, batch)
    beside: list[float] = []
    engine = await engine_cost(settings, records, batch, decode_beside=beside)
    decode = sum(beside) / len(records) * 1e6
    small = {b: await engine_cost(settings, records, b, f"enginecost{b}") for b in SMALL_BATCHES}
    return EngineCost(len(records), decode, engine, folds, small)


def figures(cost: EngineCost) -> list[tuple[str, float, str, str, float]]:
    """(name, value, unit, baseline name, baseline value) rows for the bench report."""
    rows = [
        (
            "engine CPU per realistic entry (6 projections, PostgreSQL + Redis, batches of 200)",
            round(cost.engine_us, 1),
            "µs",
            "validated decode of the same entries",
            round(cost.decode_us, 1),
        ),
        (
            "engine CPU / validated decode (goal: at most 5x)",
            round(cost.ratio, 2),
            "x",
            "goal",
            5.0,
        ),
        (
            "pure folds per entry, all six projections (no stores)",
            round(sum(cost.fold_us.values()), 1),
            "µs",
            "validated decode of the same entries",
            round(cost.decode_us, 1),
        ),
    ]
    for name, us in cost.fold_us.items():
        rows.append(
            (f"pure fold per entry: {name}", round(us, 1), "µs", "validated decode", cost.decode_us)
        )
    for batch, us in cost.small_batch_us.items():
        rows.append(
            (
                f"engine CPU per realistic entry in batches of {batch} (a worker keeping up)",
                round(us, 1),
                "µs",
                f"the same in batches of {BATCH}",
                round(cost.engine_us, 1),
            )
        )
    return rows
