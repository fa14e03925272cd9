"""Must show (issue 3): simulate, publish to the real broker, read the raw bytes back with a plain
consumer, decode them with the Apache ``avro`` library (a second implementation) using the schema
file found by fingerprint, and get exactly the entries published."""

from __future__ import annotations

import io
import json
import re
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import avro.io
import avro.schema
import pytest
from fastavro.schema import to_parsing_canonical_form

from infra.admin import create_fleet_topics
from infra.settings import Settings
from schemas.catalog import AVSC_DIR
from schemas.models import LedgerEntry, to_avro
from schemas.topics import ledger_topic
from streams.publisher import AsyncPublisher
from streams.simulate import simulate
from streams.source import read_all

pytestmark = pytest.mark.integration

SECRET_RE = re.compile(rb"AKIA[0-9A-Z]{16}|ghp_[A-Za-z0-9]{36}")


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EMPTY64 = 0xC15D213AA4D7A795


def _crc64_avro(data: bytes) -> bytes:
    """The Avro spec's Rabin fingerprint, written out here independently of our catalog."""
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (EMPTY64 & -(fp & 1))
        table.append(fp)
    fp = EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


def _schema_files_by_fingerprint() -> dict[bytes, Path]:
    """Each .avsc file by the fingerprint of its Parsing Canonical Form.

    The Apache Python library's own ``fingerprint()`` keeps ``{"type":"long"}`` for logical types
    where the spec's [STRIP] then [PRIMITIVES] steps give ``"long"`` (as Java and fastavro do),
    so the canonical form comes from fastavro and the CRC from the function above.
    """
    return {
        _crc64_avro(to_parsing_canonical_form(json.loads(p.read_text())).encode()): p
        for p in AVSC_DIR.glob("*.avsc")
    }


def _avro_decode(value: bytes, files: dict[bytes, Path]) -> dict[str, Any]:
    assert value[:2] == b"\xc3\x01", "single-object encoding marker"
    schema = avro.schema.parse(files[bytes(value[2:10])].read_text())
    reader = avro.io.DatumReader(schema)
    return cast(dict[str, Any], reader.read(avro.io.BinaryDecoder(io.BytesIO(value[10:]))))


def _untagged(record: dict[str, Any]) -> dict[str, Any]:
    """Our fastavro record with union branches as plain dicts, as the Apache library returns."""
    record = dict(record)
    record["parts"] = [part for _, part in record["parts"]]
    return record


def _plain(value: Any) -> Any:
    """Comparable form: datetimes as UTC instants in microseconds, enums as their symbols."""
    if isinstance(value, datetime):
        return (value - EPOCH) // timedelta(microseconds=1)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


async def test_published_entries_decode_with_apache_avro(services: Settings) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    settings = services.model_copy(update={"topic_prefix": prefix})
    entries = simulate(fleets=1, runs=10, seed=42)
    assert any(SECRET_RE.search(e.model_dump_json().encode()) for e in entries)

    await create_fleet_topics(settings, ["fleet-01"])
    async with AsyncPublisher(settings) as publisher:
        sent = await publisher.publish_batch(entries)
    assert [e.entry_id for e in sent] == [e.entry_id for e in entries]

    records = await read_all(settings.kafka_address, [ledger_topic(prefix, "fleet-01")])
    raw = [(r.key or b"", r.value or b"") for r in records]
    assert len(raw) == len(entries)
    assert not any(SECRET_RE.search(value) for _, value in raw)

    files = _schema_files_by_fingerprint()
    decoded = [_avro_decode(value, files) for _, value in raw]
    assert all(key.decode() == d["run_id"] for (key, _), d in zip(raw, decoded, strict=True))

    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in decoded:
        by_run[d["run_id"]].append(d)
    expected: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in sent:
        expected[e.run_id].append(e)
    assert by_run.keys() == expected.keys() and len(by_run) == 10
    for run_id, got in by_run.items():
        assert [d["sequence_no"] for d in got] == list(range(1, len(got) + 1))
        assert _plain(got) == _plain([_untagged(to_avro(e)) for e in expected[run_id]])

    redacted = [e for e in sent if e.redactions]
    assert redacted, "the simulated secrets were redacted and the redactions recorded"
    assert all("[REDACTED:" in json.dumps(e.model_dump(mode="json")) for e in redacted)
