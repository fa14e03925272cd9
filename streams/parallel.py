"""Partition-parallel replay: N processes, each applying its share of the partitions.

One Python process folds on one core. A replay (``rebuild``, the bench) splits the topics'
partitions between processes instead: a run's entries all sit in one partition, and each
partition's offsets have their own rows, so the shares never touch the same rows. Each process
builds its engine from the projection names and the settings (a projection object is not sent
across), so only the shipped projections, configured by the settings, replay in parallel.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from infra.settings import Settings
from projectors.registry import all_projections, selected
from schemas.errors import AgentLedgerError
from streams.dlq import KafkaDeadLetterSink
from streams.engine import BatchStats, Engine, Poison, SourceRecord, Target, TopicPartition, tune_gc
from streams.source import Progress, balanced, drain, partition_sizes

logger = logging.getLogger(__name__)


class ParallelReplayError(AgentLedgerError):
    """A share's process failed; the others were stopped. Stored offsets make a rerun exact."""


@dataclass(frozen=True)
class Share:
    """What one process replays: its share of the partitions of ``topics`` into ``builds``."""

    settings: Settings
    builds: tuple[tuple[str, str], ...]  # (projection name, build); none: decode only
    whole_runs_only: bool
    topics: tuple[str, ...]
    index: int
    partitions: tuple[tuple[str, int], ...]  # this share's, of ``topics`` (see shares_of)
    batch_size: int
    until: Mapping[tuple[str, int], int] | None
    redis: bool  # write hot projections' views to Redis


def parallel_ok(targets: Sequence[Target], settings: Settings) -> bool:
    """Whether these targets can be rebuilt from their names (the shipped projections)."""
    shipped = {p.name: type(p) for p in all_projections(settings)}
    return all(shipped.get(t.name) is type(t.projection) for t in targets)


async def shares_of(
    settings: Settings,
    builds: tuple[tuple[str, str], ...],
    whole_runs_only: bool,
    topics: Sequence[str],
    processes: int,
    batch_size: int,
    until: Mapping[tuple[str, int], int] | None,
    redis: bool,
) -> list[Share]:
    """``processes`` shares of a replay of ``topics``: their partitions split once, here, by
    the entries each holds (:func:`streams.source.balanced`), so the processes finish together
    and no partition is in two shares or none, whatever records are appended meanwhile. The
    sizes count from each partition's start, not from a build's stored positions (a rebuild
    from an offset or a time may split less evenly); a partition added after the split is in
    no share (partitions are added by hand: `kafka-topics --alter`, then rebuild again)."""
    sizes = await partition_sizes(settings.kafka_address, topics, until)
    split = balanced(sizes, processes)
    return [
        Share(
            settings,
            builds,
            whole_runs_only,
            tuple(topics),
            index,
            tuple((tp.topic, tp.partition) for tp in mine),
            batch_size,
            dict(until) if until is not None else None,
            redis,
        )
        for index, mine in enumerate(split)
    ]


async def drain_parallel(
    shares: Sequence[Share], progress: Callable[[Progress], None] | None = None
) -> BatchStats:
    """Run every share in its own process; the sum of their figures once all are done."""
    return await asyncio.to_thread(_run_processes, shares, progress)


def _run_processes(
    shares: Sequence[Share], progress: Callable[[Progress], None] | None
) -> BatchStats:
    ctx = multiprocessing.get_context("spawn")  # no forked event loops or sockets
    messages: Any = ctx.Queue()
    processes = [ctx.Process(target=_child, args=(s, messages), daemon=True) for s in shares]
    for p in processes:
        p.start()
    seen: dict[int, Progress] = {}
    results: dict[int, BatchStats] = {}
    try:
        while len(results) < len(shares):
            try:
                kind, index, payload = messages.get(timeout=1.0)
            except queue.Empty:
                kind = None
            if kind == "progress":
                seen[index] = Progress(*payload)
                if progress is not None:
                    progress(_sum_progress(seen.values()))
            elif kind == "done":
                results[index] = BatchStats(**payload)
            elif kind == "error":
                raise ParallelReplayError(f"replay share {index} failed:\n{payload}")
            if kind is None or kind == "progress":  # a process that died says nothing more
                dead = [i for i, p in enumerate(processes) if not p.is_alive() and i not in results]
                if dead and messages.empty():
                    time.sleep(0.5)  # its last message may still be in the pipe
                    if messages.empty():
                        raise ParallelReplayError(
                            f"replay share {dead[0]} exited ({processes[dead[0]].exitcode}) "
                            "without finishing"
                        )
    finally:
        for p in processes:
            if p.is_alive() and len(results) < len(shares):
                p.terminate()
            p.join(timeout=30)
        messages.close()
    total = BatchStats()
    for stats in results.values():
        total.add(stats)
        total.records += stats.records
    return total


def _sum_progress(parts: Any) -> Progress:
    parts = list(parts)
    return Progress(
        sum(p.done for p in parts),
        sum(p.total for p in parts),
        max(p.elapsed_s for p in parts),
    )


def _child(share: Share, messages: Any) -> None:
    logging.basicConfig(level=logging.WARNING)
    try:
        stats = asyncio.run(_replay(share, messages))
    except BaseException:
        messages.put(("error", share.index, traceback.format_exc()))
        raise
    messages.put(("done", share.index, asdict(stats)))


class _DecodeOnly(Engine):
    """Consumes and decodes, applies nothing: the ceiling a replay can at best approach."""

    async def start(self, live: bool = False) -> None:
        return None

    async def positions(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(partitions, 0)

    async def process(self, records: Sequence[SourceRecord]) -> BatchStats:
        self.codec.decode_each([r.value or b"" for r in records])
        return BatchStats(records=len(records))


async def _replay(share: Share, messages: Any) -> BatchStats:
    s = share.settings
    if not share.builds:
        return await _drain(share, _DecodeOnly([], s.pg_address, None, _NoSink()), messages)
    projections = {p.name: p for p in selected(",".join(n for n, _ in share.builds), s)}
    targets = [Target(projections[n], b, share.whole_runs_only) for n, b in share.builds]
    hot = any(t.projection.hot for t in targets)
    sink = KafkaDeadLetterSink(s)
    engine = Engine(
        targets,
        s.pg_address,
        s.redis_address if share.redis and hot else None,
        sink,
        redis_prefix=s.redis_prefix,
    )
    try:
        await engine.start()
        tune_gc()  # a process of its own, replaying for long: as the worker
        return await _drain(share, engine, messages)
    finally:
        await engine.close()
        await sink.close()


async def _drain(share: Share, engine: Engine, messages: Any) -> BatchStats:
    def report(p: Progress) -> None:
        messages.put(("progress", share.index, (p.done, p.total, p.elapsed_s)))

    return await drain(
        engine,
        share.settings.kafka_address,
        list(share.topics),
        batch_size=share.batch_size,
        until=share.until,
        progress=report,
        only=share.partitions,
    )


class _NoSink:
    async def send(self, poison: Sequence[Poison]) -> None:
        raise AssertionError("a decode-only replay dead-letters nothing")
