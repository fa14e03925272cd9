"""Dead letters: poison records with their original bytes and the reason, per fleet.

A dead letter keeps the original key, value and headers, and adds ``al.source.topic``,
``al.source.partition``, ``al.source.offset``, ``al.error.class`` and ``al.error.message``. An
original too large to copy whole (a poison record near the broker's limit, plus these headers,
would not fit one request) keeps its first 64 KiB, with ``al.original.size`` and
``al.original.sha256``, so nothing is dropped silently and the worker moves on.
``redrive`` re-checks each one with today's decoder and sends those that now decode back to their
source topic, once (PostgreSQL remembers what was redriven).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

from infra.settings import Settings
from projectors.stores import postgres_ops as ops
from schemas.codec import LedgerCodec
from schemas.errors import BadArgumentError, LedgerDecodeError
from schemas.secret_scan import default_detector
from schemas.topics import dead_letter_topic, fleet_in_ledger_topic
from streams.contract import RecordContractError
from streams.engine import CONFLICTING_DUPLICATE, OTHER_FLEET, Poison
from streams.source import topic_partitions

SOURCE_TOPIC = "al.source.topic"
SOURCE_PARTITION = "al.source.partition"
SOURCE_OFFSET = "al.source.offset"
ERROR_CLASS = "al.error.class"
ERROR_MESSAGE = "al.error.message"
REDRIVEN_FROM = "al.redriven-from"
ORIGINAL_SIZE = "al.original.size"
ORIGINAL_SHA256 = "al.original.sha256"
HEADERS_DROPPED = "al.original.headers-dropped"
OURS = frozenset(
    {
        SOURCE_TOPIC,
        SOURCE_PARTITION,
        SOURCE_OFFSET,
        ERROR_CLASS,
        ERROR_MESSAGE,
        ORIGINAL_SIZE,
        ORIGINAL_SHA256,
        HEADERS_DROPPED,
    }
)
# A dead letter is sent whole up to this size (key, value and headers); beyond, a bounded copy.
# Below aiokafka's default max_request_size (1 MiB) and the broker's message.max.bytes.
MAX_LETTER_BYTES = 768 * 1024
PREFIX_BYTES = 64 * 1024
MAX_KEY_BYTES = 4096


def fleet_of(topic: str) -> str:
    """The fleet id of a ledger topic ``<prefix>.ledger.<fleet>`` (else the topic itself)."""
    return fleet_in_ledger_topic(topic) or topic


class KafkaDeadLetterSink:
    """Writes poison records to their fleet's dead-letter topic and waits for the acks."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_address,
            acks="all",
            enable_idempotence=True,
            compression_type="zstd",
        )
        await producer.start()
        self._producer = producer

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def send(self, poison: Sequence[Poison]) -> None:
        if self._producer is None:
            await self.start()
        assert self._producer is not None
        letters = [(p, *letter_of(p)) for p in poison]
        futures = []
        for p, key, value, headers in letters:
            topic = dead_letter_topic(self.settings.topic_prefix, fleet_of(p.record.topic))
            try:
                futures.append(await self._producer.send(topic, value, key=key, headers=headers))
            except MessageSizeTooLargeError:  # the broker's limit is lower than we assume
                key, value, headers = letter_of(p, whole=False, prefix=0)
                futures.append(await self._producer.send(topic, value, key=key, headers=headers))
        for (p, *_), future in zip(letters, futures, strict=True):
            try:
                await future
            except (MessageSizeTooLargeError, RecordListTooLargeError):
                topic = dead_letter_topic(self.settings.topic_prefix, fleet_of(p.record.topic))
                key, value, headers = letter_of(p, whole=False, prefix=0)
                await (await self._producer.send(topic, value, key=key, headers=headers))


def letter_of(
    p: Poison, whole: bool | None = None, prefix: int = PREFIX_BYTES
) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """The dead letter of a poison record: (key, value, headers), bounded in size."""
    r = p.record
    value = r.value or b""
    ours = [
        (SOURCE_TOPIC, r.topic.encode()),
        (SOURCE_PARTITION, str(r.partition).encode()),
        (SOURCE_OFFSET, str(r.offset).encode()),
        (ERROR_CLASS, p.error_class.encode()[:200]),
        (ERROR_MESSAGE, p.message.encode()[:4000]),
    ]
    original = list(r.headers)
    size = len(value) + len(r.key or b"") + sum(len(k) + len(v) for k, v in original)
    if whole is None:
        whole = size <= MAX_LETTER_BYTES
    if whole:
        return r.key, value, [*original, *ours]
    kept = original if sum(len(k) + len(v) for k, v in original) <= PREFIX_BYTES else []
    extra = [
        (ORIGINAL_SIZE, str(len(value)).encode()),
        (ORIGINAL_SHA256, hashlib.sha256(value).hexdigest().encode()),
    ]
    if len(kept) < len(original):
        extra.append((HEADERS_DROPPED, str(len(original)).encode()))
    key = r.key[:MAX_KEY_BYTES] if r.key is not None else None
    return key, value[:prefix], [*kept, *ours, *extra]


@dataclass(frozen=True)
class DeadLetter:
    """One record of a dead-letter topic, as ``dlq list`` shows it."""

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    source_topic: str
    source_partition: int
    source_offset: int
    error_class: str
    message: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    original_size: int = -1  # when only a prefix of the original was kept
    original_sha256: str | None = None

    @property
    def source(self) -> tuple[str, int, int]:
        return (self.source_topic, self.source_partition, self.source_offset)

    @property
    def truncated(self) -> bool:
        return self.original_size >= 0

    @property
    def size(self) -> int:
        """The original record's value size."""
        return self.original_size if self.truncated else len(self.value)

    def original_headers(self) -> list[tuple[str, bytes]]:
        return [(k, v) for k, v in self.headers if k not in OURS]


def _dead_letter(record: Any) -> DeadLetter:
    h = {k: v.decode(errors="replace") for k, v in record.headers}
    return DeadLetter(
        dlq_topic=record.topic,
        dlq_partition=record.partition,
        dlq_offset=record.offset,
        source_topic=h.get(SOURCE_TOPIC, "?"),
        source_partition=int(h.get(SOURCE_PARTITION, "-1")),
        source_offset=int(h.get(SOURCE_OFFSET, "-1")),
        error_class=h.get(ERROR_CLASS, "?"),
        message=h.get(ERROR_MESSAGE, ""),
        key=record.key,
        value=record.value or b"",
        headers=tuple(record.headers),
        original_size=int(h.get(ORIGINAL_SIZE, "-1")),
        original_sha256=h.get(ORIGINAL_SHA256),
    )


async def read_dead_letters(settings: Settings, fleets: Sequence[str]) -> list[DeadLetter]:
    """Every dead letter of these fleets, from the beginning to the current end; a source record
    dead-lettered twice (a retried batch) is listed once."""
    topics = [dead_letter_topic(settings.topic_prefix, f) for f in fleets]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_address,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    found: dict[tuple[str, int, int], DeadLetter] = {}
    try:
        partitions = await topic_partitions(consumer, topics)
        if not partitions:
            return []
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        remaining = {tp for tp in partitions if end[tp] > 0}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=5000)
            if not batch:
                break
            for tp, records in batch.items():
                for record in records:
                    letter = _dead_letter(record)
                    found.setdefault(letter.source, letter)
                if await consumer.position(tp) >= end[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()
    return sorted(found.values(), key=lambda d: d.source)


async def redriven_sources(settings: Settings) -> set[tuple[str, int, int]]:
    async with ops.connect_async(settings.pg_address) as conn:
        return await ops.redriven_sources(conn)


async def dismissed_sources(settings: Settings) -> dict[tuple[str, int, int], tuple[str, Any]]:
    async with ops.connect_async(settings.pg_address) as conn:
        return await ops.dismissed_sources(conn)


def parse_source(text: str) -> tuple[str, int, int]:
    """``TOPIC/PARTITION/OFFSET`` as ``dlq list`` prints a dead letter's source."""
    topic, _, rest = text.rpartition("/")
    topic, _, partition = topic.rpartition("/")
    if not topic or not partition.isdigit() or not rest.isdigit():
        raise BadArgumentError(f"{text!r} is not TOPIC/PARTITION/OFFSET (as `dlq list` shows)")
    return topic, int(partition), int(rest)


async def dismiss(
    settings: Settings, fleets: Sequence[str], sources: Sequence[str], reason: str
) -> list[tuple[str, bool]]:
    """Mark these dead letters handled with ``reason`` (kept for audit); each source must be a
    dead letter of these fleets. Returns (source, newly dismissed) per source."""
    if not reason.strip():
        raise BadArgumentError("give a --reason: it is kept with the dismissal for audit")
    wanted = [(text, parse_source(text)) for text in sources]
    known = {d.source for d in await read_dead_letters(settings, fleets)}
    missing = [text for text, source in wanted if source not in known]
    if missing:
        raise BadArgumentError(
            f"no dead letter of fleets {', '.join(fleets)} comes from {', '.join(missing)} "
            "(see `agentledger dlq list`)"
        )
    out = []
    async with ops.connect_async(settings.pg_address) as conn:
        for text, source in wanted:
            out.append((text, await ops.dismiss(conn, source, reason)))
        await conn.commit()
    return out


def run_of(letter: DeadLetter, codec: LedgerCodec) -> str | None:
    """The run a dead letter belongs to: the entry's run id when its bytes decode, else the
    record's key when it is text (producers key records by run id); secrets in it redacted."""
    run_id: str | None = None
    try:
        run_id = codec.decode(letter.value).run_id
    except LedgerDecodeError:
        if letter.key:
            try:
                run_id = letter.key.decode()
            except UnicodeDecodeError:
                return None
    if run_id is None:
        return None
    return default_detector().redact(run_id)[0][:256]


@dataclass
class RedriveReport:
    redriven: int = 0
    still_bad: list[tuple[DeadLetter, str]] = field(default_factory=list)
    already: int = 0
    dismissed: int = 0  # marked handled: left alone


def refused_for_good(letter: DeadLetter) -> str | None:
    """Why sending this letter back could never apply it (None: it may apply now): an entry
    that conflicts with the one its run holds at that number (the first stands), or of a run
    that is in another fleet (it would come from the same topic again). Found trying the
    product: redrive resent such letters, said so, and each came back as a new letter."""
    if letter.error_class == CONFLICTING_DUPLICATE:
        return "refused for good: its number is taken by another entry of the run (dismiss it)"
    if letter.error_class == RecordContractError.__name__ and letter.message.startswith(
        OTHER_FLEET
    ):
        return "refused for good: its run is in another fleet (dismiss it)"
    return None


async def redrive(
    settings: Settings, fleets: Sequence[str], codec: LedgerCodec | None = None
) -> RedriveReport:
    """Send back every dead letter that decodes now; leave the rest, saying why."""
    letters = await read_dead_letters(settings, fleets)
    done = await redriven_sources(settings)
    dismissed = await dismissed_sources(settings)
    codec = codec or LedgerCodec()
    report = RedriveReport()
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_address,
        acks="all",
        enable_idempotence=True,
        compression_type="zstd",
    )
    await producer.start()
    try:
        async with ops.connect_async(settings.pg_address) as conn:
            for letter in letters:
                if letter.source in done:
                    report.already += 1
                    continue
                if letter.source in dismissed:
                    report.dismissed += 1
                    continue
                final = refused_for_good(letter)
                if final is not None:
                    report.still_bad.append((letter, final))
                    continue
                if letter.truncated:
                    report.still_bad.append(
                        (letter, f"only the first {len(letter.value)} of {letter.size} bytes kept")
                    )
                    continue
                try:
                    entry = codec.decode(letter.value)
                except LedgerDecodeError as exc:
                    report.still_bad.append((letter, str(exc)))
                    continue
                source = f"{letter.source_topic}/{letter.source_partition}/{letter.source_offset}"
                headers = [*letter.original_headers(), (REDRIVEN_FROM, source.encode())]
                await producer.send_and_wait(  # keyed by run id: a wrong key was one reason
                    letter.source_topic, letter.value, key=entry.run_id.encode(), headers=headers
                )
                await ops.mark_redriven(conn, letter.source)
                await conn.commit()
                report.redriven += 1
    finally:
        await producer.stop()
    return report


async def redrive_json(settings: Settings, fleets: Sequence[str]) -> dict[str, Any]:
    """:func:`redrive` of ``fleets`` as the web API answers it."""
    report = await redrive(settings, fleets)
    return {
        "redriven": report.redriven,
        "already": report.already,
        "dismissed": report.dismissed,
        "still_bad": [
            {
                "source": f"{d.source_topic}/{d.source_partition}/{d.source_offset}",
                "reason": reason,
            }
            for d, reason in report.still_bad
        ],
    }


async def dead_letter_rows(settings: Settings, fleets: Sequence[str]) -> list[dict[str, Any]]:
    """The dead letters of ``fleets`` as ``dlq list --json`` prints them (and the API answers):
    source position, run, error class, reason, size, whether redriven or dismissed (why, when)."""
    letters = await read_dead_letters(settings, fleets)
    done = await redriven_sources(settings)
    dismissed = await dismissed_sources(settings)
    codec = LedgerCodec()
    rows = []
    for d in letters:
        handled = dismissed.get(d.source)
        rows.append(
            {
                "source": f"{d.source_topic}/{d.source_partition}/{d.source_offset}",
                "run_id": run_of(d, codec),
                "error_class": d.error_class,
                "reason": d.message,
                "bytes": d.size,
                "truncated": d.truncated,
                "redriven": d.source in done,
                "dismissed": None
                if handled is None
                else {"reason": handled[0], "at": handled[1].isoformat()},
            }
        )
    return rows
