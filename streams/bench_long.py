"""Long runs in ``agentledger bench``: what the engine spends and writes per entry as a run grows.

Runs of 30, 300, 3,000 and 10,000 entries (the simulator's ``entries_per_run``) are applied by
the real engine against the bench's PostgreSQL and Redis, one projection at a time, in batches
of ``batch`` consecutive entries of the run (as a live run arrives). Per projection and length:

- CPU per entry: the process's CPU time (folds, documents, the PostgreSQL and Redis clients)
  over the entries applied;
- bytes written per entry: what the engine hands PostgreSQL (head, checkpoints, the tail of
  entries since the last checkpoint, history rows, held entries).

Each figure stands beside its value at the shortest length measured in the same run: the
design's goal is that neither grows with the run (at most 1.25x at 3,000 and 10,000).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infra.settings import Settings
from projectors.base import Projection
from projectors.registry import all_projections
from projectors.stores import postgres as pg
from schemas.codec import LedgerCodec
from schemas.models import LedgerEntry
from schemas.topics import ledger_topic
from streams.engine import Engine, Poison, SourceRecord, Target, tune_gc
from streams.simulate import simulate_runs

LENGTHS = (30, 300, 3_000, 10_000)
# Enough runs at each length for about this many entries (at least one run).
ENTRIES_PER_LENGTH = 3_000


@dataclass(frozen=True)
class Cost:
    projection: str
    length: int  # entries per run, as asked of the simulator
    entries: int  # entries applied
    cpu_us_per_entry: float
    bytes_per_entry: float
    checkpoints: int


class _NoDeadLetters:
    """The simulator writes no poison; one would be a bench bug, so it fails loudly."""

    async def send(self, poison: Sequence[Poison]) -> None:
        raise RuntimeError(f"the long-run bench dead-lettered {len(poison)} entries")


def write_bytes(writes: dict[pg.BuildKey, list[pg.RunWrite]]) -> tuple[int, int]:
    """Bytes handed to PostgreSQL by one batch's run writes, and how many were checkpoints."""
    total = checkpoints = 0
    for runs in writes.values():
        for w in runs:
            total += len(w.state or b"") + len(w.head or b"")
            total += sum(map(len, w.tail.values())) + sum(map(len, w.hold.values()))
            total += sum(len(h.json) for h in w.history)
            checkpoints += w.state is not None
    return total, checkpoints


def runs_of(length: int, seed: int, entries: int = ENTRIES_PER_LENGTH) -> list[list[LedgerEntry]]:
    count = max(1, entries // length)
    return list(simulate_runs(1, count, seed, entries_per_run=length))


async def measure(
    settings: Settings,
    projection: Projection[Any],
    length: int,
    runs: list[list[LedgerEntry]],
    batch: int,
    build: str | None = None,
) -> Cost:
    """One projection applying ``runs`` into a build of its own (``build``, default
    ``long<length>``: a build that already holds them would find them applied)."""
    codec = LedgerCodec()
    build = build or f"long{length}"
    engine = Engine(
        [Target(projection, build)],
        settings.pg_address,
        settings.redis_address,
        _NoDeadLetters(),
        redis_prefix=f"{settings.redis_prefix}long",
    )
    written: list[dict[pg.BuildKey, list[pg.RunWrite]]] = []
    engine.write_observer = written.append  # sizes counted after the clock stops
    await engine.start()
    offset = 0
    cpu = 0.0
    entries = 0
    try:
        for run in runs:
            topic = ledger_topic(settings.topic_prefix, run[0].fleet_id)
            records = []
            for e in run:
                records.append(
                    SourceRecord(topic, 0, offset, e.run_id.encode(), codec.encode(e), (), None)
                )
                offset += 1
            for start in range(0, len(records), batch):
                chunk = records[start : start + batch]
                t0 = time.process_time()
                await engine.process(chunk)
                cpu += time.process_time() - t0
            entries += len(run)
    finally:
        await engine.close()
    sizes = [write_bytes(w) for w in written]
    return Cost(
        projection.name,
        length,
        entries,
        cpu / entries * 1e6,
        sum(b for b, _ in sizes) / entries,
        sum(c for _, c in sizes),
    )


async def long_runs(
    settings: Settings,
    lengths: Sequence[int] = LENGTHS,
    batch: int = 10,
    seed: int = 15,
    entries_per_length: int = ENTRIES_PER_LENGTH,
    rounds: int = 1,
) -> list[Cost]:
    """Every projection at every length (see the module's doc), under the worker's collector
    settings (``tune_gc``: at the interpreter's default a young collection ran every 700
    allocations, and a long run's larger states made each one longer). With ``rounds`` > 1
    every length is measured again in each round, each into a new build, and each figure is
    the round with the least CPU: on a shared machine whose speed drifts over minutes, the
    lengths measured one after the other were measured at different speeds (a 30-entry
    figure 1.5x another of the same code within one run)."""
    tune_gc()
    made = {length: runs_of(length, seed, entries_per_length) for length in lengths}
    best: dict[tuple[str, int], Cost] = {}
    for round_ in range(rounds):
        for length in lengths:
            for projection in all_projections():
                build = f"long{length}r{round_}"
                cost = await measure(settings, projection, length, made[length], batch, build)
                key = (projection.name, length)
                if key not in best or cost.cpu_us_per_entry < best[key].cpu_us_per_entry:
                    best[key] = cost
    return [best[(p.name, length)] for length in lengths for p in all_projections()]


def figures(costs: Sequence[Cost]) -> list[tuple[str, float, str, str, float]]:
    """(name, value, unit, baseline name, baseline) per projection, length and measure; the
    baseline is the projection's figure at the shortest length."""
    shortest = min(c.length for c in costs)
    base = {c.projection: c for c in costs if c.length == shortest}
    out = []
    for c in costs:
        b = base[c.projection]
        out.append(
            (
                f"long runs: {c.projection} CPU per entry, {c.length}-entry runs",
                c.cpu_us_per_entry,
                "us",
                f"the same at {shortest}-entry runs",
                b.cpu_us_per_entry,
            )
        )
        out.append(
            (
                f"long runs: {c.projection} bytes written per entry, {c.length}-entry runs",
                c.bytes_per_entry,
                "B",
                f"the same at {shortest}-entry runs",
                b.bytes_per_entry,
            )
        )
    return out
