"""The fleet publisher: the SDK agent runtimes import, and what ``agentledger publish`` uses.

``prepare`` is pure (validate, sequence, redact, encode, size-check); ``AsyncPublisher`` adds the
idempotent producer (acks=all, key = run id, W3C ``traceparent`` header). ``Publisher`` is the
same API for synchronous callers. Bad input raises :class:`LedgerValidationError` naming the field
and nothing is sent; an unreachable broker raises :class:`BrokerUnavailableError` (retriable) after
a bounded wait.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from infra.settings import Settings
from schemas.codec import LedgerCodec
from schemas.errors import AgentLedgerError, LedgerValidationError
from schemas.models import LedgerEntry
from streams.admin import create_fleet_topics
from streams.redaction import redact_entry
from streams.topics import FLEET_ID_RE, ledger_topic

CONTENT_TYPE = b"application/vnd.agentledger.entry+avro"


class BrokerUnavailableError(AgentLedgerError):
    """Kafka did not answer within the publish timeout. Retry later; nothing was lost here."""

    retriable = True


@dataclass
class SequenceBook:
    """Per-run gapless sequence numbers: assigns the next one, or checks the one given."""

    last: dict[str, int] = field(default_factory=dict)

    def peek(self, entry: LedgerEntry) -> int:
        expected = self.last.get(entry.run_id, 0) + 1
        given = entry.sequence_no
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


def traceparent(trace_id: str, span_id: str) -> bytes:
    return f"00-{trace_id}-{span_id}-01".encode()


def prepare(
    entry: LedgerEntry, book: SequenceBook, codec: LedgerCodec, settings: Settings
) -> Prepared:
    """Validate, number, redact and encode one entry. Pure apart from the sequence book peek."""
    if not FLEET_ID_RE.match(entry.fleet_id):
        raise LedgerValidationError("fleet_id", f"{entry.fleet_id!r} is not a valid fleet id")
    sequence_no = book.peek(entry)
    updates: dict[str, Any] = {"sequence_no": sequence_no}
    if entry.trace_id is None or entry.span_id is None:
        updates["trace_id"] = entry.trace_id or secrets.token_hex(16)
        updates["span_id"] = entry.span_id or secrets.token_hex(8)
    entry = redact_entry(entry.model_copy(update=updates))
    value = codec.encode(entry)
    if len(value) > settings.max_entry_bytes:
        raise LedgerValidationError(
            "parts",
            f"encoded entry is {len(value)} bytes, over the {settings.max_entry_bytes}-byte "
            "limit; store large content as an artifact and send an artifact ref",
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
        self, settings: Settings, codec: LedgerCodec | None = None, create_topics: bool = True
    ) -> None:
        self.settings = settings
        self.codec = codec or LedgerCodec()
        self.book = SequenceBook()
        self._create_topics = create_topics
        self._fleets_ready: set[str] = set()
        self._producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
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
            await producer.stop()
            raise
        self._producer = producer

    async def close(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()

    async def publish(self, entry: LedgerEntry) -> LedgerEntry:
        """Send one entry and wait for the broker's ack. Returns the entry as sent."""
        return (await self.publish_batch([entry]))[0]

    async def publish_batch(
        self, entries: Sequence[LedgerEntry], assign_sequence: bool = False
    ) -> list[LedgerEntry]:
        """Validate all first (nothing is sent if one is bad), then send and wait for acks.

        With ``assign_sequence`` the publisher numbers each run's entries itself (continuing
        from what it last published for that run); otherwise it checks the numbers given.
        """
        before = SequenceBook(dict(self.book.last))
        try:
            staged = [self.stage(entry, assign_sequence) for entry in entries]
            await self.send(staged)
        except BaseException:
            # Nothing of this batch counts as published: the caller retries the same numbers
            # (a record that did reach the broker is then a duplicate the projections skip).
            self.book = before
            raise
        return [p.entry for p in staged]

    def stage(self, entry: LedgerEntry, assign_sequence: bool = False) -> Prepared:
        """Validate, number, redact and encode one entry, and book its sequence number."""
        if assign_sequence:
            entry = entry.model_copy(
                update={"sequence_no": self.book.last.get(entry.run_id, 0) + 1}
            )
        p = prepare(entry, self.book, self.codec, self.settings)
        self.book.commit(p.entry.run_id, p.entry.sequence_no)
        return p

    async def send(self, staged: Sequence[Prepared | Encoded]) -> None:
        """Produce staged records and wait until the broker acknowledged every one."""
        await self._ensure_fleets({p.fleet_id for p in staged})
        producer = self._require_producer()
        futures = [
            await producer.send(p.topic, p.value, key=p.key, headers=p.headers) for p in staged
        ]
        await self._bounded(asyncio.gather(*futures), "waiting for Kafka acks")

    async def flush(self) -> None:
        await self._bounded(self._require_producer().flush(), "flushing to Kafka")

    async def _ensure_fleets(self, fleets: set[str]) -> None:
        missing = fleets - self._fleets_ready
        if missing and self._create_topics:
            await self._bounded(
                create_fleet_topics(self.settings, sorted(missing)), "creating fleet topics"
            )
        self._fleets_ready |= missing

    def _require_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise AgentLedgerError("publisher not started: use 'async with' or call start()")
        return self._producer

    async def _bounded(self, awaitable: Any, what: str) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self.settings.publish_timeout_s)
        except (TimeoutError, KafkaError, OSError) as exc:
            raise BrokerUnavailableError(
                f"{what} at {self.settings.kafka_address} failed after "
                f"{self.settings.publish_timeout_s:.0f}s: {exc!r}"
            ) from exc


class Publisher:
    """Synchronous face of :class:`AsyncPublisher` (runs a private event loop)."""

    def __init__(self, settings: Settings, codec: LedgerCodec | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._inner = AsyncPublisher(settings, codec)

    def __enter__(self) -> Self:
        self._loop.run_until_complete(self._inner.start())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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
            self._loop.run_until_complete(self._inner.close())
            self._loop.close()
