"""Codec round trips, wire formats and the single error type for bad bytes."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest

from schemas import factory
from schemas.catalog import CATALOG
from schemas.codec import (
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_MAGIC,
    LedgerCodec,
    decode,
    decode_many,
    encode,
)
from schemas.errors import (
    AgentLedgerError,
    CodecConfigError,
    LedgerDecodeError,
    LedgerValidationError,
)
from schemas.models import PART_TYPES, EntryKind, LedgerEntry, TextPart

ENTRIES = [*factory.sample_run(), factory.entry_with_every_part()]
FINGERPRINT = CATALOG.current.fingerprint


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.sequence_no}-{e.kind.value}")
def test_round_trip_every_kind(entry: LedgerEntry) -> None:
    assert decode(encode(entry)) == entry


@pytest.mark.parametrize("part", factory.every_part(), ids=lambda p: p.type)
def test_round_trip_every_part_type(part: Any) -> None:
    entry = factory.sample_entry(parts=(part, part))
    decoded = decode(encode(entry))
    assert decoded == entry
    assert type(decoded.parts[0]) is type(part)


def test_every_part_type_is_exercised() -> None:
    assert {type(part) for part in factory.entry_with_every_part().parts} == set(PART_TYPES)


def test_single_object_header() -> None:
    data = encode(factory.sample_entry())
    assert data[:2] == SINGLE_OBJECT_MAGIC == b"\xc3\x01"
    assert data[2:10] == FINGERPRINT
    assert len(FINGERPRINT) == 8


def test_decode_many_matches_decode() -> None:
    batch = [encode(entry) for entry in ENTRIES]
    assert decode_many(batch) == ENTRIES
    assert decode_many([]) == []


def test_decode_many_names_the_bad_message() -> None:
    batch = [encode(entry) for entry in ENTRIES[:3]] + [b"\xc3\x01junk"]
    with pytest.raises(LedgerDecodeError, match="message 3"):
        decode_many(batch)


def test_decode_each_returns_errors_in_place() -> None:
    good = encode(ENTRIES[0])
    results = LedgerCodec().decode_each([good, b"nope", good])
    assert results[0] == results[2] == ENTRIES[0]
    assert isinstance(results[1], LedgerDecodeError)


def test_accepts_bytearray_and_memoryview() -> None:
    data = encode(ENTRIES[0])
    assert decode(bytearray(data)) == decode(memoryview(data)) == ENTRIES[0]


def test_writer_of_reports_the_writer_version() -> None:
    assert LedgerCodec().writer_of(encode(ENTRIES[0])).version == CATALOG.current.version


# --- Confluent wire format -------------------------------------------------------------------


def test_confluent_round_trip_with_mapping() -> None:
    codec = LedgerCodec(wire_format="confluent", schema_ids={42: FINGERPRINT})
    data = codec.encode(ENTRIES[0])
    assert data[:5] == CONFLUENT_MAGIC + (42).to_bytes(4, "big")
    assert codec.decode(data) == ENTRIES[0]


def test_confluent_round_trip_with_callable() -> None:
    lookups: list[int] = []

    def resolve(schema_id: int) -> bytes | None:
        lookups.append(schema_id)
        return FINGERPRINT if schema_id == 7 else None

    codec = LedgerCodec(wire_format="confluent", schema_ids=resolve, writer_schema_id=7)
    assert codec.decode(codec.encode(ENTRIES[1])) == ENTRIES[1]
    assert lookups == [7]


def test_one_reader_decodes_both_formats() -> None:
    confluent = LedgerCodec(wire_format="confluent", schema_ids={3: FINGERPRINT})
    messages = [confluent.encode(ENTRIES[0]), encode(ENTRIES[1])]
    assert confluent.decode_many(messages) == ENTRIES[:2]


def test_confluent_errors_are_decode_errors() -> None:
    data = LedgerCodec(wire_format="confluent", schema_ids={3: FINGERPRINT}).encode(ENTRIES[0])
    with pytest.raises(LedgerDecodeError, match="no schema-id mapping"):
        decode(data)
    with pytest.raises(LedgerDecodeError, match="unknown Confluent schema id 3"):
        LedgerCodec(schema_ids={4: FINGERPRINT}).decode(data)
    with pytest.raises(LedgerDecodeError, match="unknown writer schema fingerprint"):
        LedgerCodec(schema_ids={3: b"\x00" * 8}).decode(data)
    with pytest.raises(LedgerDecodeError, match="lookup failed"):
        LedgerCodec(schema_ids=_broken_resolver).decode(data)
    with pytest.raises(LedgerDecodeError, match="not 8 bytes"):
        LedgerCodec(schema_ids={3: FINGERPRINT.hex()}).decode(data)  # type: ignore[dict-item]


def _broken_resolver(schema_id: int) -> bytes | None:
    raise ConnectionError(f"registry down for {schema_id}")


def test_resolver_may_raise_its_own_ledger_error() -> None:
    class RegistryUnavailableError(AgentLedgerError):
        retriable = True

    def resolve(schema_id: int) -> bytes | None:
        raise RegistryUnavailableError(str(schema_id))

    data = CONFLUENT_MAGIC + (1).to_bytes(4, "big") + b"\x00"
    with pytest.raises(RegistryUnavailableError):
        LedgerCodec(schema_ids=resolve).decode(data)


def test_confluent_encoding_needs_a_schema_id() -> None:
    with pytest.raises(CodecConfigError, match="writer_schema_id"):
        LedgerCodec(wire_format="confluent")
    with pytest.raises(CodecConfigError, match="4 bytes"):
        LedgerCodec(wire_format="confluent", writer_schema_id=2**32)
    with pytest.raises(CodecConfigError, match="version 99"):
        LedgerCodec(reader_version=99)
    with pytest.raises(CodecConfigError, match="wire format"):
        LedgerCodec(wire_format="avro")  # type: ignore[arg-type]


# --- bad bytes: always LedgerDecodeError ----------------------------------------------------

GOOD = encode(factory.entry_with_every_part())
BAD_BYTES: dict[str, bytes] = {
    "empty": b"",
    "wrong magic": b"\xc3\x02" + GOOD[2:],
    "json": b'{"entry_id": "x"}',
    "header only": GOOD[:10],
    "short header": GOOD[:6],
    "unknown fingerprint": SINGLE_OBJECT_MAGIC + b"\x01" * 8 + GOOD[10:],
    "trailing bytes": GOOD + b"\x00",
    "confluent header only": CONFLUENT_MAGIC + b"\x00\x00",
}


@pytest.mark.parametrize("data", BAD_BYTES.values(), ids=BAD_BYTES.keys())
def test_bad_bytes_raise_decode_error(data: bytes) -> None:
    with pytest.raises(LedgerDecodeError) as caught:
        decode(data)
    assert caught.value.retriable is False
    assert str(caught.value)


def test_every_truncation_raises_decode_error() -> None:
    for size in range(len(GOOD)):
        with pytest.raises(LedgerDecodeError):
            decode(GOOD[:size])


def test_random_garbage_and_bit_flips_raise_only_decode_error() -> None:
    rng = random.Random(20260704)
    for _ in range(300):
        garbage = SINGLE_OBJECT_MAGIC + FINGERPRINT + rng.randbytes(rng.randrange(1, 300))
        _decode_or_decode_error(garbage)
        _decode_or_decode_error(rng.randbytes(rng.randrange(0, 64)))
        flipped = bytearray(GOOD)
        flipped[rng.randrange(10, len(GOOD))] ^= 1 << rng.randrange(8)
        _decode_or_decode_error(bytes(flipped))


def _decode_or_decode_error(data: bytes) -> None:
    """A flip inside a string may still decode; anything else must be a LedgerDecodeError."""
    with contextlib.suppress(LedgerDecodeError):
        decode(data)


def test_non_bytes_input_is_a_decode_error() -> None:
    with pytest.raises(LedgerDecodeError, match="expected bytes"):
        decode("c301")  # type: ignore[arg-type]


def test_decoded_contract_violations_are_decode_errors() -> None:
    """Bytes from a non-validating producer that break the model rules are dead-lettered."""
    record = factory.sample_entry().model_dump()
    record.update(sequence_no=0, parts=[])
    data = LedgerCodec().encode_record(record)
    with pytest.raises(LedgerDecodeError, match="sequence_no"):
        decode(data)


# --- encode-side validation ------------------------------------------------------------------


def test_encode_revalidates_entries_built_without_validation() -> None:
    bad = factory.sample_entry().model_copy(update={"sequence_no": 0})
    with pytest.raises(LedgerValidationError) as caught:
        encode(bad)
    assert caught.value.field == "sequence_no"


def test_encode_names_the_bad_part_field() -> None:
    part = TextPart.model_construct(text=None)
    bad = factory.sample_entry().model_copy(update={"parts": (part,)})
    with pytest.raises(LedgerValidationError) as caught:
        encode(bad)
    assert caught.value.field == "parts.0.text.text"


def test_encode_rejects_non_entries() -> None:
    with pytest.raises(LedgerValidationError, match="expected LedgerEntry"):
        encode({"entry_id": "x"})  # type: ignore[arg-type]


def test_encode_record_wraps_writer_errors() -> None:
    with pytest.raises(LedgerValidationError, match="not encodable"):
        LedgerCodec().encode_record({"entry_id": 5})


def test_validation_can_be_skipped_for_trusted_publishers() -> None:
    codec = LedgerCodec(validate=False)
    assert codec.decode(codec.encode(ENTRIES[0])) == ENTRIES[0]


def test_run_finished_round_trips_its_status() -> None:
    finished = next(e for e in ENTRIES if e.kind is EntryKind.RUN_FINISHED)
    assert decode(encode(finished)).run_status is finished.run_status is not None


def test_decode_position_reads_run_and_sequence_alone_and_refuses_what_decode_refuses() -> None:
    codec = LedgerCodec()
    for entry in ENTRIES:
        data = codec.encode(entry)
        assert codec.decode_position(data) == (entry.run_id, entry.sequence_no)
        for bad in (data[:-3], data + b"\x00", b"not avro", data[:2] + b"\x00" * 8 + data[10:]):
            with pytest.raises(LedgerDecodeError):
                codec.decode(bad)
            with pytest.raises(LedgerDecodeError):
                codec.decode_position(bad)
    old = LedgerCodec(writer_version=1)  # any catalogued writer
    entry = ENTRIES[0]
    assert codec.decode_position(old.encode(entry)) == (entry.run_id, entry.sequence_no)
