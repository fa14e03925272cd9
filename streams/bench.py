"""``agentledger bench``: figures measured beside their baselines in the same run.

Runs against the configured services, in a private database (``<db>_bench``), topic prefix and
Redis prefix, with its own background worker, so it never touches live projections.

- hot path: publish -> the run's Redis views reflect the entry, p50/p99, while a steady background
  load is published; beside it the floors measured in the same run: the publisher's Kafka ack
  latency and a Redis round trip.
- MCP (issue 30): under the same load, an agent's read-your-writes through ``agentledger mcp``
  (publish entry N, then ``get_working_memory`` with ``min_seq=N``) beside the hot path, and a
  plain MCP read beside the Redis view read itself, of the same run at the same moment.
- replay: entries/s the engine applies reading the topics directly, beside the ceiling of
  consuming and decoding only.
- redaction: the publisher's secret scan (``redact_entry``) per realistic entry, beside the
  codec's encode of the same entries, timed in the same process (issue 27).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import platform
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer

from infra.clients import redis_client
from infra.settings import Settings
from projectors.registry import all_projections, projection
from projectors.stores import postgres_ops as ops
from projectors.stores.redis import RedisViewStore, view_key
from schemas.codec import LedgerCodec
from schemas.models import LedgerEntry
from schemas.secret_scan import SecretDetector, default_detector
from schemas.topics import ledger_topic
from streams import bench_engine, bench_import, bench_long
from streams.builds import live_targets
from streams.deployment import PrivateDeployment
from streams.parallel import drain_parallel, shares_of
from streams.publisher import AsyncPublisher, Encoded
from streams.redaction import redact_entry
from streams.simulate import simulate_runs
from streams.source import Progress, topic_partitions

FLEETS = ["fleet-01", "fleet-02"]


@dataclass
class _Mix:
    """The run-length profile every figure's traffic is drawn from (``simulate``'s)."""

    value: str = "real"


MIX = _Mix()  # set by run_bench for the whole run


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    baseline_name: str = ""
    baseline: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        assert self.baseline is not None
        return self.value / self.baseline


@dataclass
class BenchReport:
    figures: list[Figure] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> str:
        figures = [asdict(f) | {"ratio": f.ratio} for f in self.figures]
        return json.dumps(
            {"figures": figures, "settings": self.settings, "machine": self.machine}, indent=2
        )


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine_info() -> dict[str, Any]:
    import aiokafka
    import faust

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "faust": faust.__version__,
        "aiokafka": aiokafka.__version__,
    }


async def _redis_rtt(url: str, samples: int) -> list[float]:
    client = aioredis.Redis.from_url(url)
    try:
        out = []
        for _ in range(samples):
            t0 = time.perf_counter()
            await client.ping()
            out.append(time.perf_counter() - t0)
        return out
    finally:
        await client.aclose()


class Crossed(Protocol):
    @property
    def run_id(self) -> str: ...


class Guard(Protocol):
    """A budget guard following the live changes (``consumers.examples.budget_guard``, handed in
    by the composition root: the write side does not import the read side)."""

    def crossings(self, stop: asyncio.Event | None = None) -> AsyncIterator[Crossed]: ...


GuardFactory = Callable[[Settings], Guard]


class McpRead(Protocol):
    @property
    def reached(self) -> bool: ...  # the answer says min_seq was reached
    @property
    def waited_ms(self) -> float: ...  # how long the server waited for it
    @property
    def served_ms(self) -> float: ...  # the server's handler, call to answer (wait included)


class McpReader(Protocol):
    """An MCP client reading a run's working memory through ``agentledger mcp``
    (``consumers.mcp_bench``, handed in by the composition root)."""

    async def working_memory(self, run_id: str, min_seq: int | None) -> McpRead: ...


McpReaderFactory = Callable[[Settings], AbstractAsyncContextManager[McpReader]]
MCP_PAUSE_S = 0.05  # between the plain reads (~15 a second with the Redis read beside each)
MCP_RYW_EVERY_S = 0.2  # an agent's read-your-writes after a publish, at most this often
MCP_RYW_IN_FLIGHT = 8  # at most this many waiting at once (the worker's lag may be seconds)
MCP_RYW = "MCP read-your-writes p99 (publish entry N -> get_working_memory(min_seq=N) answers)"
MCP_READ = "MCP get_working_memory p99 (no min_seq), under the load"


@dataclass
class _McpSamples:
    ryw: list[float] = field(default_factory=list)  # publish of N -> the answer at >= N
    own: list[float] = field(default_factory=list)  # that call less the server's wait for N
    server: list[float] = field(default_factory=list)  # of it, in the server's handler
    outside: list[float] = field(default_factory=list)  # of it, outside (stdio, SDKs, client)
    reached: int = 0
    asked: int = 0
    plain: list[float] = field(default_factory=list)  # a read without min_seq
    redis: list[float] = field(default_factory=list)  # the Redis view read, same run and moment

    def clear(self) -> None:
        for values in (self.ryw, self.own, self.server, self.outside, self.plain, self.redis):
            values.clear()
        self.reached = self.asked = 0


async def _mcp_reads(
    reader: McpReader,
    store: RedisViewStore,
    latest: list[tuple[str, int, float]],
    projected: list[str],
    fresh: asyncio.Event,
    stop: asyncio.Event,
    samples: _McpSamples,
) -> None:
    """Agents that have just published: right after a batch (at most every
    :data:`MCP_RYW_EVERY_S`), one takes the batch's last entry N and reads the run's working
    memory with ``min_seq=N``, timed from N's publish as the hot path is; beside them, one
    reads the memory of a run already projected (``projected``: the warm-up's, then the last
    one read so) without ``min_seq``, then its Redis view itself."""

    async def read_your_write(run_id: str, seq: int, published_at: float) -> None:
        asked = time.perf_counter()
        samples.asked += 1
        try:
            read = await reader.working_memory(run_id, seq)
        except RuntimeError:  # a new run the worker had not reached in the read's timeout_s
            return  # ("no run X"): asked, not reached, no latency (it has none to give)
        done = time.perf_counter()
        samples.ryw.append(done - published_at)
        samples.own.append(done - asked - read.waited_ms / 1000)
        samples.server.append((read.served_ms - read.waited_ms) / 1000)
        samples.outside.append(done - asked - read.served_ms / 1000)
        samples.reached += read.reached
        if read.reached:
            projected[:] = [run_id]

    async def plain() -> None:
        while not stop.is_set():
            if projected:  # (a run the worker has reached: the newest may be unknown yet)
                run_id = projected[0]
                asked = time.perf_counter()
                await reader.working_memory(run_id, None)
                samples.plain.append(time.perf_counter() - asked)
                asked = time.perf_counter()
                await store.read_live("working-memory", run_id)
                samples.redis.append(time.perf_counter() - asked)
            await asyncio.sleep(MCP_PAUSE_S)

    waiting: set[asyncio.Task[None]] = set()
    plain_reads = asyncio.create_task(plain())
    try:
        while not stop.is_set():
            fresh.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fresh.wait(), 1)
            if stop.is_set() or not latest or len(waiting) >= MCP_RYW_IN_FLIGHT:
                continue
            task = asyncio.create_task(read_your_write(*latest[0]))
            waiting.add(task)
            task.add_done_callback(waiting.discard)
            await asyncio.sleep(MCP_RYW_EVERY_S)
        await plain_reads
        await asyncio.gather(*waiting)
    finally:
        plain_reads.cancel()
        for task in waiting:
            task.cancel()


def _mcp_figures(m: _McpSamples, hot: list[float]) -> list[Figure]:
    ms = 1000.0
    return [
        Figure(
            MCP_RYW, _pct(m.ryw, 0.99) * ms, "ms", "hot path p99, same load", _pct(hot, 0.99) * ms
        ),
        Figure(
            "MCP read-your-writes p50",
            _pct(m.ryw, 0.5) * ms,
            "ms",
            "hot path p50, same load",
            _pct(hot, 0.5) * ms,
        ),
        Figure(
            "MCP read-your-writes: answers that reached min_seq",
            float(m.reached),
            "reads",
            "reads asked",
            float(m.asked),
        ),
        Figure(  # what MCP itself adds: the call's time less the server's wait for the worker
            "MCP read-your-writes p99, MCP's own part (the call less its wait for min_seq)",
            _pct(m.own, 0.99) * ms,
            "ms",
            "Redis view read p99",
            _pct(m.redis, 0.99) * ms,
        ),
        Figure(  # where that own part goes: the server's handler, or around it
            "MCP read-your-writes p99, MCP's own part in the server (its handler less the wait)",
            _pct(m.server, 0.99) * ms,
            "ms",
            "p50",
            _pct(m.server, 0.5) * ms,
        ),
        Figure(
            "MCP read-your-writes p99, MCP's own part outside the server's handler (stdio, "
            "the SDK both sides, the client's event loop)",
            _pct(m.outside, 0.99) * ms,
            "ms",
            "p50",
            _pct(m.outside, 0.5) * ms,
        ),
        Figure(
            MCP_READ,
            _pct(m.plain, 0.99) * ms,
            "ms",
            "Redis view read p99 (read_live)",
            _pct(m.redis, 0.99) * ms,
        ),
        Figure(
            "MCP get_working_memory p50 (no min_seq), under the load",
            _pct(m.plain, 0.5) * ms,
            "ms",
            "Redis view read p50 (read_live)",
            _pct(m.redis, 0.5) * ms,
        ),
    ]


async def hot_path(
    d: PrivateDeployment,
    rate: float,
    seconds: float,
    guard_factory: GuardFactory | None,
    warmup: float = 3.0,
    reader: McpReader | None = None,
) -> list[Figure]:
    """Publish at ``rate`` entries/s; after ``warmup`` seconds of that load, time publish ->
    every hot view reflects each entry for ``seconds`` (and, with ``guard_factory``, the budget
    guard; with ``reader``, an agent reading its own writes through MCP)."""
    s = d.settings
    # The runs drawn, generated before the clock (with the entry at which each crosses its
    # budget, folded as the worker will), so generating them costs nothing while measuring.
    # Only the runs the load will send: the two warm-ups, then runs until the entries staged
    # below are reached (drawing a fixed count of real-length runs made ~13 times the entries
    # sent, and took ~8 s of this machine's CPU for every 5 s of load).
    staged_wanted = int(rate * (warmup + seconds)) + 10
    drawn: list[list[LedgerEntry]] = []
    loaded = 0  # the entries of the runs after the warm-ups
    for run in simulate_runs(len(FLEETS), 100_000, seed=int(time.time()), length_profile=MIX.value):
        drawn.append(run)
        loaded += len(run) if len(drawn) > 2 else 0
        if loaded >= staged_wanted:
            break
    crossing_at = budget_crossings(drawn, s)
    runs = iter(drawn)
    latencies: list[float] = []
    acks: list[float] = []
    published: dict[tuple[str, int], float] = {}
    guard_latencies: list[float] = []
    views = _ViewWatch(s, lambda run_id, latency: latencies.append(latency))
    pending = views.pending
    watcher = asyncio.create_task(views.run())
    guard_stop = asyncio.Event()
    guard = asyncio.create_task(
        _guard_watch(guard_factory(s), crossing_at, published, guard_latencies, guard_stop)
        if guard_factory is not None
        else guard_stop.wait()
    )
    mcp = _McpSamples()
    latest: list[tuple[str, int, float]] = []  # the last entry published while measuring
    projected: list[str] = []  # a run the worker has applied (the warm-up's, to begin with)
    fresh, mcp_stop = asyncio.Event(), asyncio.Event()
    store = RedisViewStore.connect(s.redis_address, s.redis_prefix)
    agent = asyncio.create_task(
        _mcp_reads(reader, store, latest, projected, fresh, mcp_stop, mcp)
        if reader is not None
        else mcp_stop.wait()
    )
    try:
        async with AsyncPublisher(s) as publisher:
            # Warm-up: one run through the pipeline before the clock starts.
            for warm in (next(runs), next(runs)):
                await publisher.publish_batch(warm)
                pending[warm[0].run_id] = [(len(warm), time.perf_counter())]
            deadline = time.perf_counter() + 60
            while pending and time.perf_counter() < deadline:
                await asyncio.sleep(0.01)
            projected[:] = [warm[0].run_id]
            interval = 10 / rate  # ten entries per tick
            # Each fleet's agents validate, redact and encode on their own machines (as in
            # ingest): staged before the clock, so the publisher's CPU on this machine is what
            # sending costs. Staged inside the loop, it took a third of a core from the worker
            # and the load reached 700-890 of the 1,000 entries/s asked (docs/measured.md).
            staged: list[tuple[LedgerEntry, Encoded]] = []
            for run in runs:
                if len(staged) >= staged_wanted:
                    break
                staged.extend((e, publisher.stage(e).encoded()) for e in run)
            ticks = iter(staged[i : i + 10] for i in range(0, len(staged), 10))
            started = time.perf_counter()
            tick = 0
            measuring = False
            while time.perf_counter() - started < warmup + seconds:
                if not measuring and time.perf_counter() - started >= warmup:
                    measuring = True  # steady state: the load has run for the warm-up
                    latencies.clear()
                    acks.clear()
                    guard_latencies.clear()
                    mcp.clear()
                pairs = next(ticks, None)
                if pairs is None:
                    break  # (the runs drawn are used up)
                batch = [e for e, _ in pairs]
                t0 = time.perf_counter()
                await publisher.send([x for _, x in pairs])
                acks.append(time.perf_counter() - t0)
                for e in batch:
                    pending.setdefault(e.run_id, []).append((e.sequence_no, t0))
                    if crossing_at.get(e.run_id) == e.sequence_no:
                        published[(e.run_id, e.sequence_no)] = t0
                if measuring:
                    latest[:] = [(batch[-1].run_id, batch[-1].sequence_no, t0)]
                    fresh.set()
                tick += 1
                delay = started + tick * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
        mcp_stop.set()
        fresh.set()
        await asyncio.wait_for(agent, 60)  # (a read begun under the load is finished and kept)
        views.stop.set()
        await asyncio.wait_for(watcher, 60)
        if guard_factory is not None:
            await asyncio.sleep(3)  # the last crossings reach the guard
    finally:
        mcp_stop.set()
        agent.cancel()
        views.stop.set()
        watcher.cancel()
        guard_stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(guard, 30)
        await views.client.aclose()
        await store.close()
    rtt = await _redis_rtt(s.redis_address, 1000)
    ms = 1000.0
    guarded = guard_factory is not None
    return [
        *(_mcp_figures(mcp, latencies) if reader is not None else []),
        *(_guard_figures(guard_latencies, latencies) if guarded else []),
        Figure(
            "hot path p50 (publish -> Redis views)",
            _pct(latencies, 0.5) * ms,
            "ms",
            "publisher ack p50",
            _pct(acks, 0.5) * ms,
        ),
        Figure(
            "hot path p99 (publish -> Redis views)",
            _pct(latencies, 0.99) * ms,
            "ms",
            "publisher ack p99",
            _pct(acks, 0.99) * ms,
        ),
        Figure("Redis round trip p99", _pct(rtt, 0.99) * ms, "ms"),
        Figure("hot path entries measured", float(len(latencies)), "entries"),
        Figure(  # (a loaded machine's publisher may not reach the rate asked for)
            "hot path: rate published while measured",
            len(latencies) / seconds,
            "entries/s",
            "rate asked for",
            rate,
        ),
    ]


def _guard_figures(guard_latencies: list[float], latencies: list[float]) -> list[Figure]:
    ms = 1000.0
    return [
        Figure(
            "budget guard p99 (crossing entry published -> guard reports it)",
            _pct(guard_latencies, 0.99) * ms if guard_latencies else float("nan"),
            "ms",
            "hot path p99 (publish -> Redis views)",
            _pct(latencies, 0.99) * ms,
        ),
        Figure(
            "budget guard p50",
            _pct(guard_latencies, 0.5) * ms if guard_latencies else float("nan"),
            "ms",
            "hot path p50",
            _pct(latencies, 0.5) * ms,
        ),
        Figure("budget crossings measured", float(len(guard_latencies)), "runs"),
    ]


def budget_crossings(runs: list[list[LedgerEntry]], settings: Settings) -> dict[str, int]:
    """run_id -> the sequence number of the entry after which the run is over its budget
    (cost-metrics folded as the worker folds it), for the runs that cross."""
    costs = projection("cost-metrics", settings)
    found: dict[str, int] = {}
    for run in runs:
        state = None
        for entry in run:
            if state is None:
                state = costs.initial(entry)
            if costs.accepts(entry):
                state = costs.fold(state, entry)
            if costs.finish(state).over_budget:
                found[entry.run_id] = entry.sequence_no
                break
    return found


async def _guard_watch(
    guard: Guard,
    crossing_at: dict[str, int],
    published: dict[tuple[str, int], float],
    latencies: list[float],
    stop: asyncio.Event,
) -> None:
    """The budget guard (consumers/examples) following live changes: each crossing it reports,
    timed from the publish of the entry that crossed (its ``applied_seq`` covers that entry)."""
    async for crossing in guard.crossings(stop):
        at = published.get((crossing.run_id, crossing_at.get(crossing.run_id, -1)))
        if at is not None:
            latencies.append(time.perf_counter() - at)


class _ViewWatch:
    """Polls the hot views of the runs in ``pending`` (run_id -> [(seq, published at)]) and
    reports each entry's publish -> every hot view reflects it, once, to ``record``."""

    def __init__(self, s: Settings, record: Callable[[str, float], None]) -> None:
        self.settings = s
        self.record = record
        self.pending: dict[str, list[tuple[int, float]]] = {}
        self.stop = asyncio.Event()
        self.client = redis_client(s)
        self.hot = [p.name for p in all_projections() if p.hot]

    async def run(self) -> None:
        s, hot, pending = self.settings, self.hot, self.pending
        builds = {t.name: t.build for t in live_targets(s.pg_address) if t.name in hot}
        while not self.stop.is_set() or pending:
            run_ids = list(pending)
            if run_ids:
                pipe = self.client.pipeline(transaction=False)
                for run_id in run_ids:
                    for p in hot:
                        pipe.hget(view_key(s.redis_prefix, p, builds[p], run_id), "seq")
                seqs = await pipe.execute()
                now = time.perf_counter()
                for i, run_id in enumerate(run_ids):
                    row = seqs[i * len(hot) : (i + 1) * len(hot)]
                    seen = min(int(x) if x is not None else 0 for x in row)
                    waiting = pending[run_id]
                    for seq, t in waiting:
                        if seq <= seen:
                            self.record(run_id, now - t)
                    rest = [(seq, t) for seq, t in waiting if seq > seen]
                    if rest:
                        pending[run_id] = rest
                    else:
                        del pending[run_id]
            await asyncio.sleep(0.002)


async def long_run_in_flight(
    d: PrivateDeployment, long_entries: int, long_rate: float, rate: float, worker_pid: int
) -> list[Figure]:
    """One run of ``long_entries`` entries published at ``long_rate`` entries/s while other
    runs (the mix) arrive at ``rate`` entries/s: publish -> hot views for the long run's
    entries beside the other traffic's, and the worker's RSS over the long run's life."""
    s = d.settings
    [long_run] = list(simulate_runs(1, 1, seed=5, entries_per_run=long_entries))
    long_id = long_run[0].run_id
    others = simulate_runs(len(FLEETS), 100_000, seed=int(time.time()), length_profile=MIX.value)
    mine: list[float] = []
    theirs: list[float] = []
    views = _ViewWatch(
        s, lambda run_id, latency: (mine if run_id == long_id else theirs).append(latency)
    )
    sampler = _ProcessSampler([worker_pid])
    watcher = asyncio.create_task(views.run())
    try:
        async with AsyncPublisher(s) as publisher:
            started = time.perf_counter()
            buffer: list[LedgerEntry] = []
            tick = 0
            interval = 0.01  # per tick: the long run's share and the others' share
            long_at = 0
            other_debt = 0.0
            long_debt = 0.0
            while long_at < len(long_run):
                long_debt += long_rate * interval
                other_debt += rate * interval
                batch: list[LedgerEntry] = []
                while long_debt >= 1 and long_at < len(long_run):
                    batch.append(long_run[long_at])
                    long_at += 1
                    long_debt -= 1
                while other_debt >= 1:
                    if not buffer:
                        buffer.extend(next(others))
                    batch.append(buffer.pop(0))
                    other_debt -= 1
                if batch:
                    t0 = time.perf_counter()
                    await publisher.publish_batch(batch)
                    for e in batch:
                        views.pending.setdefault(e.run_id, []).append((e.sequence_no, t0))
                tick += 1
                if tick % 50 == 0:
                    sampler.sample()
                delay = started + tick * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
        views.stop.set()
        while not watcher.done():
            sampler.sample()
            await asyncio.sleep(0.5)
        await watcher
    finally:
        views.stop.set()
        watcher.cancel()
        await views.client.aclose()
    rss = sampler.rss_mb or [float("nan")]
    third = max(1, len(rss) // 3)
    ms = 1000.0
    label = f"{long_entries:,}-entry run in flight"
    return [
        Figure(
            f"{label}: hot path p99 for its views",
            _pct(mine, 0.99) * ms,
            "ms",
            f"other runs' entries, {rate:,.0f}/s, same window",
            _pct(theirs, 0.99) * ms,
        ),
        Figure(
            f"{label}: hot path p50 for its views",
            _pct(mine, 0.5) * ms,
            "ms",
            "other runs' entries",
            _pct(theirs, 0.5) * ms,
        ),
        Figure(f"{label}: worker RSS peak", max(rss), "MB"),
        Figure(
            f"{label}: worker RSS, last third",
            sum(rss[-third:]) / third,
            "MB",
            "first third",
            sum(rss[:third]) / third,
        ),
        Figure(
            f"{label}: entries of the run measured",
            float(len(mine)),
            "entries",
            "entries in the run",
            float(len(long_run)),
        ),
    ]


async def _publish_raw(d: PrivateDeployment, entries_wanted: int, seed: int = 99) -> int:
    from aiokafka import AIOKafkaProducer

    codec = LedgerCodec()
    producer = AIOKafkaProducer(
        bootstrap_servers=d.settings.kafka_address,
        acks="all",
        linger_ms=20,
        max_batch_size=1024 * 1024,
        compression_type="zstd",
    )
    await producer.start()
    sent = 0
    try:
        runs = simulate_runs(
            len(FLEETS), 10_000_000, seed=seed, length_profile=MIX.value, begin=_begin()
        )
        for run in runs:
            for e in run:
                topic = ledger_topic(d.settings.topic_prefix, e.fleet_id)
                await producer.send(topic, codec.encode(e), key=e.run_id.encode())
                sent += 1
            if sent >= entries_wanted:
                break
        await producer.flush()
    finally:
        await producer.stop()
    return sent


class _ProcessSampler:
    """RSS (the largest process's) and CPU time (summed) of processes and their children, from
    /proc, sampled while a figure is measured. ``agentledger worker`` is a supervisor whose
    child, the faust process, does the work (and may be started again): each pid counts with
    the children it has at each sample, and the CPU of children that ended with its own."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.rss_mb: list[float] = []
        self.cpu_start = self.cpu_s(absolute=True)

    @staticmethod
    def _family(pid: int) -> list[int]:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            children = []
        return [pid, *children]

    def sample(self) -> None:
        sizes = [
            size
            for pid in self.pids
            for member in self._family(pid)
            if (size := self._rss_mb(member)) is not None
        ]
        if sizes:
            self.rss_mb.append(max(sizes))

    def cpu_s(self, absolute: bool = False) -> float:
        total = 0.0
        for pid in self.pids:
            total += self._cpu_s(pid, reaped=True)  # with its children that ended
            total += sum(self._cpu_s(child) for child in self._family(pid)[1:])
        return total if absolute else total - self.cpu_start

    @staticmethod
    def _rss_mb(pid: int) -> float | None:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    @staticmethod
    def _cpu_s(pid: int, reaped: bool = False) -> float:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])
            if reaped:  # cutime + cstime: children waited for
                ticks += int(fields[13]) + int(fields[14])
            return ticks / os.sysconf("SC_CLK_TCK")
        except OSError:
            return 0.0


def _applied_everywhere(dsn: str) -> int:
    """Entries every live projection has applied (the least advanced one's count)."""
    with ops.connect(dsn) as conn:
        totals = ops.live_applied_totals(conn)
    if len(totals) < len(all_projections()):
        return 0
    return min(totals.values())


def _db_bytes(dsn: str) -> int:
    with ops.connect(dsn) as conn:
        return ops.database_bytes(conn)


async def ingest(d: PrivateDeployment, entries: int, publishers: int, workers: int) -> list[Figure]:
    """N publishers (simulated fleets' agents) at full speed; ``workers`` worker processes (one
    consumer group) apply all projections.

    The rate is entries over the time from the first publish until every projection committed
    the last entry; beside it the same entries consumed and decoded only by as many processes
    (the ceiling).
    """
    procs = [d.start_worker(f"ingest-{i}") for i in range(workers)]
    for i in range(workers):
        await asyncio.to_thread(d.wait_partitions, f"ingest-{i}")
    sampler = _ProcessSampler([p.pid for p in procs])
    bytes_before = _db_bytes(d.settings.pg_address)
    published = 0

    async def publish(publisher: AsyncPublisher, staged: list[Encoded]) -> None:
        nonlocal published
        for start in range(0, len(staged), 500):
            batch = staged[start : start + 500]
            await publisher.send(batch)
            published += len(batch)

    async with contextlib.AsyncExitStack() as stack:
        pubs = [
            await stack.enter_async_context(AsyncPublisher(d.settings)) for _ in range(publishers)
        ]
        # Each fleet's agents validate, redact and encode on their own machines: staged before
        # the clock starts, so the publishers' CPU here is what sending costs, not what
        # simulating and encoding a fleet's work costs.
        staged: list[list[Encoded]] = [[] for _ in pubs]
        for i, run in enumerate(_take_runs(entries, seed=7)):  # runs dealt to the publishers
            mine = staged[i % publishers]
            mine.extend(pubs[i % publishers].stage(entry).encoded() for entry in run)
        total = sum(len(mine) for mine in staged)
        started = time.perf_counter()
        tasks = [
            asyncio.create_task(publish(pub, mine)) for pub, mine in zip(pubs, staged, strict=True)
        ]
        published_at, max_lag = await _await_applied(
            d, tasks, total, sampler, started, lambda: published
        )
    elapsed = time.perf_counter() - started
    cpu = sampler.cpu_s()
    db_growth = _db_bytes(d.settings.pg_address) - bytes_before
    for p in procs:
        d.stop_worker(p)
    ceiling = await _decode_only(d, workers)
    rss = sampler.rss_mb or [float("nan")]
    third = max(1, len(rss) // 3)
    return [
        Figure(
            "ingest: publish -> all projections committed",
            total / elapsed,
            "entries/s",
            f"ceiling: consume + decode only, {workers} processes",
            ceiling,
        ),
        Figure(
            "ingest: publishers alone",
            total / ((published_at or time.perf_counter()) - started),
            "entries/s",
        ),
        Figure(
            "ingest: entries",
            float(total),
            "entries",
            f"{publishers} publishers, {workers} workers",
        ),
        Figure("ingest: max lag (published - applied)", float(max_lag), "entries"),
        Figure("worker RSS peak (largest worker)", max(rss), "MB"),
        Figure(
            "worker RSS, last third of the run",
            sum(rss[-third:]) / third,
            "MB",
            "middle third",
            sum(rss[third:-third] or rss) / len(rss[third:-third] or rss),
        ),
        Figure("worker RSS, first third of the run", sum(rss[:third]) / third, "MB"),
        Figure("worker CPU per 1k entries (all workers)", cpu / total * 1000 * 1000, "ms"),
        Figure("PostgreSQL bytes per million entries", db_growth / total * 1e6 / 2**20, "MiB"),
    ]


async def import_figures(d: PrivateDeployment, files: int) -> list[Figure]:
    """``agentledger import`` of a directory of ``files`` trajectories (into an empty fleet)
    beside ``agentledger publish`` of the same entries as JSONL (into another), one process."""
    with tempfile.TemporaryDirectory(prefix="agentledger-bench-import-") as folder:
        m = await bench_import.measure(d.settings, Path(folder), FLEETS[0], FLEETS[1], files)
    return [
        Figure(
            IMPORT_FIGURE,
            m.import_rate,
            "entries/s",
            "publish of the same entries as JSONL",
            m.publish_rate,
        ),
        Figure("import: entries", float(m.entries), "entries", f"{m.files} files"),
        Figure(
            "import again (nothing new): seconds",
            m.again_s,
            "s",
            "entries it published (must be 0)",
            float(m.again_published),
        ),
    ]


IMPORT_FIGURE = "import: a directory of mini-swe-agent trajectories"


async def one_worker(d: PrivateDeployment, entries: int) -> list[Figure]:
    """One worker process (``agentledger worker``, all six projections) applying a backlog of
    realistic entries: entries/s from its first partition assignment until every projection
    committed the last entry, beside one process consuming and decoding the same topics."""
    total = await _publish_raw(d, entries, seed=31)
    worker = d.start_worker("one")
    await asyncio.to_thread(d.wait_partitions, "one", 120)
    started = time.perf_counter()
    while await asyncio.to_thread(_applied_everywhere, d.settings.pg_address) < total:
        await asyncio.sleep(0.25)
        if time.perf_counter() - started > 3600:
            raise RuntimeError("one worker did not apply the backlog in an hour")
    rate = total / (time.perf_counter() - started)
    d.stop_worker(worker)
    ceiling = await _decode_only(d, 1)
    return [
        Figure(
            "one worker: a backlog applied (all six projections)",
            rate,
            "entries/s",
            "ceiling: consume + decode only, 1 process",
            ceiling,
        ),
        Figure("one worker: entries of the backlog", float(total), "entries"),
    ]


async def _await_applied(
    d: PrivateDeployment,
    tasks: list[asyncio.Task[None]],
    total: int,
    sampler: _ProcessSampler,
    started: float,
    published: Callable[[], int],
) -> tuple[float | None, int]:
    """Poll until every projection committed ``total`` entries: when publishing ended, max lag."""
    published_at = None
    max_lag = 0
    while True:
        await asyncio.sleep(0.5)
        done = await asyncio.to_thread(_applied_everywhere, d.settings.pg_address)
        sampler.sample()
        max_lag = max(max_lag, published() - done)
        if published_at is None and all(t.done() for t in tasks):
            published_at = time.perf_counter()
            await asyncio.gather(*tasks)
        if done >= total:
            return published_at, max_lag
        if time.perf_counter() - started > 3600:
            raise RuntimeError(f"ingest did not finish: {done}/{total} applied")


def _begin() -> datetime:
    """Where a long bench stream's simulated clock starts: far enough back that its last run
    (at 17 simulated minutes per run) is not ahead of today."""
    return datetime.now(UTC) - timedelta(days=400)


def _take_runs(entries: int, seed: int) -> Iterator[list[LedgerEntry]]:
    count = 0
    runs = simulate_runs(len(FLEETS), 10_000_000, seed, length_profile=MIX.value, begin=_begin())
    for run in runs:
        if count >= entries:
            return
        count += len(run)
        yield run


async def naive(d: PrivateDeployment, entries: int) -> list[Figure]:
    """The naive faust agent (one transaction per entry) over its own topics."""
    from streams import naive as naive_app

    await _publish_raw(d, entries)
    total = sum(len(r) for r in _take_runs(entries, seed=99))
    naive_app.create_schema(d.settings.pg_address)
    process = d.start_process("naive", ["-m", "streams.naive"])
    try:
        started = None
        deadline = time.perf_counter() + 1800
        while time.perf_counter() < deadline:
            await asyncio.sleep(0.25)
            done = naive_app.applied(d.settings.pg_address)
            if started is None and done > 0:
                started, first = time.perf_counter(), done
            if done >= total:
                break
        else:
            raise RuntimeError("the naive baseline did not finish")
        assert started is not None
        rate = (done - first) / (time.perf_counter() - started)
    finally:
        d.stop_worker(process)
    return [Figure("naive faust agent (1 entry per transaction)", rate, "entries/s")]


async def rebuild(d: PrivateDeployment, entries: int, processes: int) -> list[Figure]:
    """Every projection rebuilt at once from offset 0, the partitions split between
    ``processes`` processes, reading the topics directly."""
    have = await _topic_entries(d)
    if have < entries:
        await _publish_raw(d, entries - have, seed=11)
    ceiling = await _decode_only(d, processes)
    rate, replayed = await _replay(
        d, tuple((p.name, "bench-rebuild") for p in all_projections()), processes
    )
    return [
        Figure(
            "rebuild: every projection from offset 0",
            rate,
            "entries/s",
            f"ceiling: consume + decode only, {processes} processes",
            ceiling,
        ),
        Figure("rebuild: entries replayed", float(replayed), "entries", f"{processes} processes"),
    ]


async def _replay(
    d: PrivateDeployment, builds: tuple[tuple[str, str], ...], processes: int
) -> tuple[float, int]:
    """Replay the bench topics from their start into ``builds`` (none: decode only) in
    ``processes`` processes: entries/s (from the processes' own clocks, so starting them is
    not counted) and entries replayed."""
    topics = tuple(ledger_topic(d.settings.topic_prefix, f) for f in FLEETS)
    shares = await shares_of(d.settings, builds, False, topics, processes, 5000, None, False)
    last: list[Progress] = []
    stats = await drain_parallel(shares, last.append)
    return (last[-1].rate if last else float("nan")), stats.records


async def _decode_only(d: PrivateDeployment, processes: int) -> float:
    """The ceiling: the bench topics consumed and decoded only, by ``processes`` processes."""
    return (await _replay(d, (), processes))[0]


async def _topic_entries(d: PrivateDeployment) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=d.settings.kafka_address)
    await consumer.start()
    try:
        parts = await topic_partitions(
            consumer, [ledger_topic(d.settings.topic_prefix, f) for f in FLEETS]
        )
        return sum((await consumer.end_offsets(parts)).values()) if parts else 0
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class Sizes:
    hot_rate: float
    hot_seconds: float
    ingest_entries: int
    publishers: int
    naive_entries: int
    rebuild_entries: int
    rebuild_processes: int
    ingest_workers: int
    long_lengths: tuple[int, ...] = (30, 300)
    long_entries: int = 300  # per length (at least one run)
    in_flight_entries: int = 1_000  # the long run in flight beside other traffic
    in_flight_rate: float = 100.0  # its entries/s
    engine_runs: int = 40  # runs of 300 entries for the engine-vs-decode figure
    one_worker_entries: int = 100_000  # the backlog one worker applies
    import_files: int = 500  # mini-swe-agent trajectories imported (beside publish as JSONL)
    redact_runs: int = 40  # simulated runs whose entries are redacted and encoded, timed
    long_rounds: int = 1  # rounds of every length, the least CPU of each kept (bench_long)


CORES = os.cpu_count() or 1
QUICK = Sizes(
    1000.0,
    5.0,
    5_000,
    4,
    300,
    10_000,
    min(2, CORES),
    min(2, CORES),
    in_flight_entries=500,
    engine_runs=8,
    one_worker_entries=3_000,
    import_files=20,
    redact_runs=8,
)
# Ingest at 300k entries (the publishers stage every entry before the clock starts, ~1 ms of
# their CPU each); rebuild at 1M (topped up with raw entries after the ingest).
FULL = Sizes(
    1000.0,
    30.0,
    300_000,
    4,
    3_000,
    1_000_000,
    CORES,
    CORES,
    bench_long.LENGTHS,
    3_000,
    10_000,
    long_rounds=3,
)


REDACT_FIGURE = "publisher: redact_entry per realistic entry"


def redaction_figures(runs: int, seed: int = 27, rounds: int = 3) -> list[Figure]:
    """``redact_entry`` µs per entry of simulated runs of realistic length (the mix's), beside
    the codec's encode of the same entries: the two steps the publisher takes for every entry.
    Timed in alternating rounds over the same entries; the median round of each is reported."""
    simulated = simulate_runs(len(FLEETS), runs, seed, length_profile=MIX.value, begin=_begin())
    entries = [e for run in itertools.islice(simulated, runs) for e in run]
    codec = LedgerCodec()
    redact_entry(entries[0])  # the rules compiled, the schema parsed: not in the figures
    codec.encode(entries[0])
    redact_s: list[float] = []
    encode_s: list[float] = []
    changed = 0
    rules = default_detector()
    for _ in range(rounds):
        # a detector of its own each round: what it keeps of short texts (ids that come back in
        # entry after entry) is kept within a round, as a publisher would, never between them
        detector = SecretDetector(rules.rules, rules.allowlists)
        started = time.perf_counter()
        redacted = [redact_entry(e, detector) for e in entries]
        redact_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        for e in redacted:
            codec.encode(e)
        encode_s.append(time.perf_counter() - started)
        changed = sum(r is not e for r, e in zip(redacted, entries, strict=True))
    n = len(entries)
    redact_us = sorted(redact_s)[rounds // 2] / n * 1e6
    encode_us = sorted(encode_s)[rounds // 2] / n * 1e6
    return [
        Figure(REDACT_FIGURE, redact_us, "µs", "codec encode, same entries", encode_us),
        Figure("publisher: entries timed for redaction", n, "entries", f"{runs} runs", runs),
        Figure("publisher: entries the redaction changed", changed, "entries"),
    ]


async def mcp_phase(
    settings: Settings, sizes: Sizes, mcp_reader: McpReaderFactory, seconds: float | None = None
) -> list[Figure]:
    """The MCP phase (``bench``, and ``bench --mcp`` alone): the hot path's load in a
    deployment of its own with an agent reading through ``agentledger mcp``, its figures
    beside the hot path and the Redis view read of the same run; the load average before and
    after it among them."""
    d = PrivateDeployment(
        settings,
        "benchmcp",
        FLEETS,
        settings.state_dir / "bench",
        {"AGENTLEDGER_WORKER_BATCH_SIZE": "2000"},
    )
    await d.create()
    try:
        d.start_worker("worker")
        await asyncio.to_thread(d.wait_partitions, "worker")
        before = os.getloadavg()[0]
        async with mcp_reader(d.settings) as reader:
            found = await hot_path(
                d, sizes.hot_rate, seconds or sizes.hot_seconds, None, reader=reader
            )
        after = os.getloadavg()[0]
    finally:
        d.drop()
    return [
        *(
            f if f.name.startswith("MCP") else replace(f, name=f"MCP phase: {f.name}")
            for f in found
        ),
        Figure("MCP phase: load average (1 min) after it", after, "", "before it", before),
    ]


async def run_bench(
    settings: Settings,
    quick: bool,
    guard_factory: GuardFactory,
    mix: str = "real",
    entries: int | None = None,
    sizes: Sizes | None = None,
    mcp_reader: McpReaderFactory | None = None,
) -> BenchReport:
    """Every figure; traffic drawn from ``mix`` (a simulate length profile: ``real`` by
    default, ``short`` for the ~30-entry story); ``entries`` replaces the ingest and rebuild
    sizes; ``sizes`` replaces the quick or full sizes altogether (the suite's smaller run);
    with ``mcp_reader``, the hot path's load again with an agent reading through MCP."""
    if sizes is None:
        sizes = QUICK if quick else FULL
    if entries is not None:
        sizes = replace(sizes, ingest_entries=entries, rebuild_entries=entries)
    MIX.value = mix
    report = BenchReport(
        machine=machine_info(),
        settings={
            "quick": quick,
            "mix": mix,
            **asdict(sizes),
            "projections": [p.name for p in all_projections()],
        },
    )

    async def deployment(kind: str) -> PrivateDeployment:
        d = PrivateDeployment(
            settings,
            kind,
            FLEETS,
            settings.state_dir / "bench",
            {"AGENTLEDGER_WORKER_BATCH_SIZE": "2000"},
        )
        await d.create()
        return d

    d = await deployment("benchengine")
    try:  # first: nothing else of the bench runs beside it
        cost = await bench_engine.measure(d.settings, runs=sizes.engine_runs)
        report.figures += [Figure(*f) for f in bench_engine.figures(cost)]
    finally:
        d.drop()
    # the publisher's redaction beside its encode: in this process, nothing else running
    report.figures += await asyncio.to_thread(redaction_figures, sizes.redact_runs)
    d = await deployment("benchimport")
    try:
        report.figures += await import_figures(d, sizes.import_files)
    finally:
        d.drop()
    d = await deployment("benchone")
    try:
        report.figures += await one_worker(d, sizes.one_worker_entries)
    finally:
        d.drop()
    d = await deployment("benchhot")
    try:
        d.start_worker("worker")
        await asyncio.to_thread(d.wait_partitions, "worker")
        report.figures += await hot_path(d, sizes.hot_rate, sizes.hot_seconds, guard_factory)
    finally:
        d.drop()
    if mcp_reader is not None:  # a phase of its own: the hot path's figures above stay as they were
        report.figures += await mcp_phase(settings, sizes, mcp_reader)
    d = await deployment("benchinflight")
    try:
        worker = d.start_worker("worker")
        await asyncio.to_thread(d.wait_partitions, "worker")
        report.figures += await long_run_in_flight(
            d, sizes.in_flight_entries, sizes.in_flight_rate, sizes.hot_rate, worker.pid
        )
    finally:
        d.drop()
    d = await deployment("benchnaive")
    try:
        naive_figures = await naive(d, sizes.naive_entries)
    finally:
        d.drop()
    d = await deployment("benchingest")
    try:
        ingest_figures = await ingest(
            d, sizes.ingest_entries, sizes.publishers, sizes.ingest_workers
        )
        first = ingest_figures[0]
        report.figures += ingest_figures[:1]
        report.figures.append(
            Figure(
                "ingest vs the naive baseline",
                first.value,
                "entries/s",
                naive_figures[0].name,
                naive_figures[0].value,
            )
        )
        report.figures += ingest_figures[1:]
        report.figures += await rebuild(d, sizes.rebuild_entries, sizes.rebuild_processes)
    finally:
        d.drop()
    d = await deployment("benchlong")
    try:
        costs = await bench_long.long_runs(
            d.settings,
            sizes.long_lengths,
            entries_per_length=sizes.long_entries,
            rounds=sizes.long_rounds,
        )
        report.figures += [Figure(*f) for f in bench_long.figures(costs)]
    finally:
        d.drop()
    return report
