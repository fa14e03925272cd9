"""The projection engine: a batch of raw records in, projections and offsets committed together.

Per batch, in one PostgreSQL transaction: lock the batch's offset rows (per projection build),
skip records at or below them, decode the rest once, dead-letter the poison ones, fold each run's
new entries in sequence order (duplicates once, gaps held durably), write the touched runs and the
new offsets. After the commit, hot projections' Redis views are CAS-written. Retriable failures
(PostgreSQL, Redis, the dead-letter producer) back off and retry the batch; the stored offsets
make the retry exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

from infra.errors import is_retriable
from projectors.base import HistoryRow, Projection, projection_inputs, refold
from projectors.ordering import missing_ranges, plan_run
from projectors.stores import contract as pg
from projectors.stores.contract import RunView, Store, StoreTransaction, ViewStore
from projectors.stores.postgres import PostgresStore
from projectors.stores.redis import RedisViewStore
from projectors.working_memory import SHARED_FOLDS
from schemas.codec import LedgerCodec
from schemas.errors import LedgerDecodeError
from schemas.models import LedgerEntry
from schemas.topics import ledger_topic
from streams.contract import RecordContractError, check_record
from streams.telemetry import Telemetry

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
T = TypeVar("T")

# See Engine.checkpoint_tail_entries.
CHECKPOINT_RATIO = 4
# At most this many runs' outgrown sizes kept (Engine._outgrown).
OUTGROWN_KEPT = 65_536

# An entry further than this ahead of its run's applied position is dead-lettered, not held:
# a run holds at most this many entries behind a gap (each batch of the run loads them all).
MAX_AHEAD = 10_000


@dataclass(frozen=True)
class SourceRecord:
    """One Kafka record as the engine sees it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None  # the record's Kafka timestamp
    # (topic, partition), made once: the engine asks for it of every record for every target
    tp: TopicPartition = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tp", (self.topic, self.partition))

    @property
    def key_tp(self) -> tuple[TopicPartition, int]:
        """Where the record sits: its partition and offset."""
        return (self.tp, self.offset)


@dataclass(frozen=True)
class Target:
    """A projection and the build it writes."""

    projection: Projection[Any]
    build: str
    # A build started mid-topic (rebuild --from-offset/--from-time) skips the runs whose first
    # entry came before its start, instead of holding them forever behind a gap.
    whole_runs_only: bool = False

    @property
    def name(self) -> str:
        return self.projection.name


@dataclass(frozen=True)
class Poison:
    record: SourceRecord
    error_class: str
    message: str


class DeadLetterSink(Protocol):
    async def send(self, poison: Sequence[Poison]) -> None:
        """Write every poison record durably (awaiting acks) before the batch commits."""


@dataclass
class BatchStats:
    records: int = 0
    applied: int = 0
    duplicates: int = 0
    redelivered: int = 0
    held: int = 0
    dead_lettered: int = 0
    runs_written: int = 0
    skipped: int = 0  # entries of runs begun before a partial build's start

    def add(self, other: BatchStats) -> None:
        """Fold in one phase's figures (the batch's records and redeliveries are not summed)."""
        self.applied += other.applied
        self.duplicates += other.duplicates
        self.redelivered = max(self.redelivered, other.redelivered)
        self.held += other.held
        self.dead_lettered += other.dead_lettered
        self.runs_written += other.runs_written
        self.skipped += other.skipped


@dataclass
class _TargetResult:
    writes: list[pg.RunWrite] = field(default_factory=list)
    views: list[RunView] = field(default_factory=list)
    poison: list[Poison] = field(default_factory=list)
    # (run_id, applied_seq, state, ended) of each written run: the state cache once committed
    states: list[tuple[str, int, Any, bool]] = field(default_factory=list)


# The entry (None until decoded), its original bytes, and its record (None when it was held).
Item = tuple[LedgerEntry | None, bytes, "SourceRecord | None"]


class Engine:
    """Applies batches of records to projection builds with exactly-once effect."""

    def __init__(
        self,
        targets: Sequence[Target],
        store: str | Store,
        views: str | ViewStore | None,
        dead_letters: DeadLetterSink,
        codec: LedgerCodec | None = None,
        telemetry: Telemetry | None = None,
        redis_prefix: str = "al",
        max_backoff_s: float = 5.0,
        defer_analytics: bool = False,
        follow_live: bool = False,
        state_cache_runs: int = 256,
        analytics_interval_s: float = 0.0,
        analytics_max_pending: int = 4000,
        on_lane_failure: Callable[[BaseException | None], None] | None = None,
        checkpoint_tail_entries: int = 10_000,
        checkpoint_min_bytes: int = 64 * 1024,
        change_streams: Collection[str] = (),
        analytics_beside_hot: int = 500,
    ) -> None:
        self.targets = list(targets)
        # The projections whose live builds' changes go to their change streams (the outbox).
        self.change_streams = frozenset(change_streams)
        # A run's whole state is written (a checkpoint) when its tail of entries folded since
        # the last one holds this many entries, or CHECKPOINT_RATIO times the bytes of that
        # checkpoint (at least checkpoint_min_bytes), or the run ends, or the batch's own
        # entries hold as many bytes as the checkpoint would; otherwise only its head and the
        # new entries. So a batch writes O(its entries) bytes, and checkpoints add at
        # most 1/CHECKPOINT_RATIO of what the tails cost: bytes written per entry do not grow
        # with the run (a cold start folds at most checkpoint_tail_entries entries).
        self.checkpoint_tail_entries = checkpoint_tail_entries
        self.checkpoint_min_bytes = checkpoint_min_bytes
        # Called with each committed batch's run writes (the bench counts their bytes).
        self.write_observer: Callable[[dict[pg.BuildKey, list[pg.RunWrite]]], None] | None = None
        # The store contract (projectors/stores/contract.py): a PostgreSQL DSN or a Store; the
        # views: a Redis URL, a ViewStore, or None for no views.
        self.store: Store = PostgresStore(store) if isinstance(store, str) else store
        self._views_url = views if isinstance(views, str) else None
        self._views: ViewStore | None = None if isinstance(views, str) else views
        self.has_views = views is not None
        self.dead_letters = dead_letters
        self.codec = codec or LedgerCodec()
        self.telemetry = telemetry or Telemetry.disabled()
        self.redis_prefix = redis_prefix
        self.max_backoff_s = max_backoff_s
        # With defer_analytics, a batch's analytics (not hot) targets commit in the background
        # on their own connection while the next batches' hot targets are applied. Batches that
        # arrive while an analytics commit runs (or within analytics_interval_s of the last
        # one) go together in the next, so small hot batches do not each pay an analytics
        # transaction; at analytics_max_pending records waiting, process() waits for them.
        self.defer_analytics = defer_analytics
        self.analytics_interval_s = analytics_interval_s
        self.analytics_max_pending = analytics_max_pending
        # An analytics batch of at least this many records folds while a hot phase waits on
        # PostgreSQL (a backlog: throughput); a smaller one waits for the hot phase to end.
        self.analytics_beside_hot = analytics_beside_hot
        self._pending: list[SourceRecord] = []
        self._pending_decoded: dict[tuple[TopicPartition, int], LedgerEntry | LedgerDecodeError]
        self._pending_decoded = {}
        self._pending_sent: set[tuple[TopicPartition, int]] = set()
        self._hurry = asyncio.Event()  # set while flush() waits: no interval
        self.on_lane_failure = on_lane_failure
        # The live worker writes whatever build al_live points to, switching when a rebuild is
        # swapped in: it reads the pointers inside the batch transaction, holding them (FOR
        # SHARE) until it commits, so a swap waits for the batch and no batch lands in the old
        # build after the swap.
        self.follow_live = follow_live
        # The folded states of recently written runs, per build, as committed (LRU, runs that
        # ended leave it): a run seen again skips fetching and parsing its document whenever
        # PostgreSQL still holds that same position. Folds are pure and states immutable, so
        # an object kept is as good as one parsed again.
        self.state_cache_runs = state_cache_runs
        self._states: dict[pg.BuildKey, OrderedDict[str, tuple[int, Any]]] = {}
        # The bytes a run's state serialized to when a batch last tried to write it whole
        # instead of its tail and found it larger (see _fold_run's ``cheap``): not tried again
        # until a batch adds at least that much. Only saves work; bounded by clearing.
        self._outgrown: dict[tuple[str, str, str], int] = {}
        self._deferred: asyncio.Task[None] | None = None
        self._offset_rows: set[pg.OffsetKey] = set()
        self._hot_idle = asyncio.Event()  # no hot phase running (deferred analytics wait)
        self._hot_idle.set()  # al_offsets rows known to be committed

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, live: bool = False) -> None:
        """Record the builds, then refill Redis from PostgreSQL (views a crash left behind)."""
        for t in self.targets:
            await self.store.ensure_build(
                t.name, t.build, t.projection.version, live, inputs=projection_inputs(t.projection)
            )
        if self.has_views:
            await self._retrying(self.refill_views, "refilling Redis views")
            await self._retrying(self.publish_live_pointers, "publishing live builds to Redis")

    async def flush(self) -> None:
        """Wait until deferred analytics work is committed; raises what it raised (the work
        it failed on stays pending, ahead of anything newer)."""
        self._hurry.set()  # the lane stops waiting out its interval
        try:
            while self._deferred is not None or self._pending:
                if self._deferred is None:
                    self._deferred = asyncio.create_task(self._analytics_lane())
                task = self._deferred
                try:
                    await task
                finally:
                    if self._deferred is task:
                        self._deferred = None
        finally:
            self._hurry.clear()

    async def _analytics_lane(self) -> None:
        """Commit the analytics targets over everything pending, until nothing is."""
        while self._pending:
            records, self._pending = self._pending, []
            decoded, self._pending_decoded = self._pending_decoded, {}
            sent, self._pending_sent = self._pending_sent, set()
            cold = [t for t in self.targets if not t.projection.hot]
            stats = BatchStats(records=len(records))
            try:
                await self._phase("analytics", cold, records, decoded, sent, stats)
            except BaseException:
                # Not committed: back in front of what arrived meanwhile, so no later commit
                # moves this lane's offsets past records it never applied.
                self._pending[:0] = records
                self._pending_decoded.update(decoded)
                self._pending_sent |= sent
                raise
            if self.analytics_interval_s > 0 and not self._hurry.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), self.analytics_interval_s)

    def _defer(
        self,
        records: Sequence[SourceRecord],
        decoded: dict[tuple[TopicPartition, int], LedgerEntry | LedgerDecodeError],
        sent: set[tuple[TopicPartition, int]],
    ) -> None:
        self._pending.extend(records)
        self._pending_decoded.update(decoded)
        self._pending_sent |= sent
        if self._deferred is None:
            self._deferred = asyncio.create_task(self._analytics_lane())
            self._deferred.add_done_callback(self._lane_done)

    def _lane_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            if self._deferred is task:
                self._deferred = None  # the next batch starts another
            return
        _log_failure(task)  # kept: the next process() or flush() raises it
        if self.on_lane_failure is not None:  # the worker stops now, not at the next batch
            self.on_lane_failure(task.exception())

    async def close(self) -> None:
        try:
            await self.flush()
        finally:
            await self.store.close()
        if self._views is not None and self._views_url is not None:  # made here: closed here
            await self._views.close()
            self._views = None

    # -- positions -------------------------------------------------------------------------

    async def positions(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """Where to resume each partition: the lowest next offset over all targets (-1: none)."""

        async def read() -> dict[TopicPartition, int]:
            # Its own lane: a rebalance asks while a batch may be using the others.
            topics = sorted({t for t, _ in partitions})
            result = {tp: -1 for tp in partitions}
            first = True
            for target in self.targets:
                stored = await self.store.read_positions(target.name, target.build, topics)
                for tp in partitions:
                    next_offset = stored.get(tp, -1) + 1 if tp in stored else 0
                    result[tp] = next_offset if first else min(result[tp], next_offset)
                first = False
            return result

        return await self._retrying(read, "reading stored offsets", "positions")

    # -- the batch -------------------------------------------------------------------------

    async def process(self, records: Sequence[SourceRecord]) -> BatchStats:
        """Apply one batch; retries retriable failures until it is committed.

        Hot targets (served from Redis) commit and publish their views first; the others commit
        in a second transaction, so analytics projections never delay what agents read back.
        Each target's offsets live in its own rows, so the two commits are independent.
        """
        if not records:
            return BatchStats()
        started = time.perf_counter()
        stats = BatchStats(records=len(records))
        decoded: dict[tuple[TopicPartition, int], LedgerEntry | LedgerDecodeError] = {}
        sent: set[tuple[TopicPartition, int]] = set()  # poison dead-lettered by an earlier phase
        hot = [t for t in self.targets if t.projection.hot]
        cold = [t for t in self.targets if not t.projection.hot]
        with self.telemetry.batch_span(records) as span:
            if hot:
                self._hot_idle.clear()
                try:
                    await self._phase("hot", hot, records, decoded, sent, stats)
                finally:
                    self._hot_idle.set()
            if cold and self.defer_analytics:
                if self._deferred is not None and self._deferred.done():
                    await self.flush()  # raises what the lane raised
                self._defer(records, decoded, sent)
                if len(self._pending) >= self.analytics_max_pending:
                    await self.flush()
            elif cold:
                await self._phase("analytics", cold, records, decoded, sent, stats)
            span.set_attribute("agentledger.records", len(records))
        self.telemetry.record_batch(stats, time.perf_counter() - started)
        return stats

    async def _phase(
        self,
        lane: str,
        targets: Sequence[Target],
        records: Sequence[SourceRecord],
        decoded: dict[tuple[TopicPartition, int], LedgerEntry | LedgerDecodeError],
        sent: set[tuple[TopicPartition, int]],
        stats: BatchStats,
    ) -> None:
        current = list(targets)
        while True:
            try:
                views = await self._retrying(
                    partial(self._commit, lane, current, records, decoded, sent, stats),
                    "applying a batch",
                    lane,
                )
                break
            except _LiveMoved as exc:
                self._follow(exc.moved)
                current = [self._current(t) for t in current]
        if self.has_views and views:
            await self._retrying(lambda: self._write_views(views), "writing Redis views")

    def _follow(self, moved: dict[str, str]) -> None:
        for name, build in moved.items():
            logger.warning("%s: the live build is now %s; writing it from here on", name, build)
        self.targets = [
            Target(t.projection, moved[t.name], t.whole_runs_only) if t.name in moved else t
            for t in self.targets
        ]
        current = {(t.name, t.build) for t in self.targets}
        for key in [k for k in self._states if k not in current]:
            del self._states[key]

    def _current(self, target: Target) -> Target:
        return next(t for t in self.targets if t.name == target.name)

    async def _commit(
        self,
        lane: str,
        targets: Sequence[Target],
        records: Sequence[SourceRecord],
        decoded: dict[tuple[TopicPartition, int], LedgerEntry | LedgerDecodeError],
        sent: set[tuple[TopicPartition, int]],
        totals: BatchStats,
    ) -> dict[Target, list[RunView]]:
        stats = BatchStats()
        views: dict[Target, list[RunView]] = {}
        last: dict[TopicPartition, int] = {}
        for r in records:
            last[r.tp] = max(last.get(r.tp, -1), r.offset)
        partitions = sorted(last)
        keys = [(t.name, t.build) for t in targets]
        async with self.store.transaction(lane) as tx:
            if self.follow_live:
                # the pointers first, held to the commit, then the offset rows (a swap locks
                # them in the same order): no batch lands in a build after it stopped being live
                live = await tx.live_builds([t.name for t in targets])
                moved = {
                    t.name: live[t.name] for t in targets if live.get(t.name, t.build) != t.build
                }
                if moved:
                    raise _LiveMoved(moved)
            stored = await tx.lock_positions(keys, partitions, self._offset_rows)
            fresh_by_target: dict[Target, list[SourceRecord]] = {}
            by_position: dict[tuple[tuple[TopicPartition, int], ...], list[SourceRecord]] = {}
            for target in targets:  # targets standing at the same offsets share one list
                mine = stored[(target.name, target.build)]
                at = tuple(sorted(mine.items()))
                if at not in by_position:
                    by_position[at] = [r for r in records if r.offset > mine[r.tp]]
                fresh = fresh_by_target[target] = by_position[at]
                stats.redelivered = max(stats.redelivered, len(records) - len(fresh))
            self._decode(fresh_by_target, decoded)
            poison = [
                p for p in self._poison(fresh_by_target, decoded) if p.record.key_tp not in sent
            ]
            results = await self._apply(lane, tx, fresh_by_target, decoded, stats)
            seen = {p.record.key_tp for p in poison} | sent
            for result in results.values():  # each target refuses the same record: send it once
                for p in result.poison:
                    if p.record.key_tp not in seen:
                        seen.add(p.record.key_tp)
                        poison.append(p)
            if poison:
                with self.telemetry.span("dead-letter", count=len(poison)):
                    await self.dead_letters.send(poison)
                sent.update(p.record.key_tp for p in poison)
                stats.dead_lettered = len(poison)
            with self.telemetry.span("postgres.write", targets=len(results)):
                await tx.write(
                    {(t.name, t.build): r.writes for t, r in results.items()},
                    {key: last for key in keys},
                )
            for target, result in results.items():
                stats.runs_written += len(result.writes)
                if target.projection.hot and result.views:
                    views[target] = result.views
        self._offset_rows.update((n, b, t, p) for n, b in keys for t, p in partitions)
        if self.write_observer is not None:
            self.write_observer({(t.name, t.build): r.writes for t, r in results.items()})
        for target, result in results.items():
            self._remember((target.name, target.build), result.states)
        totals.add(stats)  # only once committed: a retried attempt is not counted twice
        return views

    def _decode(
        self,
        fresh_by_target: dict[Target, list[SourceRecord]],
        decoded: dict[tuple[TopicPartition, int], LedgerEntry | LedgerDecodeError],
    ) -> None:
        todo = {(r.tp, r.offset): r for fresh in fresh_by_target.values() for r in fresh}
        missing = [r for k, r in todo.items() if k not in decoded]
        with self.telemetry.span("decode", count=len(missing)):
            results = self.codec.decode_each([r.value or b"" for r in missing])
        for record, result in zip(missing, results, strict=True):
            if isinstance(result, LedgerEntry):
                broken = check_record(result, record.topic, record.key, record.timestamp_ms)
                decoded[(record.tp, record.offset)] = broken or result
            else:
                decoded[(record.tp, record.offset)] = result

    @staticmethod
    def _poison(
        fresh_by_target: dict[Target, list[SourceRecord]],
        decoded: dict[tuple[TopicPartition, int], LedgerEntry | LedgerDecodeError],
    ) -> list[Poison]:
        seen: dict[tuple[TopicPartition, int], Poison] = {}
        for fresh in fresh_by_target.values():
            for r in fresh:
                result = decoded[(r.tp, r.offset)]
                if isinstance(result, LedgerDecodeError) and (r.tp, r.offset) not in seen:
                    seen[(r.tp, r.offset)] = Poison(r, type(result).__name__, str(result))
        return list(seen.values())

    async def _apply(
        self,
        lane: str,
        tx: StoreTransaction,
        fresh_by_target: dict[Target, list[SourceRecord]],
        decoded: dict[tuple[TopicPartition, int], LedgerEntry | LedgerDecodeError],
        stats: BatchStats,
    ) -> dict[Target, _TargetResult]:
        arriving_by_target: dict[Target, dict[str, list[tuple[int, Item]]]] = {}
        by_fresh: dict[int, dict[str, list[tuple[int, Item]]]] = {}  # keyed by the shared list
        for target, fresh in fresh_by_target.items():
            if id(fresh) not in by_fresh:
                by_fresh[id(fresh)] = _by_run(fresh, decoded)
            arriving_by_target[target] = by_fresh[id(fresh)]
        wanted = {(t.name, t.build): sorted(a) for t, a in arriving_by_target.items()}
        kept = self._kept(wanted)  # taken now: what the positions sent to PostgreSQL name
        rows = await tx.load_states(
            wanted, {key: {r: seq for r, (seq, _s) in ks.items()} for key, ks in kept.items()}
        )
        known_ids = await self._stored_entry_ids(tx, arriving_by_target, rows)
        if lane != "hot" and self._arrivals(arriving_by_target) < self.analytics_beside_hot:
            # folding blocks the loop: a few records (the hot path's batches) wait for the hot
            # phase to end, so they never delay its commit; a backlog's batches fold while the
            # hot phase waits on PostgreSQL, which would otherwise leave the CPU idle
            await self._hot_idle.wait()
        results: dict[Target, _TargetResult] = {}
        SHARED_FOLDS.arm()  # (no await until it is cleared: no other batch folds meanwhile)
        try:
            with self.telemetry.span("fold", targets=len(arriving_by_target)):
                for target, arriving in arriving_by_target.items():
                    mine = rows[(target.name, target.build)]
                    states = kept.get((target.name, target.build), {})
                    result = results[target] = _TargetResult()
                    for run_id, arrived in arriving.items():
                        row = mine.get(run_id)
                        source, items = _admit(row, arrived, result.poison)
                        if not items:
                            continue
                        if target.whole_runs_only and row is None and _begun_before(items):
                            stats.skipped += len(items)
                            continue
                        state = states[run_id][1] if row and row.cached else None
                        ids = known_ids.get((target.name, target.build), {}).get(run_id, {})
                        write, view = self._fold_run(
                            target, run_id, row, state, items, stats, result, source, ids
                        )
                        result.writes.append(write)
                        if view is not None:
                            result.views.append(view)
        finally:
            SHARED_FOLDS.clear()  # (its results are shared within one batch's folds)
        return results

    @staticmethod
    def _arrivals(arriving_by_target: dict[Target, dict[str, list[tuple[int, Item]]]]) -> int:
        """How many records the phase folds for its most fed target."""
        return max((sum(map(len, a.values())) for a in arriving_by_target.values()), default=0)

    @staticmethod
    async def _stored_entry_ids(
        tx: StoreTransaction,
        arriving_by_target: dict[Target, dict[str, list[tuple[int, Item]]]],
        rows: dict[pg.BuildKey, dict[str, pg.RunRow]],
    ) -> dict[pg.BuildKey, dict[str, dict[int, str]]]:
        """The stored entry ids at the numbers arrivals repeat (already applied ones), for the
        targets that keep entry ids: one query, and only when something repeats."""
        wanted: dict[pg.BuildKey, dict[str, list[int]]] = {}
        for target, arriving in arriving_by_target.items():
            if not _keeps_ids(target):
                continue
            key = (target.name, target.build)
            for run_id, arrived in arriving.items():
                row = rows[key].get(run_id)
                repeated = sorted(
                    {s for s, _ in arrived if row is not None and s <= row.applied_seq}
                )
                if repeated:
                    wanted.setdefault(key, {})[run_id] = repeated
        return await tx.entry_ids(wanted) if wanted else {}

    def _fold_run(
        self,
        target: Target,
        run_id: str,
        row: pg.RunRow | None,
        kept: Any,
        items: list[tuple[int, Item]],
        stats: BatchStats,
        result: _TargetResult,
        source: TopicPartition | None = None,
        known_ids: dict[int, str] | None = None,
    ) -> tuple[pg.RunWrite, RunView | None]:
        """Fold a run's arrivals onto its stored row (or ``kept``, the cached state the row
        says is current)."""
        projection = target.projection
        held: dict[int, Item] = {
            seq: (None, payload, None)
            for seq, payload in (row.held_payloads if row else {}).items()
        }
        plan = plan_run(row.applied_seq if row else 0, held, items)
        if kept is not None:
            state = kept
        else:
            state = projection.from_doc(row.state) if row and row.state else None
            if row is not None and row.tail_payloads:  # the checkpoint, then its tail
                tail = sorted(row.tail_payloads.items())
                state = refold(projection, state, (self.codec.decode(p) for _, p in tail))
        stored = state
        history: list[HistoryRow] = []
        ended = finished = False
        applied: dict[int, bytes] = {}
        for entry, payload, record in plan.apply:
            entry = entry or self.codec.decode(payload)
            ended = entry.run_status is not None
            finished = finished or ended
            before = state
            try:
                if state is None:
                    state = projection.initial(entry)
                if projection.accepts(entry):
                    applied[entry.sequence_no] = payload  # the tail needs only what is folded
                    state = projection.fold(state, entry)
                    history.extend(projection.history(before, state, entry))
            except Exception as exc:  # a fold bug must not stop the worker on this entry forever
                state = before
                result.poison.append(_fold_failure(projection.name, entry, payload, record, exc))
        entry_ids: dict[int, str] = {}
        conflicts = 0
        if _keeps_ids(target):
            for entry, payload, _record in plan.apply:
                entry = entry or self.codec.decode(payload)
                entry_ids[entry.sequence_no] = entry.entry_id
            for seq, (entry, payload, record), keeper in plan.duplicate_items:
                entry = entry or self.codec.decode(payload)
                if keeper is not None:
                    first = keeper[0] or self.codec.decode(keeper[1])
                    first_id: str | None = first.entry_id
                else:
                    first_id = (known_ids or {}).get(seq)
                if first_id is not None and first_id != entry.entry_id and record is not None:
                    conflicts += 1
                    result.poison.append(_conflict(entry, first_id, record))
        stats.applied += len(plan.apply)
        stats.duplicates += plan.duplicates
        stats.held += len(plan.hold)
        fleet_id = row.fleet_id if row else _first_entry(items).fleet_id
        gaps = missing_ranges(plan.applied_seq, plan.held)
        if state is not None and plan.apply:
            try:
                state = projection.finish(state)
            except Exception:  # derived parts only: keep the folded state, say so loudly
                logger.exception("%s: finish failed for run %s", projection.name, run_id)
        added = sum(map(len, applied.values()))
        tail_count = (row.tail_count if row else 0) + len(applied)
        tail_bytes = (row.tail_bytes if row else 0) + added
        due = (
            row is None
            or (stored is None and state is not None)  # begun by an entry the tail does not keep
            or finished
            or tail_count >= self.checkpoint_tail_entries
            or tail_bytes >= max(self.checkpoint_min_bytes, CHECKPOINT_RATIO * row.checkpoint_bytes)
        )
        # A state whose last checkpoint was no larger than the entries this batch adds to its
        # tail (run-stats' few hundred bytes) is written whole if it still is: the checkpoint
        # then writes less than the tail would.
        grown_key = (target.name, target.build, run_id)
        cheap = (
            not due
            and row is not None
            and 0 < max(row.checkpoint_bytes, self._outgrown.get(grown_key, 0)) <= added
        )
        head: bytes | None = None
        split: tuple[bytes, dict[str, bytes]] | None = None
        try:
            head = projection.head_json(state) if state is not None else None
            doc, split = _checkpoint(projection, state) if due or cheap else (None, None)
            if cheap and doc is not None and len(doc) > added:
                if len(self._outgrown) >= OUTGROWN_KEPT:
                    self._outgrown.clear()
                self._outgrown[grown_key] = len(doc)
                doc, split = None, None  # (it grew: the tail is the smaller write)
            elif doc is not None or finished:
                self._outgrown.pop(grown_key, None)
        except Exception as exc:  # a state no document holds: the batch's entries go, not the run
            if row is not None and (due or cheap) and head is not None:
                doc, split = None, None  # only the checkpoint failed: keep the tail, say so loudly
                logger.exception("%s: no checkpoint for run %s", projection.name, run_id)
            else:
                state, history, applied = stored, [], {}
                head = projection.head_json(state) if state is not None else None
                doc, split = _checkpoint(projection, state) if due else (None, None)
                tail_count = row.tail_count if row else 0
                tail_bytes = row.tail_bytes if row else 0
                for entry, payload, record in plan.apply:
                    entry = entry or self.codec.decode(payload)
                    result.poison.append(
                        _fold_failure(projection.name, entry, payload, record, exc)
                    )
        result.states.append((run_id, plan.applied_seq, state, ended))
        write = pg.RunWrite(
            run_id=run_id,
            fleet_id=fleet_id,
            applied_seq=plan.applied_seq,
            held=plan.held,
            gaps=gaps,
            state=doc,
            head=head,
            hold={seq: payload for seq, (_, payload, _r) in plan.hold.items()},
            release=plan.release,
            history=history,
            source=source,
            tail={} if doc is not None else applied,
            tail_count=0 if doc is not None else tail_count,
            tail_bytes=0 if doc is not None else tail_bytes,
            entry_ids=entry_ids,
            conflicts=conflicts,
            paged=projection.paged,
            split=split,
        )
        changed = bool(plan.apply or plan.hold or conflicts)
        if changed and projection.name in self.change_streams:
            write.publish = True
            write.traceparent = _last_traceparent(plan.apply)
        view = RunView(run_id, plan.applied_seq, len(plan.held), [list(g) for g in gaps], head)
        return write, view if changed else None

    def _kept(self, wanted: dict[pg.BuildKey, list[str]]) -> dict[pg.BuildKey, dict[str, Any]]:
        """The cached (applied_seq, state) of the wanted runs, per build."""
        out: dict[pg.BuildKey, dict[str, Any]] = {}
        for key, run_ids in wanted.items():
            cache = self._states.get(key)
            if cache:
                out[key] = {r: cache[r] for r in run_ids if r in cache}
        return out

    def _remember(self, key: pg.BuildKey, states: list[tuple[str, int, Any, bool]]) -> None:
        """Keep the committed states of a batch's runs; forget ended runs, then the oldest."""
        if self.state_cache_runs <= 0:
            return
        cache = self._states.setdefault(key, OrderedDict())
        for run_id, applied_seq, state, ended in states:
            if ended or state is None:
                cache.pop(run_id, None)
            else:
                cache[run_id] = (applied_seq, state)
                cache.move_to_end(run_id)
        while len(cache) > self.state_cache_runs:
            cache.popitem(last=False)

    # -- Redis -----------------------------------------------------------------------------

    async def _write_views(self, views: dict[Target, list[RunView]]) -> None:
        store = await self._view_store()
        with self.telemetry.span("redis.write", targets=len(views)):
            ready = await store.write_builds((t.name, t.build, b) for t, b in views.items())
        lost = [t for t in views if (t.name, t.build) not in ready]
        for target in lost:  # views lost (flush, restart): CAS never moves them backwards
            await self._refill(store, target)
        if lost:
            await self.publish_live_pointers()  # lost with them

    async def publish_live_pointers(self, lane: str = "hot") -> None:
        """Mirror PostgreSQL's live pointer into Redis for the targets that are live."""
        store = await self._view_store()
        for target in self.targets:
            if await self.store.live_build(target.name, lane) == target.build:
                await store.set_live(target.name, target.build)

    async def refill_views(self) -> None:
        """Write every hot target's views from PostgreSQL (CAS: never backwards), mark ready."""
        store = await self._view_store()
        for target in self.targets:
            if target.projection.hot:
                await self._refill(store, target)

    async def check_views(self) -> int:
        """Refill the hot builds whose views Redis lost (flushed, restarted) while no batch came
        to notice; returns how many were refilled. For a timer: safe beside running batches
        (its own PostgreSQL connection; CAS writes never move a view backwards)."""
        if not self.has_views:
            return 0
        hot = [t for t in self.targets if t.projection.hot]

        async def check() -> int:
            store = await self._view_store()
            ready = await store.ready_builds((t.name, t.build) for t in hot)
            lost = [t for t in hot if (t.name, t.build) not in ready]
            if lost:  # the pointers first: a view Redis shows again is never one no pointer names
                await self.publish_live_pointers(lane="refill")
            for target in lost:
                await self._refill(store, target, lane="refill")
            return len(lost)

        return await self._retrying(check, "checking Redis views", "refill")

    async def _refill(self, store: ViewStore, target: Target, lane: str = "hot") -> None:
        heads = await self.store.heads(target.name, target.build, lane)
        views = [RunView(h.run_id, h.applied_seq, len(h.held), h.gaps, h.head) for h in heads]
        for start in range(0, len(views), 2000):
            await store.write(target.name, target.build, views[start : start + 2000])
        await store.mark_ready(target.name, target.build)
        self.telemetry.count("views_refilled", len(views), projection=target.name)
        logger.info("refilled %d %s views from PostgreSQL", len(views), target.name)

    # -- connections and retries -----------------------------------------------------------

    async def _view_store(self) -> ViewStore:
        if self._views is None:
            assert self._views_url is not None
            self._views = RedisViewStore.connect(self._views_url, self.redis_prefix)
        return self._views

    async def _retrying(self, step: Callable[[], Awaitable[T]], what: str, lane: str = "hot") -> T:
        delay = 0.2
        while True:
            try:
                return await step()
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                logger.warning(
                    "%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay
                )
                self.telemetry.count("retries", 1, step=what)
                await self.store.reset(lane)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)


def tune_gc() -> None:
    """The collector settings of a process that runs an engine for long (the worker, a
    rebuild, the bench): what exists now lives as long as the process, so it is kept out of
    every collection (a full collection then scans only what batches allocate: a long pause is
    hot-path latency); and folds allocate many short-lived containers: at the default 700
    allocations a young collection ran ~60 times a second (~1 s of every 25 at 1,000
    entries/s), at 50,000 ~2 times a second, ~0.15 s of every 25 (measured with gc.callbacks).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


def _by_run(
    fresh: list[SourceRecord],
    decoded: dict[tuple[TopicPartition, int], LedgerEntry | LedgerDecodeError],
) -> dict[str, list[tuple[int, Item]]]:
    """The decoded entries of ``fresh``, by run, with their sequence numbers (poison left out)."""
    arriving: dict[str, list[tuple[int, Item]]] = defaultdict(list)
    for r in fresh:
        entry = decoded[(r.tp, r.offset)]
        if isinstance(entry, LedgerEntry):
            arriving[entry.run_id].append((entry.sequence_no, (entry, r.value or b"", r)))
    return arriving


def _admit(
    row: pg.RunRow | None, arrived: list[tuple[int, Item]], poison: list[Poison]
) -> tuple[TopicPartition | None, list[tuple[int, Item]]]:
    """The arrivals a run may apply, and the partition it lives on; the others go to ``poison``.

    A run lives on the partition its first stored entry came from; an entry found on another
    one (a topic given more partitions, a producer with its own partitioner) would be applied
    by two workers at once, each overwriting the other's row. And an entry more than
    ``MAX_AHEAD`` past the run's position would wait for entries that may never come.
    """
    source = row.source if row else None
    applied = row.applied_seq if row else 0
    admitted = []
    for seq, item in arrived:
        record = item[2]
        if record is None:
            admitted.append((seq, item))
            continue
        source = source or record.tp
        if record.tp[0] != source[0]:
            why = (
                f"{OTHER_FLEET} {source[0]}, this one from {record.topic}: "
                "a run id belongs to one fleet (publish another fleet's runs under their own ids)"
            )
        elif record.tp != source:
            why = (
                f"the run's entries come from {source[0]} partition {source[1]}, this one from "
                f"partition {record.partition}: one run must stay on one partition"
            )
        elif seq > applied + MAX_AHEAD:
            why = (
                f"sequence_no is more than {MAX_AHEAD} ahead of the run's applied position "
                f"{applied}: the entries between are missing"
            )
        else:
            admitted.append((seq, item))
            continue
        poison.append(Poison(record, RecordContractError.__name__, why))
    return source, admitted


def _begun_before(items: list[tuple[int, Item]]) -> bool:
    return min(seq for seq, _ in items) > 1


class _LiveMoved(Exception):
    """The live pointer of some targets moved to another build (a rebuild was swapped in)."""

    def __init__(self, moved: dict[str, str]) -> None:
        super().__init__(moved)
        self.moved = moved


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("deferred analytics batch failed", exc_info=task.exception())


def _checkpoint(
    projection: Projection[Any], state: Any
) -> tuple[bytes, tuple[bytes, dict[str, bytes]] | None]:
    return projection.checkpoint_pages(state) if state is not None else (b"{}", None)


def _fold_failure(
    projection: str,
    entry: LedgerEntry,
    payload: bytes,
    record: SourceRecord | None,
    exc: Exception,
) -> Poison:
    """A dead letter for an entry a projection's fold rejected; the run moves on without it."""
    source = record or SourceRecord(
        ledger_topic("held", entry.fleet_id), -1, -1, entry.run_id.encode(), payload
    )
    message = (
        f"projection {projection} failed on run {entry.run_id} seq {entry.sequence_no}: "
        f"{type(exc).__name__}: {exc}"
    )
    return Poison(source, "ProjectionFoldError", message)


CONFLICTING_DUPLICATE = "ConflictingDuplicateError"
# how the refusal of an entry of a run that is in another fleet begins (a RecordContractError)
OTHER_FLEET = "the run's entries come from topic"


def _last_traceparent(applied: Sequence[tuple[Any, bytes, SourceRecord | None]]) -> str | None:
    """The publisher's traceparent header of the last applied entry that came with one."""
    for _entry, _payload, record in reversed(applied):
        if record is not None:
            for name, value in record.headers:
                if name == "traceparent":
                    return bytes(value).decode("ascii", "replace")
    return None


def _keeps_ids(target: Target) -> bool:
    return bool(getattr(target.projection, "keeps_entry_ids", False))


def _conflict(entry: LedgerEntry, first_id: str, record: SourceRecord) -> Poison:
    """A dead letter for an entry sent under a sequence number another entry already has."""
    return Poison(
        record,
        CONFLICTING_DUPLICATE,
        f"run {entry.run_id} sequence_no {entry.sequence_no}: entry {entry.entry_id} conflicts "
        f"with entry {first_id}, which has that number already (the first one stands); send "
        "it under the run's next number, or not at all if it is the same step",
    )


def _first_entry(items: list[tuple[int, Item]]) -> LedgerEntry:
    for _, (entry, _payload, _record) in items:
        if entry is not None:
            return entry
    raise ValueError("no decoded entry among the arrivals")
