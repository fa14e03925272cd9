"""The publisher's pure path: validation, sequence numbers, redaction, size limit; and a bounded
failure when no broker answers."""

from __future__ import annotations

import json
import socket
import time

import pytest

from infra.settings import Settings, load_settings
from schemas.codec import LedgerCodec
from schemas.errors import LedgerValidationError
from schemas.factory import EntryBuilder, json_part, model_usage, sample_entry
from schemas.models import (
    EntryKind,
    ErrorPart,
    LedgerEntry,
    TextPart,
    ToolResultPart,
    ToolResultStatus,
    parse_entry,
)
from streams.publisher import AsyncPublisher, BrokerUnavailableError, SequenceBook, prepare
from tests.unit.secret_corpus import corpus

CODEC = LedgerCodec()


@pytest.fixture
def settings() -> Settings:
    return load_settings(kafka_bootstrap="127.0.0.1:1", publish_timeout_s=2.0)


def _carriers(text: str, secret_json: str) -> list[LedgerEntry]:
    """The secret-bearing text in every free-text place of an entry."""
    usage = model_usage().model_copy(update={"raw_usage_json": secret_json})
    return [
        sample_entry(EntryKind.USER_TASK, parts=(TextPart(text=text),)),
        sample_entry(
            EntryKind.TOOL_CALL_RESULT,
            parts=(
                ToolResultPart(
                    tool_call_id="c1",
                    status=ToolResultStatus.FAILED,
                    exit_code=1,
                    timed_out=False,
                    summary=text,
                ),
            ),
        ),
        sample_entry(EntryKind.ERROR_EVENT, parts=(ErrorPart(category="tool", message=text),)),
        sample_entry(EntryKind.RUN_SUMMARY, metadata={"note": text}),
        sample_entry(EntryKind.RUN_SUMMARY, parts=(json_part({"log": text}),)),
        sample_entry(EntryKind.MODEL_CALL, parts=(usage,)),
    ]


@pytest.mark.parametrize(("name", "secret", "text"), corpus(), ids=lambda v: str(v)[:24])
def test_no_secret_survives_into_encoded_bytes(
    name: str, secret: str, text: str, settings: Settings
) -> None:
    secret_json = json.dumps({"input_tokens": 10, "output_tokens": 3, "debug": text})
    for entry in _carriers(text, secret_json):
        prepared = prepare(entry, SequenceBook(), CODEC, settings)
        assert secret.encode() not in prepared.value, f"{name} leaked"
        assert prepared.entry.redactions, "each redaction is recorded"
        recorded = json.dumps([r.model_dump(mode="json") for r in prepared.entry.redactions])
        assert secret not in recorded


def test_corpus_is_big_enough() -> None:
    assert len(corpus()) >= 100


def test_clean_entry_is_untouched(settings: Settings) -> None:
    entry = sample_entry(
        EntryKind.USER_TASK, parts=(TextPart(text="Fix pagination, max_tokens=4096"),)
    )
    prepared = prepare(entry, SequenceBook(), CODEC, settings)
    assert prepared.entry.parts == entry.parts
    assert prepared.entry.redactions == ()
    assert CODEC.decode(prepared.value) == prepared.entry


def test_sequence_must_be_gapless_per_run(settings: Settings) -> None:
    b = EntryBuilder("run-x")
    first, second, third = (b.add(EntryKind.USER_TASK) for _ in range(3))
    book = SequenceBook()
    book.commit("run-x", prepare(first, book, CODEC, settings).entry.sequence_no)
    with pytest.raises(LedgerValidationError, match=r"skips 2\.\.2") as skipped:
        prepare(third, book, CODEC, settings)
    assert skipped.value.field == "sequence_no"
    with pytest.raises(LedgerValidationError, match="repeats"):
        prepare(first, book, CODEC, settings)
    assert prepare(second, book, CODEC, settings).entry.sequence_no == 2


def test_a_run_this_publisher_has_not_seen_continues_where_it_says(settings: Settings) -> None:
    """Another process wrote entries 1-2 of the run: this publisher's first entry of it is 3."""
    b = EntryBuilder("run-y")
    entries = [b.add(EntryKind.USER_TASK) for _ in range(5)]
    book = SequenceBook()
    third = prepare(entries[2], book, CODEC, settings)
    assert third.entry.sequence_no == 3
    book.commit("run-y", 3)
    with pytest.raises(LedgerValidationError, match=r"skips 4\.\.4"):
        prepare(entries[4], book, CODEC, settings)  # from here on, checked as before
    with pytest.raises(LedgerValidationError, match="repeats"):
        prepare(entries[1], book, CODEC, settings)
    assert prepare(entries[3], book, CODEC, settings).entry.sequence_no == 4


def test_oversized_entry_is_refused(settings: Settings) -> None:
    entry = sample_entry(EntryKind.USER_TASK, parts=(TextPart(text="x" * (600 * 1024)),))
    with pytest.raises(LedgerValidationError, match="artifact") as exc:
        prepare(entry, SequenceBook(), CODEC, settings)
    assert exc.value.field == "parts"


def test_bad_fleet_id_is_refused(settings: Settings) -> None:
    entry = sample_entry().model_dump()
    entry["fleet_id"] = "no/slashes"
    with pytest.raises(LedgerValidationError) as exc:
        parse_entry(entry)
    assert exc.value.field == "fleet_id"
    assert "no/slashes" not in str(exc.value), "the rejected value is never echoed"


def test_traceparent_header_always_present(settings: Settings) -> None:
    entry = sample_entry().model_copy(update={"trace_id": None, "span_id": None})
    prepared = prepare(entry, SequenceBook(), CODEC, settings)
    header = dict(prepared.headers)["traceparent"].decode()
    assert header == f"00-{prepared.entry.trace_id}-{prepared.entry.span_id}-01"
    assert prepared.key == entry.run_id.encode()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_broker_is_retriable_error_not_hang() -> None:
    settings = load_settings(kafka_bootstrap=f"127.0.0.1:{_closed_port()}", publish_timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as exc:
        async with AsyncPublisher(settings) as publisher:
            await publisher.publish(sample_entry())
    assert exc.value.retriable
    assert time.monotonic() - started < 10
