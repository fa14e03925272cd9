"""The JSON form is lossless and matches JSON_FORM.md."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from schemas import factory
from schemas.errors import LedgerValidationError
from schemas.json_form import from_json, from_json_text, to_json, to_json_text
from schemas.models import PART_TYPES, LedgerEntry, part_tag

ENTRIES = [*factory.sample_run(), factory.entry_with_every_part()]
ISO_MICROS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.sequence_no}-{e.kind.value}")
def test_round_trip_is_lossless(entry: LedgerEntry) -> None:
    assert from_json(to_json(entry)) == entry
    assert from_json(json.loads(json.dumps(to_json(entry)))) == entry
    assert from_json_text(to_json_text(entry)) == entry


def test_shape_follows_the_documented_form() -> None:
    form = to_json(factory.entry_with_every_part())
    assert ISO_MICROS.match(form["occurred_at"])
    assert form["occurred_at"].endswith(".123457Z")
    assert form["kind"] == "RUN_SUMMARY"
    assert form["step_id"] == "run-1-step1"
    assert form["run_status"] is None
    assert [part["type"] for part in form["parts"]] == [part_tag(p) for p in PART_TYPES]
    tool_call = form["parts"][5]
    assert ISO_MICROS.match(tool_call["started_at"]) and ISO_MICROS.match(tool_call["finished_at"])
    assert form["redactions"] == [
        {"type": "SECRET_PATTERN", "field": "AWS_SECRET_ACCESS_KEY", "rule": None}
    ]


def test_zero_microseconds_are_kept() -> None:
    entry = factory.sample_entry(occurred_at=factory.BASE_TIME.replace(microsecond=0))
    assert to_json(entry)["occurred_at"] == "2026-07-04T03:00:00.000000Z"


def test_offsets_are_accepted_and_normalized() -> None:
    form = to_json(factory.sample_entry())
    form["occurred_at"] = "2026-07-04T10:00:01.000001+07:00"
    assert to_json(from_json(form))["occurred_at"] == "2026-07-04T03:00:01.000001Z"


def test_defaults_may_be_omitted() -> None:
    form = to_json(factory.sample_entry())
    for key in ("step_id", "causation", "trace_id", "span_id", "run_status", "parts", "redactions"):
        form.pop(key)
    entry = from_json(form)
    assert entry.parts == () and entry.causation.parent_entry_id is None


STRICT_REJECTS: list[tuple[str, Any, str]] = [
    ("occurred_at", 1783134001, "occurred_at"),
    ("occurred_at", "2026-07-04T03:00:01", "occurred_at"),
    ("sequence_no", "1", "sequence_no"),
    ("sequence_no", 1.5, "sequence_no"),
    ("kind", "user_task", "kind"),
    ("metadata", {"k": 1}, "metadata.<key>"),
    ("parts", [{"text": "no type"}], "parts.0"),
    ("unexpected", True, "<key>"),
]


@pytest.mark.parametrize(("key", "value", "field"), STRICT_REJECTS)
def test_from_json_is_strict(key: str, value: Any, field: str) -> None:
    form = {**to_json(factory.sample_entry()), key: value}
    with pytest.raises(LedgerValidationError) as caught:
        from_json(form)
    assert caught.value.field == field


def test_non_json_values_are_rejected() -> None:
    form = {**to_json(factory.sample_entry()), "metadata": {"k": object()}}
    with pytest.raises(LedgerValidationError, match="not a JSON document"):
        from_json(form)


def test_json_form_doc_example_parses() -> None:
    doc = (Path(__file__).parents[2] / "schemas" / "JSON_FORM.md").read_text(encoding="utf-8")
    example = doc.split("```json\n", 1)[1].split("```", 1)[0]
    entry = from_json(json.loads(example))
    assert to_json(entry) == json.loads(example)
