"""The fleet publisher: the SDK agent runtimes import, and what ``agentledger publish`` uses.

``prepare`` is pure (validate, sequence, redact, encode, size-check; an entry over the size limit
has its largest texts moved to the artifact store first); ``AsyncPublisher`` adds the
idempotent producer (acks=all, key = run id, W3C ``traceparent`` header). ``Publisher`` is the
same API for synchronous callers. Bad input raises :class:`LedgerValidationError` naming the field
and nothing is sent; an unreachable broker raises :class:`BrokerUnavailableError` (retriable) after
a bounded wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from infra.admin import create_fleet_topics
from infra.settings import Settings
from schemas.codec import LedgerCodec
from schemas.context_delta import Previous, delta_part, resolve
from schemas.errors import AgentLedgerError, LedgerValidationError
from schemas.models import ContextItem, ContextItemsPart, EntryKind, LedgerEntry
from schemas.topics import ledger_topic
from streams.artifacts import ArtifactStore, FileArtifactStore, offload
from streams.contract import MAX_CLOCK_AHEAD
from streams.kafka_logs import PRODUCE_REFUSALS, hold_back_kafka_floods
from streams.ledger_position import LedgerPositions
from streams.redaction import redact_entry

CONTENT_TYPE = b"application/vnd.agentledger.entry+avro"


class FleetTopicMissingError(AgentLedgerError):
    """A fleet's ledger topic does not exist. Topics are made by one deliberate step,
    ``agentledger topics create --fleet F``, with the same settings for every fleet; a first
    publish never makes them. Nothing of the batch was sent."""

    def __init__(self, topics: Sequence[str], fleets: Sequence[str]) -> None:
        self.topics = list(topics)
        self.fleets = list(fleets)
        flags = " ".join(f"--fleet {f}" for f in self.fleets)
        super().__init__(
            f"no ledger topic for fleet{'s' if len(self.fleets) > 1 else ''} "
            f"{', '.join(self.fleets)} ({', '.join(self.topics)}); nothing sent. Create it "
            f"once with `agentledger topics create {flags}` (every fleet gets the same "
            "partitions, retention and compression), then publish again"
        )


class BrokerUnavailableError(AgentLedgerError):
    """Kafka did not answer within the publish timeout. Retry later; nothing was lost here.

    ``acknowledged`` and ``unacknowledged`` list the (run id, sequence number) of the entries
    the broker did and did not confirm. Resending the unacknowledged ones (or the whole batch)
    is safe: an entry that did arrive is skipped downstream as a duplicate. ``cause`` is the
    why alone (e.g. "timed out after 4.0s"), for callers that word their own account;
    ``refusals`` what the brokers answered to the retried sends, when they refused them.
    """

    retriable = True

    def __init__(
        self,
        message: str,
        acknowledged: Sequence[tuple[str, int]] = (),
        unacknowledged: Sequence[tuple[str, int]] = (),
        cause: str | None = None,
        refusals: str | None = None,
    ) -> None:
        super().__init__(message)
        self.acknowledged = list(acknowledged)
        self.unacknowledged = list(unacknowledged)
        self.cause = cause or message
        self.refusals = refusals


@dataclass
class SequenceBook:
    """Per-run gapless sequence numbers: assigns the next one, or checks the one given.

    A run this book has not seen may start at any number: another process (the orchestrator,
    an agent before its restart) may have written its first entries. Gaps and duplicates across
    processes are the projections' to find (a run's ``gaps``, a duplicate skipped)."""

    last: dict[str, int] = field(default_factory=dict)

    def peek(self, entry: LedgerEntry) -> int:
        given = entry.sequence_no
        if entry.run_id not in self.last:
            return given
        expected = self.last[entry.run_id] + 1
        if given < expected:
            raise LedgerValidationError(
                "sequence_no",
                f"run {entry.run_id}: sequence_no {given} repeats (last published {expected - 1})",
            )
        if given != expected:
            raise LedgerValidationError(
                "sequence_no",
                f"run {entry.run_id}: sequence_no {given} skips {expected}..{given - 1}",
            )
        return given

    def commit(self, run_id: str, sequence_no: int) -> None:
        self.last[run_id] = sequence_no


@dataclass(frozen=True)
class Encoded:
    """What goes on the wire for one entry: its fleet, topic, key, bytes and headers."""

    fleet_id: str
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


@dataclass(frozen=True)
class Prepared:
    """An entry ready to send: its topic, key, bytes and headers."""

    entry: LedgerEntry
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]

    @property
    def fleet_id(self) -> str:
        return self.entry.fleet_id

    def encoded(self) -> Encoded:
        """The wire form alone (without the entry object), e.g. to hold many in memory."""
        return Encoded(self.entry.fleet_id, self.topic, self.key, self.value, self.headers)


class ContextBook:
    """The last context manifest sent per run (its entry id and whole item list), for the newest
    ``runs`` runs; runs that ended are forgotten."""

    def __init__(self, runs: int = 4096) -> None:
        self.runs = runs
        self.last: OrderedDict[str, Previous] = OrderedDict()

    def copy(self) -> ContextBook:
        book = ContextBook(self.runs)
        book.last = OrderedDict(self.last)
        return book

    def delta(self, entry: LedgerEntry) -> tuple[LedgerEntry, tuple[ContextItem, ...] | None]:
        """``entry`` with a whole manifest sent as a delta of the run's previous one, and the
        whole item list it stands for (None: not a manifest this book can follow)."""
        if entry.kind is not EntryKind.CONTEXT_PROJECTED:
            return entry, None
        parts = [p for p in entry.parts if isinstance(p, ContextItemsPart)]
        if len(parts) != 1 or len(entry.parts) != 1:
            return entry, None
        previous = self.last.get(entry.run_id)
        whole, problem = resolve(previous, parts)
        if problem is not None:
            return entry, None
        if previous is None or parts[0].base_entry_id is not None:
            return entry, whole
        part = delta_part(previous[0], previous[1], whole)
        return entry.model_copy(update={"parts": (part,)}), whole

    def sent(self, entry: LedgerEntry, manifest: Previous | None) -> None:
        if entry.run_status is not None:
            self.last.pop(entry.run_id, None)
        elif manifest is not None:
            self.last[entry.run_id] = manifest
            self.last.move_to_end(entry.run_id)
            while len(self.last) > self.runs:
                self.last.popitem(last=False)
        elif entry.kind is EntryKind.CONTEXT_PROJECTED:
            self.last.pop(entry.run_id, None)  # one it cannot follow: the next one goes whole


def traceparent(trace_id: str, span_id: str) -> bytes:
    return f"00-{trace_id}-{span_id}-01".encode()


# run ids that cannot name a run in a URL path: a browser resolves them as dot segments (an id
# holding '/' is one encoded segment, see consumers.web.app.seg, and opens as any other)
DOT_SEGMENTS = (".", "..")


def prepare(
    entry: LedgerEntry,
    book: SequenceBook,
    codec: LedgerCodec,
    settings: Settings,
    now: datetime | None = None,
    transform: Callable[[LedgerEntry], LedgerEntry] | None = None,
    artifacts: ArtifactStore | None = None,
) -> Prepared:
    """Validate, redact, number and encode one entry. Pure apart from the sequence book peek
    (and the clock, read once when ``now`` is not given), and of the ``artifacts`` store that an
    entry over the size limit has its largest texts moved to (:func:`streams.artifacts.offload`)."""
    if entry.run_id in DOT_SEGMENTS:
        # (the decoder still takes such ids: runs already on a ledger replay as they were)
        raise LedgerValidationError(
            "run_id",
            "a run's id may not be '.' or '..': it names the run in the web pages', the API's "
            "and MCP's addresses, where a browser reads those as the folder itself or above it",
        )
    if entry.occurred_at > (now or datetime.now(UTC)) + MAX_CLOCK_AHEAD:
        raise LedgerValidationError(
            "occurred_at", f"more than {MAX_CLOCK_AHEAD.days} day ahead of this machine's clock"
        )
    if entry.trace_id is None or entry.span_id is None:
        entry = entry.model_copy(
            update={
                "trace_id": entry.trace_id or secrets.token_hex(16),
                "span_id": entry.span_id or secrets.token_hex(8),
            }
        )
    # Redaction first: it refuses ids that hold a secret, before any message names the run.
    entry = redact_entry(entry)
    if transform is not None:  # on the redacted entry, as it will be sent
        entry = transform(entry)
    book.peek(entry)
    value = codec.encode(entry)
    limit = settings.max_entry_bytes
    moved = 0
    if len(value) > limit and artifacts is not None:
        # Content over the limit goes to the artifact store (secret-scanned there too), the
        # entry keeps a ref; written before the send, harmless if the send fails (same address).
        entry, moved = offload(entry, artifacts, lambda e: len(codec.encode(e)) <= limit)
        value = codec.encode(entry) if moved else value
    if len(value) > limit:
        what = (
            f"even with its {moved} largest texts moved to the artifact store"
            if moved
            else "with no text large enough to move to the artifact store"
            if artifacts is not None
            else "and this publisher has no artifact store"
        )
        raise LedgerValidationError(
            "parts",
            f"entry {entry.entry_id} of run {entry.run_id}: encoded entry is {len(value)} bytes, "
            f"over the {limit}-byte limit {what}; store large content as an artifact and send "
            "an artifact ref",
        )
    assert entry.trace_id is not None and entry.span_id is not None
    headers = [
        ("traceparent", traceparent(entry.trace_id, entry.span_id)),
        ("content-type", CONTENT_TYPE),
    ]
    topic = ledger_topic(settings.topic_prefix, entry.fleet_id)
    return Prepared(entry, topic, entry.run_id.encode(), value, headers)


class AsyncPublisher:
    """Publish ledger entries with an idempotent producer. Use as ``async with``."""

    def __init__(
        self,
        settings: Settings,
        codec: LedgerCodec | None = None,
        create_topics: bool = False,
        context_deltas: bool = True,
        artifacts: ArtifactStore | None = None,
        offload_large: bool = True,
    ) -> None:
        self.settings = settings
        # An entry over AGENTLEDGER_MAX_ENTRY_BYTES has its largest texts moved to the artifact
        # store (the local one under the state folder unless given) and carries refs instead;
        # with offload_large=False it is refused, as before artifacts existed.
        self.artifacts: ArtifactStore | None = None
        if offload_large:
            self.artifacts = artifacts or FileArtifactStore.from_settings(settings)
        self.codec = codec or LedgerCodec()
        self.book = SequenceBook()
        self._create_topics = create_topics
        self._fleets_ready: set[str] = set()
        self._producer: AIOKafkaProducer | None = None
        # Context manifests go as deltas of the run's previous one this publisher sent (schema
        # v2): a long run's ledger grows with its length, not its square. A run this publisher
        # has not seen (another process, a restart) starts with a whole manifest.
        self.context_deltas = context_deltas
        self.contexts = ContextBook()
        # Where runs stand on the ledger, read once per partition and then only what was
        # appended since (made on the first resume, closed with the publisher).
        self.positions: LedgerPositions | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.close()
        except BrokerUnavailableError:
            if exc is None:
                raise  # else the error that ended the block says more; this one adds nothing

    async def start(self) -> None:
        hold_back_kafka_floods()  # (and remember what the brokers refuse, for the error)
        timeout_ms = int(self.settings.publish_timeout_s * 1000)
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_address,
            acks="all",
            enable_idempotence=True,
            linger_ms=self.settings.publish_linger_ms,
            compression_type="zstd",
            max_batch_size=256 * 1024,
            request_timeout_ms=timeout_ms,
        )
        try:
            await self._bounded(producer.start(), "connecting to Kafka")
        except BaseException:
            await _stop_within(producer, self.settings.publish_timeout_s)
            raise
        self._producer = producer

    async def close(self) -> None:
        """Flush what is pending and disconnect, within the publish timeout. Past it (the broker
        is gone), the producer is torn down and :class:`BrokerUnavailableError` says so: entries
        whose acks never came were not confirmed and should be sent again."""
        if self.positions is not None:
            positions, self.positions = self.positions, None
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await asyncio.wait_for(positions.close(), self.settings.publish_timeout_s)
        if self._producer is not None:
            producer, self._producer = self._producer, None
            started = time.monotonic()
            if not await _stop_within(producer, self.settings.publish_timeout_s):
                raise BrokerUnavailableError(
                    f"closing the publisher: Kafka at {self.settings.kafka_address} did not "
                    f"take the pending entries within {time.monotonic() - started:.1f}s; the "
                    "connection was dropped, entries not acknowledged earlier were not sent"
                )

    async def publish(self, entry: LedgerEntry) -> LedgerEntry:
        """Send one entry and wait for the broker's ack. Returns the entry as sent."""
        return (await self.publish_batch([entry]))[0]

    async def publish_batch(
        self, entries: Sequence[LedgerEntry], assign_sequence: bool = False
    ) -> list[LedgerEntry]:
        """Validate all first (nothing is sent if one is bad), then send and wait for acks.

        With ``assign_sequence`` the publisher numbers each run's entries itself, continuing
        from what it last published for that run, or for a run it has not seen from where the
        ledger stands (a RUN_STARTED begins at 1); otherwise it checks the numbers given.
        """
        if assign_sequence:
            await self.resume(
                {
                    (e.fleet_id, e.run_id)
                    for e in entries
                    if e.run_id not in self.book.last and e.kind is not EntryKind.RUN_STARTED
                }
            )
        before = SequenceBook(dict(self.book.last))
        contexts = self.contexts.copy()
        try:
            staged = [self.stage(entry, assign_sequence) for entry in entries]
            await self.send(staged)
        except BaseException:
            # Nothing of this batch counts as published: the caller retries the same numbers
            # (a record that did reach the broker is then a duplicate the projections skip).
            self.book = before
            self.contexts = contexts
            raise
        return [p.entry for p in staged]

    async def resume(self, runs: Iterable[tuple[str, str]]) -> dict[str, int]:
        """Learn where these (fleet_id, run_id) runs stand on the ledger (their highest
        sequence number, 0 for none), so this publisher numbers their next entries after it.

        The ledger is read once per partition over the publisher's lifetime, and then only what
        was appended since: a run not on the ledger costs a look at the newest records, not a
        pass over its partition (see :mod:`streams.ledger_position`)."""
        wanted = [r for r in runs if r[1] not in self.book.last]
        if not wanted:
            return {}
        await self._ensure_fleets({fleet for fleet, _ in wanted})
        if self.positions is None:
            self.positions = LedgerPositions(self.settings, self.codec)
        found: dict[str, int] = await self._bounded(
            self.positions.last_sequence_nos(wanted), "reading where runs stand"
        )
        for run_id, seq in found.items():
            if seq:
                self.book.last.setdefault(run_id, seq)
        return found

    def stage(self, entry: LedgerEntry, assign_sequence: bool = False) -> Prepared:
        """Validate, number, redact and encode one entry, and book its sequence number."""
        if assign_sequence:
            entry = entry.model_copy(
                update={"sequence_no": self.book.last.get(entry.run_id, 0) + 1}
            )
        made: list[Previous] = []

        def as_delta(e: LedgerEntry) -> LedgerEntry:
            sent, whole = self.contexts.delta(e) if self.context_deltas else (e, None)
            if whole is not None:
                made.append((e.entry_id, whole))
            return sent

        p = prepare(
            entry,
            self.book,
            self.codec,
            self.settings,
            transform=as_delta,
            artifacts=self.artifacts,
        )
        self.book.commit(p.entry.run_id, p.entry.sequence_no)
        self.contexts.sent(p.entry, made[0] if made else None)
        return p

    async def send(self, staged: Sequence[Prepared | Encoded]) -> None:
        """Produce staged records and wait until the broker acknowledged every one, within the
        publish timeout; else :class:`BrokerUnavailableError` says which were acknowledged."""
        started = time.monotonic()
        await self._ensure_fleets({p.fleet_id for p in staged})
        producer = self._require_producer()
        deadline = started + self.settings.publish_timeout_s
        futures: list[asyncio.Future[Any]] = []
        failure: BaseException | None = None
        try:
            for p in staged:  # send() itself waits while the producer's buffer is full
                futures.append(
                    await asyncio.wait_for(
                        producer.send(p.topic, p.value, key=p.key, headers=p.headers),
                        max(deadline - time.monotonic(), 0.001),
                    )
                )
            if futures:
                await asyncio.wait(futures, timeout=max(deadline - time.monotonic(), 0.001))
        except (TimeoutError, KafkaError, OSError) as exc:
            failure = exc
        acked = [f.done() and not f.cancelled() and f.exception() is None for f in futures]
        if failure is None and all(acked) and len(acked) == len(staged):
            return
        errors = [f.exception() for f in futures if f.done() and not f.cancelled()]
        failure = failure or next((e for e in errors if e is not None), None)
        raise _unacknowledged(
            staged,
            acked,
            failure,
            time.monotonic() - started,
            self.settings.kafka_address,
            PRODUCE_REFUSALS.since(started),  # what Kafka answered while its client retried
        )

    async def flush(self) -> None:
        await self._bounded(self._require_producer().flush(), "flushing to Kafka")

    async def _ensure_fleets(self, fleets: set[str]) -> None:
        """Each fleet's ledger topic exists (``create_topics``: create it, as
        ``topics create`` does; else :class:`FleetTopicMissingError`)."""
        unknown = fleets - self._fleets_ready
        if not unknown:
            return
        if self._create_topics:
            await self._bounded(
                create_fleet_topics(self.settings, sorted(unknown)), "creating fleet topics"
            )
        else:
            cluster = await self._bounded(
                self._require_producer().client.fetch_all_metadata(), "reading topic metadata"
            )
            existing = set(cluster.topics())
            absent = sorted(f for f in unknown if self._topic(f) not in existing)
            if absent:
                raise FleetTopicMissingError([self._topic(f) for f in absent], absent)
        self._fleets_ready |= unknown

    def _topic(self, fleet_id: str) -> str:
        return ledger_topic(self.settings.topic_prefix, fleet_id)

    def _require_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise AgentLedgerError("publisher not started: use 'async with' or call start()")
        return self._producer

    async def _bounded(self, awaitable: Any, what: str) -> Any:
        started = time.monotonic()
        try:
            return await asyncio.wait_for(awaitable, self.settings.publish_timeout_s)
        except (TimeoutError, KafkaError, OSError) as exc:
            raise BrokerUnavailableError(
                f"{what} at {self.settings.kafka_address} failed after "
                f"{time.monotonic() - started:.1f}s: {_why(exc, self.settings.publish_timeout_s)}"
            ) from exc


def _why(exc: BaseException | None, timeout_s: float | None = None) -> str:
    if exc is None or isinstance(exc, TimeoutError):
        return "timed out" if timeout_s is None else f"timed out (limit {timeout_s:g}s)"
    name, text = type(exc).__name__, str(exc)
    if not text or text.startswith(name):  # aiokafka's errors already begin with their name
        return text or name
    return f"{name}: {text}"


def _unacknowledged(
    staged: Sequence[Prepared | Encoded],
    acked: Sequence[bool],
    failure: BaseException | None,
    elapsed_s: float,
    address: str,
    refusals: str | None = None,
) -> BrokerUnavailableError:
    """The error for a partly acknowledged send: how many, which runs from where, and why
    (with ``refusals``, what the brokers answered to the retried requests)."""
    ids = [_identity(p) for p in staged]
    confirmed = [*acked, *[False] * (len(ids) - len(acked))]  # the rest never reached send()
    yes = [i for i, ok in zip(ids, confirmed, strict=True) if ok]
    no = [i for i, ok in zip(ids, confirmed, strict=True) if not ok]
    first_missing: dict[str, int] = {}
    for run_id, seq in no:
        first_missing[run_id] = min(first_missing.get(run_id, seq), seq)
    runs = ", ".join(f"{r} from seq {s}" for r, s in sorted(first_missing.items())[:5])
    more = f" and {len(first_missing) - 5} more runs" if len(first_missing) > 5 else ""
    why = _why(failure) + (f"; {refusals}" if refusals else "")
    return BrokerUnavailableError(
        f"waiting for Kafka acks at {address}: {len(yes)} of {len(ids)} entries acknowledged, "
        f"{len(no)} not ({runs}{more}) after {elapsed_s:.1f}s: {why}; send the "
        "unacknowledged entries again (any that did arrive are skipped as duplicates)",
        acknowledged=yes,
        unacknowledged=no,
        cause=f"{_why(failure)} after {elapsed_s:.1f}s" + (f"; {refusals}" if refusals else ""),
        refusals=refusals,
    )


def _identity(p: Prepared | Encoded) -> tuple[str, int]:
    if isinstance(p, Prepared):
        return (p.entry.run_id, p.entry.sequence_no)
    return (p.key.decode(errors="replace"), -1)


async def _stop_within(producer: AIOKafkaProducer, timeout_s: float) -> bool:
    """Stop a producer; past ``timeout_s`` (no broker to flush to), tear it down instead: its
    sender task is cancelled and its connections closed. True if it stopped cleanly."""
    deadline = time.monotonic() + timeout_s
    try:
        # Flush first and stop only once nothing is pending: aiokafka's stop() drains the
        # accumulator in a task of its own that outlives a cancelled stop(), so with the broker
        # gone that task waited for ever (one leaked task per publisher, holding every unsent
        # record, later logged as "Task was destroyed but it is pending").
        await asyncio.wait_for(producer.flush(), timeout_s)
        await asyncio.wait_for(producer.stop(), max(deadline - time.monotonic(), 0.001))
        return True
    except (TimeoutError, KafkaError, OSError):
        pass
    # The accumulator never drains with the broker gone; its sender and client are the two
    # things holding the loop.
    sender = producer._sender
    if sender is not None and sender.sender_task is not None:
        sender.sender_task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(sender.sender_task, 2.0)
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(producer.client.close(), 2.0)
    # What stop() would have set first; without it the producer warns "Unclosed" when collected.
    producer._closed = True
    return False


class Publisher:
    """Synchronous face of :class:`AsyncPublisher` (runs a private event loop)."""

    def __init__(
        self,
        settings: Settings,
        codec: LedgerCodec | None = None,
        artifacts: ArtifactStore | None = None,
        offload_large: bool = True,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._inner = AsyncPublisher(
            settings, codec, artifacts=artifacts, offload_large=offload_large
        )

    def __enter__(self) -> Self:
        self._loop.run_until_complete(self._inner.start())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except BrokerUnavailableError:
            if exc is None:
                raise

    def publish(self, entry: LedgerEntry) -> LedgerEntry:
        return self._loop.run_until_complete(self._inner.publish(entry))

    def publish_batch(
        self, entries: Sequence[LedgerEntry], assign_sequence: bool = False
    ) -> list[LedgerEntry]:
        return self._loop.run_until_complete(self._inner.publish_batch(entries, assign_sequence))

    def flush(self) -> None:
        self._loop.run_until_complete(self._inner.flush())

    def close(self) -> None:
        if not self._loop.is_closed():
            try:
                self._loop.run_until_complete(self._inner.close())
            finally:
                _close_loop(self._loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what a torn-down producer left behind (its flush waits forever), then close."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
