"""The subscriber SDK: a projection's change stream as typed changes, async or sync.

    async with Subscriber(settings, "cost-metrics", start="beginning") as sub:
        async for change in sub:          # ProjectionChange
            ...

    for change in changes(settings, "cost-metrics", start="now"):
        ...

``start``: ``"beginning"`` gives the current state of every key first (the topic read up to its
end at start, only each key's latest record, keys removed left out, the latest build marker
first), then live changes; ``"now"`` only what comes after; a ``datetime`` every record
committed since then. ``group_id`` stores positions in a Kafka consumer group (committed by
:meth:`Subscriber.commit`); ``positions`` resumes from offsets the caller stored
(:meth:`Subscriber.positions`), e.g. in the same transaction as what it did with the changes.
Either one overrides ``start`` wherever it has a position. Records are read with
``read_committed``. A record written with a newer schema is resolved through the schema topic,
so an old subscriber reads a newer relay's records (and a new one an older relay's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import asdict
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.settings import Settings
from projectors.cost_metrics import CostTotals, known_sum, partly_unknown, shown_state
from schemas.changes import ChangeCodec, ProjectionChange
from schemas.errors import LedgerDecodeError
from schemas.topics import change_schema_topic, change_topic

logger = logging.getLogger(__name__)

Start = Literal["beginning", "now"] | datetime


class Subscriber:
    """Async iterator over one projection's changes (see the module's docstring)."""

    def __init__(
        self,
        settings: Settings,
        projection: str,
        *,
        start: Start = "now",
        fleet: str | None = None,
        group_id: str | None = None,
        positions: Mapping[int, int] | None = None,
        codec: ChangeCodec | None = None,
        idle_timeout_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.projection = projection
        self.topic = change_topic(settings.topic_prefix, projection)
        self.start = start
        self.fleet = fleet
        self.group_id = group_id
        self.stored = dict(positions or {})
        self._schemas: dict[bytes, str] = {}
        self.codec = codec or ChangeCodec()
        self.codec.resolve = self._schemas.get
        self.idle_timeout_s = idle_timeout_s
        self.caught_up = asyncio.Event()  # the current state (from the beginning) was given
        self.buffered = 0  # changes fetched and not given yet (a batch boundary when 0)
        self.undecodable = 0  # records skipped: not a change record this reader can decode
        self.live_build: str | None = None  # the latest build marker seen
        self._consumer: AIOKafkaConsumer | None = None
        self._parts: list[TopicPartition] = []
        self._next: dict[int, int] = {}  # per partition: the offset after the last given record
        self._snapshot_end: dict[TopicPartition, int] | None = None
        self._reached: dict[int, int] = {}

    async def __aenter__(self) -> Subscriber:
        await self.open()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def open(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_address,
            group_id=self.group_id,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        self._consumer = consumer
        parts = consumer.partitions_for_topic(self.topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(self.topic)
        if not parts:
            await consumer.stop()
            raise LookupError(
                f"no change topic {self.topic}: is {self.projection!r} streamed "
                "(AGENTLEDGER_CHANGE_STREAMS) and have `agentledger topics create` or a worker "
                "run?"
            )
        self._parts = [TopicPartition(self.topic, p) for p in sorted(parts)]
        consumer.assign(self._parts)
        await self._load_schemas()
        resumed: dict[TopicPartition, int] = {}
        for tp in self._parts:
            if tp.partition in self.stored:
                resumed[tp] = self.stored[tp.partition]
            elif self.group_id is not None:
                committed = await consumer.committed(tp)
                if committed is not None:
                    resumed[tp] = committed
        ends = await consumer.end_offsets(self._parts)
        if resumed:
            for tp in self._parts:
                consumer.seek(tp, resumed.get(tp, ends[tp]))
            self.caught_up.set()
        elif self.start == "beginning":
            await consumer.seek_to_beginning(*self._parts)
            self._snapshot_end = {tp: o for tp, o in ends.items() if o > 0}
            if not self._snapshot_end:
                self._snapshot_end = None
                self.caught_up.set()
        elif self.start == "now":
            for tp in self._parts:
                consumer.seek(tp, ends[tp])
            self.caught_up.set()
        else:
            assert isinstance(self.start, datetime)
            millis = int(self.start.timestamp() * 1000)
            found = await consumer.offsets_for_times(dict.fromkeys(self._parts, millis))
            for tp in self._parts:
                at = found.get(tp)
                consumer.seek(tp, at.offset if at is not None else ends[tp])
            self.caught_up.set()
        for tp in self._parts:
            self._next[tp.partition] = await consumer.position(tp)

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    def positions(self) -> dict[int, int]:
        """Per partition, the offset to resume from: after the last change given (during the
        current-state snapshot, where it began: a subscriber resumed from there reads every
        record since, in order, and ends at the same state)."""
        return dict(self._next)

    async def commit(self) -> None:
        """Store :meth:`positions` in the consumer group."""
        if self._consumer is None or self.group_id is None:
            raise RuntimeError("commit needs an open subscriber with a group_id")
        await self._consumer.commit(
            {TopicPartition(self.topic, p): o for p, o in self._next.items()}
        )

    def __aiter__(self) -> AsyncIterator[ProjectionChange]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[ProjectionChange]:
        if self._consumer is None:
            await self.open()
        if self._snapshot_end is not None:
            ends = self._snapshot_end
            start = dict(self._next)  # until every state is given, resume from the start
            snapshot = await self._snapshot(ends)
            self._next = start
            for i, change in enumerate(snapshot):
                self.buffered = len(snapshot) - i - 1
                if not self.buffered:
                    self._next = {
                        tp.partition: ends.get(tp, start[tp.partition]) for tp in self._parts
                    }
                yield change
            self._next = {tp.partition: ends.get(tp, start[tp.partition]) for tp in self._parts}
            self._snapshot_end = None
            self.caught_up.set()
        while True:
            batch = await self._fetch()
            if batch is None:
                return
            for i, change in enumerate(batch):
                self.buffered = len(batch) - i - 1
                if change.partition is not None and change.offset is not None:
                    self._next[change.partition] = change.offset + 1
                yield change
            self._next.update(self._reached)

    async def _fetch(self) -> list[ProjectionChange] | None:
        """The next records as changes (None: idle for ``idle_timeout_s``)."""
        consumer = self._consumer
        assert consumer is not None
        since = time.monotonic()
        while True:
            got = await consumer.getmany(timeout_ms=200, max_records=2000)
            out: list[ProjectionChange] = []
            reached: dict[int, int] = {}
            for tp in sorted(got):
                for record in got[tp]:
                    reached[tp.partition] = record.offset + 1
                    change = await self._decode(record)
                    if change is not None and self._wanted(change):
                        out.append(change)
            if out:
                self._reached = reached  # taken once every change of the batch is given
                return out
            self._next.update(reached)  # only records this subscriber does not want
            idle = time.monotonic() - since
            if self.idle_timeout_s is not None and idle >= self.idle_timeout_s:
                return None

    async def _snapshot(self, ends: dict[TopicPartition, int]) -> list[ProjectionChange]:
        """Each key's latest record up to ``ends``, removals left out, in record order."""
        consumer = self._consumer
        assert consumer is not None
        latest: dict[tuple[int, bytes | None], ProjectionChange] = {}
        marker: ProjectionChange | None = None
        pending = dict(ends)
        while pending:
            got = await consumer.getmany(*pending, timeout_ms=1000, max_records=5000)
            for tp, records in got.items():
                for record in records:
                    if record.offset >= ends[tp]:
                        continue
                    change = await self._decode(record)
                    if change is None:
                        continue
                    if change.kind == "BUILD_CHANGED":
                        if marker is None or change.change_id > marker.change_id:
                            marker = change
                        continue
                    latest[(tp.partition, record.key)] = change
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    del pending[tp]
        for tp in self._parts:  # a partition read past its end: what it read beyond comes again
            consumer.seek(tp, ends.get(tp, self._next.get(tp.partition, 0)))
        states = sorted(
            (c for c in latest.values() if c.kind == "STATE" and self._wanted(c)),
            key=lambda c: (c.partition or 0, c.offset or 0),
        )
        return ([marker] if marker is not None else []) + states

    async def _decode(self, record: Any) -> ProjectionChange | None:
        if record.value is None:
            return None
        for attempt in (1, 2):
            try:
                change = self.codec.decode(record.value).at(record.partition, record.offset)
            except LedgerDecodeError as exc:
                if attempt == 1 and "does not know" in str(exc):
                    await self._load_schemas()  # a newer writer registered its schema
                    continue
                self.undecodable += 1
                logger.warning(
                    "%s[%d]@%d: %s; skipped", record.topic, record.partition, record.offset, exc
                )
                return None
            if change.kind == "BUILD_CHANGED":
                self.live_build = change.build
            return change
        return None

    def _wanted(self, change: ProjectionChange) -> bool:
        if change.kind == "BUILD_CHANGED":
            return True
        return self.fleet is None or change.fleet_id == self.fleet

    async def _load_schemas(self) -> None:
        """Every writer schema the relays registered (the schema topic, read to its end)."""
        reader = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_address,
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await reader.start()
        try:
            tp = TopicPartition(change_schema_topic(self.settings.topic_prefix), 0)
            reader.assign([tp])
            end = (await reader.end_offsets([tp]))[tp]
            await reader.seek_to_beginning(tp)
            while await reader.position(tp) < end:
                got = await reader.getmany(tp, timeout_ms=1000)
                for record in got.get(tp, []):
                    if record.key and record.value:
                        self._schemas[bytes.fromhex(record.key.decode())] = record.value.decode()
        finally:
            await reader.stop()


def changes(
    settings: Settings,
    projection: str,
    **options: Any,
) -> Iterator[ProjectionChange]:
    """:class:`Subscriber` as a plain iterator (it runs its own event loop)."""
    loop = asyncio.new_event_loop()
    subscriber = Subscriber(settings, projection, **options)
    try:
        loop.run_until_complete(subscriber.open())
        stream = subscriber.__aiter__()
        while True:
            try:
                yield loop.run_until_complete(anext(stream))
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(subscriber.close())
        loop.close()


def change_doc(change: ProjectionChange) -> dict[str, Any]:
    """A change as a JSON object (what ``subscribe --json`` prints)."""
    doc = asdict(change)
    doc["committed_at"] = change.committed_at.isoformat()
    if change.projection == "cost-metrics" and change.state is not None:
        # its sums as every output shows them: unknown null, never 0 (the change topic keeps
        # the state as stored, with the counts of unknowns a consumer reads it by)
        doc["state"] = shown_state(change.state)
    return {k: v for k, v in doc.items() if v is not None}


def change_line(change: ProjectionChange, as_json: bool = False) -> str:
    """One line per change: JSON, or words."""
    if as_json:
        return orjson.dumps(change_doc(change), default=str).decode()
    at = change.committed_at.isoformat(timespec="milliseconds")
    if change.kind == "BUILD_CHANGED":
        inputs = ", ".join(f"{k} {v}" for k, v in (change.inputs or {}).items())
        return (
            f"{at}  {change.projection}: live build {change.previous_build or '-'} -> "
            f"{change.build} (version {change.projection_version}{'; ' + inputs if inputs else ''})"
        )
    if change.kind == "REMOVED":
        return f"{at}  {change.projection} {change.run_id}: not in build {change.build}"
    summary = summarize_state(change.projection, change.state or {})
    return (
        f"{at}  {change.projection} {change.run_id} (fleet {change.fleet_id}) at seq "
        f"{change.applied_seq}{f', {change.held} held' if change.held else ''}"
        f"{': ' + summary if summary else ''}"
    )


def summarize_state(projection: str, state: dict[str, Any]) -> str:
    """A few words about a state document: what a reader of that projection looks at first."""
    if projection == "cost-metrics":
        totals = state.get("totals") or {}
        budget = state.get("task_budget_usd")
        counts = CostTotals.model_validate(totals)
        cost = known_sum(counts, "cost", totals.get("cost_usd"))  # unknown is never $0
        bound = ">= " if "cost" in partly_unknown(counts) else ""
        words = [
            f"{bound}${cost}" if cost is not None else "cost unknown",
            f"{counts.calls} calls"
            if counts.calls
            else "model calls unknown (the log keeps no usage)"
            if state.get("calls_unknown")
            else "no model calls recorded",
        ]
        if totals.get("unpriced_calls"):
            words.append(f"{totals['unpriced_calls']} unpriced")
        if counts.usage_unknown_calls:
            words.append(f"{counts.usage_unknown_calls} of unknown usage")
        if budget is not None:
            words.append(f"budget ${budget}{' EXCEEDED' if state.get('over_budget') else ''}")
        return ", ".join(words)
    for field in ("status", "failure_class", "final_status"):
        if state.get(field):
            return f"{field} {state[field]}"
    return ""
