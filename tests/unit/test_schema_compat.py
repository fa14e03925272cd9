"""Schema evolution (FULL_TRANSITIVE) and cross-implementation checks with Apache `avro`.

Apache's checker answers "can `reader` read what `writer` wrote?". FULL_TRANSITIVE means that holds
for every ordered pair of versions, old and new alike, in both directions.
"""

from __future__ import annotations

import copy
import io
import itertools
from collections.abc import Callable
from typing import Any, cast

import avro.io
import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from schemas import factory
from schemas.catalog import CATALOG, SchemaCatalog, SchemaVersion
from schemas.codec import LedgerCodec, encode
from schemas.errors import SchemaCatalogError
from schemas.models import (
    PART_TYPES,
    EntryKind,
    LedgerEntry,
    avro_name,
    from_avro,
    part_tag,
    to_avro,
)


def _apache(version: SchemaVersion) -> avro.schema.Schema:
    return avro.schema.parse(version.schema_json)


def incompatibilities(versions: tuple[SchemaVersion, ...]) -> list[str]:
    """Every (reader, writer) pair Apache's checker rejects, with its messages."""
    parsed = {v.version: _apache(v) for v in versions}
    problems = []
    for reader, writer in itertools.product(parsed, repeat=2):
        checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
        result = checker.get_compatibility(parsed[reader], parsed[writer])
        if result.compatibility is not SchemaCompatibilityType.compatible:
            problems.append(f"v{reader} reading v{writer}: {sorted(result.messages)}")
    return problems


def test_every_stored_version_is_full_transitive() -> None:
    assert incompatibilities(CATALOG.versions) == []


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["name"] == name)


def _enum(schema: dict[str, Any], name: str) -> dict[str, Any]:
    field_type = _field(schema, name)["type"]
    return field_type if isinstance(field_type, dict) else field_type[1]


def v2_schema() -> dict[str, Any]:
    """The current schema plus a defaulted field and a new entry kind."""
    schema = copy.deepcopy(CATALOG.current.schema)
    schema["fields"].append(
        {"name": "cost_center", "type": "string", "default": "unassigned", "doc": "Billing unit."}
    )
    _enum(schema, "kind")["symbols"].append("PLAN_UPDATED")
    return schema


CATALOG_V2 = CATALOG.with_version(v2_schema(), CATALOG.current.version + 1)
V1, V2 = CATALOG.current.version, CATALOG.current.version + 1


def test_v2_is_full_transitive_with_every_stored_version() -> None:
    assert incompatibilities(CATALOG_V2.versions) == []


def test_v2_reader_decodes_v1_bytes_with_defaults() -> None:
    entry = factory.entry_with_every_part()
    record = LedgerCodec(CATALOG_V2).decode_record(encode(entry))
    assert record.pop("cost_center") == "unassigned"
    assert from_avro(record) == entry


def test_v1_reader_decodes_v2_bytes() -> None:
    entry = factory.entry_with_every_part()
    v2_bytes = LedgerCodec(CATALOG_V2).encode_record({**to_avro(entry), "cost_center": "cc-7"})
    assert LedgerCodec(CATALOG_V2).writer_of(v2_bytes).version == V2
    assert LedgerCodec(CATALOG_V2, reader_version=V1).decode(v2_bytes) == entry


def test_v1_reader_maps_a_newer_enum_symbol_to_its_default() -> None:
    entry = factory.sample_entry(EntryKind.USER_TASK)
    record = {**to_avro(entry), "kind": "PLAN_UPDATED", "cost_center": "cc-7"}
    v2_bytes = LedgerCodec(CATALOG_V2).encode_record(record)
    decoded = LedgerCodec(CATALOG_V2, reader_version=V1).decode(v2_bytes)
    assert decoded.kind is EntryKind.UNKNOWN
    assert decoded.model_copy(update={"kind": entry.kind}) == entry


def test_catalog_without_v2_cannot_read_v2_bytes() -> None:
    """Readers must get a new .avsc before any writer uses it."""
    v2_bytes = LedgerCodec(CATALOG_V2).encode(factory.sample_entry())
    with pytest.raises(Exception, match="unknown writer schema fingerprint"):
        LedgerCodec().decode(v2_bytes)


def _add_required_field(schema: dict[str, Any]) -> None:
    schema["fields"].append({"name": "tenant", "type": "string", "doc": "No default."})


def _drop_enum_default_and_a_symbol(schema: dict[str, Any]) -> None:
    enum = _enum(schema, "visibility")
    del enum["default"]
    enum["symbols"].remove("REDACTED")


def _change_a_type(schema: dict[str, Any]) -> None:
    _field(schema, "sequence_no")["type"] = "string"


def _add_a_part_type(schema: dict[str, Any]) -> None:
    union = _field(schema, "parts")["type"]["items"]
    fields = [{"name": "data", "type": "string", "doc": "x"}]
    union.append({"type": "record", "name": "NewPart", "doc": "x", "fields": fields})


BREAKING: dict[str, Callable[[dict[str, Any]], None]] = {
    "field without default": _add_required_field,
    "enum symbol removed without reader default": _drop_enum_default_and_a_symbol,
    "type change": _change_a_type,
    "new part type (the union is closed)": _add_a_part_type,
}


@pytest.mark.parametrize("change", BREAKING.values(), ids=BREAKING.keys())
def test_checker_catches_breaking_changes(change: Callable[[dict[str, Any]], None]) -> None:
    schema = copy.deepcopy(CATALOG.current.schema)
    change(schema)
    assert incompatibilities(CATALOG.with_version(schema, V2).versions) != []


# --- cross-implementation ---------------------------------------------------------------------

_PART_BY_FIELDS = {frozenset(cls.model_fields) - {"type"}: part_tag(cls) for cls in PART_TYPES}
_PART_NAMES = {avro_name(cls) for cls in PART_TYPES}


def apache_decode(data: bytes) -> dict[str, Any]:
    """Decode our single-object bytes with Apache avro and the .avsc named by the fingerprint."""
    assert data[:2] == b"\xc3\x01"
    version = CATALOG.by_fingerprint(data[2:10])
    assert version.path is not None
    schema = avro.schema.parse(version.path.read_text(encoding="utf-8"))
    reader = avro.io.DatumReader(schema, schema)
    decoder = avro.io.BinaryDecoder(io.BytesIO(data[10:]))
    return cast("dict[str, Any]", reader.read(decoder))


def _as_entry(apache: dict[str, Any]) -> LedgerEntry:
    """Apache returns union branches untagged; the field set identifies each part type."""
    parts = [{"type": _PART_BY_FIELDS[frozenset(p)], **p} for p in apache["parts"]]
    return LedgerEntry.model_validate({**apache, "parts": parts})


def _untagged(value: Any) -> Any:
    """Our fastavro record with union tuples dropped and tuples as lists, as Apache returns it."""
    if isinstance(value, dict):
        return {key: _untagged(item) for key, item in value.items()}
    if isinstance(value, tuple) and len(value) == 2 and str(value[0]) in _PART_NAMES:
        return _untagged(value[1])
    if isinstance(value, tuple | list):
        return [_untagged(item) for item in value]
    return value


@pytest.mark.parametrize("entry", [*factory.sample_run(), factory.entry_with_every_part()])
def test_apache_avro_decodes_our_bytes_to_the_same_values(entry: LedgerEntry) -> None:
    apache = apache_decode(encode(entry))
    assert apache == _untagged(to_avro(entry))
    assert _as_entry(apache) == entry


def test_fingerprint_matches_apache_implementation() -> None:
    """Apache agrees on CRC-64-AVRO. Its canonical form keeps {"type":"long"} for logical types
    where the spec (and Java, fastavro) collapse it to "long", so we compare after that fix."""
    version = CATALOG.current
    assert avro.schema.parse(version.canonical_form).fingerprint() == version.fingerprint
    apache_form = _apache(version).canonical_form.replace('{"type":"long"}', '"long"')
    assert apache_form == version.canonical_form


# --- catalog ----------------------------------------------------------------------------------


def test_catalog_indexes_every_file_once() -> None:
    assert [v.version for v in CATALOG.versions] == list(range(1, len(CATALOG.versions) + 1))
    assert CATALOG.current is CATALOG.versions[-1]
    for version in CATALOG.versions:
        assert CATALOG.by_version(version.version) is version
        assert CATALOG.by_fingerprint(version.fingerprint) is version
        assert (
            version.path is not None
            and version.path.name == f"ledger_entry.v{version.version}.avsc"
        )


def test_with_version_leaves_the_default_catalog_alone() -> None:
    assert CATALOG_V2.current.version == V2
    assert CATALOG.current.version == V1
    with pytest.raises(SchemaCatalogError, match="share a version"):
        CATALOG.with_version(v2_schema(), V1)
    with pytest.raises(SchemaCatalogError, match="share a fingerprint"):
        CATALOG.with_version(CATALOG.current.schema, V2)


def test_doc_only_changes_keep_the_fingerprint() -> None:
    schema = copy.deepcopy(CATALOG.current.schema)
    schema["doc"] = "reworded"
    assert CATALOG.with_version(v2_schema(), V2).current.fingerprint != CATALOG.current.fingerprint
    with pytest.raises(SchemaCatalogError, match="share a fingerprint"):
        CATALOG.with_version(schema, V2)


BAD_SCHEMAS: dict[str, dict[str, Any]] = {
    "not the envelope": {"type": "record", "name": "Other", "fields": []},
    "invalid avro": {
        "type": "record",
        "name": "LedgerEntry",
        "namespace": "agentledger",
        "fields": [{"name": "x", "type": "agentledger.NoSuchType"}],
    },
}


@pytest.mark.parametrize("schema", BAD_SCHEMAS.values(), ids=BAD_SCHEMAS.keys())
def test_bad_schemas_are_catalog_errors(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaCatalogError):
        CATALOG.with_version(schema, V2)


def test_directory_files_must_be_named_by_version(tmp_path: Any) -> None:
    (tmp_path / "ledger_entry.avsc").write_text(CATALOG.current.schema_json, encoding="utf-8")
    with pytest.raises(SchemaCatalogError, match="file name"):
        SchemaCatalog.from_directory(tmp_path)
    with pytest.raises(SchemaCatalogError, match="at least one"):
        SchemaCatalog([])
