"""The pydantic models agree with the newest .avsc field by field, and enforce the contract."""

from __future__ import annotations

import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import AwareDatetime, BaseModel, ValidationError
from pydantic.fields import FieldInfo

from schemas import factory, models
from schemas.catalog import CATALOG
from schemas.errors import LedgerValidationError
from schemas.models import PART_TYPES, EntryKind, LedgerEntry, parse_entry

INT32_MAX = 2**31 - 1
PRIMITIVES = {"string": str, "boolean": bool, "double": float}


def _named_types(schema: Any, found: dict[str, dict[str, Any]]) -> None:
    """Collect every named type (record, enum) defined anywhere in the schema, by full name."""
    if isinstance(schema, list):
        for branch in schema:
            _named_types(branch, found)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "enum"):
            found[f"{models.NAMESPACE}.{schema['name']}"] = schema
        for field in schema.get("fields", ()):
            _named_types(field["type"], found)
        for key in ("items", "values"):
            if key in schema:
                _named_types(schema[key], found)


NAMED: dict[str, dict[str, Any]] = {}
_named_types(CATALOG.current.schema, NAMED)


def _resolve(schema: Any) -> Any:
    if isinstance(schema, str) and schema.startswith(f"{models.NAMESPACE}."):
        return NAMED[schema]
    if isinstance(schema, str) and f"{models.NAMESPACE}.{schema}" in NAMED:
        return NAMED[f"{models.NAMESPACE}.{schema}"]
    return schema


def avro_shape(schema: Any) -> Any:
    """A comparable description of an Avro type."""
    schema = _resolve(schema)
    if isinstance(schema, list):
        if schema[0] == "null":
            assert len(schema) == 2, schema
            return ("nullable", avro_shape(schema[1]))
        return ("union", tuple(avro_shape(branch) for branch in schema))
    if isinstance(schema, str):
        return schema
    kind = schema["type"]
    if schema.get("logicalType") == "timestamp-micros":
        return "timestamp-micros"
    if kind == "array":
        return ("array", avro_shape(schema["items"]))
    if kind == "map":
        return ("map", avro_shape(schema["values"]))
    if kind == "enum":
        return ("enum", schema["name"], tuple(schema["symbols"]))
    if kind == "record":
        return ("record", schema["name"])
    return kind


def _bounds(metadata: list[Any]) -> int | None:
    return next((item.le for item in metadata if hasattr(item, "le")), None)


def python_shape(annotation: Any, metadata: list[Any]) -> Any:
    """A comparable description of a pydantic annotation, in Avro terms."""
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extra = get_args(annotation)
        nested = [
            m for item in extra for m in (item.metadata if isinstance(item, FieldInfo) else [item])
        ]
        return python_shape(inner, metadata + nested)
    if origin in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) < len(get_args(annotation)):
            assert len(members) == 1, annotation
            return ("nullable", python_shape(members[0], metadata))
        return ("union", tuple(python_shape(arg, []) for arg in members))
    if origin is tuple:
        item, ellipsis = get_args(annotation)
        assert ellipsis is Ellipsis, annotation
        return ("array", python_shape(item, []))
    if origin is Literal:  # a string narrowed to named values (the schema keeps it a string)
        assert all(isinstance(arg, str) for arg in get_args(annotation)), annotation
        return "string"
    if origin is dict:
        key, value = get_args(annotation)
        assert get_origin(key) is Annotated or key is str, annotation
        assert (get_args(key)[0] if get_origin(key) is Annotated else key) is str, annotation
        return ("map", python_shape(value, []))
    return _leaf_shape(annotation, metadata)


def _leaf_shape(annotation: Any, metadata: list[Any]) -> Any:
    if annotation in (datetime, AwareDatetime):
        return "timestamp-micros"
    if annotation is int:
        return "int" if _bounds(metadata) == INT32_MAX else "long"
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        return ("enum", annotation.__name__, tuple(member.value for member in annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return ("record", annotation.__name__)
    names = [name for name, python in PRIMITIVES.items() if python is annotation]
    assert names, f"unmapped annotation {annotation!r}"
    return names[0]


def _field_metadata(info: FieldInfo) -> list[Any]:
    return list(info.metadata)


def _model_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    fields = dict(model.model_fields)
    if model in PART_TYPES:
        tag = fields.pop("type")
        assert next(iter(model.model_fields)) == "type"
        assert tag.annotation == Literal[models.part_tag(model)]  # type: ignore[comparison-overlap]
    return fields


def _python_default(info: FieldInfo) -> Any:
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return value.model_dump()
    return list(value) if isinstance(value, tuple) else value


def _names_of(kind: str) -> Iterator[str]:
    return (name for name, schema in NAMED.items() if schema["type"] == kind)


@pytest.mark.parametrize("name", list(_names_of("record")))
def test_record_fields_agree(name: str) -> None:
    schema = NAMED[name]
    model = getattr(models, schema["name"])
    assert issubclass(model, BaseModel)
    assert models.avro_name(model) == name
    fields = _model_fields(model)
    assert list(fields) == [field["name"] for field in schema["fields"]]
    for field in schema["fields"]:
        info = fields[field["name"]]
        where = f"{name}.{field['name']}"
        assert python_shape(info.annotation, _field_metadata(info)) == avro_shape(field["type"]), (
            where
        )
        assert info.is_required() == ("default" not in field), where
        if "default" in field:
            assert _python_default(info) == field["default"], where


@pytest.mark.parametrize("name", list(_names_of("enum")))
def test_enum_symbols_agree_and_have_a_default(name: str) -> None:
    schema = NAMED[name]
    enum = getattr(models, schema["name"])
    assert [member.value for member in enum] == schema["symbols"]
    assert [member.name for member in enum] == schema["symbols"]
    assert schema.get("default") in schema["symbols"], "newer symbols need a fallback"


def test_parts_union_matches_part_types_in_order() -> None:
    parts = next(f for f in CATALOG.current.schema["fields"] if f["name"] == "parts")
    branches = [f"{models.NAMESPACE}.{branch['name']}" for branch in parts["type"]["items"]]
    assert branches == [models.avro_name(part) for part in PART_TYPES]
    tags = [models.part_tag(part) for part in PART_TYPES]
    assert len(set(tags)) == len(tags)


def test_every_named_type_field_and_enum_is_documented() -> None:
    for name, schema in NAMED.items():
        assert schema.get("doc"), name
        for field in schema.get("fields", ()):
            assert field.get("doc"), f"{name}.{field['name']}"


def test_factory_covers_every_kind_and_part_type() -> None:
    run = factory.sample_run()
    assert {entry.kind for entry in run} == set(EntryKind) - {EntryKind.UNKNOWN}
    assert [entry.sequence_no for entry in run] == list(range(1, len(run) + 1))
    assert [type(part) for part in factory.every_part()] == list(PART_TYPES)


def test_timestamps_are_normalized_to_utc() -> None:
    plus7 = timezone(timedelta(hours=7))
    entry = factory.sample_entry(occurred_at=datetime(2026, 7, 4, 10, 0, 0, 5, tzinfo=plus7))
    assert entry.occurred_at == datetime(2026, 7, 4, 3, 0, 0, 5, tzinfo=UTC)
    assert entry.occurred_at.utcoffset() == timedelta(0)


def test_models_are_frozen() -> None:
    entry = factory.sample_entry()
    with pytest.raises(ValidationError):
        entry.sequence_no = 2


BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"sequence_no": 0}, "sequence_no"),
    ({"entry_id": ""}, "entry_id"),
    ({"occurred_at": datetime(2026, 7, 4)}, "occurred_at"),
    ({"kind": "NOT_A_KIND"}, "kind"),
    ({"kind": EntryKind.RUN_FINISHED}, "run_status"),
    ({"run_status": "FAILED"}, "run_status"),
    # keys nobody declared are never echoed (they may be secrets): named <key>
    ({"surprise": 1}, "<key>"),
    ({"metadata": {"k": 1}}, "metadata.<key>"),
]


@pytest.mark.parametrize(("override", "field"), BAD_FIELDS)
def test_parse_entry_names_the_bad_field(override: dict[str, Any], field: str) -> None:
    data = {**factory.sample_entry().model_dump(), **override}
    with pytest.raises(LedgerValidationError) as caught:
        parse_entry(data)
    assert caught.value.field == field
    assert caught.value.retriable is False


BAD_PARTS: list[tuple[dict[str, Any], str]] = [
    ({"type": "json", "json_text": "{not json"}, "parts.0.json.json_text"),
    ({**factory.artifact_part("x").model_dump(), "sha256": "abc"}, "parts.0.artifact_ref.sha256"),
    ({**factory.file_snippet().model_dump(), "line_end": 1}, "parts.0.file_snippet.line_end"),
    ({**factory.model_usage().model_dump(), "cached_input_tokens": 10**6}, "parts.0.model_usage"),
    ({**factory.model_usage().model_dump(), "provider_reported_cost_usd": float("nan")}, "parts.0"),
    ({**factory.tool_result().model_dump(), "exit_code": 2**31}, "parts.0.tool_result.exit_code"),
    ({"type": "nope", "text": "x"}, "parts.0"),
]


@pytest.mark.parametrize(("part", "field"), BAD_PARTS)
def test_parts_are_validated(part: dict[str, Any], field: str) -> None:
    data = {**factory.sample_entry().model_dump(), "parts": [part]}
    with pytest.raises(LedgerValidationError) as caught:
        parse_entry(data)
    assert caught.value.field.startswith(field)


def test_renamed_file_needs_old_path() -> None:
    data = {**factory.diff().files[2].model_dump(), "old_path": None}
    with pytest.raises(ValidationError, match="RENAMED"):
        models.DiffFile.model_validate(data)


def test_artifact_ref_part_converts_to_nested_ref() -> None:
    part = factory.artifact_part("log")
    assert part.to_ref() == factory.artifact("log")


def test_unknown_kind_may_carry_a_run_status() -> None:
    """A v1 reader maps a newer run-ending kind to UNKNOWN; its run_status must still load."""
    entry = factory.sample_entry(EntryKind.UNKNOWN, run_status="FAILED")
    assert entry.run_status is models.RunStatus.FAILED


def test_entry_model_is_the_envelope() -> None:
    assert models.avro_name(LedgerEntry) == f"{CATALOG.current.schema['namespace']}.LedgerEntry"


def test_sample_run_is_coherent() -> None:
    run = factory.sample_run("run-9")
    ids = {entry.entry_id for entry in run}
    calls = [p.tool_call_id for e in run for p in e.parts if isinstance(p, models.ToolCallPart)]
    results = [p.tool_call_id for e in run for p in e.parts if isinstance(p, models.ToolResultPart)]
    assert calls == results and len(calls) == 2
    assert all(e.causation.parent_entry_id in ids for e in run if e.causation.parent_entry_id)
    proposal = next(p for e in run for p in e.parts if isinstance(p, models.MemoryProposalPart))
    refs = {ref.split(":", 1)[1] for fact in proposal.facts for ref in fact.evidence_refs}
    assert refs <= ids | set(calls)
    times = [entry.occurred_at for entry in run]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert {entry.run_id for entry in run} == {"run-9"}
