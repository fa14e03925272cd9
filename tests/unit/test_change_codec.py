"""Change records: encoding, schema evolution both ways, and the FULL_TRANSITIVE rule."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.catalog import SchemaCatalog
from schemas.changes import CHANGE_CATALOG, ChangeCodec, ProjectionChange, change_key
from schemas.errors import LedgerDecodeError
from tests.unit.test_schema_compat import incompatibilities

AT = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
CHANGE = ProjectionChange(
    change_id=42,
    kind="STATE",
    projection="cost-metrics",
    build="b2",
    projection_version=2,
    committed_at=AT,
    fleet_id="fleet-01",
    run_id="run-1",
    applied_seq=17,
    held=2,
    state={"totals": {"cost_usd": "0.0123", "calls": 3}, "text": "a\x00b"},
    traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
)


def _v2() -> dict[str, Any]:
    """A newer writer: one field more, with a default (what a compatible change may add)."""
    schema = copy.deepcopy(CHANGE_CATALOG.current.schema)
    schema["fields"].append({"name": "region", "type": ["null", "string"], "default": None})
    return schema


def test_round_trip() -> None:
    codec = ChangeCodec()
    assert codec.decode(codec.encode(CHANGE)) == CHANGE


def test_a_state_given_as_its_json_text_is_read_back_as_the_state() -> None:
    """The relay hands the outbox's JSON text on unparsed: readers get the same state."""
    import orjson

    codec = ChangeCodec()
    raw = ProjectionChange(
        **{**CHANGE.__dict__, "state": None, "state_json": orjson.dumps(CHANGE.state).decode()}
    )
    assert codec.decode(codec.encode(raw)) == CHANGE
    spaced = ProjectionChange(**{**raw.__dict__, "state_json": '{"totals": {"calls": 3}}'})
    assert codec.decode(codec.encode(spaced)).state == {"totals": {"calls": 3}}


def test_keys_keep_a_run_latest_state_and_one_marker_per_partition() -> None:
    assert change_key(CHANGE, 3) == b'["state","run-1"]'
    marker = ProjectionChange(1, "BUILD_CHANGED", "cost-metrics", "b2", 2, AT)
    assert change_key(marker, 3) == b'["build",3]'


def test_an_old_reader_reads_a_newer_writer_through_the_schema_it_registered() -> None:
    newer = CHANGE_CATALOG.with_version(_v2(), 2)
    writer = ChangeCodec(newer)
    data = writer.encode(ProjectionChange(**{**CHANGE.__dict__, "extra": {"region": "eu"}}))
    old = ChangeCodec()  # knows v1 only
    with pytest.raises(LedgerDecodeError, match="does not know"):
        old.decode(data)
    registered = {newer.current.fingerprint: newer.current.schema_json}
    old.resolve = registered.get
    assert old.decode(data) == CHANGE  # v1 reader: the new field is not read
    assert writer.decode(data).extra == {"region": "eu"}


def test_a_newer_reader_reads_an_old_writer() -> None:
    newer = CHANGE_CATALOG.with_version(_v2(), 2)
    data = ChangeCodec().encode(CHANGE)
    got = ChangeCodec(newer).decode(data)
    assert got.extra == {"region": None} and got.run_id == CHANGE.run_id


def test_a_resolved_schema_must_have_the_fingerprint_asked_for() -> None:
    newer = CHANGE_CATALOG.with_version(_v2(), 2)
    data = ChangeCodec(newer).encode(CHANGE)
    liar = ChangeCodec(resolve=lambda _digest: CHANGE_CATALOG.current.schema_json)
    with pytest.raises(LedgerDecodeError):
        liar.decode(data)


@pytest.mark.parametrize("data", [b"", b"\xc3", b"\x00\x01\x02", b"\xc3\x01" + b"\x00" * 8 + b"x"])
def test_bad_bytes_are_decode_errors(data: bytes) -> None:
    with pytest.raises(LedgerDecodeError):
        ChangeCodec().decode(data)


def test_every_change_schema_version_is_full_transitive() -> None:
    assert incompatibilities(CHANGE_CATALOG.versions) == []
    assert incompatibilities(CHANGE_CATALOG.with_version(_v2(), 2).versions) == []


def test_the_ledger_catalog_holds_only_ledger_schemas() -> None:
    from schemas.catalog import CATALOG

    assert {v.schema["name"] for v in CATALOG.versions} == {"LedgerEntry"}
    assert isinstance(CHANGE_CATALOG, SchemaCatalog)
